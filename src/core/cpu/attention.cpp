// The CPU's Attention kernel (fusion.cpp decides where it goes): per output row, the scores row is computed into a
// buffer, the row program (scale, mask, softmax) runs over it, and the probabilities weight V's rows. The scores and
// probabilities are never written to memory.
#include <algorithm>
#include <memory>
#include <stdexcept>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/lower/ops.h"

namespace luminal {
namespace {

// Unmasked float32 views inside their buffers (checked once per run, not per element).
void check_operand(const KernelArg& a, const char* what) {
  const ConcreteView& v = a.view;
  if (a.buf->dtype != DType::F32 || v.masked) throw std::logic_error(std::string("Attention: bad ") + what);
  if (!v.reads_within(a.buf->numel()))
    throw std::out_of_range(std::string("Attention: the ") + what + " view reads outside its buffer");
}

// args: q, k (S's operands, views (.., T, D)), v (the output product's right operand, view (.., N, T)), then the
// program's inputs except the scores.
void attention_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  const AttentionPlan& plan = op_as<AttentionOp>(node)->plan;
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
  Registrar() { register_cpu_kernel(typeid(AttentionOp), attention_kernel); }
} registrar;

}  // namespace
}  // namespace luminal
