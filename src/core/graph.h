// The graph: nodes of primitive ops whose input edges carry views of their producers' outputs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/expr.h"
#include "core/kernel_op.h"
#include "core/view.h"

namespace luminal {

enum class Op : uint8_t {
  // plumbing
  Input, Constant, Output,
  // the primitive ops
  Log2, Exp2, Sin, Sqrt, Recip,
  Add, Mul, Mod, LessThan,
  SumReduce, MaxReduce,
  Iota, Gather, Scatter, Cast,
  // a backend op a compiler put in place (see kernel_op.h)
  Custom,
};

const char* op_name(Op op);
Op op_named(const std::string& name);  // the inverse of op_name; std::invalid_argument for an unknown name
bool is_unary(Op op);
bool is_binary(Op op);

struct Edge {
  int64_t node;
  View view;  // how the consumer reads the producer's contiguous output
};

struct Node {
  Op op;
  DType dtype;
  Shape shape;               // output shape; outputs are stored contiguously
  std::vector<Edge> inputs;
  int axis = -1;             // SumReduce / MaxReduce
  double value = 0;          // Constant
  Expr expr;                 // Iota: the value at index `z`
  std::string name;          // Input's name
  std::shared_ptr<const KernelOp> kop;  // Custom: the backend op, with its attributes
  bool alive = true;
};

// The op's display name: a primop's, or the backend op's.
std::string op_label(const Node& n);

// The backend op of type T a node holds, or null.
template <class T>
const T* op_as(const Node& n) {
  return n.op == Op::Custom ? dynamic_cast<const T*>(n.kop.get()) : nullptr;
}

// A materialised tensor: contiguous elements of `dtype`.
struct Buffer {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::shared_ptr<void> data;
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  static Buffer alloc(DType dtype, std::vector<int64_t> shape);
};

// A kernel's input: its producer's buffer and the (evaluated) view through which to read it.
struct KernelArg {
  const Buffer* buf;
  ConcreteView view;
};

class Graph {
 public:
  // Builders; each checks shapes and dtypes and throws std::invalid_argument naming the op and shapes.
  int64_t input(const Shape& shape, DType dtype, const std::string& name);
  int64_t constant(double value, DType dtype);
  int64_t output(const Edge& x);
  int64_t unary(Op op, const Edge& x);
  int64_t binary(Op op, const Edge& a, const Edge& b);
  int64_t reduce(Op op, const Edge& x, int axis);
  int64_t iota(const Expr& expr, const Expr& n);
  int64_t gather(const Edge& table, const Edge& idx);
  int64_t scatter(const Edge& dest, const Edge& idx, const Edge& src);
  int64_t cast(const Edge& x, DType dtype);
  int64_t backend_op(std::shared_ptr<const KernelOp> op, const std::vector<Edge>& inputs, const Shape& shape,
                     DType dtype);
  int64_t add(Node n);  // generic: validates by op, appends, returns the new id

  const Node& node(int64_t id) const;
  Node& node_mut(int64_t id);
  size_t size() const { return nodes_.size(); }
  std::vector<int64_t> topo_order() const;  // alive nodes, producers first
  std::vector<int64_t> outputs() const;     // alive Output nodes
  // needed[id]: node id is an Output or one reaches an Output through it. `order` is topo_order().
  std::vector<char> needed(const std::vector<int64_t>& order) const;
  size_t alive_count() const;

  // Rewrites: consumers of `old_id` read `new_id` (same shape and dtype) instead, and ids users hold follow.
  void replace_uses(int64_t old_id, int64_t new_id);
  // The same for a replacement holding one value (numel 1): each consumer reads it broadcast to its view.
  void replace_uses_scalar(int64_t old_id, int64_t new_id);
  void remove(int64_t id);
  // Consumer `consumer`'s input k becomes `e` (a rewrite that moves an edge onto another node and view).
  void set_input(int64_t consumer, size_t k, const Edge& e);
  int64_t resolve(int64_t id) const;  // follows the remap of replaced nodes
  Edge resolve_edge(const Edge& e) const;  // the same for a read through a view (a one-value replacement broadcasts)
  std::vector<int64_t> users(int64_t id) const;  // alive consumers, each once
  void keep(int64_t id) { kept_.push_back(id); }  // survives dead-node removal
  std::vector<int64_t> kept() const;

  // Changes with every edit, so that executors know when their schedule is stale.
  uint64_t version() const { return version_; }

 private:
  void check_edge(const Edge& e, const char* op) const;
  void check_replacement(int64_t old_id, int64_t new_id, bool scalar) const;
  std::vector<Node> nodes_;
  std::vector<std::vector<int64_t>> users_;  // producer -> consumers (may hold stale entries; users() filters)
  std::vector<int64_t> kept_;
  std::unordered_map<int64_t, int64_t> remap_;
  std::unordered_map<int64_t, bool> remap_scalar_;  // replaced by a one-value node
  uint64_t version_ = 0;
};

// The edge reads its producer's output exactly as stored.
inline bool is_plain(const Graph& g, const Edge& e) {
  return e.view.is_contiguous() && e.view.shape == g.node(e.node).shape;
}

}  // namespace luminal
