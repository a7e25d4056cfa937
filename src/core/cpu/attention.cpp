// Attention as one kernel: MatMul(P, V) where P is a row program (scale, mask, softmax) over the rows of another
// MatMul S = Q K^T becomes "Attention": per output row, the scores row is computed into a buffer, the program runs
// over it, and the probabilities weight V's rows. The scores and probabilities are never written to memory, and a
// layer's attention is one kernel instead of three.
#include <algorithm>
#include <memory>
#include <stdexcept>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/kernel_ir.h"

namespace luminal {
namespace {

struct AttentionPlan {
  Program prog;  // P's program
  int scores;    // the input of `prog` that reads S's row
};

// Unmasked float32 views inside their buffers (checked once per run, not per element).
void check_operand(const KernelArg& a, const char* what) {
  const ConcreteView& v = a.view;
  if (a.buf->dtype != DType::F32 || v.masked) throw std::logic_error(std::string("Attention: bad ") + what);
  int64_t lo = v.offset, hi = v.offset;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] == 0) return;
    int64_t span = (v.shape[d] - 1) * v.strides[d];
    (span < 0 ? lo : hi) += span;
  }
  if (lo < 0 || hi >= a.buf->numel())
    throw std::out_of_range(std::string("Attention: the ") + what + " view reads outside its buffer");
}

// args: q, k (S's operands, views (.., T, D)), v (the output product's right operand, view (.., N, T)), then the
// program's inputs except the scores.
void attention_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  const AttentionPlan& plan = *static_cast<const AttentionPlan*>(node.payload.get());
  const KernelArg &q = args.at(0), &k = args.at(1), &v = args.at(2);
  check_operand(q, "query");
  check_operand(k, "key");
  check_operand(v, "value");
  const ConcreteView &vq = q.view, &vk = k.view, &vv = v.view;
  size_t rq = vq.shape.size(), rv = vv.shape.size();
  int64_t T = vq.shape[rq - 2], D = vq.shape[rq - 1], N = vv.shape[rv - 2];
  int64_t rows = N ? out.numel() / N : 0;
  std::vector<KernelArg> pargs;
  for (size_t i = 3; i < args.size(); ++i) {
    if (int(pargs.size()) == plan.scores) pargs.push_back(KernelArg{nullptr, {}});  // served from the row buffer
    pargs.push_back(args[i]);
  }
  if (int(pargs.size()) == plan.scores) pargs.push_back(KernelArg{nullptr, {}});
  const float *pq = static_cast<const float*>(q.buf->data.get()), *pk = static_cast<const float*>(k.buf->data.get()),
              *pv = static_cast<const float*>(v.buf->data.get());
  float* po = static_cast<float*>(out.data.get());
  int64_t sqn = vq.strides[rq - 2], sqd = vq.strides[rq - 1], skn = vk.strides[rq - 2], skd = vk.strides[rq - 1];
  int64_t svn = vv.strides[rv - 2], svt = vv.strides[rv - 1];
  parallel_for(rows, T * (2 * D + N + int64_t(plan.prog.code.size())), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> s, p;
    s.resize(T);
    p.resize(T);
    for (int64_t r = r0; r < r1; ++r) {
      const float *qa = pq + outer_offset(vq, r, 2), *kb = pk + outer_offset(vk, r, 2);
      if (sqn == 0 && sqd == 1 && skd == 1) {  // one query row against every key (the query broadcast over keys)
        simd::dot_rows_f32(qa, kb, skn, T, D, s.data());
      } else {
        for (int64_t n = 0; n < T; ++n) {
          if (sqd == 1 && skd == 1) {
            s[n] = simd::dot_f32(qa + n * sqn, kb + n * skn, D);
            continue;
          }
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qa[n * sqn + d * sqd] * kb[n * skn + d * skd];
          s[n] = acc;
        }
      }
      eval_program_row(plan.prog, pargs, r, T, plan.scores, s.data(), p.data());
      const float* vb = pv + outer_offset(vv, r, 2);  // element (n, t) at vb[n * svn + t * svt]
      float* o = po + r * N;
      if (svn == 1) {
        simd::weighted_rows_f32(p.data(), vb, svt, T, N, o);
      } else {
        for (int64_t n = 0; n < N; ++n) {
          float acc = 0;
          for (int64_t t = 0; t < T; ++t) acc += p[t] * vb[n * svn + t * svt];
          o[n] = acc;
        }
      }
    }
  });
}

struct Registrar {
  Registrar() { register_builtin_kernel("Attention", attention_kernel); }
} registrar;

bool is_matmul(const Node& n) { return n.op == Op::Custom && n.name == "MatMul" && n.dtype == DType::F32; }

bool only_user(const Graph& g, int64_t producer, int64_t consumer) {
  std::vector<int64_t> us = g.users(producer), kept = g.kept();
  return us.size() == 1 && us[0] == consumer && std::find(kept.begin(), kept.end(), producer) == kept.end();
}

bool f32_unmasked(const Graph& g, const Edge& e) { return g.node(e.node).dtype == DType::F32 && !e.view.has_mask(); }

}  // namespace

size_t fuse_attention(Graph& g) {
  size_t count = 0;
  for (int64_t id : g.topo_order()) {
    const Node& o = g.node(id);
    if (!o.alive || !is_matmul(o) || o.inputs.size() != 2) continue;
    // O = P @ V: its left operand reads row r of P for every output column (stride 0 across the columns).
    const Edge &pe = o.inputs[0], &ve = o.inputs[1];
    const Node& p = g.node(pe.node);
    const Program* prog = program_of(p);
    if (!prog || prog->reduce != Op::Input || !prog->float_registers || p.dtype != DType::F32 ||
        !only_user(g, pe.node, id) || !f32_unmasked(g, ve) || pe.view.has_mask())
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
    if (!f32_unmasked(g, s.inputs[0]) || !f32_unmasked(g, s.inputs[1])) continue;
    int64_t s_id = p.inputs[scores].node, p_id = pe.node;
    std::vector<Edge> inputs{s.inputs[0], s.inputs[1], ve};
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (int(i) != scores) inputs.push_back(p.inputs[i]);
    auto plan = std::make_shared<AttentionPlan>(AttentionPlan{*prog, scores});
    Shape shape = o.shape;
    int64_t a = g.custom("Attention", inputs, shape, DType::F32);
    g.node_mut(a).payload = plan;
    g.replace_uses(id, a);
    g.remove(id);
    g.remove(p_id);
    g.remove(s_id);
    ++count;
  }
  return count;
}

}  // namespace luminal
