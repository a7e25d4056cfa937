#include "core/reference.h"

#include "core/primops.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>

namespace luminal {
namespace {

// One input: its producer's buffer read through a concrete view, with every read bounds-checked.
struct Reader {
  const void* base;
  DType dtype;
  int64_t size;
  const ConcreteView& v;
  explicit Reader(const KernelArg& a) : base(a.buf->data.get()), dtype(a.buf->dtype), size(a.buf->numel()), v(a.view) {}

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

}  // namespace

void run_primop(const Node& n, const std::vector<KernelArg>& ins, const Bindings& dims, Buffer& out) {
  auto reader = [&](size_t k) { return Reader(ins.at(k)); };
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
      int64_t t_numel = 1, row_size = 1;
      for (auto d : table.v.shape) t_numel *= d;
      for (size_t d = 1; d < table.v.shape.size(); ++d) row_size *= table.v.shape[d];
      if (table.dtype == n.dtype && table.v.is_plain(table.v.shape) && table.size >= t_numel) {
        // Rows of the same dtype read as stored (embeddings, routed experts, interpolation taps): copied bytewise.
        size_t bytes = size_t(row_size) * dtype_size(n.dtype);
        for_each_index(index.v.shape, [&](int64_t mi, const int64_t* m) {
          double r = index.at(m);
          if (!(r >= 0 && r < rows))
            throw std::out_of_range("Gather: index " + std::to_string(int64_t(r)) + " is out of range for " +
                                    std::to_string(rows) + " rows");
          std::memcpy(static_cast<char*>(o) + mi * bytes, static_cast<const char*>(table.base) + int64_t(r) * bytes,
                      bytes);
        });
        break;
      }
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
      // Rows of the same dtype read as stored are copied bytewise (the KV-cache update of every decode step).
      size_t es = dtype_size(n.dtype);
      bool dest_plain = dest.dtype == n.dtype && dest.v.is_plain(out.shape) && dest.size >= out.numel();
      if (o == dest.base && dest_plain) {
        // in place (see Executor): dest is already the output
      } else if (dest_plain) {
        std::memcpy(o, dest.base, out.nbytes());
      } else {
        for_each_index(out.shape, [&](int64_t i, const int64_t* idx) { store_from_double(o, i, n.dtype, dest.at(idx)); });
      }
      std::vector<int64_t> row_shape(out.shape.begin() + 1, out.shape.end());
      int64_t row_size = 1;
      for (auto d : row_shape) row_size *= d;
      int64_t src_numel = 1;
      for (auto d : src.v.shape) src_numel *= d;
      bool src_plain = src.dtype == n.dtype && src.v.is_plain(src.v.shape) && src.size >= src_numel;
      // Rows of the same dtype through an unpadded strided view (the V rows of a stacked q/k/v product): copied
      // element by element without the double round trip, every offset inside the buffer (checked once).
      bool src_strided = !src_plain && src.dtype == n.dtype && !src.v.masked && src_numel > 0 &&
                         src.v.reads_within(src.size);
      size_t ni = index.v.shape.size();
      std::vector<int64_t> s_idx(src.v.shape.size());
      for_each_index(index.v.shape, [&](int64_t mi, const int64_t* m) {
        double r = index.at(m);
        if (r < 0 || r >= out.shape[0])
          throw std::out_of_range("Scatter: index " + std::to_string(int64_t(r)) + " is out of range for " +
                                  std::to_string(out.shape[0]) + " rows");
        if (src_plain) {
          std::memcpy(static_cast<char*>(o) + int64_t(r) * row_size * es,
                      static_cast<const char*>(src.base) + mi * row_size * es, row_size * es);
          return;
        }
        for (size_t d = 0; d < ni; ++d) s_idx[d] = m[d];
        if (src_strided) {
          char* row = static_cast<char*>(o) + int64_t(r) * row_size * es;
          for_each_index(row_shape, [&](int64_t j, const int64_t* rest) {
            int64_t off = src.v.offset;
            for (size_t d = 0; d < ni; ++d) off += m[d] * src.v.strides[d];
            for (size_t d = 0; d < row_shape.size(); ++d) off += rest[d] * src.v.strides[ni + d];
            std::memcpy(row + j * es, static_cast<const char*>(src.base) + off * es, es);
          });
          return;
        }
        for_each_index(row_shape, [&](int64_t j, const int64_t* rest) {
          for (size_t d = 0; d < row_shape.size(); ++d) s_idx[ni + d] = rest[d];
          store_from_double(o, int64_t(r) * row_size + j, n.dtype, src.at(s_idx.data()));
        });
      });
      break;
    }
    case Op::Custom: case Op::Input: throw std::logic_error("run_primop: not a primitive op");
  }
}

Buffer materialize(const Buffer& src, const ConcreteView& view) {
  Buffer out = Buffer::alloc(src.dtype, view.shape);
  KernelArg a{&src, view};
  Reader r(a);
  for_each_index(out.shape, [&](int64_t i, const int64_t* idx) {
    store_from_double(out.data.get(), i, out.dtype, r.at(idx));
  });
  return out;
}

}  // namespace luminal
