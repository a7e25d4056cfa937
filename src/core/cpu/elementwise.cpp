// Fused elementwise kernels: chains of unary/binary/cast primops (optionally ending in a sum or max over the last
// axis) become one "Fused" node carrying a small register program. The kernel runs it row by row over chunks of
// the last axis, reading every input through its view, in double precision with each step rounded to its node's
// dtype: exactly what the reference executor computes, one pass over memory instead of one per primop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/kernel_ir.h"

namespace luminal {
namespace {

constexpr int64_t kChunk = 256;

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

// Loads elements [j0, j1) of row `row` of an input (padding reads as zero).
template <class T>
void load_row(const KernelArg& a, int64_t row, int64_t j0, int64_t j1, T* out) {
  const ConcreteView& v = a.view;
  size_t r = v.shape.size();
  int64_t n = j1 - j0;
  int64_t base = v.offset, rest = row;
  bool valid = true;
  for (int d = int(r) - 2; d >= 0; --d) {
    int64_t i = rest % v.shape[d];
    rest /= v.shape[d];
    base += i * v.strides[d];
    if (v.masked && (i < v.lo[d] || i >= v.hi[d])) valid = false;
  }
  int64_t lo = j0, hi = j1, s = r ? v.strides[r - 1] : 0;
  if (v.masked && r) { lo = std::max(j0, v.lo[r - 1]); hi = std::min(j1, v.hi[r - 1]); }
  if (!valid || lo >= hi) { std::fill(out, out + n, T(0)); return; }
  std::fill(out, out + (lo - j0), T(0));
  std::fill(out + (hi - j0), out + n, T(0));
  int64_t first = base + lo * s, last = base + (hi - 1) * s;
  if (std::min(first, last) < 0 || std::max(first, last) >= a.buf->numel())
    throw std::out_of_range("Fused: a view reads outside its buffer");
  const void* p = a.buf->data.get();
  T* o = out + (lo - j0);
  if (a.buf->dtype == DType::F32) {
    const float* f = static_cast<const float*>(p) + first;
    if (s == 1) for (int64_t j = 0; j < hi - lo; ++j) o[j] = f[j];
    else for (int64_t j = 0; j < hi - lo; ++j) o[j] = f[j * s];
  } else {
    for (int64_t j = 0; j < hi - lo; ++j) o[j] = T(load_as_double(p, first + j * s, a.buf->dtype));
  }
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
    case Op::Sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(x[i]); break;
    case Op::Recip: for (int64_t i = 0; i < n; ++i) o[i] = T(1) / x[i]; break;
    case Op::Add: for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i]; break;
    case Op::Mul: for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i]; break;
    case Op::Mod: for (int64_t i = 0; i < n; ++i) o[i] = std::fmod(x[i], y[i]); break;
    case Op::LessThan: for (int64_t i = 0; i < n; ++i) o[i] = x[i] < y[i] ? T(1) : T(0); break;
    default: std::copy(x, x + n, o); break;  // Cast: the rounding does the work
  }
}

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
  parallel_for(rows, std::max<int64_t>(L, 1) * int64_t(nreg), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<T> regs;  // reused across calls: decode runs hundreds of small programs per token
    if (regs.size() < nreg * kChunk) regs.resize(nreg * kChunk);
    for (int64_t row = r0; row < r1; ++row) {
      double acc = prog.reduce == Op::MaxReduce ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t j0 = 0; j0 < L; j0 += kChunk) {
        int64_t j1 = std::min(L, j0 + kChunk), n = j1 - j0;
        for (size_t i = 0; i < nreg; ++i) {
          const Instr& in = prog.code[i];
          T* dst = regs.data() + i * kChunk;
          if (in.kind == Instr::Load) {
            load_row(args[in.input], row, j0, j1, dst);
            continue;
          }
          if (in.kind == Instr::Imm) { std::fill(dst, dst + n, T(in.imm)); continue; }
          apply<T>(in.op, regs.data() + in.a * kChunk, in.b >= 0 ? regs.data() + in.b * kChunk : nullptr, dst, n);
          round_to_dtype(dst, n, in.dtype);
        }
        const T* res = regs.data() + (nreg - 1) * kChunk;
        if (!reduce) {
          if (node.dtype == DType::F32 && std::is_same<T, float>::value)
            std::copy(res, res + n, static_cast<float*>(o) + row * L + j0);
          else
            for (int64_t j = 0; j < n; ++j) store_from_double(o, row * L + j0 + j, node.dtype, double(res[j]));
        } else if (prog.reduce == Op::SumReduce) {
          for (int64_t j = 0; j < n; ++j) acc += double(res[j]);
        } else {
          for (int64_t j = 0; j < n; ++j) acc = (std::isnan(double(res[j])) || res[j] > acc) ? double(res[j]) : acc;
        }
      }
      if (reduce) store_from_double(o, row, node.dtype, acc);
    }
  });
}

void fused_kernel(const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
  const Program& prog = *std::static_pointer_cast<const Program>(node.payload);
  if (prog.float_registers) run_program<float>(prog, args, node, out);
  else run_program<double>(prog, args, node, out);
}

struct Registrar {
  Registrar() { register_builtin_kernel("Fused", fused_kernel); }
} registrar;

bool fusible(const Node& n) {
  if (is_unary(n.op) || is_binary(n.op) || n.op == Op::Cast) return true;
  return (n.op == Op::SumReduce || n.op == Op::MaxReduce) && n.axis == int(n.inputs[0].view.shape.size()) - 1;
}


}  // namespace

size_t fuse_elementwise(Graph& g) {
  size_t count = 0;
  for (int64_t id : g.topo_order()) {
    Node x = g.node(id);  // a copy: adding nodes may move the node table
    if (!x.alive || !fusible(x)) continue;
    auto prog = std::make_shared<Program>();
    std::vector<Edge> inputs;
    // Emits the code computing edge e; returns its register.
    std::function<int(const Edge&)> emit = [&](const Edge& e) -> int {
      const Node& p = g.node(e.node);
      const Program* inner = program_of(p);
      if (inner && inner->reduce == Op::Input && is_plain(g, e) && g.users(e.node).size() == 1) {
        // Inline the producer's program, renumbering its registers and inputs.
        int base = int(prog->code.size());
        std::vector<int> in_map;
        for (auto& pe : p.inputs) {
          in_map.push_back(int(inputs.size()));
          inputs.push_back(pe);
        }
        for (Instr in : inner->code) {
          if (in.a >= 0) in.a += base;
          if (in.b >= 0) in.b += base;
          if (in.kind == Instr::Load) in.input = in_map[in.input];
          prog->code.push_back(in);
        }
        return int(prog->code.size()) - 1;
      }
      Instr in;
      if (p.op == Op::Constant && !e.view.has_mask()) {
        in.kind = Instr::Imm;
        in.imm = p.value;
      } else {
        in.kind = Instr::Load;
        in.input = int(inputs.size());
        inputs.push_back(e);
      }
      in.dtype = p.dtype;
      prog->code.push_back(in);
      return int(prog->code.size()) - 1;
    };
    if (x.op == Op::SumReduce || x.op == Op::MaxReduce) {
      emit(x.inputs[0]);
      prog->reduce = x.op;
    } else {
      Instr in{Instr::Apply, x.op};
      in.a = emit(x.inputs[0]);
      if (x.inputs.size() > 1) in.b = emit(x.inputs[1]);
      in.dtype = x.dtype;
      prog->code.push_back(in);
    }
    if (inputs.empty()) continue;  // constants only: GenericCompiler folds those
    prog->float_registers = true;
    for (auto& in : prog->code) {
      bool f = in.dtype == DType::F32 || in.dtype == DType::Bool;
      if (in.kind == Instr::Load) {
        DType t = g.node(inputs[in.input].node).dtype;
        f = t == DType::F32 || t == DType::Bool;
      }
      if (in.kind == Instr::Imm) f = f && double(float(in.imm)) == in.imm;
      prog->float_registers = prog->float_registers && f;
    }
    int64_t f = g.custom("Fused", inputs, x.shape, x.dtype);
    g.node_mut(f).payload = prog;
    g.replace_uses(id, f);
    g.remove(id);
    ++count;
  }
  if (count) remove_dead_nodes(g);
  return count;
}

}  // namespace luminal
