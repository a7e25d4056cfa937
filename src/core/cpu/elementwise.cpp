// Fused elementwise kernels: chains of unary/binary/cast primops (optionally ending in a sum or max over the last
// axis) become one "Fused" node carrying a small register program. The kernel runs it row by row over chunks of
// the last axis, reading every input through its view, in double precision with each step rounded to its node's
// dtype: exactly what the reference executor computes, one pass over memory instead of one per primop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "core/cpu/cpu.h"

namespace luminal {
namespace {

struct Instr {
  enum Kind : uint8_t { Load, Imm, Apply } kind;
  Op op = Op::Input;  // Apply: a unary or binary primop, or Cast
  int a = -1, b = -1;  // operand registers
  int input = -1;      // Load: which kernel input
  double imm = 0;      // Imm
  DType dtype = DType::F32;  // the step's result type: values are rounded to it
};

struct Program {
  std::vector<Instr> code;  // register i is code[i]'s result; the last one is the output
  Op reduce = Op::Input;    // SumReduce / MaxReduce over the last axis, or Input for none
};

constexpr int64_t kChunk = 256;

void round_to_dtype(double* x, int64_t n, DType d) {
  switch (d) {
    case DType::F32: for (int64_t i = 0; i < n; ++i) x[i] = double(float(x[i])); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(float(x[i]))); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(float(x[i]))); break;
    default: for (int64_t i = 0; i < n; ++i) x[i] = round_to(d, x[i]); break;
  }
}

// Loads elements [j0, j1) of row `row` of an input (padding reads as zero).
void load_row(const KernelArg& a, int64_t row, int64_t j0, int64_t j1, double* out) {
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
  if (!valid || lo >= hi) { std::fill(out, out + n, 0.0); return; }
  std::fill(out, out + (lo - j0), 0.0);
  std::fill(out + (hi - j0), out + n, 0.0);
  int64_t first = base + lo * s, last = base + (hi - 1) * s;
  if (std::min(first, last) < 0 || std::max(first, last) >= a.buf->numel())
    throw std::out_of_range("Fused: a view reads outside its buffer");
  const void* p = a.buf->data.get();
  double* o = out + (lo - j0);
  if (a.buf->dtype == DType::F32) {
    const float* f = static_cast<const float*>(p) + first;
    if (s == 1) for (int64_t j = 0; j < hi - lo; ++j) o[j] = f[j];
    else for (int64_t j = 0; j < hi - lo; ++j) o[j] = f[j * s];
  } else {
    for (int64_t j = 0; j < hi - lo; ++j) o[j] = load_as_double(p, first + j * s, a.buf->dtype);
  }
}

void apply(Op op, const double* x, const double* y, double* o, int64_t n) {
  switch (op) {
    case Op::Log2: for (int64_t i = 0; i < n; ++i) o[i] = std::log2(x[i]); break;
    case Op::Exp2: for (int64_t i = 0; i < n; ++i) o[i] = std::exp2(x[i]); break;
    case Op::Sin: for (int64_t i = 0; i < n; ++i) o[i] = std::sin(x[i]); break;
    case Op::Sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(x[i]); break;
    case Op::Recip: for (int64_t i = 0; i < n; ++i) o[i] = 1.0 / x[i]; break;
    case Op::Add: for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i]; break;
    case Op::Mul: for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i]; break;
    case Op::Mod: for (int64_t i = 0; i < n; ++i) o[i] = std::fmod(x[i], y[i]); break;
    case Op::LessThan: for (int64_t i = 0; i < n; ++i) o[i] = x[i] < y[i] ? 1.0 : 0.0; break;
    default: std::copy(x, x + n, o); break;  // Cast: the rounding does the work
  }
}

Buffer fused_kernel(const std::vector<KernelArg>& args, const Node& node) {
  const Program& prog = *std::static_pointer_cast<const Program>(node.payload);
  // The iteration space is the inputs' (view) shape: the output's, plus the reduced axis.
  std::vector<int64_t> out_shape;
  std::vector<int64_t> space;
  if (!args.empty()) space = args[0].view.shape;
  bool reduce = prog.reduce != Op::Input;
  Buffer out;
  {
    // Shape of the output: the space, less its last axis when reducing.
    std::vector<int64_t> s = space;
    if (args.empty()) throw std::logic_error("Fused: a kernel without inputs");
    if (reduce) s.pop_back();
    out = Buffer::alloc(node.dtype, s);
  }
  int64_t L = space.empty() ? 1 : space.back();
  int64_t total = 1;
  for (auto d : space) total *= d;
  int64_t rows = L ? total / L : 0;
  if (reduce && L == 0) rows = out.numel();
  size_t nreg = prog.code.size();
  void* o = out.data.get();
  parallel_for(rows, std::max<int64_t>(L, 1) * int64_t(nreg), [&](int64_t r0, int64_t r1) {
    std::vector<double> regs(nreg * kChunk);
    for (int64_t row = r0; row < r1; ++row) {
      double acc = prog.reduce == Op::MaxReduce ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t j0 = 0; j0 < L; j0 += kChunk) {
        int64_t j1 = std::min(L, j0 + kChunk), n = j1 - j0;
        for (size_t i = 0; i < nreg; ++i) {
          const Instr& in = prog.code[i];
          double* dst = regs.data() + i * kChunk;
          if (in.kind == Instr::Load) {
            load_row(args[in.input], row, j0, j1, dst);
            continue;
          }
          if (in.kind == Instr::Imm) { std::fill(dst, dst + n, in.imm); continue; }
          apply(in.op, regs.data() + in.a * kChunk, in.b >= 0 ? regs.data() + in.b * kChunk : nullptr, dst, n);
          round_to_dtype(dst, n, in.dtype);
        }
        const double* res = regs.data() + (nreg - 1) * kChunk;
        if (!reduce) {
          for (int64_t j = 0; j < n; ++j) store_from_double(o, row * L + j0 + j, node.dtype, res[j]);
        } else if (prog.reduce == Op::SumReduce) {
          for (int64_t j = 0; j < n; ++j) acc += res[j];
        } else {
          for (int64_t j = 0; j < n; ++j) acc = (std::isnan(res[j]) || res[j] > acc) ? res[j] : acc;
        }
      }
      if (reduce) store_from_double(o, row, node.dtype, acc);
    }
  });
  return out;
}

struct Registrar {
  Registrar() { register_builtin_kernel("Fused", fused_kernel); }
} registrar;

bool fusible(const Node& n) {
  if (is_unary(n.op) || is_binary(n.op) || n.op == Op::Cast) return true;
  return (n.op == Op::SumReduce || n.op == Op::MaxReduce) && n.axis == int(n.inputs[0].view.shape.size()) - 1;
}

const Program* program_of(const Node& n) {
  return n.op == Op::Custom && n.name == "Fused" ? static_cast<const Program*>(n.payload.get()) : nullptr;
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
