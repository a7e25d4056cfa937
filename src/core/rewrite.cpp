#include "core/rewrite.h"

#include <stdexcept>

namespace luminal {

const Edge& Match::operator[](const std::string& name) const {
  auto it = bound.find(name);
  if (it == bound.end()) throw std::out_of_range("the pattern binds no name '" + name + "'");
  return it->second;
}

namespace {

bool match_edge(const Graph& g, const Pattern& p, const Edge& e, Match& m);

bool match_inputs(const Graph& g, const Pattern& p, const Node& n, const std::vector<size_t>& order, Match& m) {
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const Pattern& c = p.inputs[i];
    const Edge& e = n.inputs[order[i]];
    // Descending into an op pattern needs a plain edge, so that a rewrite can rewire without composing views.
    if (!c.inputs.empty() && !is_plain(g, e)) return false;
    if (!match_edge(g, c, e, m)) return false;
  }
  return true;
}

bool match_edge(const Graph& g, const Pattern& p, const Edge& e, Match& m) {
  const Node& n = g.node(e.node);
  if (!n.alive) return false;
  if (p.op && n.op != *p.op) return false;
  if (p.dtype && n.dtype != *p.dtype) return false;
  if (p.value && !(n.op == Op::Constant && n.value == *p.value)) return false;
  if (!p.custom.empty() && !(n.op == Op::Custom && n.kop->name() == p.custom)) return false;
  if (p.single_use && g.users(e.node).size() != 1) return false;
  if (p.where && !p.where(g, e.node, e.view)) return false;
  if (!p.name.empty()) {
    auto it = m.bound.find(p.name);
    if (it != m.bound.end()) {
      if (it->second.node != e.node || it->second.view != e.view) return false;
    } else {
      m.bound.emplace(p.name, e);
    }
  }
  if (p.inputs.empty()) return true;
  if (n.inputs.size() != p.inputs.size()) return false;
  std::vector<size_t> order(p.inputs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Match saved = m;
  if (match_inputs(g, p, n, order, m)) return true;
  if (p.commutative && order.size() == 2 && (n.op == Op::Add || n.op == Op::Mul)) {
    m = saved;
    std::swap(order[0], order[1]);
    if (match_inputs(g, p, n, order, m)) return true;
  }
  m = std::move(saved);
  return false;
}

}  // namespace

bool match(const Graph& g, const Pattern& p, int64_t node, Match& m) {
  m.root = node;
  return match_edge(g, p, Edge{node, View::contiguous(g.node(node).shape)}, m);
}

namespace {
// Cheap tests on the root alone, before any view is built or state copied.
bool root_may_match(const Pattern& p, const Node& n) {
  if (p.op && n.op != *p.op) return false;
  if (p.dtype && n.dtype != *p.dtype) return false;
  if (!p.custom.empty() && (n.op != Op::Custom || n.kop->name() != p.custom)) return false;
  return p.inputs.empty() || n.inputs.size() == p.inputs.size();
}
}  // namespace

size_t apply_rules(Graph& g, const std::vector<Rule>& rules) {
  size_t count = 0;
  for (int64_t id : g.topo_order()) {
    const Node& n = g.node(id);
    if (!n.alive || n.op == Op::Output || n.op == Op::Input) continue;
    std::optional<Edge> root;  // built once per node, only if some rule gets past the cheap tests
    for (auto& rule : rules) {
      if (!root_may_match(rule.pattern, g.node(id))) continue;
      if (!root) root = Edge{id, View::contiguous(g.node(id).shape)};
      Match m;
      m.root = id;
      if (!match_edge(g, rule.pattern, *root, m)) continue;
      std::optional<int64_t> r = rule.rewrite(g, m);
      if (!r || *r == id) continue;
      bool scalar = g.node(*r).shape.size() != g.node(id).shape.size() || g.node(*r).shape != g.node(id).shape;
      try {
        scalar ? g.replace_uses_scalar(id, *r) : g.replace_uses(id, *r);
      } catch (const std::logic_error& e) {
        throw std::logic_error("rule '" + rule.name + "': " + e.what());
      }
      g.remove(id);
      ++count;
      break;
    }
  }
  return count;
}

}  // namespace luminal
