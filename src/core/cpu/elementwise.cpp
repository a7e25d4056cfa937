// The CPU's "Fused" kernel: it interprets the register program (kernel_ir.h) that fusion.cpp put on the node, over
// chunks of rows, reading every input through its view, with each step rounded to its node's dtype: what the
// reference executor computes, in one pass over memory instead of one per primop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/lower/ops.h"

namespace luminal {
namespace {

constexpr int64_t kChunk = 1024;

// Registers are double, or float when every step of the program is float32 or bool: for + - * / sqrt fmod and
// comparisons a float operation gives exactly the double result rounded to float, and the transcendental ones go
// through double, so both choices compute what the reference executor computes.
template <class T>
void round_to_dtype(T* x, int64_t n, DType d) {
  switch (d) {
    case DType::F32: if (!std::is_same<T, float>::value) for (int64_t i = 0; i < n; ++i) x[i] = T(float(x[i])); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(float(x[i]))); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(float(x[i]))); break;
    case DType::Bool: for (int64_t i = 0; i < n; ++i) x[i] = x[i] != T(0) ? T(1) : T(0); break;
    default: for (int64_t i = 0; i < n; ++i) x[i] = T(round_to(d, double(x[i]))); break;
  }
}

// Loads whole rows [row0, row0 + m) of length L. An unpadded float32 view (the common case: a convolution's output
// and its per-channel batch-norm parameters) steps through its outer indices like an odometer instead of dividing
// per row, and copies one run when the rows are consecutive in memory; plan.cpp checked its bounds once.
template <class T>
void load_rows(const KernelArg& a, int64_t row0, int64_t m, int64_t L, T* out) {
  const ConcreteView& v = a.view;
  size_t r = v.shape.size();
  if (v.masked || r == 0 || a.buf->dtype != DType::F32 || m <= 1) {
    for (int64_t i = 0; i < m; ++i) load_row(a, row0 + i, 0, L, out + i * L, "Fused");
    return;
  }
  const float* f = static_cast<const float*>(a.buf->data.get());
  int64_t s = v.strides[r - 1];
  // Consecutive rows: every outer stride is the row-major one.
  bool flat = s == 1;
  for (int64_t d = int64_t(r) - 2, expect = L; flat && d >= 0; expect *= v.shape[size_t(d)], --d)
    flat = v.shape[size_t(d)] == 1 || v.strides[size_t(d)] == expect;
  if (flat) {
    std::copy(f + v.offset + row0 * L, f + v.offset + (row0 + m) * L, out);
    return;
  }
  int idx[8];
  if (r - 1 > 8) {
    for (int64_t i = 0; i < m; ++i) load_row(a, row0 + i, 0, L, out + i * L, "Fused");
    return;
  }
  int64_t base = v.offset, rest = row0;
  for (int d = int(r) - 2; d >= 0; --d) {
    idx[d] = int(rest % v.shape[size_t(d)]);
    rest /= v.shape[size_t(d)];
    base += idx[d] * v.strides[size_t(d)];
  }
  for (int64_t i = 0; i < m; ++i) {
    T* o = out + i * L;
    const float* p = f + base;
    if (s == 1) std::copy(p, p + L, o);
    else if (s == 0) std::fill(o, o + L, T(*p));
    else for (int64_t j = 0; j < L; ++j) o[j] = p[j * s];
    for (int d = int(r) - 2; d >= 0; --d) {  // the next row
      base += v.strides[size_t(d)];
      if (++idx[d] < v.shape[size_t(d)]) break;
      base -= idx[d] * v.strides[size_t(d)];
      idx[d] = 0;
    }
  }
}

// The float32 loops, compiled once more for AVX2 (picked by cpu_isa()): + * / sqrt and < are exact in any vector
// width, so both versions give the same bits. The bodies are inlined into one function per target.
#define LM_BODY __attribute__((always_inline)) inline
// The binary max (an Apply of MaxReduce): torch.maximum's NaN if either is NaN, and x on ties (-0.0 vs 0.0).
// x != x for isnan: the same test, but one the compiler vectorises.
template <class T>
LM_BODY T max_nan(T x, T y) { return (y != y || y > x) ? y : x; }
LM_BODY void apply_f32_body(Op op, const float* x, const float* y, float* o, int64_t n) {
  switch (op) {
    case Op::Sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(x[i]); break;
    case Op::Recip: for (int64_t i = 0; i < n; ++i) o[i] = 1.0f / x[i]; break;
    case Op::Add: for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i]; break;
    case Op::Mul: for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i]; break;
    case Op::LessThan: for (int64_t i = 0; i < n; ++i) o[i] = x[i] < y[i] ? 1.0f : 0.0f; break;
    case Op::MaxReduce: for (int64_t i = 0; i < n; ++i) o[i] = max_nan(x[i], y[i]); break;
    default: std::copy(x, x + n, o); break;
  }
}

// The sum of n floats in double, in eight interleaved sums (two vectors of four doubles).
LM_BODY double sum_f32_body(const float* x, int64_t n) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) a[k] += double(x[j + k]);
  double acc = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  for (; j < n; ++j) acc += double(x[j]);
  return acc;
}
#undef LM_BODY

void apply_f32_default(Op op, const float* x, const float* y, float* o, int64_t n) { apply_f32_body(op, x, y, o, n); }
double sum_f32_default(const float* x, int64_t n) { return sum_f32_body(x, n); }
#ifdef LUMINAL_X86
__attribute__((target("avx2"))) void apply_f32_avx2(Op op, const float* x, const float* y, float* o, int64_t n) {
  apply_f32_body(op, x, y, o, n);
}
__attribute__((target("avx2"))) double sum_f32_avx2(const float* x, int64_t n) { return sum_f32_body(x, n); }
#endif

void apply_f32(Op op, const float* x, const float* y, float* o, int64_t n) {
#ifdef LUMINAL_X86
  if (isa_at_least_avx2()) return apply_f32_avx2(op, x, y, o, n);
#endif
  apply_f32_default(op, x, y, o, n);
}

double sum_f32(const float* x, int64_t n) {
#ifdef LUMINAL_X86
  if (isa_at_least_avx2()) return sum_f32_avx2(x, n);
#endif
  return sum_f32_default(x, n);
}

template <class T>
void apply(Op op, const T* x, const T* y, T* o, int64_t n) {
  switch (op) {
    case Op::Log2: for (int64_t i = 0; i < n; ++i) o[i] = T(std::log2(double(x[i]))); break;
    case Op::Exp2:
      if constexpr (std::is_same<T, float>::value) simd::exp2_f32(x, o, n);  // softmax, SiLU: the hot one
      else for (int64_t i = 0; i < n; ++i) o[i] = T(std::exp2(double(x[i])));
      break;
    case Op::Sin: for (int64_t i = 0; i < n; ++i) o[i] = T(std::sin(double(x[i]))); break;
    case Op::Mod: for (int64_t i = 0; i < n; ++i) o[i] = std::fmod(x[i], y[i]); break;
    default:
      if constexpr (std::is_same<T, float>::value) {
        apply_f32(op, x, y, o, n);
        break;
      }
      switch (op) {
        case Op::Sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(x[i]); break;
        case Op::Recip: for (int64_t i = 0; i < n; ++i) o[i] = T(1) / x[i]; break;
        case Op::Add: for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i]; break;
        case Op::Mul: for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i]; break;
        case Op::LessThan: for (int64_t i = 0; i < n; ++i) o[i] = x[i] < y[i] ? T(1) : T(0); break;
        case Op::MaxReduce: for (int64_t i = 0; i < n; ++i) o[i] = max_nan(x[i], y[i]); break;
        default: std::copy(x, x + n, o); break;  // Cast: the rounding does the work
      }
  }
}

// Folds x into a running sum or max (NaN wins, as in the reference).
inline void accumulate(Op op, double& acc, double x) {
  if (op == Op::SumReduce) acc += x;
  else if (std::isnan(x) || x > acc) acc = x;
}

// The sum or max of a register's n values, in double. Float registers (whose programs are within a few ulp of the
// reference anyway) add in eight interleaved sums (sum_f32); double registers (bit-identical to
// the reference) add in order.
template <class T>
double reduce_row(Op op, const T* x, int64_t n) {
  if constexpr (std::is_same<T, float>::value)
    if (op == Op::SumReduce) return sum_f32(x, n);
  double acc = op == Op::MaxReduce ? -std::numeric_limits<double>::infinity() : 0.0;
  for (int64_t j = 0; j < n; ++j) accumulate(op, acc, double(x[j]));
  return acc;
}

// Immediates never change: their registers are filled once per call, not per chunk.
template <class T>
void fill_immediates(const Program& prog, T* regs) {
  for (size_t i = 0; i < prog.code.size(); ++i)
    if (prog.code[i].kind == Instr::Imm) std::fill(regs + i * kChunk, regs + (i + 1) * kChunk, T(prog.code[i].imm));
}

// A step's result rounded to its dtype (a comparison's 0 or 1 is already a bool).
template <class T>
void round_step(const Instr& in, T* x, int64_t n) {
  if (!(in.op == Op::LessThan && in.dtype == DType::Bool)) round_to_dtype(x, n, in.dtype);
}

// Runs the program over chunks of kChunk values: several whole rows, or one piece of a long row. A Reduce step needs
// its whole row first, so a long row takes one pass per Reduce step (evaluating only what that step needs), then
// one for the output: rows of any length run in a fixed amount of register memory.
template <class T>
void run_program(const Program& prog, const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  if (args.empty()) throw std::logic_error("Fused: a kernel without inputs");
  // The iteration space is the inputs' (view) shape: the output's, plus the reduced axis.
  const std::vector<int64_t>& space = args[0].view.shape;
  bool reduce = prog.reduce != Op::Input;
  int64_t L = space.empty() ? 1 : space.back();
  int64_t rows = reduce ? out.numel() : (L ? out.numel() / L : 0);
  size_t nreg = prog.code.size();
  void* o = out.data.get();
  if (L > 0 && L <= kChunk) {
    // Short rows: several whole rows per chunk, so each step's loop covers up to kChunk values, and a row's Reduce
    // steps see the whole row at once: one pass, in program order.
    int64_t per = kChunk / L;
    parallel_for(rows, L * int64_t(nreg), [&](int64_t r0, int64_t r1) {
      thread_local std::vector<T> regs;
      if (regs.size() < nreg * kChunk) regs.resize(nreg * kChunk);
      fill_immediates(prog, regs.data());
      for (int64_t g0 = r0; g0 < r1; g0 += per) {
        int64_t m = std::min(r1 - g0, per), n = m * L;
        for (size_t i = 0; i < nreg; ++i) {
          const Instr& in = prog.code[i];
          T* dst = regs.data() + i * kChunk;
          if (in.kind == Instr::Load) {
            load_rows(args[in.input], g0, m, L, dst);
          } else if (in.kind == Instr::Imm) {
            continue;
          } else if (in.kind == Instr::Reduce) {
            const T* x = regs.data() + in.a * kChunk;
            for (int64_t r = 0; r < m; ++r)
              std::fill(dst + r * L, dst + (r + 1) * L, T(round_to(in.dtype, reduce_row(in.op, x + r * L, L))));
          } else {
            apply<T>(in.op, regs.data() + in.a * kChunk, in.b >= 0 ? regs.data() + in.b * kChunk : nullptr, dst, n);
            round_step(in, dst, n);
          }
        }
        const T* res = regs.data() + (nreg - 1) * kChunk;
        if (reduce) {
          for (int64_t r = 0; r < m; ++r) {
            double acc = prog.reduce == Op::MaxReduce ? -std::numeric_limits<double>::infinity() : 0.0;
            for (int64_t j = 0; j < L; ++j) accumulate(prog.reduce, acc, double(res[r * L + j]));
            store_from_double(o, g0 + r, node.dtype, acc);
          }
        } else if (node.dtype == DType::F32 && std::is_same<T, float>::value) {
          std::copy(res, res + n, static_cast<float*>(o) + g0 * L);
        } else {
          for (int64_t j = 0; j < n; ++j) store_from_double(o, g0 * L + j, node.dtype, double(res[j]));
        }
      }
    });
    return;
  }
  // Long rows: chunks of one row, one pass per Reduce step.
  std::vector<size_t> targets;  // the Reduce steps in order, then the output
  for (size_t i = 0; i < nreg; ++i)
    if (prog.code[i].kind == Instr::Reduce) targets.push_back(i);
  targets.push_back(nreg - 1);
  std::vector<std::vector<char>> need;
  for (size_t t : targets) need.push_back(prog.needed_for(t));
  parallel_for(rows, std::max<int64_t>(L, 1) * int64_t(nreg * targets.size()), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<T> regs;  // reused across calls: decode runs hundreds of small programs per token
    thread_local std::vector<T> known;  // each Reduce step's value for the current row
    if (regs.size() < nreg * kChunk) regs.resize(nreg * kChunk);
    if (known.size() < nreg) known.resize(nreg);
    fill_immediates(prog, regs.data());
    for (int64_t row = r0; row < r1; ++row) {
      for (size_t ph = 0; ph < targets.size(); ++ph) {
        size_t target = targets[ph];
        bool last = ph + 1 == targets.size();
        const Instr& tin = prog.code[target];
        Op red = last ? prog.reduce : tin.op;
        double acc = red == Op::MaxReduce ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int64_t j0 = 0; j0 < L; j0 += kChunk) {
          int64_t j1 = std::min(L, j0 + kChunk), n = j1 - j0;
          for (size_t i = 0; i < nreg; ++i) {
            if (!need[ph][i]) continue;
            const Instr& in = prog.code[i];
            T* dst = regs.data() + i * kChunk;
            if (in.kind == Instr::Load) {
              load_row(args[in.input], row, j0, j1, dst, "Fused");
            } else if (in.kind == Instr::Imm) {
              continue;
            } else if (in.kind == Instr::Reduce) {
              if (i == target && !last) {  // this phase's goal: fold its operand over the row
                const T* x = regs.data() + in.a * kChunk;
                for (int64_t j = 0; j < n; ++j) accumulate(in.op, acc, double(x[j]));
              } else {
                std::fill(dst, dst + n, known[i]);
              }
            } else {
              apply<T>(in.op, regs.data() + in.a * kChunk, in.b >= 0 ? regs.data() + in.b * kChunk : nullptr, dst, n);
              round_step(in, dst, n);
            }
          }
          if (!last) continue;
          const T* res = regs.data() + (nreg - 1) * kChunk;
          if (!reduce) {
            if (node.dtype == DType::F32 && std::is_same<T, float>::value)
              std::copy(res, res + n, static_cast<float*>(o) + row * L + j0);
            else
              for (int64_t j = 0; j < n; ++j) store_from_double(o, row * L + j0 + j, node.dtype, double(res[j]));
          } else {
            for (int64_t j = 0; j < n; ++j) accumulate(prog.reduce, acc, double(res[j]));
          }
        }
        if (!last) known[target] = T(round_to(tin.dtype, acc));
        else if (reduce) store_from_double(o, row, node.dtype, acc);
      }
    }
  });
}

void fused_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  const Program& prog = op_as<FusedOp>(node)->prog;
  if (prog.float_registers) run_program<float>(prog, args, node, out);
  else run_program<double>(prog, args, node, out);
}

// A Maximum that no fusion absorbed (a graph compiled without ElementwiseFusion): the one-step program fusion would
// make of it.
void maximum_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  auto f32 = [](DType d) { return d == DType::F32 || d == DType::Bool; };
  Program prog;
  for (int k = 0; k < 2; ++k) {
    Instr ld{Instr::Load};
    ld.input = k;
    ld.dtype = args[size_t(k)].buf->dtype;
    prog.code.push_back(ld);
  }
  Instr mx{Instr::Apply, Op::MaxReduce};
  mx.a = 0;
  mx.b = 1;
  mx.dtype = node.dtype;
  prog.code.push_back(mx);
  if (f32(node.dtype) && f32(args[0].buf->dtype) && f32(args[1].buf->dtype)) run_program<float>(prog, args, node, out);
  else run_program<double>(prog, args, node, out);
}

}  // namespace

void eval_program_row(const Program& prog, const std::vector<KernelArg>& args, int64_t row, int64_t L, int given,
                      const float* given_row, float* out) {
  size_t nreg = prog.code.size();
  thread_local std::vector<float> regs;
  if (regs.size() < nreg * size_t(L)) regs.resize(nreg * size_t(L));
  for (size_t i = 0; i < nreg; ++i) {
    const Instr& in = prog.code[i];
    float* dst = regs.data() + i * L;
    if (in.kind == Instr::Load) {
      if (in.input == given) std::copy(given_row, given_row + L, dst);
      else load_row(args[in.input], row, 0, L, dst, "Fused");
    } else if (in.kind == Instr::Imm) {
      std::fill(dst, dst + L, float(in.imm));
    } else if (in.kind == Instr::Reduce) {
      std::fill(dst, dst + L, float(round_to(in.dtype, reduce_row(in.op, regs.data() + in.a * L, L))));
    } else {
      apply<float>(in.op, regs.data() + in.a * L, in.b >= 0 ? regs.data() + in.b * L : nullptr, dst, L);
      round_to_dtype(dst, L, in.dtype);
    }
  }
  std::copy(regs.data() + (nreg - 1) * L, regs.data() + nreg * L, out);
}

namespace {

struct Registrar {
  Registrar() {
    register_cpu_kernel(typeid(FusedOp), fused_kernel);
    register_cpu_kernel(typeid(MaximumOp), maximum_kernel);
  }
} registrar;

}  // namespace
}  // namespace luminal
