// Binary max lowering: Tensor.maximum (and so relu, clamp, minimum) is recorded as stack([a, b]).amax(dim), a
// MaxReduce over an axis of length 2 of an Add of two pieces, each padded to one index of that axis. The reduction
// is not over the row, so it would run as its own pass over memory; as an element-wise Maximum of the two pieces it
// fuses into the kernel of its producers (a convolution's batch norm) and consumers.
#include "core/lower/lower.h"
#include "core/rewrite.h"

namespace luminal {
namespace {

bool is_const(const Expr& e, int64_t v) { return e.is_const() && e.as_const() == v; }

// The index of `axis` a stack piece is valid at (0 or 1), or -1 when it is not a piece of a length-2 stack.
int piece_index(const View& v, int axis) {
  if (!v.has_mask()) return -1;
  const auto& [lo, hi] = v.mask[size_t(axis)];
  if (is_const(lo, 0) && is_const(hi, 1)) return 0;
  if (is_const(lo, 1) && is_const(hi, 2)) return 1;
  return -1;
}

// The piece's view with the stacked axis removed: what the Add holds at that index (the other piece is padding
// there). A mask left covering every index is dropped, so a broadcast constant (relu's 0) stays an immediate.
View unstacked(const View& v, int axis, int index) {
  View w = v.slice(axis, Expr(index), Expr(index + 1)).squeeze(axis);
  bool full = true;
  for (size_t d = 0; d < w.mask.size(); ++d) full = full && is_const(w.mask[d].first, 0) && w.mask[d].second == w.shape[d];
  if (full) w.mask.clear();
  return w;
}

}  // namespace

size_t lower_maximum(Graph& g) {
  Pattern add = op(Op::Add, {any("x"), any("y")}, "stack");
  add.commutative = false;  // the masks say which piece comes first
  Pattern root = op(Op::MaxReduce, {add});
  root.where = [](const Graph& gg, int64_t id, const View&) {
    const Node& n = gg.node(id);
    const View& v = n.inputs[0].view;
    return n.axis >= 0 && size_t(n.axis) < v.rank() && is_const(v.shape[size_t(n.axis)], 2);
  };
  Rule rule{"MaxReduce(stack of two) -> Maximum", root, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              const Node& n = gg.node(m.root);
              int axis = n.axis;
              Edge x = m["x"], y = m["y"];
              int ix = piece_index(x.view, axis), iy = piece_index(y.view, axis);
              if (ix < 0 || iy < 0 || ix == iy) return std::nullopt;
              if (ix == 1) std::swap(x, y);  // x: index 0, the first operand (torch keeps it on ties: -0.0 vs 0.0)
              // Two constants: nothing to load, and GenericCompiler folds such graphs anyway.
              if (gg.node(x.node).op == Op::Constant && gg.node(y.node).op == Op::Constant) return std::nullopt;
              Edge a{x.node, unstacked(x.view, axis, 0)}, b{y.node, unstacked(y.view, axis, 1)};
              return gg.backend_op(std::make_shared<MaximumOp>(), {a, b}, n.shape, n.dtype);
            }};
  size_t count = apply_rules(g, {rule});
  if (count) remove_dead_nodes(g);  // the stacks' Adds: read by nobody now, but still users of the pieces to fusion
  return count;
}

}  // namespace luminal
