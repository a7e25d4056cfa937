// The CPU's Attention kernel (fusion.cpp decides where it goes). The scores and probabilities are never written to
// memory. Two paths:
//  * split KV (flash-decoding): when the row program is a softmax of an element-wise function X of the scores (scale,
//    additive mask), the keys are cut into chunks and each task (a group of query rows that read the same K and V,
//    e.g. the query heads of one KV head, times one chunk of keys) runs an online softmax over its chunk, block by
//    block: each K and V block is read from memory once for the whole group, and a decode step (a few rows against
//    a long cache) spreads over every thread; with few rows a task takes every group over its chunk, so that the
//    heads of a token-major cache are read together. The chunks' partial results are then combined per row.
//    Weights under 2^-64 of a row's largest are dropped (far below float resolution; see kTiny).
//  * per row: otherwise the scores row is computed into a buffer, the row program runs over it, and the
//    probabilities weight V's rows.
// For tests: LUMINAL_ATTENTION=rows forces the per-row path, =split demands the split path (an error where it does
// not apply), and LUMINAL_ATTENTION_CHUNK=n sets the chunk length.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <stdexcept>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/lower/ops.h"

namespace luminal {
namespace {

constexpr int64_t kBlock = 256;     // keys per block: the group's scores and the block's K and V rows stay in cache
constexpr int64_t kGroup = 8;       // query rows per task at most
constexpr int64_t kMinChunk = 256;  // keys per chunk at least, when a row's keys are split over tasks
constexpr int64_t kFewRows = 64;    // at most this many rows: every group in each task (see split_kv)
constexpr float kTiny = 64;         // softmax weights under 2^-kTiny of the row's largest are dropped (see split_kv)

// Unmasked views inside their buffers (checked once per run, not per element): float32, or for k and v (a 16-bit
// KV cache, see fuse_attention) bfloat16 or float16 too.
void check_operand(const KernelArg& a, const char* what, bool half_ok = false) {
  const ConcreteView& v = a.view;
  DType t = a.buf->dtype;
  bool ok = t == DType::F32 || (half_ok && (t == DType::BF16 || t == DType::F16));
  if (!ok || v.masked) throw std::logic_error(std::string("Attention: bad ") + what);
  if (!v.reads_within(a.buf->numel()))
    throw std::out_of_range(std::string("Attention: the ") + what + " view reads outside its buffer");
}

// ---- the softmax form --------------------------------------------------------------------------------------------
// out = exp2((X - max X) * c) / sum(...), X computed element by element from the scores and other inputs with adds
// and multiplies (what Tensor.softmax of scaled, masked scores lowers to).
struct SoftmaxForm {
  int x = -1;
  float c = 0;
  std::vector<int> pre;  // the registers X needs, in program order (X last)
};

bool is_apply(const Instr& in, Op op) { return in.kind == Instr::Apply && in.op == op && in.dtype == DType::F32; }

bool imm(const Program& p, int r, double& v) {
  if (r < 0 || p.code[r].kind != Instr::Imm) return false;
  v = p.code[r].imm;
  return true;
}

bool match_softmax(const Program& p, int scores, const std::vector<KernelArg>& pargs, SoftmaxForm& f) {
  const auto& code = p.code;
  int n = int(code.size());
  if (n < 2 || p.reduce != Op::Input) return false;
  const Instr& o = code[n - 1];
  if (!is_apply(o, Op::Mul)) return false;
  // out = E * recip(sum E), either order.
  int e = -1, z = -1;
  for (int pick = 0; pick < 2 && e < 0; ++pick) {
    int r = pick ? o.b : o.a, other = pick ? o.a : o.b;
    if (r < 0 || other < 0 || !is_apply(code[r], Op::Recip)) continue;
    const Instr& s = code[code[r].a];
    if (s.kind == Instr::Reduce && s.op == Op::SumReduce && s.a == other) e = other, z = code[r].a;
  }
  if (e < 0 || z < 0 || !is_apply(code[e], Op::Exp2)) return false;
  // E = exp2(D * c), D = X + M * -1, M = max X.
  const Instr& y = code[code[e].a];
  if (!is_apply(y, Op::Mul)) return false;
  double c = 0, minus = 0;
  int d = -1;
  if (imm(p, y.b, c)) d = y.a;
  else if (imm(p, y.a, c)) d = y.b;
  if (d < 0 || !(c > 0) || !is_apply(code[d], Op::Add)) return false;
  for (int pick = 0; pick < 2; ++pick) {
    int x = pick ? code[d].b : code[d].a, neg = pick ? code[d].a : code[d].b;
    if (x < 0 || neg < 0 || !is_apply(code[neg], Op::Mul)) continue;
    int mr = imm(p, code[neg].b, minus) ? code[neg].a : imm(p, code[neg].a, minus) ? code[neg].b : -1;
    if (mr < 0 || minus != -1 || code[mr].kind != Instr::Reduce || code[mr].op != Op::MaxReduce || code[mr].a != x)
      continue;
    f.x = x;
    break;
  }
  if (f.x < 0) return false;
  f.c = float(c);
  if (double(f.c) != c) return false;
  // X: loads (the scores, or float32 inputs), immediates, adds and multiplies; no reductions.
  std::vector<char> need = p.needed_for(size_t(f.x));
  for (int i = 0; i <= f.x; ++i) {
    if (!need[i]) continue;
    const Instr& in = code[i];
    bool ok = in.dtype == DType::F32;
    if (in.kind == Instr::Load) ok = ok && (in.input == scores || pargs.at(in.input).buf->dtype == DType::F32);
    else if (in.kind == Instr::Imm) ok = ok && double(float(in.imm)) == in.imm;
    else ok = ok && (is_apply(in, Op::Add) || is_apply(in, Op::Mul)) && in.b >= 0;
    if (!ok) return false;
    f.pre.push_back(i);
  }
  return true;
}

// X over keys [t0, t0 + n) of `row`, the scores given: a pointer to n values (into `regs` or `scores`).
const float* eval_x(const Program& p, const SoftmaxForm& f, int given, const std::vector<KernelArg>& pargs,
                    int64_t row, int64_t t0, int64_t n, const float* scores, std::vector<float>& regs,
                    std::vector<const float*>& ptr, std::vector<float>& scalar) {
  if (regs.size() < size_t(f.x + 1) * kBlock) regs.resize(size_t(f.x + 1) * kBlock);
  ptr.assign(f.x + 1, nullptr);  // null: the register is the scalar scalar[i]
  scalar.assign(f.x + 1, 0.0f);
  for (int i : f.pre) {
    const Instr& in = p.code[i];
    float* dst = regs.data() + size_t(i) * kBlock;
    if (in.kind == Instr::Load) {
      if (in.input == given) {
        ptr[i] = scores;
      } else {
        load_row(pargs[in.input], row, t0, t0 + n, dst, "Attention");
        ptr[i] = dst;
      }
    } else if (in.kind == Instr::Imm) {
      scalar[i] = float(in.imm);
    } else {
      const float *a = ptr[in.a], *b = ptr[in.b];
      bool add = in.op == Op::Add;
      if (!a && !b) {
        scalar[i] = add ? scalar[in.a] + scalar[in.b] : scalar[in.a] * scalar[in.b];
        continue;
      }
      if (!a) std::swap(a, b);  // a vector, b a vector or the scalar below
      float sb = b ? 0.0f : scalar[ptr[in.a] ? in.b : in.a];
      if (add) {
        if (b) for (int64_t j = 0; j < n; ++j) dst[j] = a[j] + b[j];
        else for (int64_t j = 0; j < n; ++j) dst[j] = a[j] + sb;
      } else {
        if (b) for (int64_t j = 0; j < n; ++j) dst[j] = a[j] * b[j];
        else for (int64_t j = 0; j < n; ++j) dst[j] = a[j] * sb;
      }
      ptr[i] = dst;
    }
  }
  if (!ptr[f.x]) {  // X does not depend on the scores (a constant row)
    float* dst = regs.data() + size_t(f.x) * kBlock;
    std::fill(dst, dst + n, scalar[f.x]);
    ptr[f.x] = dst;
  }
  return ptr[f.x];
}

// A 16-bit operand's rows as float32: n rows of `len` elements (unit stride), row i at element base + i * stride,
// into dst (n x len). The float32 kernels then read them as float32 rows (a group's rows share the copy).
void widen_rows(const KernelArg& a, int64_t base, int64_t stride, int64_t n, int64_t len, float* dst) {
  const uint16_t* src = static_cast<const uint16_t*>(a.buf->data.get());
  bool bf = a.buf->dtype == DType::BF16;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* r = src + base + i * stride;
    float* o = dst + i * len;
    if (bf) {
      for (int64_t j = 0; j < len; ++j) o[j] = bf16_to_f32(r[j]);
    } else {
      for (int64_t j = 0; j < len; ++j) o[j] = simd::half(reinterpret_cast<const uint8_t*>(r + j));
    }
  }
}

// A row's online softmax state over the keys seen so far: max m, sum l of exp2((x - m) c), acc = sum of those * V.
struct RowState {
  float m, l;
  float* acc;
};

void split_kv(const std::vector<KernelArg>& args, const std::vector<KernelArg>& pargs, const AttentionPlan& plan,
              const SoftmaxForm& f, Buffer& out, int64_t chunk_env) {
  const KernelArg &q = args.at(0), &k = args.at(1), &v = args.at(2);
  const ConcreteView &vq = q.view, &vk = k.view, &vv = v.view;
  size_t rq = vq.shape.size(), rv = vv.shape.size();
  const int64_t T = vq.shape[rq - 2], D = vq.shape[rq - 1], N = vv.shape[rv - 2];
  const int64_t rows = out.numel() / N;
  if (rows == 0) return;
  const int64_t skn = vk.strides[rq - 2], svt = vv.strides[rv - 1];
  const float *pq = static_cast<const float*>(q.buf->data.get()), *pk = static_cast<const float*>(k.buf->data.get()),
              *pv = static_cast<const float*>(v.buf->data.get());
  const bool k16 = k.buf->dtype != DType::F32, v16 = v.buf->dtype != DType::F32;  // (widened block by block)
  float* po = static_cast<float*>(out.data.get());
  // Groups: runs of consecutive rows reading the same K and V rows.
  std::vector<int64_t> start;  // group i: rows [start[i], start[i + 1])
  int64_t prev_k = -1, prev_v = -1;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ko = outer_offset(vk, r, 2), vo = outer_offset(vv, r, 2);
    if (r == 0 || ko != prev_k || vo != prev_v || r - start.back() == kGroup) start.push_back(r);
    prev_k = ko, prev_v = vo;
  }
  const int64_t groups = int64_t(start.size());
  start.push_back(rows);
  // With few rows against many keys (a decode step), a task takes every group over its chunk, block by block: a
  // block's keys and values of every KV head are then read together (token-major caches interleave the heads, and a
  // task per head would stride through memory). Against few keys the groups are the tasks, spread over the threads.
  const bool long_rows = chunk_env > 0 || T >= 2 * kMinChunk;
  const int64_t per_super = rows <= kFewRows && long_rows ? groups : 1, supers = (groups + per_super - 1) / per_super;
  // Chunks: enough tasks for every thread, in a count the pool's equal shares divide evenly.
  int64_t chunks = 1;
  const int64_t threads = num_threads(), share = 2 * threads;
  if (chunk_env > 0) {
    chunks = std::max<int64_t>(1, (T + chunk_env - 1) / chunk_env);
  } else if (threads > 1 && T >= 2 * kMinChunk && supers % share) {
    int64_t most = T / kMinChunk;
    chunks = std::min<int64_t>(most, (share + supers - 1) / supers);
    while (chunks < most && (supers * chunks) % share) ++chunks;
  }
  const int64_t tasks = supers * chunks;
  // Partial results of split rows: (m, l, acc[N]) per row and chunk.
  std::vector<float> part(chunks > 1 ? size_t(rows) * chunks * (N + 2) : 0);
  const float c = f.c, ninf = -std::numeric_limits<float>::infinity();
  int64_t task_rows = start[std::min(groups, per_super)] - start[0];
  int64_t per_task = std::max<int64_t>(1, T / chunks) * task_rows * (2 * D + N + int64_t(f.pre.size()));
  parallel_for(tasks, per_task, [&](int64_t t_begin, int64_t t_end) {
    thread_local std::vector<float> scores, regs, y, p, tmp, acc, scalar, kw, vw;
    thread_local std::vector<const float*> ptr;
    thread_local std::vector<RowState> st;
    scores.resize(kBlock);
    y.resize(kBlock);
    p.resize(kBlock);
    tmp.resize(N);
    if (k16) kw.resize(size_t(kBlock * D));
    if (v16) vw.resize(size_t(kBlock * N));
    for (int64_t task = t_begin; task < t_end; ++task) {
      int64_t si = task / chunks, ci = task % chunks;
      int64_t g0 = si * per_super, g1 = std::min(groups, g0 + per_super);
      int64_t r0 = start[g0], r1 = start[g1];
      int64_t k0 = T * ci / chunks, k1 = T * (ci + 1) / chunks;
      acc.resize(size_t(r1 - r0) * N);
      st.resize(size_t(r1 - r0));
      for (int64_t i = 0; i < r1 - r0; ++i) {
        st[i] = {ninf, 0.0f, acc.data() + i * N};
        std::fill(st[i].acc, st[i].acc + N, 0.0f);
      }
      for (int64_t b0 = k0; b0 < k1; b0 += kBlock) {
        int64_t n = std::min(kBlock, k1 - b0);
        for (int64_t gi = g0; gi < g1; ++gi) {
          int64_t ko = outer_offset(vk, start[gi], 2), vo = outer_offset(vv, start[gi], 2);
          // The block's rows of k and v: float32 in place, or 16-bit widened once for the group's rows.
          const float *kr = k16 ? kw.data() : pk + ko + b0 * skn, *vr = v16 ? vw.data() : pv + vo + b0 * svt;
          const int64_t ks = k16 ? D : skn, vs = v16 ? N : svt;
          if (k16) widen_rows(k, ko + b0 * skn, skn, n, D, kw.data());
          if (v16) widen_rows(v, vo + b0 * svt, svt, n, N, vw.data());
          for (int64_t r = start[gi]; r < start[gi + 1]; ++r) {
            // This row's scores against the block: the group's other rows find the block's keys in cache.
            simd::dot_rows_f32(pq + outer_offset(vq, r, 2), kr, ks, n, D, scores.data());
            const float* x = eval_x(plan.prog, f, plan.scores, pargs, r, b0, n, scores.data(), regs, ptr, scalar);
            float mx = ninf;
            for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
            if (mx == ninf) continue;  // every key of the block masked out
            RowState& s = st[r - r0];
            if (mx > s.m) {
              if (s.l > 0) {
                float e = (s.m - mx) * c, alpha = e <= -kTiny ? 0.0f : std::exp2(e);
                s.l *= alpha;
                for (int64_t j = 0; j < N; ++j) s.acc[j] *= alpha;
              }
              s.m = mx;
            }
            // Weights under 2^-kTiny of the largest one are taken as 0: far below a float's resolution of the sum
            // (at least 1), and kept they would make subnormal products with V (each one a slow microcode assist:
            // a peaked softmax over a long context has many) and send exp2 to its scalar path below 2^-126.
            for (int64_t j = 0; j < n; ++j) y[j] = std::max((x[j] - s.m) * c, -kTiny);
            simd::exp2_f32(y.data(), p.data(), n);
            for (int64_t j = 0; j < n; ++j) p[j] = y[j] <= -kTiny ? 0.0f : p[j];
            float sum = 0;
            for (int64_t j = 0; j < n; ++j) sum += p[j];
            s.l += sum;
            simd::weighted_rows_f32(p.data(), vr, vs, n, N, tmp.data());
            for (int64_t j = 0; j < N; ++j) s.acc[j] += tmp[j];
          }
        }
      }
      for (int64_t r = r0; r < r1; ++r) {
        const RowState& s = st[r - r0];
        if (chunks == 1) {
          float* o = po + r * N;
          // Every key masked: softmax's 0/0, as the reference computes it.
          float inv = s.l > 0 ? 1.0f / s.l : std::numeric_limits<float>::quiet_NaN();
          for (int64_t j = 0; j < N; ++j) o[j] = s.acc[j] * inv;
        } else {
          float* w = part.data() + (r * chunks + ci) * (N + 2);
          w[0] = s.m, w[1] = s.l;
          std::copy(s.acc, s.acc + N, w + 2);
        }
      }
    }
  });
  if (chunks == 1) return;
  parallel_for(rows, chunks * N, [&](int64_t ra, int64_t rb) {
    for (int64_t r = ra; r < rb; ++r) {
      const float* w = part.data() + r * chunks * (N + 2);
      float m = ninf, l = 0;
      for (int64_t ci = 0; ci < chunks; ++ci) m = std::max(m, w[ci * (N + 2)]);
      float* o = po + r * N;
      std::fill(o, o + N, 0.0f);
      if (m == ninf) {
        std::fill(o, o + N, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      for (int64_t ci = 0; ci < chunks; ++ci) {
        const float* wc = w + ci * (N + 2);
        float e = (wc[0] - m) * c;
        if (wc[1] == 0 || e <= -kTiny) continue;
        float a = std::exp2(e);
        l += a * wc[1];
        for (int64_t j = 0; j < N; ++j) o[j] += a * wc[2 + j];
      }
      float inv = 1.0f / l;
      for (int64_t j = 0; j < N; ++j) o[j] *= inv;
    }
  });
}

// ---- per row ---------------------------------------------------------------------------------------------------
void per_row(const std::vector<KernelArg>& args, const std::vector<KernelArg>& pargs, const AttentionPlan& plan,
             Buffer& out) {
  const KernelArg &q = args.at(0), &k = args.at(1), &v = args.at(2);
  const ConcreteView &vq = q.view, &vk = k.view, &vv = v.view;
  size_t rq = vq.shape.size(), rv = vv.shape.size();
  int64_t T = vq.shape[rq - 2], D = vq.shape[rq - 1], N = vv.shape[rv - 2];
  int64_t rows = N ? out.numel() / N : 0;
  const float *pq = static_cast<const float*>(q.buf->data.get()), *pk = static_cast<const float*>(k.buf->data.get()),
              *pv = static_cast<const float*>(v.buf->data.get());
  float* po = static_cast<float*>(out.data.get());
  int64_t sqn = vq.strides[rq - 2], sqd = vq.strides[rq - 1], skn = vk.strides[rq - 2], skd = vk.strides[rq - 1];
  int64_t svn = vv.strides[rv - 2], svt = vv.strides[rv - 1];
  const bool k16 = k.buf->dtype != DType::F32, v16 = v.buf->dtype != DType::F32;
  parallel_for(rows, T * (2 * D + N + int64_t(plan.prog.code.size())), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> s, p, kw, vw;
    // rows x cols of a 16-bit operand (element (i, j) at o + i * si + j * sj) as float32, row-major, into dst
    auto widen = [](const auto& x, int64_t o, int64_t rows, int64_t cols, int64_t si, int64_t sj, std::vector<float>& dst) {
      dst.resize(size_t(rows * cols));
      const void* src = x.buf->data.get();
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[size_t(i * cols + j)] = float(load_as_double(src, o + i * si + j * sj, x.buf->dtype));
    };
    s.resize(T);
    p.resize(T);
    for (int64_t r = r0; r < r1; ++r) {
      const float *qa = pq + outer_offset(vq, r, 2), *kb = pk + outer_offset(vk, r, 2);
      // A 16-bit k or v: this row's (T, D) keys and (N, T) values as float32, read through the same strides.
      int64_t sk_n = skn, sk_d = skd, sv_n = svn, sv_t = svt;
      if (k16) {
        widen(k, outer_offset(vk, r, 2), T, D, skn, skd, kw);
        kb = kw.data(), sk_n = D, sk_d = 1;
      }
      if (sqn == 0 && sqd == 1 && sk_d == 1) {  // one query row against every key (the query broadcast over keys)
        simd::dot_rows_f32(qa, kb, sk_n, T, D, s.data());
      } else {
        for (int64_t n = 0; n < T; ++n) {
          if (sqd == 1 && sk_d == 1) {
            s[n] = simd::dot_f32(qa + n * sqn, kb + n * sk_n, D);
            continue;
          }
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qa[n * sqn + d * sqd] * kb[n * sk_n + d * sk_d];
          s[n] = acc;
        }
      }
      eval_program_row(plan.prog, pargs, r, T, plan.scores, s.data(), p.data());
      const float* vb = pv + outer_offset(vv, r, 2);  // element (n, t) at vb[n * svn + t * svt]
      if (v16) {
        widen(v, outer_offset(vv, r, 2), T, N, svt, svn, vw);
        vb = vw.data(), sv_n = 1, sv_t = N;
      }
      float* o = po + r * N;
      if (sv_n == 1) {
        simd::weighted_rows_f32(p.data(), vb, sv_t, T, N, o);
      } else {
        for (int64_t n = 0; n < N; ++n) {
          float acc = 0;
          for (int64_t t = 0; t < T; ++t) acc += p[t] * vb[n * sv_n + t * sv_t];
          o[n] = acc;
        }
      }
    }
  });
}

// args: q, k (S's operands, views (.., T, D)), v (the output product's right operand, view (.., N, T)), then the
// program's inputs except the scores.
void attention_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  const AttentionPlan& plan = op_as<AttentionOp>(node)->plan;
  const KernelArg &q = args.at(0), &k = args.at(1), &v = args.at(2);
  check_operand(q, "query");
  check_operand(k, "key", true);
  check_operand(v, "value", true);
  std::vector<KernelArg> pargs;
  for (size_t i = 3; i < args.size(); ++i) {
    if (int(pargs.size()) == plan.scores) pargs.push_back(KernelArg{nullptr, {}});  // served from the row buffer
    pargs.push_back(args[i]);
  }
  if (int(pargs.size()) == plan.scores) pargs.push_back(KernelArg{nullptr, {}});
  const ConcreteView &vq = q.view, &vk = k.view, &vv = v.view;
  size_t rq = vq.shape.size(), rv = vv.shape.size();
  int64_t T = vq.shape[rq - 2], D = vq.shape[rq - 1], N = vv.shape[rv - 2];
  const char* mode = std::getenv("LUMINAL_ATTENTION");
  const char* chunk = std::getenv("LUMINAL_ATTENTION_CHUNK");
  SoftmaxForm form;
  bool split = !(mode && std::string(mode) == "rows") && T > 0 && D > 0 && N > 0 && vq.strides[rq - 2] == 0 &&
               vq.strides[rq - 1] == 1 && vk.strides[rq - 1] == 1 && vv.strides[rv - 2] == 1 &&
               match_softmax(plan.prog, plan.scores, pargs, form);
  if (split) return split_kv(args, pargs, plan, form, out, chunk ? std::atoll(chunk) : 0);
  if (mode && std::string(mode) == "split")
    throw std::logic_error("Attention: LUMINAL_ATTENTION=split, but this attention cannot take the split-KV path "
                           "(its row program is no softmax of scaled, masked scores, or a layout is not unit-stride)");
  per_row(args, pargs, plan, out);
}

struct Registrar {
  Registrar() { register_cpu_kernel(typeid(AttentionOp), attention_kernel); }
} registrar;

}  // namespace
}  // namespace luminal
