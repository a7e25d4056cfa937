// Linear layers' inputs stored in the compute dtype. A 16-bit product rounds its activations to 16 bits anyway
// (cuBLASLt and the tensor-core kernels take 16-bit operands): a float32 activation would be written at twice the
// bytes, then copied to 16 bits before each product. Rounded where it is computed, it is written once, half the
// size, and read in place (as torch's bf16 models do: every activation is a bf16 tensor).
#include <algorithm>

#include "core/lower/lower.h"
#include "core/rewrite.h"

namespace luminal {
namespace {

// A program that only moves one input (a load, then casts): attention's heads put back in order, say. For one
// token that copy is the identity and launches nothing, where a rounding would be a kernel of its own.
bool is_copy(const Program& p) {
  int loads = 0;
  for (const Instr& in : p.code) {
    if (in.kind == Instr::Load) ++loads;
    else if (in.kind != Instr::Apply || in.op != Op::Cast) return false;
  }
  return loads == 1;
}

// Node id's readers read `low` (the same op, inputs and shape in another dtype) instead, edge by edge
// (replace_uses keeps the dtype).
void retype(Graph& g, int64_t id, int64_t low) {
  for (int64_t u : g.users(id))
    for (size_t k = 0; k < g.node(u).inputs.size(); ++k)
      if (g.node(u).inputs[k].node == id) g.set_input(u, k, Edge{low, g.node(u).inputs[k].view});
}

}  // namespace

size_t store_matmul_inputs(Graph& g, DType compute) {
  if (compute != DType::BF16 && compute != DType::F16) return 0;
  std::vector<int64_t> order = g.topo_order();
  std::vector<char> written(g.size(), 0);  // a Scatter's destination: a cache, not a weight
  for (int64_t id : order)
    if (g.node(id).op == Op::Scatter) written[size_t(g.node(id).inputs[0].node)] = 1;
  // A Linear layer reading x: a MatMul whose other operand is a float32 weight (an Input nothing writes).
  auto linear_of = [&](int64_t user, int64_t x) {
    const Node& m = g.node(user);
    if (!op_as<MatMulOp>(m) || m.inputs.size() != 2 || m.inputs[0].node == m.inputs[1].node) return false;
    const Edge& w = m.inputs[m.inputs[0].node == x ? 1 : 0];
    const Node& wn = g.node(w.node);
    return wn.op == Op::Input && wn.dtype == DType::F32 && !written[size_t(w.node)];
  };
  size_t count = 0;
  for (int64_t id : order) {
    const Node& n = g.node(id);
    const Program* prog = program_of(n);
    if (!n.alive || !prog || n.dtype != DType::F32 || prog->reduce != Op::Input || is_copy(*prog)) continue;
    std::vector<int64_t> users = g.users(id);
    if (users.empty() || !std::all_of(users.begin(), users.end(), [&](int64_t u) { return linear_of(u, id); }))
      continue;
    retype(g, id, g.backend_op(n.kop, n.inputs, n.shape, compute));
    ++count;
  }
  if (count) remove_dead_nodes(g);  // (the float32 programs replaced: no longer readers of their products)
  // Then a Linear layer whose products only such 16-bit programs read (gate and up under SwiGLU, k and v on their
  // way to a 16-bit cache) stores them in 16 bits too: one rounding more, as torch's bf16 layers do, for half the
  // bytes written and read. Products read into float32 (q before attention, a residual add) stay as they are.
  for (int64_t id : g.topo_order()) {
    const Node& n = g.node(id);
    if (!op_as<MatMulOp>(n) || n.dtype != DType::F32 || n.inputs.size() != 2) continue;
    if (!linear_of(id, n.inputs[0].node) && !linear_of(id, n.inputs[1].node)) continue;
    std::vector<int64_t> users = g.users(id);
    if (users.empty() || !std::all_of(users.begin(), users.end(), [&](int64_t u) {
          const Node& un = g.node(u);
          return program_of(un) && un.dtype == compute;
        }))
      continue;
    retype(g, id, g.backend_op(n.kop, n.inputs, n.shape, compute));
    ++count;
  }
  if (count) remove_dead_nodes(g);
  return count;
}

}  // namespace luminal
