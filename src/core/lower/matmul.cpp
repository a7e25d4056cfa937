// Matmul lowering: SumReduce over the last axis of a Mul becomes one MatMul op (a dot product per output element,
// read straight through the operands' broadcast views); each backend picks its kernels for it. Sums over
// further trailing axes of a MatMul fold into it as one Contraction (a convolution: channels x kernel window).
#include "core/lower/lower.h"
#include "core/rewrite.h"

namespace luminal {

size_t lower_matmuls(Graph& g) {
  Pattern mul = op(Op::Mul, {any("a"), any("b")});
  mul.commutative = false;
  Pattern root = op(Op::SumReduce, {mul});
  root.where = [](const Graph& gg, int64_t id, const View&) {
    const Node& n = gg.node(id);
    return n.axis == int(n.inputs[0].view.shape.size()) - 1;
  };
  Rule rule{"SumReduce(Mul) -> MatMul", root, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              // A row times itself is a sum of squares (RMSNorm), not a product of matrices: it stays a reduction,
              // which fuses with its producers and consumers.
              if (m["a"].node == m["b"].node && m["a"].view == m["b"].view) return std::nullopt;
              const Node& n = gg.node(m.root);
              return gg.backend_op(std::make_shared<MatMulOp>(), {m["a"], m["b"]}, n.shape, n.dtype);
            }};
  return apply_rules(g, {rule});
}

size_t lower_contractions(Graph& g) {
  auto rule_over = [](const std::string& inner_name) {
    Pattern inner;
    inner.custom = inner_name;
    inner.name = "inner";
    inner.single_use = true;  // merged, it is computed once: nothing else may read its partial sums
    inner.inputs = {any("a"), any("b")};
    Pattern root = op(Op::SumReduce, {inner});
    root.where = [](const Graph& gg, int64_t id, const View&) {
      const Node& n = gg.node(id);
      return n.axis == int(n.inputs[0].view.shape.size()) - 1;
    };
    return Rule{"SumReduce(" + inner_name + ") -> Contraction", root,
                [](Graph& gg, const Match& m) -> std::optional<int64_t> {
                  const Node& in = gg.node(m["inner"].node);
                  const ContractionOp* c = op_as<ContractionOp>(in);
                  int axes = c ? c->axes + 1 : 2;
                  const Node& n = gg.node(m.root);
                  return gg.backend_op(std::make_shared<ContractionOp>(axes), {m["a"], m["b"]}, n.shape, n.dtype);
                }};
  };
  std::vector<Rule> rules = {rule_over("MatMul"), rule_over("Contraction")};
  size_t total = 0;
  for (size_t n; (n = apply_rules(g, rules)) > 0;) total += n;
  return total;
}

}  // namespace luminal
