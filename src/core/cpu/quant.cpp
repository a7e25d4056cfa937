// GGUF block-quantised weights (Q8_0, Q4_0, Q4_1). The graph reads them through a `Dequant<type>` op on the raw
// rows (unpacking needs bit reinterpretation, which the primops lack). The CPU lowering fuses a matmul over a
// dequantised weight into one kernel that unpacks each weight row on the fly, so no float copy of the weights is
// ever made, and moves gathers (embeddings) in front of the dequantisation.
#include <algorithm>
#include <optional>
#include <tuple>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/kernel_ir.h"

namespace luminal {
namespace {

struct Format {
  const char* name;
  int block_bytes;
};
constexpr int kBlock = 32;
const Format kFormats[] = {{"Q8_0", 34}, {"Q4_0", 18}, {"Q4_1", 20}};

const Format* format_of(const std::string& op, const char* prefix) {
  size_t n = std::strlen(prefix);
  if (op.compare(0, n, prefix) != 0) return nullptr;
  for (auto& f : kFormats)
    if (op.substr(n) == f.name) return &f;
  return nullptr;
}


// Unpacks one row of `k` weights.
void dequant_row(const Format& f, const uint8_t* row, int64_t k, float* out) {
  simd::dequant_blocks(f.block_bytes, row, k / kBlock, out);
}

// Rows of raw bytes read through `v`: unmasked, bytes contiguous. Returns a pointer to row i.
const uint8_t* raw_row(const KernelArg& a, int64_t i) {
  int64_t off = outer_offset(a.view, i, 1), bytes = a.view.shape.back();
  if (off < 0 || off + bytes > a.buf->numel()) throw std::out_of_range("Dequant: a row lies outside its buffer");
  return static_cast<const uint8_t*>(a.buf->data.get()) + off;
}

void check_raw(const KernelArg& a, const Format& f, const char* op) {
  const ConcreteView& v = a.view;
  if (a.buf->dtype != DType::U8 || v.masked || v.shape.empty() || v.strides.back() != 1 ||
      v.shape.back() % f.block_bytes)
    throw std::invalid_argument(std::string(op) + ": expects uint8 rows of whole " + f.name + " blocks");
}

CustomKernel dequant_kernel(const Format& f) {
  return [&f](const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
    const KernelArg& a = args.at(0);
    check_raw(a, f, "Dequant");
    if (node.dtype != DType::F32) throw std::invalid_argument("Dequant produces float32");
    int64_t k = a.view.shape.back() / f.block_bytes * kBlock;
    int64_t rows = k ? out.numel() / k : 0;
    float* o = static_cast<float*>(out.data.get());
    parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) dequant_row(f, raw_row(a, r), k, o + r * k);
    });
  };
}

// The rows of one or more weights stacked (QMatMul over q/k/v at once): row n of the stack. Each weight's rows are
// read through a view of whole rows (W[n, :], broadcast over the other dims): a base pointer and a row stride,
// checked against the buffer once, so the hot loop does no index arithmetic per row.
struct StackedRows {
  std::vector<const uint8_t*> base;
  std::vector<int64_t> stride;
  std::vector<int64_t> start;  // first stacked row of each weight, and the total at the end
  StackedRows(const std::vector<KernelArg>& args, const Format& f) : start{0} {
    for (size_t i = 1; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      check_raw(a, f, "QMatMul");
      size_t r = a.view.shape.size();
      int64_t rows = r >= 2 ? a.view.shape[r - 2] : 1;
      base.push_back(raw_row(a, 0));
      stride.push_back(r >= 2 ? a.view.strides[r - 2] : 0);
      if (rows > 1) raw_row(a, rows - 1);  // the last row lies inside the buffer too
      start.push_back(start.back() + rows);
    }
  }
  // The weight holding stacked row n, and n's row within it.
  size_t which(int64_t n) const {
    size_t j = 0;
    while (j + 1 < base.size() && n >= start[j + 1]) ++j;
    return j;
  }
  const uint8_t* operator()(int64_t n) const {
    size_t j = which(n);
    return base[j] + (n - start[j]) * stride[j];
  }
};

// out[..., m, n] = sum_k a[..., m, n, k] * W[n, k] with W's rows unpacked once per row and reused for every m. W is
// the stack of the weight inputs' rows (one weight, or several that read the same activations).
CustomKernel qmatmul_kernel(const Format& f) {
  return [&f](const std::vector<KernelArg>& args, const Node&, Buffer& out) {
    const KernelArg& a = args.at(0);
    StackedRows w(args, f);
    const ConcreteView& va = a.view;
    size_t r = va.shape.size();
    int64_t K = va.shape[r - 1], N = va.shape[r - 2];
    if (N != w.start.back()) throw std::logic_error("QMatMul: the activations' view does not span the weight rows");
    int64_t rows = N ? out.numel() / N : 0;
    const float* pa = static_cast<const float*>(a.buf->data.get());
    float* o = static_cast<float*>(out.data.get());
    std::vector<int64_t> row_off(rows);
    for (int64_t row = 0; row < rows; ++row) {
      int64_t off = outer_offset(va, row, 2);
      row_off[row] = off;
      if (off < 0 || off + K > a.buf->numel()) throw std::out_of_range("QMatMul: activations outside their buffer");
    }
    int64_t nb = K / kBlock;
    if (rows <= 4) {
      // Few rows (decode): quantise the activations to int8 blocks once, then multiply straight from the packed
      // weight blocks in integer arithmetic (memory-bound: each weight byte is read once).
      std::vector<int8_t> q(rows * K);
      std::vector<float> d(rows * nb), s(rows * nb);
      for (int64_t row = 0; row < rows; ++row) {
        simd::quantize_q8(pa + row_off[row], nb, q.data() + row * K, d.data() + row * nb, s.data() + row * nb);
        if (simd::wants_pairs(f.block_bytes))
          simd::pair_activations(q.data() + row * K, d.data() + row * nb, s.data() + row * nb, nb);
      }
      parallel_for(N, rows * K, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1;) {
          size_t j = w.which(n);
          int64_t end = std::min(n1, w.start[j + 1]);  // this weight's rows in [n, n1)
          const uint8_t* wr = w(n);
          for (; n < end; ++n, wr += w.stride[j])
            for (int64_t row = 0; row < rows; ++row)
              o[row * N + n] = simd::dot_q8(f.block_bytes, wr, q.data() + row * K, d.data() + row * nb,
                                            s.data() + row * nb, nb);
        }
      });
      return;
    }
    // Many rows (prefill): unpack weight rows once, three at a time, and run them against 4 rows of activations
    // at a time (a 4 x 3 register tile; fewer rows at the end).
    parallel_for((N + 2) / 3, rows * K * 3, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(3 * K, 0.0f);  // a last group of fewer than 3 rows computes on zeros, discarded
      const float* wr[3] = {buf.data(), buf.data() + K, buf.data() + 2 * K};
      for (int64_t t = t0; t < t1; ++t) {
        int64_t n = 3 * t, cols = std::min<int64_t>(3, N - n);
        for (int64_t c = 0; c < cols; ++c) dequant_row(f, w(n + c), K, buf.data() + c * K);
        for (int64_t row = 0; row < rows; row += 4) {
          int rr = int(std::min<int64_t>(4, rows - row));
          const float* a4[4];
          for (int i = 0; i < rr; ++i) a4[i] = pa + row_off[row + i];
          float r12[12];
          simd::dot_rx3_f32(rr, a4, wr, K, r12);
          for (int i = 0; i < rr; ++i)
            for (int64_t c = 0; c < cols; ++c) o[(row + i) * N + n + c] = r12[3 * i + c];
        }
      }
    });
  };
}

struct Registrar {
  Registrar() {
    for (auto& f : kFormats) {
      register_builtin_kernel(std::string("Dequant") + f.name, dequant_kernel(f));
      register_builtin_kernel(std::string("QMatMul") + f.name, qmatmul_kernel(f));
    }
  }
} registrar;


Pattern dequant(const std::string& raw) {
  Pattern p = op(Op::Custom, {any(raw)}, "w");
  p.where = [](const Graph& g, int64_t id, const View&) { return format_of(g.node(id).name, "Dequant") != nullptr; };
  return p;
}

// A view of a contiguous (.., n) buffer, moved onto the same elements of a contiguous (.., total) buffer that
// holds those rows from column `col`: strides of whole rows scale by total / n, strides within a row stay, and the
// offset splits into rows and a column. Nothing when the view has other strides (or symbolic ones), or when its
// valid reads (the padding mask counts: rotate_half pads) reach across a row.
std::optional<View> rebase_rows(const View& v, int64_t n, int64_t total, int64_t col) {
  if (!v.offset.is_const()) return std::nullopt;
  int64_t off = v.offset.as_const(), lo_reach = 0, hi_reach = 0;  // the in-row dims' reach, without the offset
  View out = v;
  for (size_t d = 0; d < v.rank(); ++d) {
    if (v.shape[d] == Expr(1)) continue;  // its stride is never used
    if (!v.strides[d].is_const() || v.strides[d].as_const() < 0) return std::nullopt;
    int64_t st = v.strides[d].as_const();
    if (st % n == 0) {
      out.strides[d] = Expr(st / n * total);
      continue;
    }
    Expr lo = v.has_mask() ? v.mask[d].first : Expr(0), hi = v.has_mask() ? v.mask[d].second : v.shape[d];
    if (!lo.is_const() || !hi.is_const()) return std::nullopt;
    int64_t l = std::max<int64_t>(0, lo.as_const()), h = std::min(hi.as_const(), v.shape[d].is_const() ?
                                                                  v.shape[d].as_const() : hi.as_const());
    if (h <= l) continue;  // reads nothing
    lo_reach += l * st;
    hi_reach += (h - 1) * st;
  }
  int64_t base = off + lo_reach;
  int64_t r0 = base >= 0 ? base / n : -((-base + n - 1) / n);  // floor
  int64_t c0 = off - r0 * n;
  if (c0 + lo_reach < 0 || c0 + hi_reach >= n) return std::nullopt;
  out.offset = Expr(r0 * total + col + c0);
  return out;
}

}  // namespace

int quant_block_bytes(const std::string& name, const char* prefix) {
  const Format* f = format_of(name, prefix);
  return f ? f->block_bytes : 0;
}

size_t lower_quantized(Graph& g) {
  // MatMul(a, Dequant(raw)) where the weight is read as W[n, k] and the activations are plain float32 rows.
  Pattern mm = op(Op::Custom, {any("a"), any("w_edge")});
  mm.custom = "MatMul";
  Rule fuse{"MatMul(a, Dequant(raw)) -> QMatMul", mm, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              const Edge &a = m["a"], &we = m["w_edge"];
              const Node& wn = gg.node(we.node);
              const Format* f = wn.op == Op::Custom ? format_of(wn.name, "Dequant") : nullptr;
              if (!f || wn.shape.size() != 2 || gg.node(a.node).dtype != DType::F32) return std::nullopt;
              const View &va = a.view, &vw = we.view;
              size_t r = vw.rank();
              // Activations: rows of k read with stride 1, the same row for every n.
              if (r < 2 || va.has_mask() || vw.has_mask() || va.strides[r - 1] != Expr(1) ||
                  va.strides[r - 2] != Expr(0))
                return std::nullopt;
              // The weight view must be W[n, k] broadcast over everything else.
              if (vw.offset != Expr(0) || vw.strides[r - 1] != Expr(1) || vw.strides[r - 2] != wn.shape[1] ||
                  vw.shape[r - 2] != wn.shape[0] || vw.shape[r - 1] != wn.shape[1])
                return std::nullopt;
              for (size_t d = 0; d + 2 < r; ++d)
                if (vw.strides[d] != Expr(0)) return std::nullopt;
              const Node& root = gg.node(m.root);
              if (root.dtype != DType::F32) return std::nullopt;
              Edge raw = wn.inputs[0];
              Shape shape = root.shape;
              return gg.custom(std::string("QMatMul") + f->name, {a, raw}, shape, DType::F32);
            }};
  // Gather(Dequant(raw), idx) -> Dequant(Gather(raw, idx)): unpack only the rows looked up.
  Pattern gather = op(Op::Gather, {dequant("raw"), any("idx")});
  Rule swap{"Gather(Dequant) -> Dequant(Gather)", gather, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              const Node& w = gg.node(m["w"].node);
              std::string name = w.name;
              int64_t rows = gg.gather(m["raw"], m["idx"]);
              Shape shape = gg.node(m.root).shape;
              return gg.custom(name, {Edge{rows, View::contiguous(gg.node(rows).shape)}}, shape, DType::F32);
            }};
  return apply_rules(g, {fuse, swap});
}

// QMatMuls of one format over the same activations (q/k/v, gate/up) -> one QMatMul over their stacked weights:
// the activations are quantised once and the threads split one range of rows instead of several. The consumers
// read their columns of the stacked output through rebased views.
size_t stack_qmatmuls(Graph& g) {
  struct Group {
    int64_t a;
    std::string name;
    View key;  // the activations' view, its (broadcast) weight-row dim set to 1
    std::vector<int64_t> ids;
  };
  std::vector<Group> groups;
  std::vector<int64_t> kept = g.kept();
  for (int64_t id : g.topo_order()) {
    const Node& n = g.node(id);
    if (n.op != Op::Custom || !format_of(n.name, "QMatMul") || n.inputs.size() != 2 || !n.shape.back().is_const() ||
        std::count(kept.begin(), kept.end(), id))
      continue;
    View key = n.inputs[0].view;
    key.shape[key.rank() - 2] = Expr(1);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.a == n.inputs[0].node && gr.name == n.name && gr.key == key;
    });
    if (it == groups.end()) groups.push_back(Group{n.inputs[0].node, n.name, key, {id}});
    else it->ids.push_back(id);
  }
  size_t count = 0;
  for (auto& gr : groups) {
    if (gr.ids.size() < 2) continue;
    int64_t total = 0;
    for (int64_t id : gr.ids) total += g.node(id).shape.back().as_const();
    // Every consumer's view must move onto the stack, or nothing changes.
    std::vector<std::tuple<int64_t, size_t, View>> edits;
    bool ok = true;
    int64_t col = 0;
    for (int64_t member : gr.ids) {
      int64_t width = g.node(member).shape.back().as_const();
      for (int64_t u : g.users(member))
        for (size_t k = 0; k < g.node(u).inputs.size(); ++k) {
          const Edge& e = g.node(u).inputs[k];
          if (e.node != member) continue;
          auto v = rebase_rows(e.view, width, total, col);
          if (!v) ok = false;
          else edits.emplace_back(u, k, *v);
        }
      col += width;
    }
    if (!ok) continue;
    const Node& first = g.node(gr.ids[0]);
    Edge a = first.inputs[0];
    a.view.shape[a.view.rank() - 2] = Expr(total);
    std::vector<Edge> inputs{a};
    for (int64_t id : gr.ids) inputs.push_back(g.node(id).inputs[1]);
    Shape shape = first.shape;
    shape.back() = Expr(total);
    int64_t stacked = g.custom(first.name, inputs, shape, DType::F32);
    for (auto& [u, k, v] : edits) g.set_input(u, k, Edge{stacked, v});
    for (int64_t id : gr.ids) g.remove(id);
    count += 1;
  }
  return count;
}

}  // namespace luminal
