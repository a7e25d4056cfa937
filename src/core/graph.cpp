#include "core/graph.h"

#include <algorithm>
#include <stdexcept>

namespace luminal {

const char* op_name(Op op) {
  static const char* names[] = {"Input", "Constant", "Output", "Log2", "Exp2", "Sin", "Sqrt", "Recip", "Add", "Mul",
                                "Mod", "LessThan", "SumReduce", "MaxReduce", "Iota", "Gather", "Scatter", "Cast",
                                "Custom"};
  return names[int(op)];
}
Op op_named(const std::string& name) {
  for (int i = 0; i <= int(Op::Custom); ++i)
    if (name == op_name(Op(i))) return Op(i);
  throw std::invalid_argument("unknown op '" + name + "'");
}

bool is_unary(Op op) { return op >= Op::Log2 && op <= Op::Recip; }
bool is_binary(Op op) { return op >= Op::Add && op <= Op::LessThan; }

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Buffer Buffer::alloc(DType dtype, std::vector<int64_t> shape) {
  Buffer b;
  b.dtype = dtype;
  b.shape = std::move(shape);
  size_t bytes = std::max<size_t>(b.nbytes(), 1);
  b.data = std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); });
  return b;
}

namespace {
std::invalid_argument err(Op op, const std::string& msg) {
  return std::invalid_argument(std::string(op_name(op)) + ": " + msg);
}
}  // namespace

void Graph::check_edge(const Edge& e, const char* op) const {
  if (e.node < 0 || e.node >= int64_t(nodes_.size()) || !nodes_[e.node].alive)
    throw std::invalid_argument(std::string(op) + ": input node " + std::to_string(e.node) + " does not exist");
  if (nodes_[e.node].op == Op::Output)
    throw std::invalid_argument(std::string(op) + ": an Output node cannot feed another op");
}

int64_t Graph::add(Node n) {
  ++version_;
  const char* name = op_name(n.op);
  for (auto& e : n.inputs) check_edge(e, name);
  auto in_dtype = [&](size_t i) { return nodes_[n.inputs[i].node].dtype; };
  auto need_inputs = [&](size_t k) {
    if (n.inputs.size() != k)
      throw err(n.op, "expects " + std::to_string(k) + " inputs, got " + std::to_string(n.inputs.size()));
  };
  switch (n.op) {
    case Op::Input: case Op::Constant: need_inputs(0); break;
    case Op::Output: case Op::Cast:
      need_inputs(1);
      n.shape = n.inputs[0].view.shape;
      if (n.op == Op::Output) n.dtype = in_dtype(0);
      break;
    case Op::Log2: case Op::Exp2: case Op::Sin: case Op::Sqrt: case Op::Recip:
      need_inputs(1);
      n.dtype = in_dtype(0);
      if (!is_float(n.dtype)) throw err(n.op, std::string("needs a float input, got ") + dtype_name(n.dtype));
      n.shape = n.inputs[0].view.shape;
      break;
    case Op::Add: case Op::Mul: case Op::Mod: case Op::LessThan: {
      need_inputs(2);
      auto& sa = n.inputs[0].view.shape;
      auto& sb = n.inputs[1].view.shape;
      if (sa != sb) throw err(n.op, "shape mismatch " + shape_str(sa) + " vs " + shape_str(sb));
      if (in_dtype(0) != in_dtype(1))
        throw err(n.op, std::string("dtype mismatch ") + dtype_name(in_dtype(0)) + " vs " + dtype_name(in_dtype(1)));
      n.shape = sa;
      n.dtype = n.op == Op::LessThan ? DType::Bool : in_dtype(0);
      break;
    }
    case Op::SumReduce: case Op::MaxReduce: {
      need_inputs(1);
      auto s = n.inputs[0].view.shape;
      if (n.axis < 0 || n.axis >= int(s.size()))
        throw err(n.op, "axis " + std::to_string(n.axis) + " out of range for shape " + shape_str(s));
      s.erase(s.begin() + n.axis);
      n.shape = s;
      n.dtype = in_dtype(0);
      break;
    }
    case Op::Iota:
      need_inputs(0);
      if (n.shape.size() != 1) throw err(n.op, "is one-dimensional");
      n.dtype = DType::I32;
      break;
    case Op::Gather: {
      need_inputs(2);
      auto& t = n.inputs[0].view.shape;
      auto& i = n.inputs[1].view.shape;
      if (t.empty()) throw err(n.op, "the table needs at least one dim");
      if (in_dtype(1) != DType::I32) throw err(n.op, std::string("indices must be int32, got ") + dtype_name(in_dtype(1)));
      n.shape = i;
      n.shape.insert(n.shape.end(), t.begin() + 1, t.end());
      n.dtype = in_dtype(0);
      break;
    }
    case Op::Scatter: {
      need_inputs(3);
      auto& d = n.inputs[0].view.shape;
      auto& i = n.inputs[1].view.shape;
      auto& s = n.inputs[2].view.shape;
      if (d.empty()) throw err(n.op, "the destination needs at least one dim");
      if (in_dtype(1) != DType::I32) throw err(n.op, std::string("indices must be int32, got ") + dtype_name(in_dtype(1)));
      Shape want = i;
      want.insert(want.end(), d.begin() + 1, d.end());
      if (want != s) throw err(n.op, "source shape " + shape_str(s) + " does not match " + shape_str(want) +
                                         " (indices " + shape_str(i) + " + destination " + shape_str(d) + " rows)");
      if (in_dtype(0) != in_dtype(2))
        throw err(n.op, std::string("dtype mismatch ") + dtype_name(in_dtype(0)) + " vs " + dtype_name(in_dtype(2)));
      n.shape = d;
      n.dtype = in_dtype(0);
      break;
    }
    case Op::Custom:
      if (!n.kop) throw err(n.op, "needs a backend op");
      break;
  }
  n.alive = true;
  int64_t id = int64_t(nodes_.size());
  for (auto& e : n.inputs) users_[e.node].push_back(id);
  nodes_.push_back(std::move(n));
  users_.emplace_back();
  return id;
}

int64_t Graph::input(const Shape& shape, DType dtype, const std::string& name) {
  for (auto& d : shape)
    if (d.is_const() && d.as_const() < 0)
      throw std::invalid_argument("input '" + name + "': negative dimension in shape " + shape_str(shape));
  Node n{Op::Input, dtype, shape};
  n.name = name;
  return add(std::move(n));
}
int64_t Graph::constant(double value, DType dtype) {
  Node n{Op::Constant, dtype, {}};
  n.value = round_to(dtype, value);  // the value as the dtype holds it, so folding matches execution
  return add(std::move(n));
}
int64_t Graph::output(const Edge& x) { return add(Node{Op::Output, DType::F32, {}, {x}}); }
int64_t Graph::unary(Op op, const Edge& x) {
  if (!is_unary(op)) throw err(op, "is not a unary op");
  return add(Node{op, DType::F32, {}, {x}});
}
int64_t Graph::binary(Op op, const Edge& a, const Edge& b) {
  if (!is_binary(op)) throw err(op, "is not a binary op");
  return add(Node{op, DType::F32, {}, {a, b}});
}
int64_t Graph::reduce(Op op, const Edge& x, int axis) {
  if (op != Op::SumReduce && op != Op::MaxReduce) throw err(op, "is not a reduction");
  Node n{op, DType::F32, {}, {x}};
  n.axis = axis;
  return add(std::move(n));
}
int64_t Graph::iota(const Expr& expr, const Expr& len) {
  Node n{Op::Iota, DType::I32, {len}};
  n.expr = expr;
  return add(std::move(n));
}
int64_t Graph::gather(const Edge& table, const Edge& idx) { return add(Node{Op::Gather, DType::F32, {}, {table, idx}}); }
int64_t Graph::scatter(const Edge& dest, const Edge& idx, const Edge& src) {
  return add(Node{Op::Scatter, DType::F32, {}, {dest, idx, src}});
}
int64_t Graph::cast(const Edge& x, DType dtype) { return add(Node{Op::Cast, dtype, {}, {x}}); }
int64_t Graph::backend_op(std::shared_ptr<const KernelOp> op, const std::vector<Edge>& inputs, const Shape& shape,
                          DType dtype) {
  Node n{Op::Custom, dtype, shape, inputs};
  n.kop = std::move(op);
  return add(std::move(n));
}

std::string op_label(const Node& n) { return n.op == Op::Custom && n.kop ? n.kop->name() : op_name(n.op); }

const Node& Graph::node(int64_t id) const {
  if (id < 0 || id >= int64_t(nodes_.size())) throw std::out_of_range("no node with id " + std::to_string(id));
  return nodes_[id];
}
Node& Graph::node_mut(int64_t id) {
  ++version_;
  return const_cast<Node&>(node(id));
}

std::vector<int64_t> Graph::topo_order() const {
  // Ids grow with insertion, but rewrites may point an old node at a newer one: order by DFS.
  std::vector<int64_t> order;
  std::vector<uint8_t> state(nodes_.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<std::pair<int64_t, size_t>> stack;
  for (int64_t root = 0; root < int64_t(nodes_.size()); ++root) {
    if (!nodes_[root].alive || state[root]) continue;
    stack.push_back({root, 0});
    state[root] = 1;
    while (!stack.empty()) {
      auto& [id, k] = stack.back();
      if (k < nodes_[id].inputs.size()) {
        int64_t in = nodes_[id].inputs[k++].node;
        if (state[in] == 1) throw std::logic_error("graph has a cycle through node " + std::to_string(in));
        if (state[in] == 0) { state[in] = 1; stack.push_back({in, 0}); }
      } else {
        state[id] = 2;
        order.push_back(id);
        stack.pop_back();
      }
    }
  }
  return order;
}

std::vector<char> Graph::needed(const std::vector<int64_t>& order) const {
  std::vector<char> need(nodes_.size(), 0);
  for (auto id : outputs()) need[id] = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (need[*it])
      for (auto& e : nodes_[*it].inputs) need[e.node] = 1;
  return need;
}

std::vector<int64_t> Graph::outputs() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < int64_t(nodes_.size()); ++i)
    if (nodes_[i].alive && nodes_[i].op == Op::Output) out.push_back(i);
  return out;
}

size_t Graph::alive_count() const {
  size_t n = 0;
  for (auto& x : nodes_) n += x.alive;
  return n;
}

void Graph::check_replacement(int64_t old_id, int64_t new_id, bool scalar) const {
  const Node &a = node(old_id), &b = node(new_id);
  if (a.dtype != b.dtype || (scalar ? numel(b.shape) != Expr(1) : a.shape != b.shape))
    throw std::logic_error(std::string("a rewrite replaced ") + op_name(a.op) + " " + shape_str(a.shape) + " " +
                           dtype_name(a.dtype) + " with " + op_name(b.op) + " " + shape_str(b.shape) + " " +
                           dtype_name(b.dtype));
}

std::vector<int64_t> Graph::users(int64_t id) const {
  std::vector<int64_t> out;
  for (int64_t u : users_.at(id)) {
    if (!nodes_[u].alive || std::find(out.begin(), out.end(), u) != out.end()) continue;
    for (auto& e : nodes_[u].inputs)
      if (e.node == id) { out.push_back(u); break; }
  }
  return out;
}

void Graph::replace_uses(int64_t old_id, int64_t new_id) {
  ++version_;
  if (old_id == new_id) return;
  check_replacement(old_id, new_id, false);
  for (int64_t u : users(old_id)) {
    for (auto& e : nodes_[u].inputs)
      if (e.node == old_id) e.node = new_id;
    users_[new_id].push_back(u);
  }
  users_[old_id].clear();
  remap_[old_id] = new_id;
}

void Graph::replace_uses_scalar(int64_t old_id, int64_t new_id) {
  ++version_;
  check_replacement(old_id, new_id, true);
  for (int64_t u : users(old_id)) {
    for (auto& e : nodes_[u].inputs)
      if (e.node == old_id) {
        // Every element of a one-value buffer is at offset 0: keep the shape and mask, zero the strides.
        e.node = new_id;
        for (auto& s : e.view.strides) s = Expr(0);
        e.view.offset = Expr(0);
      }
    users_[new_id].push_back(u);
  }
  users_[old_id].clear();
  remap_[old_id] = new_id;
  remap_scalar_[old_id] = true;
}

Edge Graph::resolve_edge(const Edge& e) const {
  Edge out = e;
  for (auto it = remap_.find(out.node); it != remap_.end(); it = remap_.find(out.node)) {
    if (remap_scalar_.count(out.node)) {
      for (auto& s : out.view.strides) s = Expr(0);
      out.view.offset = Expr(0);
    }
    out.node = it->second;
  }
  return out;
}

std::vector<int64_t> Graph::kept() const {
  std::vector<int64_t> out;
  for (auto id : kept_) out.push_back(resolve(id));
  return out;
}

void Graph::set_input(int64_t consumer, size_t k, const Edge& e) {
  check_edge(e, op_name(node(consumer).op));
  Node& n = node_mut(consumer);
  if (k >= n.inputs.size()) throw std::out_of_range("set_input: no input " + std::to_string(k));
  n.inputs[k] = e;
  users_[e.node].push_back(consumer);
}

void Graph::remove(int64_t id) {
  // The id stays valid (users may hold it) but the node's edges and data go: a compiled LLM step graph leaves
  // thousands of dead nodes behind, and their views are most of the graph's memory.
  Node& n = node_mut(id);
  n.alive = false;
  std::vector<Edge>().swap(n.inputs);
  n.kop.reset();
  std::vector<int64_t>().swap(users_[id]);
}

int64_t Graph::resolve(int64_t id) const {
  for (auto it = remap_.find(id); it != remap_.end(); it = remap_.find(id)) id = it->second;
  return id;
}

}  // namespace luminal
