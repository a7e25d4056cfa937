// GenericCompiler's passes: dead-node removal, CSE, arithmetic identities, constant folding.
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/primops.h"
#include "core/rewrite.h"

namespace luminal {

size_t remove_dead_nodes(Graph& g) {
  std::vector<int64_t> order = g.topo_order();
  std::vector<char> live(g.size(), 0);
  for (int64_t id : order) {
    Op op = g.node(id).op;
    if (op == Op::Output || op == Op::Input) live[id] = 1;  // inputs stay: users set their data by id
  }
  for (int64_t id : g.kept()) live[id] = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (live[*it])
      for (auto& e : g.node(*it).inputs) live[e.node] = 1;
  size_t removed = 0;
  for (int64_t id : order)
    if (!live[id]) { g.remove(id); ++removed; }
  return removed;
}

namespace {

size_t node_hash(const Node& n) {
  size_t h = size_t(n.op) * 1315423911u + size_t(n.dtype);
  auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (auto& d : n.shape) mix(d.hash());
  mix(std::hash<int>()(n.axis));
  uint64_t bits; std::memcpy(&bits, &n.value, 8);
  mix(std::hash<uint64_t>()(bits));
  mix(n.expr.hash());
  mix(std::hash<std::string>()(n.name));
  if (n.kop) mix(n.kop->hash());
  for (auto& e : n.inputs) { mix(std::hash<int64_t>()(e.node)); mix(e.view.hash()); }
  return h;
}

bool same_node(const Node& a, const Node& b) {
  if (a.op != b.op || a.dtype != b.dtype || a.axis != b.axis || a.name != b.name || a.shape != b.shape ||
      std::memcmp(&a.value, &b.value, 8) != 0 || a.expr != b.expr || bool(a.kop) != bool(b.kop) ||
      (a.kop && !a.kop->equals(*b.kop)) || a.inputs.size() != b.inputs.size())
    return false;
  for (size_t i = 0; i < a.inputs.size(); ++i)
    if (a.inputs[i].node != b.inputs[i].node || a.inputs[i].view != b.inputs[i].view) return false;
  return true;
}

// A Constant read without padding: every element it yields is its value.
Pattern constant(const std::string& name, std::optional<double> value = std::nullopt) {
  Pattern p; p.op = Op::Constant; p.name = name; p.value = value;
  p.where = [](const Graph&, int64_t, const View& v) { return !v.has_mask(); };
  return p;
}
// A one-value int32 Iota (a symbolic scalar such as the sequence length).
Pattern sym_scalar(const std::string& name) {
  Pattern p; p.op = Op::Iota; p.name = name;
  p.where = [](const Graph& g, int64_t id, const View& v) { return g.node(id).shape[0] == Expr(1) && !v.has_mask(); };
  return p;
}

// Rewrite to a bound input, which is only sound when the root read it as stored.
Rewrite to_input(const std::string& name) {
  return [name](Graph& g, const Match& m) -> std::optional<int64_t> {
    const Edge& e = m[name];
    if (!is_plain(g, e) || g.node(e.node).dtype != g.node(m.root).dtype) return std::nullopt;
    return e.node;
  };
}

}  // namespace

size_t eliminate_common_subexpressions(Graph& g) {
  std::unordered_multimap<size_t, int64_t> seen;
  size_t merged = 0;
  for (int64_t id : g.topo_order()) {
    const Node& n = g.node(id);
    if (n.op == Op::Input || n.op == Op::Output) continue;  // distinct data, distinct results
    size_t h = node_hash(n);
    int64_t twin = -1;
    for (auto [it, end] = seen.equal_range(h); it != end; ++it)
      if (same_node(g.node(it->second), n)) { twin = it->second; break; }
    if (twin < 0) { seen.emplace(h, id); continue; }
    g.replace_uses(id, twin);
    g.remove(id);
    ++merged;
  }
  return merged;
}

std::vector<Rule> arithmetic_rules() {
  std::vector<Rule> r;
  r.push_back({"x + 0 -> x", op(Op::Add, {any("x"), constant("", 0.0)}), to_input("x")});
  r.push_back({"x * 1 -> x", op(Op::Mul, {any("x"), constant("", 1.0)}), to_input("x")});
  r.push_back({"-(-x) -> x", op(Op::Mul, {op(Op::Mul, {any("x"), constant("", -1.0)}), constant("", -1.0)}), to_input("x")});
  r.push_back({"recip(recip(x)) -> x", op(Op::Recip, {op(Op::Recip, {any("x")})}), to_input("x")});
  // exp2(log2(x)) is x only where log2 is defined: fire when x is known to be non-negative.
  Pattern nonneg = any("x");
  nonneg.where = [](const Graph& g, int64_t id, const View& v) {
    const Node& n = g.node(id);
    return !v.has_mask() && (n.op == Op::Exp2 || n.op == Op::Sqrt || (n.op == Op::Constant && n.value >= 0));
  };
  r.push_back({"exp2(log2(x)) -> x", op(Op::Exp2, {op(Op::Log2, {nonneg})}), to_input("x")});
  // A same-dtype Cast is a copy (what `contiguous` records); reading its input as stored makes it a no-op.
  r.push_back({"no-op cast/copy", op(Op::Cast, {any("x")}), to_input("x")});
  return r;
}

std::vector<Rule> constant_folding_rules() {
  std::vector<Rule> r;
  for (Op o : {Op::Log2, Op::Exp2, Op::Sin, Op::Sqrt, Op::Recip})
    r.push_back({std::string("fold ") + op_name(o), op(o, {constant("a")}),
                 [](Graph& g, const Match& m) -> std::optional<int64_t> {
                   const Node& n = g.node(m.root);
                   return g.constant(eval_unary(n.op, g.node(m["a"].node).value), n.dtype);
                 }});
  for (Op o : {Op::Add, Op::Mul, Op::Mod, Op::LessThan}) {
    Pattern p = op(o, {constant("a"), constant("b")});
    p.commutative = false;
    r.push_back({std::string("fold ") + op_name(o), p, [](Graph& g, const Match& m) -> std::optional<int64_t> {
                   const Node& n = g.node(m.root);
                   return g.constant(eval_binary(n.op, g.node(m["a"].node).value, g.node(m["b"].node).value),
                                     n.dtype);
                 }});
  }
  r.push_back({"fold cast", op(Op::Cast, {constant("a")}), [](Graph& g, const Match& m) -> std::optional<int64_t> {
    const Node& n = g.node(m.root);
    return g.constant(g.node(m["a"].node).value, n.dtype);
  }});
  // Reductions of a broadcast constant with a known length.
  auto reduce_const = [](Op o) {
    return Rule{o == Op::SumReduce ? "fold sum of constant" : "fold max of constant", op(o, {constant("a")}),
                [](Graph& g, const Match& m) -> std::optional<int64_t> {
                  const Node& n = g.node(m.root);
                  const Edge& e = m["a"];
                  const Expr& len = e.view.shape[n.axis];
                  if (!len.is_const() || len.as_const() == 0) return std::nullopt;
                  double v = g.node(e.node).value;
                  if (n.op == Op::SumReduce) v *= double(len.as_const());
                  return g.constant(v, n.dtype);
                }};
  };
  r.push_back(reduce_const(Op::SumReduce));
  r.push_back(reduce_const(Op::MaxReduce));
  // Symbolic constants: a one-value Iota whose expression is a number is a Constant; integer arithmetic on
  // one-value Iotas stays an Iota of the combined expression.
  r.push_back({"fold constant iota", sym_scalar("a"), [](Graph& g, const Match& m) -> std::optional<int64_t> {
    Expr e = g.node(m.root).expr.substitute("z", Expr(0));  // the one index is 0
    if (!e.is_const()) return std::nullopt;
    return g.constant(double(e.as_const()), DType::I32);
  }});
  auto sym_binary = [](Op o) {
    return Rule{o == Op::Add ? "fold symbolic add" : "fold symbolic mul", op(o, {sym_scalar("a"), any("b")}),
                [o](Graph& g, const Match& m) -> std::optional<int64_t> {
                  const Node& b = g.node(m["b"].node);
                  if (m["b"].view.has_mask()) return std::nullopt;
                  Expr eb;
                  if (b.op == Op::Iota && b.shape[0] == Expr(1)) eb = b.expr.substitute("z", Expr(0));
                  else if (b.op == Op::Constant && b.dtype == DType::I32 && b.value == std::floor(b.value)) eb = Expr(int64_t(b.value));
                  else return std::nullopt;
                  Expr ea = g.node(m["a"].node).expr.substitute("z", Expr(0));
                  return g.iota(o == Op::Add ? ea + eb : ea * eb, Expr(1));
                }};
  };
  r.push_back(sym_binary(Op::Add));
  r.push_back(sym_binary(Op::Mul));
  return r;
}

}  // namespace luminal
