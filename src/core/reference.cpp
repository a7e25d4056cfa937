#include "core/reference.h"

#include "core/primops.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <stdexcept>

namespace luminal {
namespace {

// One input edge, bound to its producer's buffer and concrete view.
struct Reader {
  const void* base;
  DType dtype;
  int64_t size;
  ConcreteView v;
  Reader(const Buffer& b, const View& view, const Bindings& dims) : Reader(b, ConcreteView(view, dims)) {}
  Reader(const Buffer& b, ConcreteView view) : base(b.data.get()), dtype(b.dtype), size(b.numel()), v(std::move(view)) {}

  double at(const int64_t* idx) const {
    int64_t off = v.offset;
    for (size_t d = 0; d < v.shape.size(); ++d) {
      if (v.masked && (idx[d] < v.lo[d] || idx[d] >= v.hi[d])) return 0.0;
      off += idx[d] * v.strides[d];
    }
    if (off < 0 || off >= size)
      throw std::out_of_range("a view reads element " + std::to_string(off) + " of a buffer of " +
                              std::to_string(size) + " elements");
    return load_as_double(base, off, dtype);
  }
};

// Advances a row-major multi-index; false once it wraps around.
bool next_index(std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

std::vector<int64_t> eval_shape(const Shape& s, const Bindings& dims) {
  std::vector<int64_t> out;
  for (auto& e : s) {
    int64_t v = e.eval(dims);
    if (v < 0) throw std::invalid_argument("dimension " + e.str() + " evaluates to a negative size " + std::to_string(v));
    out.push_back(v);
  }
  return out;
}

// Calls f(out_flat_index, multi_index) for every element of `shape`.
template <class F>
void for_each_index(const std::vector<int64_t>& shape, F&& f) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t i = 0;
  do { f(i++, idx.data()); } while (next_index(idx, shape));
}

Buffer run_custom(const Graph& g, const Node& n, const Bindings& dims, const BufferMap& bufs) {
  const CustomKernel* k = g.kernel(n.name);
  if (!k) throw std::runtime_error("custom op '" + n.name + "' has no CPU kernel registered");
  std::vector<KernelArg> ins;
  for (auto& e : n.inputs) ins.push_back(KernelArg{&bufs.at(e.node), ConcreteView(e.view, dims)});
  Buffer r = (*k)(ins, n);
  if (r.dtype != n.dtype || r.shape != eval_shape(n.shape, dims))
    throw std::runtime_error("custom op '" + n.name + "' returned a " + dtype_name(r.dtype) +
                             " result of the wrong shape or dtype (expected " + dtype_name(n.dtype) + ")");
  return r;
}

Buffer run_node(const Graph& g, const Node& n, const Bindings& dims, const BufferMap& bufs) {
  auto reader = [&](size_t k) { return Reader(bufs.at(n.inputs[k].node), n.inputs[k].view, dims); };
  // An output that reads its producer as stored shares the producer's buffer.
  if (n.op == Op::Output && is_plain(g, n.inputs[0])) return bufs.at(n.inputs[0].node);
  if (n.op == Op::Custom) return run_custom(g, n, dims, bufs);  // the kernel allocates its own result
  Buffer out = Buffer::alloc(n.dtype, eval_shape(n.shape, dims));
  void* o = out.data.get();
  switch (n.op) {
    case Op::Constant: store_from_double(o, 0, n.dtype, n.value); break;
    case Op::Output:
    case Op::Cast:
    case Op::Log2: case Op::Exp2: case Op::Sin: case Op::Sqrt: case Op::Recip: {
      Reader a = reader(0);
      for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
        store_from_double(o, i, n.dtype, eval_unary(n.op, a.at(idx)));
      });
      break;
    }
    case Op::Add: case Op::Mul: case Op::Mod: case Op::LessThan: {
      Reader a = reader(0), b = reader(1);
      for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
        store_from_double(o, i, n.dtype, eval_binary(n.op, a.at(idx), b.at(idx)));
      });
      break;
    }
    case Op::SumReduce: case Op::MaxReduce: {
      Reader a = reader(0);
      int64_t len = a.v.shape[n.axis];
      std::vector<int64_t> in_idx(a.v.shape.size());
      for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
        for (int d = 0, k = 0; d < int(in_idx.size()); ++d) in_idx[d] = d == n.axis ? 0 : idx[k++];
        double acc = n.op == Op::SumReduce ? 0.0 : -std::numeric_limits<double>::infinity();
        for (int64_t r = 0; r < len; ++r) {
          in_idx[n.axis] = r;
          double x = a.at(in_idx.data());
          acc = n.op == Op::SumReduce ? acc + x : (std::isnan(x) || x > acc ? x : acc);
        }
        store_from_double(o, i, n.dtype, acc);
      });
      break;
    }
    case Op::Iota: {
      Bindings b = dims;
      for (int64_t i = 0; i < out.shape[0]; ++i) {
        b["z"] = i;
        store_from_double(o, i, n.dtype, double(n.expr.eval(b)));
      }
      break;
    }
    case Op::Gather: {
      Reader table = reader(0), index = reader(1);
      size_t ni = index.v.shape.size();
      int64_t rows = table.v.shape[0];
      std::vector<int64_t> t_idx(table.v.shape.size());
      for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
        double r = index.at(idx);
        if (r < 0 || r >= rows)
          throw std::out_of_range("Gather: index " + std::to_string(int64_t(r)) + " is out of range for " +
                                  std::to_string(rows) + " rows");
        t_idx[0] = int64_t(r);
        for (size_t d = 1; d < t_idx.size(); ++d) t_idx[d] = idx[ni + d - 1];
        store_from_double(o, i, n.dtype, table.at(t_idx.data()));
      });
      break;
    }
    case Op::Scatter: {
      Reader dest = reader(0), index = reader(1), src = reader(2);
      for_each_index(out.shape, [&](int64_t i, const int64_t* idx) { store_from_double(o, i, n.dtype, dest.at(idx)); });
      std::vector<int64_t> row_shape(out.shape.begin() + 1, out.shape.end());
      int64_t row_size = 1;
      for (auto d : row_shape) row_size *= d;
      size_t ni = index.v.shape.size();
      std::vector<int64_t> s_idx(src.v.shape.size());
      for_each_index(index.v.shape, [&](int64_t, const int64_t* m) {
        double r = index.at(m);
        if (r < 0 || r >= out.shape[0])
          throw std::out_of_range("Scatter: index " + std::to_string(int64_t(r)) + " is out of range for " +
                                  std::to_string(out.shape[0]) + " rows");
        for (size_t d = 0; d < ni; ++d) s_idx[d] = m[d];
        for_each_index(row_shape, [&](int64_t j, const int64_t* rest) {
          for (size_t d = 0; d < row_shape.size(); ++d) s_idx[ni + d] = rest[d];
          store_from_double(o, int64_t(r) * row_size + j, n.dtype, src.at(s_idx.data()));
        });
      });
      break;
    }
    case Op::Custom: case Op::Input: break;  // handled above / by the caller
  }
  return out;
}

}  // namespace

Buffer materialize(const Buffer& src, const ConcreteView& view) {
  Reader a(src, view);
  Buffer out = Buffer::alloc(src.dtype, a.v.shape);
  for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
    store_from_double(out.data.get(), i, out.dtype, a.at(idx));
  });
  return out;
}

BufferMap run_reference(const Graph& g, const Bindings& dims, const BufferMap& inputs) {
  // Run only what the outputs need, and free each intermediate after its last reader.
  std::vector<int64_t> order = g.topo_order();
  std::vector<char> needed(g.size(), 0);
  for (auto id : g.outputs()) needed[id] = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (needed[*it])
      for (auto& e : g.node(*it).inputs) needed[e.node] = 1;
  std::vector<int64_t> last_use(g.size(), -1);
  for (size_t p = 0; p < order.size(); ++p)
    if (needed[order[p]])
      for (auto& e : g.node(order[p]).inputs) last_use[e.node] = int64_t(p);

  BufferMap bufs, results;
  // LUMINAL_PROFILE=1 prints the time spent per op kind.
  static const bool profile = std::getenv("LUMINAL_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, int>> prof;
  for (size_t p = 0; p < order.size(); ++p) {
    int64_t id = order[p];
    if (!needed[id]) continue;
    const Node& n = g.node(id);
    if (n.op == Op::Input) {
      auto it = inputs.find(id);
      if (it == inputs.end())
        throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(id) + ") has no data: call set() on it");
      auto want = eval_shape(n.shape, dims);
      if (it->second.shape != want || it->second.dtype != n.dtype)
        throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
      bufs[id] = it->second;
    } else {
      auto t0 = std::chrono::steady_clock::now();
      bufs[id] = run_node(g, n, dims, bufs);
      if (profile) {
        auto& e = prof[n.op == Op::Custom ? n.name : op_name(n.op)];
        e.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        e.second += 1;
      }
    }
    if (n.op == Op::Output) results[id] = bufs[id];
    for (auto& e : n.inputs)
      if (last_use[e.node] == int64_t(p)) bufs.erase(e.node);
  }
  if (profile)
    for (auto& [k, v] : prof) std::fprintf(stderr, "%-12s %5d nodes %9.3f ms\n", k.c_str(), v.second, v.first * 1e3);
  return results;
}

}  // namespace luminal
