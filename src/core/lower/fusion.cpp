// Fusion passes: which primops run as one kernel. The decisions are shared by every backend; each backend runs or
// prints the kernels they make (the CPU in src/core/cpu, CUDA in src/cuda).
#include "core/lower/lower.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "core/rewrite.h"

namespace luminal {
namespace {

bool fusible(const Node& n) {
  if (is_unary(n.op) || is_binary(n.op) || n.op == Op::Cast || op_as<MaximumOp>(n)) return true;
  return (n.op == Op::SumReduce || n.op == Op::MaxReduce) && n.axis == int(n.inputs[0].view.shape.size()) - 1;
}

// Builds the program of one root node, inlining the fused producers of its group. Every register is an element of
// the root's iteration space S (the row is its last axis). A producer is inlined through an edge when
//  - the edge reads it element for element (plain, or a contiguous reshape keeping the row): its code runs as is;
//  - or (row reductions on) the edge broadcasts one value per row of S: a producer holding a value per row (say the
//    1/rms of RMSNorm) runs its code once per row; a producer that reduces over a row of S becomes a Reduce step.
// Its input views are moved into S. Emission is memoised per (node, view), so a value read twice is computed once.
class ProgramBuilder {
 public:
  ProgramBuilder(Graph& g, bool rows, int64_t root) : g_(g), rows_(rows), root_(root) {}

  // Grows the group until no producer can join: one whose users are all in the group (so it dies with the root).
  void plan() {
    for (;;) {
      build();
      bool grew = false;
      for (int64_t c : candidates_) {
        std::vector<int64_t> us = g_.users(c);
        if (std::all_of(us.begin(), us.end(), [&](int64_t u) { return u == root_ || group_.count(u); }))
          grew = group_.insert(c).second || grew;
      }
      if (!grew) return;
    }
  }

  // The root's program and the edges it loads.
  void build() {
    prog_ = std::make_shared<Program>();
    inputs_.clear();
    memo_.clear();
    candidates_.clear();
    const Node& x = g_.node(root_);
    if (x.op == Op::SumReduce || x.op == Op::MaxReduce) {
      emit(x.inputs[0]);
      prog_->reduce = x.op;
      return;
    }
    Instr in{Instr::Apply, op_as<MaximumOp>(x) ? Op::MaxReduce : x.op};  // MaxReduce applied: a binary max
    in.a = emit(x.inputs[0]);
    if (x.inputs.size() > 1) in.b = emit(x.inputs[1]);
    in.dtype = x.dtype;
    prog_->code.push_back(in);
  }

  // Removes the inlined producers nothing reads any more (the root was replaced), so that the users of the nodes
  // before them are exact for the roots that follow.
  void remove_absorbed() {
    std::vector<int64_t> kept = g_.kept();
    for (bool removed = true; removed;) {
      removed = false;
      for (int64_t id : group_)
        if (g_.node(id).alive && g_.users(id).empty() && std::find(kept.begin(), kept.end(), id) == kept.end()) {
          g_.remove(id);
          removed = true;
        }
    }
  }

  std::shared_ptr<Program> prog_;
  std::vector<Edge> inputs_;

 private:
  enum class Mode { Same, Rows };

  // How the view `e` (in the root's space) can run producer `p`'s code, with p's input views moved into that
  // space; nothing when it can only load p.
  std::optional<std::vector<View>> inline_views(const Edge& e) const {
    const Node& p = g_.node(e.node);
    const Program* q = program_of(p);
    if (!q || p.inputs.empty()) return std::nullopt;
    const View& v = e.view;
    const Shape& S = v.shape;
    const Shape& space = p.inputs[0].view.shape;  // p's iteration space
    bool p_reduces = q->reduce != Op::Input;
    std::optional<Mode> mode;
    if (!p_reduces && v.is_contiguous() && numel(S) == numel(p.shape) &&
        (!q->has_row_reductions() || (!S.empty() && !space.empty() && S.back() == space.back())))
      mode = Mode::Same;
    else if (rows_ && !S.empty() && !v.has_mask() && v.strides.back() == Expr(0)) {
      View per_row{Shape(S.begin(), S.end() - 1), Shape(v.strides.begin(), v.strides.end() - 1), v.offset, {}};
      bool aligned = per_row.is_contiguous() && numel(per_row.shape) == numel(p.shape);
      if (aligned && !p_reduces && !q->has_row_reductions()) mode = Mode::Rows;
      if (aligned && p_reduces && !space.empty() && space.back() == S.back()) mode = Mode::Rows;
    }
    if (!mode) return std::nullopt;
    bool per_row = *mode == Mode::Rows && !p_reduces;  // p's inputs hold one value per row: read them broadcast
    Shape shape = S;
    if (per_row) shape.back() = Expr(1);
    std::vector<View> views;
    for (const Edge& pe : p.inputs) {
      std::optional<View> w = pe.view.reshape(shape);
      if (!w) return std::nullopt;
      views.push_back(per_row ? w->expand(int(S.size()) - 1, S.back()) : *w);
    }
    return views;
  }

  int emit(const Edge& e) {
    for (auto& [seen, reg] : memo_)
      if (seen.node == e.node && seen.view == e.view) return reg;
    auto views = inline_views(e);
    int reg;
    if (views && group_.count(e.node)) {
      reg = inline_code(g_.node(e.node), *views);
    } else {
      if (views) candidates_.insert(e.node);
      reg = load(e);
    }
    memo_.emplace_back(e, reg);
    return reg;
  }

  int inline_code(const Node& p, const std::vector<View>& views) {
    const Program& q = *program_of(p);
    std::vector<int> reg(q.code.size());
    for (size_t i = 0; i < q.code.size(); ++i) {
      Instr in = q.code[i];
      if (in.kind == Instr::Load) {
        reg[i] = emit(Edge{p.inputs[in.input].node, views[in.input]});
        continue;
      }
      if (in.a >= 0) in.a = reg[in.a];
      if (in.b >= 0) in.b = reg[in.b];
      prog_->code.push_back(in);
      reg[i] = int(prog_->code.size()) - 1;
    }
    if (q.reduce != Op::Input) {  // p reduced each row of this space: a Reduce step
      Instr r{Instr::Reduce, q.reduce};
      r.a = reg.back();
      r.dtype = p.dtype;
      prog_->code.push_back(r);
    }
    return int(prog_->code.size()) - 1;
  }

  int load(const Edge& e) {
    const Node& p = g_.node(e.node);
    Instr in;
    if (p.op == Op::Constant && !e.view.has_mask()) {
      in.kind = Instr::Imm;
      in.imm = p.value;
    } else {
      in.kind = Instr::Load;
      in.input = int(inputs_.size());
      inputs_.push_back(e);
    }
    in.dtype = p.dtype;
    prog_->code.push_back(in);
    return int(prog_->code.size()) - 1;
  }

  Graph& g_;
  bool rows_;
  int64_t root_;
  std::set<int64_t> group_, candidates_;
  std::vector<std::pair<Edge, int>> memo_;
};

bool is_matmul(const Node& n) { return op_as<MatMulOp>(n) && n.dtype == DType::F32; }

bool only_user(const Graph& g, int64_t producer, int64_t consumer) {
  std::vector<int64_t> us = g.users(producer), kept = g.kept();
  return us.size() == 1 && us[0] == consumer && std::find(kept.begin(), kept.end(), producer) == kept.end();
}

bool f32_unmasked(const Graph& g, const Edge& e) { return g.node(e.node).dtype == DType::F32 && !e.view.has_mask(); }

bool is_16bit(DType t) { return t == DType::BF16 || t == DType::F16; }

// `outer` (no mask) reads a buffer of shape `x` as stored; `inner` reads x's elements from another buffer. The view
// reading that other buffer directly: each dim of `outer` steps one dim of x (its whole length) or none (a
// broadcast); nothing when it mixes dims (a reshape across them).
std::optional<View> compose(const View& outer, const Shape& x, const View& inner) {
  if (outer.has_mask() || inner.has_mask() || outer.offset != Expr(0) || inner.rank() != x.size()) return std::nullopt;
  View c = View::contiguous(x), r;
  r.shape = outer.shape;
  r.offset = inner.offset;
  std::vector<char> used(x.size(), 0);
  for (size_t k = 0; k < outer.rank(); ++k) {
    if (outer.strides[k] == Expr(0) || outer.shape[k] == Expr(1)) {
      r.strides.push_back(Expr(0));
      continue;
    }
    size_t j = 0;
    while (j < x.size() &&
           (used[j] || x[j] == Expr(1) || c.strides[j] != outer.strides[k] || x[j] != outer.shape[k]))
      ++j;
    if (j == x.size()) return std::nullopt;
    used[j] = 1;
    r.strides.push_back(inner.strides[j]);
  }
  return r;
}

// A K or V operand read through a float32 cast of 16-bit data (a 16-bit KV cache read back, see llama.py's
// _cache_rows), the cast only the product reads: the edge reading the 16-bit data directly, so the attention kernel
// loads it as stored and no float32 copy is made. `e` unchanged otherwise.
Edge through_cast(const Graph& g, const Edge& e, int64_t product) {
  const Node& c = g.node(e.node);
  if (c.dtype != DType::F32 || c.inputs.size() != 1 || !only_user(g, e.node, product)) return e;
  if (c.op != Op::Cast) {  // (fuse_elementwise leaves a cast as a program: load, cast)
    const Program* q = program_of(c);
    if (!q || q->reduce != Op::Input || q->code.size() != 2 || q->code[0].kind != Instr::Load ||
        q->code[1].kind != Instr::Apply || q->code[1].op != Op::Cast || q->code[1].a != 0 ||
        q->code[1].dtype != DType::F32)
      return e;
  }
  const Edge& src = c.inputs[0];
  if (!is_16bit(g.node(src.node).dtype)) return e;
  std::optional<View> v = compose(e.view, c.shape, src.view);
  return v ? Edge{src.node, *v} : e;
}

}  // namespace

size_t fuse_elementwise(Graph& g, bool row_reductions) {
  size_t count = 0;
  for (int64_t id : g.topo_order()) {
    if (!g.node(id).alive || !fusible(g.node(id))) continue;
    ProgramBuilder b(g, row_reductions, id);
    b.plan();
    if (b.inputs_.empty()) continue;  // constants only: GenericCompiler folds those
    Program& prog = *b.prog_;
    prog.float_registers = true;
    for (auto& in : prog.code) {
      bool f = in.dtype == DType::F32 || in.dtype == DType::Bool;
      if (in.kind == Instr::Load) {
        DType t = g.node(b.inputs_[in.input].node).dtype;
        f = t == DType::F32 || t == DType::Bool;
      }
      if (in.kind == Instr::Imm) f = f && double(float(in.imm)) == in.imm;
      prog.float_registers = prog.float_registers && f;
    }
    const Node& x = g.node(id);
    Shape shape = x.shape;
    int64_t f = g.backend_op(std::make_shared<FusedOp>(std::move(prog)), b.inputs_, shape, x.dtype);
    g.replace_uses(id, f);
    g.remove(id);
    b.remove_absorbed();
    ++count;
  }
  if (count) remove_dead_nodes(g);
  return count;
}


size_t fuse_attention(Graph& g) {
  size_t count = 0;
  for (int64_t id : g.topo_order()) {
    const Node& o = g.node(id);
    if (!o.alive || !is_matmul(o) || o.inputs.size() != 2) continue;
    // O = P @ V: its left operand reads row r of P for every output column (stride 0 across the columns).
    const Edge &pe = o.inputs[0], &ve = o.inputs[1];
    const Node& p = g.node(pe.node);
    const Program* prog = program_of(p);
    // Only a row program that needs the whole row (softmax) is worth the fusion: an element-wise one (an MLP's
    // activation between two products) runs faster as two GEMMs, which this kernel's per-row products are not.
    Edge ve16 = through_cast(g, ve, id);
    if (!prog || prog->reduce != Op::Input || !prog->has_row_reductions() || !prog->float_registers ||
        p.dtype != DType::F32 || !only_user(g, pe.node, id) || pe.view.has_mask() ||
        (!f32_unmasked(g, ve) && ve16.node == ve.node))
      continue;
    size_t r = pe.view.rank();
    if (r < 2 || pe.view.strides[r - 2] != Expr(0)) continue;
    View per_row = pe.view;
    per_row.shape.erase(per_row.shape.begin() + (r - 2));
    per_row.strides.erase(per_row.strides.begin() + (r - 2));
    if (!per_row.is_contiguous() || numel(per_row.shape) != numel(p.shape) || p.shape.empty() ||
        per_row.shape.back() != p.shape.back())
      continue;
    // P reads exactly one MatMul S element for element, rows of the same length.
    int scores = -1;
    bool ok = true;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const Node& s = g.node(p.inputs[i].node);
      if (!is_matmul(s)) continue;
      if (scores >= 0 || !only_user(g, p.inputs[i].node, pe.node) || !p.inputs[i].view.is_contiguous() ||
          numel(s.shape) != numel(p.shape) || s.shape.empty() || s.shape.back() != p.shape.back())
        ok = false;
      scores = int(i);
    }
    if (!ok || scores < 0) continue;
    const Node& s = g.node(p.inputs[scores].node);
    int64_t s_id = p.inputs[scores].node, p_id = pe.node;
    Edge ke16 = through_cast(g, s.inputs[1], s_id);
    if (!f32_unmasked(g, s.inputs[0]) || (!f32_unmasked(g, s.inputs[1]) && ke16.node == s.inputs[1].node)) continue;
    // The casts the kernel now reads through die with the products.
    std::vector<int64_t> casts;
    if (ke16.node != s.inputs[1].node) casts.push_back(s.inputs[1].node);
    if (ve16.node != ve.node) casts.push_back(ve.node);
    std::vector<Edge> inputs{s.inputs[0], ke16, ve16};
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (int(i) != scores) inputs.push_back(p.inputs[i]);
    auto op = std::make_shared<AttentionOp>(AttentionPlan{*prog, scores});
    Shape shape = o.shape;
    int64_t a = g.backend_op(op, inputs, shape, DType::F32);
    g.replace_uses(id, a);
    g.remove(id);
    g.remove(p_id);
    g.remove(s_id);
    for (int64_t c : casts) g.remove(c);
    ++count;
  }
  return count;
}

}  // namespace luminal
