// Quantised-weight lowering (GGUF blocks, ops.h): a matmul over a dequantised weight becomes a QMatMul that
// unpacks weight rows on the fly (no float copy of the weights), gathers (embeddings) move in front of the
// dequantisation, and QMatMuls over the same activations stack into one.
#include <algorithm>
#include <optional>
#include <tuple>

#include "core/lower/lower.h"
#include "core/rewrite.h"

namespace luminal {

namespace {
const QuantFormatInfo kFormats[] = {{"Q8_0", 34}, {"Q4_0", 18}, {"Q4_1", 20}};  // by QuantFormat
}  // namespace

const QuantFormatInfo& format_info(QuantFormat f) { return kFormats[size_t(f)]; }

std::optional<QuantFormat> quant_format(const std::string& name) {
  for (size_t i = 0; i < std::size(kFormats); ++i)
    if (name == kFormats[i].name) return QuantFormat(i);
  return std::nullopt;
}

namespace {

Pattern dequant(const std::string& raw) {
  Pattern p = op(Op::Custom, {any(raw)}, "w");
  p.where = [](const Graph& g, int64_t id, const View&) { return op_as<DequantOp>(g.node(id)) != nullptr; };
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

size_t lower_quantized(Graph& g) {
  // MatMul(a, Dequant(raw)) where the weight is read as W[n, k] and the activations are plain float32 rows.
  Pattern mm = op(Op::Custom, {any("a"), any("w_edge")});
  mm.where = [](const Graph& gg, int64_t id, const View&) { return op_as<MatMulOp>(gg.node(id)) != nullptr; };
  Rule fuse{"MatMul(a, Dequant(raw)) -> QMatMul", mm, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              const Edge &a = m["a"], &we = m["w_edge"];
              const Node& wn = gg.node(we.node);
              const DequantOp* f = op_as<DequantOp>(wn);
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
              return gg.backend_op(std::make_shared<QMatMulOp>(f->format), {a, raw}, shape, DType::F32);
            }};
  // Gather(Dequant(raw), idx) -> Dequant(Gather(raw, idx)): unpack only the rows looked up.
  Pattern gather = op(Op::Gather, {dequant("raw"), any("idx")});
  Rule swap{"Gather(Dequant) -> Dequant(Gather)", gather, [](Graph& gg, const Match& m) -> std::optional<int64_t> {
              std::shared_ptr<const KernelOp> dequant = gg.node(m["w"].node).kop;
              int64_t rows = gg.gather(m["raw"], m["idx"]);
              Shape shape = gg.node(m.root).shape;
              return gg.backend_op(dequant, {Edge{rows, View::contiguous(gg.node(rows).shape)}}, shape, DType::F32);
            }};
  return apply_rules(g, {fuse, swap});
}

// QMatMuls of one format over the same activations (q/k/v, gate/up) -> one QMatMul over their stacked weights:
// the activations are quantised once and the threads split one range of rows instead of several. The consumers
// read their columns of the stacked output through rebased views.
size_t stack_qmatmuls(Graph& g) {
  struct Group {
    int64_t a;
    QuantFormat format;
    View key;  // the activations' view, its (broadcast) weight-row dim set to 1
    std::vector<int64_t> ids;
  };
  std::vector<Group> groups;
  std::vector<int64_t> kept = g.kept();
  for (int64_t id : g.topo_order()) {
    const Node& n = g.node(id);
    const QMatMulOp* q = op_as<QMatMulOp>(n);
    if (!q || n.inputs.size() != 2 || !n.shape.back().is_const() ||
        std::count(kept.begin(), kept.end(), id))
      continue;
    View key = n.inputs[0].view;
    key.shape[key.rank() - 2] = Expr(1);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.a == n.inputs[0].node && gr.format == q->format && gr.key == key;
    });
    if (it == groups.end()) groups.push_back(Group{n.inputs[0].node, q->format, key, {id}});
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
    int64_t stacked = g.backend_op(first.kop, inputs, shape, DType::F32);
    for (auto& [u, k, v] : edits) g.set_input(u, k, Edge{stacked, v});
    for (int64_t id : gr.ids) g.remove(id);
    count += 1;
  }
  return count;
}

}  // namespace luminal
