#include "core/plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/memory_plan.h"

namespace luminal {

size_t size_class(size_t bytes) {
  size_t b = std::max<size_t>(bytes, 256);
  size_t top = size_t(1) << (63 - __builtin_clzll(b));
  size_t step = std::max<size_t>(top / 8, 256);
  return (b + step - 1) / step * step;
}

Plan::Num Plan::num(const Expr& e) {
  Num n;
  if (e.is_const()) n.value = e.as_const();
  else n.expr = &e;  // points into the graph, which outlives the plan
  return n;
}

Plan::Plan(const Graph& g, const Schedule& s) : g_(g), s_(s) {
  size_t nn = g_.size(), ns = s_.steps.size();
  step_of_.assign(nn, -1);
  for (size_t i = 0; i < ns; ++i) step_of_[size_t(s_.steps[i].node)] = int64_t(i);
  // Steps are evaluated in order: a step placed before one it reads (an absorbed one included) would read a shape
  // not evaluated yet. A schedule bug, named here rather than as a view reading outside its buffer.
  for (size_t i = 0; i < ns; ++i)
    for (auto& in : g_.node(s_.steps[i].node).inputs)
      if (step_of_[size_t(in.node)] >= int64_t(i))
        throw std::logic_error("schedule: " + op_label(g_.node(s_.steps[i].node)) + " (node " +
                               std::to_string(s_.steps[i].node) + ") comes before node " + std::to_string(in.node) +
                               " that it reads");
  shape_nums_.resize(nn);
  grows_.assign(nn, 0);
  std::vector<int64_t> readers(nn, 0);
  fresh_.assign(nn, 0);  // returned by a run: outputs, and what an output reads as stored
  for (const Step& st : s_.steps) {
    const Node& n = g_.node(st.node);
    if (n.op != Op::Output) continue;
    fresh_[size_t(st.node)] = 1;
    if (st.kind == Step::Alias) fresh_[size_t(n.inputs[0].node)] = 1;
  }
  for (const Step& st : s_.steps) {
    const Node& n = g_.node(st.node);
    for (auto& e : n.shape) shape_nums_[size_t(st.node)].push_back(num(e));
    grows_[size_t(st.node)] = std::any_of(n.shape.begin(), n.shape.end(), [](const Expr& e) { return !e.is_const(); });
    std::vector<SymView> views;
    for (auto& in : n.inputs) {
      const View& v = in.view;
      SymView sv;
      sv.offset = num(v.offset);
      sv.masked = v.has_mask();
      for (size_t d = 0; d < v.rank(); ++d) {
        sv.shape.push_back(num(v.shape[d]));
        sv.strides.push_back(num(v.strides[d]));
        if (sv.masked) {
          sv.lo.push_back(num(v.mask[d].first));
          sv.hi.push_back(num(v.mask[d].second));
        }
      }
      views.push_back(std::move(sv));
      readers[size_t(in.node)]++;
    }
    sym_views_.push_back(std::move(views));
  }
  // The dims each step's numbers depend on (its shape, its views, its inputs' sizes): an update evaluates a step
  // again only when one of them changed.
  for (size_t i = 0; i < ns; ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    std::vector<std::string> vars;
    auto add = [&](const Expr& e) {
      if (!e.is_const())
        for (auto& v : e.vars()) vars.push_back(v);
    };
    for (auto& e : n.shape) add(e);
    if (n.op == Op::Iota)
      for (auto& v : n.expr.vars())
        if (v != "z") vars.push_back(v);  // z is the element index
    for (auto& in : n.inputs) {
      for (auto& e : g_.node(in.node).shape) add(e);
      const View& v = in.view;
      add(v.offset);
      for (size_t d = 0; d < v.rank(); ++d) {
        add(v.shape[d]);
        add(v.strides[d]);
        if (v.has_mask()) {
          add(v.mask[d].first);
          add(v.mask[d].second);
        }
      }
    }
    uint64_t mask = 0;
    for (auto& v : vars) {
      size_t k = size_t(std::find(var_names_.begin(), var_names_.end(), v) - var_names_.begin());
      if (k == var_names_.size()) var_names_.push_back(v);
      mask |= uint64_t(1) << std::min<size_t>(k, 63);
    }
    step_vars_.push_back(mask);
    const Edge* dest = n.op == Op::Scatter && st.kind == Step::Kernel ? &n.inputs[0] : nullptr;
    in_place_ok_.push_back(dest && g_.node(dest->node).op == Op::Input && readers[size_t(dest->node)] == 1 &&
                           is_plain(g_, *dest) && s_.storage[size_t(dest->node)] == s_.storage[size_t(st.node)]);
    // A copy may be skipped (see identity()) when the run does not return it, it is not an epilogue of a matrix-vector group, and
    // reads a buffer the run computes (not an input a Scatter may update in place, nor such a Scatter's result).
    const Node* src = st.kind == Step::Kernel && n.inputs.size() == 1 ? &g_.node(n.inputs[0].node) : nullptr;
    may_alias_.push_back(src && !fresh_[size_t(st.node)] && st.elementwise() &&
                         (st.group < 0 || s_.groups[size_t(st.group)].kind == Group::Batch) && src->op != Op::Input &&
                         src->op != Op::Constant && src->op != Op::Iota && src->op != Op::Scatter);
  }
  // Liveness: the last step whose kernels read each node. A group may run as one kernel: what its steps read stays
  // alive, and what they write stays apart from it, through the whole group.
  reads_last_.assign(nn, -1);
  for (size_t i = 0; i < ns; ++i)
    for (int64_t r : kernel_reads(g_, s_.steps[i])) reads_last_[size_t(r)] = int64_t(i);
  for (const Group& G : s_.groups)
    for (size_t i = G.first; i <= G.last; ++i)
      for (int64_t r : kernel_reads(g_, s_.steps[i]))
        if (reads_last_[size_t(r)] >= int64_t(G.first))
          reads_last_[size_t(r)] = std::max<int64_t>(reads_last_[size_t(r)], int64_t(G.last));
  for (const Group& G : s_.groups)  // (a group's kernel reads what its prologue's step reads)
    if (G.prologue >= 0)
      for (int64_t r : kernel_reads(g_, s_.steps[size_t(G.prologue)]))
        reads_last_[size_t(r)] = std::max<int64_t>(reads_last_[size_t(r)], int64_t(G.last));
  shapes_.assign(nn, {});
  views_.assign(ns, {});
  identity_.assign(ns, 0);
  offset_.assign(nn, 0);
  // Homes: fixed by the schedule, but for the copies that some dims make the identity (plan_memory).
  home_.assign(nn, Home::None);
  same_as_.assign(nn, -1);
  for (const Step& st : s_.steps) {
    size_t id = size_t(st.node);
    switch (st.kind) {
      case Step::Input: home_[id] = Home::Input; break;
      case Step::Constant: home_[id] = Home::Leaf; break;
      case Step::Iota: home_[id] = fresh_[id] ? Home::Fresh : Home::Leaf; break;
      case Step::Alias:
        home_[id] = Home::SameAs;
        same_as_[id] = g_.node(st.node).inputs[0].node;
        break;
      case Step::Kernel: case Step::Host:
        home_[id] = fresh_[id] ? Home::Fresh : st.absorbed ? Home::None : Home::Arena;
        break;
    }
  }
}

int64_t Plan::numel(int64_t node) const {
  int64_t n = 1;
  for (int64_t d : shapes_[size_t(node)]) n *= d;
  return n;
}

void Plan::evaluate(size_t i, const Bindings& dims) {
  const Step& st = s_.steps[i];
  const Node& n = g_.node(st.node);
  std::vector<int64_t>& shape = shapes_[size_t(st.node)];
  shape.resize(n.shape.size());
  for (size_t d = 0; d < n.shape.size(); ++d) {
    shape[d] = shape_nums_[size_t(st.node)][d].eval(dims);
    if (shape[d] < 0)
      throw std::invalid_argument("dimension " + n.shape[d].str() + " evaluates to a negative size " +
                                  std::to_string(shape[d]));
  }
  std::vector<ConcreteView>& cv = views_[i];
  cv.resize(n.inputs.size());
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const SymView& sv = sym_views_[i][k];
    ConcreteView& v = cv[k];
    size_t r = sv.shape.size();
    v.offset = sv.offset.eval(dims);
    v.masked = sv.masked;
    v.shape.resize(r);
    v.strides.resize(r);
    v.lo.resize(sv.masked ? r : 0);
    v.hi.resize(sv.masked ? r : 0);
    for (size_t d = 0; d < r; ++d) {
      v.shape[d] = sv.shape[d].eval(dims);
      v.strides[d] = sv.strides[d].eval(dims);
      if (sv.masked) {
        v.lo[d] = sv.lo[d].eval(dims);
        v.hi[d] = sv.hi[d].eval(dims);
      }
    }
    // Unpadded views are checked here, once per plan; padded ones are checked by the kernels per element.
    int64_t src = n.inputs[k].node;
    int64_t size = g_.node(src).op == Op::Constant ? 1 : numel(src);
    if (!v.masked && !v.reads_within(size)) {
      int64_t lo = v.offset, hi = v.offset;
      for (size_t d = 0; d < r; ++d) (v.strides[d] < 0 ? lo : hi) += (v.shape[d] - 1) * v.strides[d];
      throw std::out_of_range(op_label(n) + " (node " + std::to_string(st.node) + "): a view reads element " +
                              std::to_string(lo < 0 ? lo : hi) + " of a buffer of " + std::to_string(size) +
                              " elements");
    }
  }
  bool same = false;
  if (may_alias_[i]) {
    const std::vector<Instr>& code = st.program->code;
    const ConcreteView& v = cv[0];
    same = code[0].kind == Instr::Load && code[0].dtype == n.dtype && code.size() <= 2 &&
           (code.size() == 1 || (code[1].kind == Instr::Apply && code[1].op == Op::Cast && code[1].a == 0 &&
                                 code[1].dtype == n.dtype)) &&
           !v.masked && v.offset == 0 && v.shape == shape &&
           s_.storage[size_t(n.inputs[0].node)] == s_.storage[size_t(st.node)];
    int64_t expect = 1;
    for (size_t d = v.shape.size(); same && d-- > 0;) {
      if (v.shape[d] != 1 && v.strides[d] != expect) same = false;
      expect *= v.shape[d];
    }
  }
  identity_[i] = same;
}

void Plan::update(const Bindings& dims) {
  bool all = !valid_;
  valid_ = false;
  uint64_t changed = 0;
  for (size_t k = 0; k < var_names_.size(); ++k) {
    auto a = dims_.find(var_names_[k]);
    auto b = dims.find(var_names_[k]);
    if (a == dims_.end() || b == dims.end() || a->second != b->second) changed |= uint64_t(1) << std::min<size_t>(k, 63);
  }
  stale_.clear();
  for (size_t i = 0; i < s_.steps.size(); ++i)
    if (all || (step_vars_[i] & changed)) {
      evaluate(i, dims);  // (a dim that is not bound raises here, naming it)
      stale_.push_back(i);
    }
  dims_ = dims;
  plan_memory();
  valid_ = true;
}

// Every buffer a run computes that it does not return gets an offset in one arena, by liveness (first fit, in step
// order). Sizes are planned in size classes (1/8 of a power of two; a power of two for a buffer whose shape depends
// on the dims), so that a buffer growing by a row per decode step (attention scores) keeps the plan for many steps.
void Plan::plan_memory() {
  size_t ns = s_.steps.size();
  bool moved = !planned_;
  std::vector<size_t> sizes;
  std::vector<size_t> arena_nodes;
  for (size_t i = 0; i < ns; ++i) {
    const Step& st = s_.steps[i];
    size_t id = size_t(st.node);
    if (may_alias_[i] && !st.absorbed) {  // an identity copy under these dims takes its input's buffer
      Home h = identity_[i] ? Home::SameAs : Home::Arena;
      moved = moved || h != home_[id];
      home_[id] = h;
      same_as_[id] = identity_[i] ? g_.node(st.node).inputs[0].node : -1;
    }
    if (home_[id] != Home::Arena) continue;
    size_t cls = size_class(size_t(numel(st.node)) * dtype_size(s_.storage[id]));
    if (grows_[id]) cls = size_t(1) << (64 - __builtin_clzll(std::max<size_t>(cls, 2) - 1));
    sizes.push_back(cls);
    arena_nodes.push_back(i);
  }
  if (!moved && sizes == planned_sizes_) return;
  // A buffer lives until its last reader, or its aliases' (identity copies, latest first: they may chain).
  std::vector<int64_t> until = reads_last_;
  for (size_t i = ns; i-- > 0;)
    if (identity_[i]) {
      int64_t in = g_.node(s_.steps[i].node).inputs[0].node;
      until[size_t(in)] = std::max(until[size_t(in)], std::max(until[size_t(s_.steps[i].node)], int64_t(i)));
    }
  std::vector<int64_t> made, last;
  for (size_t i : arena_nodes) {
    const Step& st = s_.steps[i];
    made.push_back(st.group >= 0 ? int64_t(s_.groups[size_t(st.group)].first) : int64_t(i));
    last.push_back(std::max(until[size_t(st.node)], int64_t(i)));
  }
  std::vector<size_t> offsets;
  arena_bytes_ = plan_arena(sizes, made, last, offsets);
  for (size_t k = 0; k < arena_nodes.size(); ++k) offset_[size_t(s_.steps[arena_nodes[k]].node)] = offsets[k];
  planned_sizes_ = std::move(sizes);
  planned_ = true;
}

}  // namespace luminal
