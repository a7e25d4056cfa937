#include "core/schedule.h"

#include <algorithm>

#include "core/lower/ops.h"

namespace luminal {
namespace {

Instr load(const Graph& g, const Node& n, int k) {
  Instr ld{Instr::Load};
  ld.input = k;
  ld.dtype = g.node(n.inputs[k].node).dtype;
  return ld;
}

// The register program computing a primop, a MatMul or a Fused node, or null.
std::shared_ptr<const Program> program_for(const Graph& g, const Node& n, std::vector<int>& perm) {
  if (const FusedOp* f = op_as<FusedOp>(n)) return std::shared_ptr<const Program>(n.kop, &f->prog);
  auto prog = std::make_shared<Program>();
  if (op_as<MatMulOp>(n)) {
    // A dot product per output. The product is not rounded to the output type (as the CPU MatMul kernel).
    prog->code = {load(g, n, 0), load(g, n, 1)};
    Instr mul{Instr::Apply, Op::Mul};
    mul.a = 0;
    mul.b = 1;
    mul.dtype = is_float(n.dtype) ? DType::F32 : n.dtype;
    prog->code.push_back(mul);
    prog->reduce = Op::SumReduce;
    return prog;
  }
  if (op_as<MaximumOp>(n)) {  // normally fused; alone it is a one-step program
    prog->code = {load(g, n, 0), load(g, n, 1)};
    Instr mx{Instr::Apply, Op::MaxReduce};
    mx.a = 0;
    mx.b = 1;
    mx.dtype = n.dtype;
    prog->code.push_back(mx);
    return prog;
  }
  switch (n.op) {
    case Op::Output: case Op::Cast: case Op::Log2: case Op::Exp2: case Op::Sin: case Op::Sqrt: case Op::Recip:
    case Op::Add: case Op::Mul: case Op::Mod: case Op::LessThan: {
      for (size_t k = 0; k < n.inputs.size(); ++k) prog->code.push_back(load(g, n, int(k)));
      Instr ap{Instr::Apply, n.op == Op::Output ? Op::Cast : n.op};
      ap.a = 0;
      if (n.inputs.size() > 1) ap.b = 1;
      ap.dtype = n.dtype;
      prog->code.push_back(ap);
      return prog;
    }
    case Op::SumReduce: case Op::MaxReduce: {
      // Any axis: the view is read with the reduced axis moved last.
      int r = int(n.inputs[0].view.rank());
      for (int d = 0; d < r; ++d)
        if (d != n.axis) perm.push_back(d);
      perm.push_back(n.axis);
      prog->code.push_back(load(g, n, 0));
      prog->reduce = n.op;
      return prog;
    }
    default: return nullptr;
  }
}

class Scheduler {
 public:
  Scheduler(const Graph& g, const ScheduleOptions& o) : g_(g), opts_(o) {}
  Schedule run();

 private:
  const Graph& g_;
  ScheduleOptions opts_;
  Schedule s_;
  std::vector<size_t> move_together(const std::vector<std::vector<size_t>>& sets);
  void group_matvecs();
  void batch_steps();
  void mark_add_epilogues();
};

Schedule Scheduler::run() {
  s_.storage.assign(g_.size(), DType::F32);
  std::vector<int64_t> order = g_.topo_order();
  std::vector<char> needed = g_.needed(order);  // only what the outputs need
  // Weights (float32 inputs a matmul multiplies by, or a gather reads rows of) are kept in the weights dtype;
  // other inputs (caches, activations, small tables such as RoPE frequencies) stay as they are.
  std::vector<char> weight(g_.size(), 0);
  std::vector<int> reads(g_.size(), 0);  // readers among the needed nodes
  std::vector<long> at(g_.size(), -1);   // node -> its step
  for (int64_t id : order) {
    const Node& n = g_.node(id);
    bool mm = op_as<MatMulOp>(n) != nullptr || op_as<ContractionOp>(n) != nullptr;  // (a convolution's weights)
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (mm || (n.op == Op::Gather && k == 0)) weight[n.inputs[k].node] = 1;
      if (needed[id]) reads[n.inputs[k].node]++;
    }
  }
  for (int64_t id : order) {
    const Node& n = g_.node(id);
    s_.storage[id] = n.op == Op::Input && n.dtype == DType::F32 && weight[id] ? opts_.weights : n.dtype;
    if (!needed[id]) continue;
    Step st{Step::Kernel, id};
    if (n.op == Op::Input) st.kind = Step::Input;
    else if (n.op == Op::Constant) st.kind = Step::Constant;
    else if (n.op == Op::Iota) st.kind = Step::Iota;
    // An Output reading its producer's buffer in order (as stored, or reshaped) hands that buffer out.
    else if (n.op == Op::Output && n.inputs[0].view.is_contiguous() &&
             numel(n.inputs[0].view.shape) == numel(g_.node(n.inputs[0].node).shape))
      st.kind = Step::Alias;
    else if (opts_.host_fallback && op_as<HostOp>(n)) st.kind = Step::Host;
    else st.program = program_for(g_, n, st.perm);
    if (op_as<MatMulOp>(n)) {
      const View &a = n.inputs[0].view, &b = n.inputs[1].view;
      st.matvec = is_float(s_.storage[n.inputs[0].node]) && is_float(s_.storage[n.inputs[1].node]) &&
                  is_float(n.dtype) && !a.has_mask() && !b.has_mask() && a.rank() >= 1;
    }
    // A Q8_0 QMatMul over one weight joins the groups too (its rows unpacked in the dot loop): the runtime takes
    // the group kernel for it only for one row of activations (decode).
    if (const QMatMulOp* q = op_as<QMatMulOp>(n))
      st.matvec = q->format == QuantFormat::Q8_0 && n.inputs.size() == 2 && is_float(s_.storage[n.inputs[0].node]) &&
                  n.dtype == DType::F32 && !n.inputs[0].view.has_mask() && n.inputs[0].view.rank() >= 2;
    if (n.op == Op::Scatter && opts_.groups) {
      // The source's element-wise producer, when only this Scatter reads it, as stored.
      const Edge& src = n.inputs[2];
      Step* prod = at[src.node] >= 0 ? &s_.steps[size_t(at[src.node])] : nullptr;
      if (prod && prod->elementwise() && g_.node(src.node).op != Op::Output && reads[src.node] == 1 &&
          is_plain(g_, src)) {
        st.producer = src.node;
        prod->absorbed = true;
      }
    }
    at[id] = long(s_.steps.size());
    s_.steps.push_back(std::move(st));
  }
  if (opts_.groups) {
    group_matvecs();
    batch_steps();
  }
  mark_add_epilogues();
  return std::move(s_);
}

// Moves each set of steps next to each other, in the order given, to the place of its earliest step, with the leaves
// they read (inputs, constants, Iotas) just before; the other steps keep their order. The groups made so far are
// renumbered with the steps. Returns each step's new index.
std::vector<size_t> Scheduler::move_together(const std::vector<std::vector<size_t>>& sets) {
  std::vector<Step>& steps = s_.steps;
  size_t ns = steps.size();
  std::vector<long> at(g_.size(), -1), set_of(ns, -1);
  for (size_t i = 0; i < ns; ++i) at[steps[i].node] = long(i);
  std::vector<size_t> earliest(sets.size(), SIZE_MAX);
  for (size_t j = 0; j < sets.size(); ++j)
    for (size_t i : sets[j]) {
      set_of[i] = long(j);
      earliest[j] = std::min(earliest[j], i);
    }
  std::vector<size_t> order;
  std::vector<char> emitted(ns, 0);
  auto emit = [&](size_t i) {
    if (!emitted[i]) order.push_back(i);
    emitted[i] = 1;
  };
  for (size_t i = 0; i < ns; ++i) {
    long j = set_of[i];
    if (j < 0) {
      emit(i);
    } else if (earliest[size_t(j)] == i) {
      for (size_t m : sets[size_t(j)])
        for (int64_t r : kernel_reads(g_, steps[m]))
          if (at[r] >= 0 && steps[size_t(at[r])].leaf()) emit(size_t(at[r]));
      // A Scatter's absorbed producer moves with it (it reads what the Scatter's kernel reads, so it is ready): a
      // step that does not run still comes before its reader, whose plan evaluates the view of it.
      for (size_t m : sets[size_t(j)])
        if (steps[m].producer >= 0) emit(size_t(at[steps[m].producer]));
      for (size_t m : sets[size_t(j)]) emit(m);
    }
  }
  std::vector<size_t> now(ns);
  for (size_t k = 0; k < ns; ++k) now[order[k]] = k;
  for (Group& G : s_.groups) {
    for (std::vector<size_t>* v : {&G.members, &G.epilogues, &G.batch})
      for (size_t& i : *v) i = now[i];
    G.first = now[G.first];
    G.last = now[G.last];
    if (G.prologue >= 0) G.prologue = long(now[size_t(G.prologue)]);
  }
  std::vector<Step> re;
  re.reserve(ns);
  for (size_t k : order) re.push_back(std::move(steps[k]));
  steps = std::move(re);
  return now;
}

// Matrix-vector products that read the same activations (a layer's q/k/v, or gate and up) become one group, and an
// element-wise step that is the only reader of some of them (the residual add after o or down, SwiGLU's
// silu(gate) * up) is computed as they store, so that their results never go through memory. A Llama layer's
// decode then runs 4 matrix-vector kernels instead of 7, and 3 element-wise kernels fewer. The group's steps are
// moved next to each other (they only read what is ready by then). A factored row program that computes the
// activations and that only the group's members read (the RMSNorm before q/k/v, gate/up, or the logits) becomes
// the group's prologue (Group::prologue): a group then forms for a single product too.
void Scheduler::group_matvecs() {
  std::vector<Step>& steps = s_.steps;
  size_t ns = steps.size();
  std::vector<long> at(g_.size(), -1), reader(g_.size(), -1);
  std::vector<int> reads(g_.size(), 0);
  for (size_t i = 0; i < ns; ++i) {
    at[steps[i].node] = long(i);
    for (auto& e : g_.node(steps[i].node).inputs) {
      reads[e.node]++;
      reader[e.node] = long(i);
    }
  }
  // Step s's inputs are ready at step g0 (other than the nodes in `except`).
  auto ready = [&](size_t s, size_t g0, const std::vector<int64_t>& except) {
    for (auto& e : g_.node(steps[s].node).inputs) {
      long p = at[e.node];
      bool skip = std::find(except.begin(), except.end(), e.node) != except.end();
      if (!skip && p >= long(g0) && !steps[size_t(p)].leaf()) return false;
    }
    return true;
  };
  // The element-wise step that is matmul step i's only reader, reading it as stored at its own shape; or -1.
  auto epilogue_of = [&](size_t i) -> long {
    int64_t id = steps[i].node;
    long f = reader[id];
    if (reads[id] != 1 || f < 0) return -1;
    const Step& fs = steps[size_t(f)];
    const Node& fn = g_.node(fs.node);
    bool ok = fs.elementwise() && !fs.absorbed && fn.op != Op::Output && fn.shape == g_.node(id).shape;
    for (auto& e : fn.inputs)
      if (e.node == id) ok = ok && is_plain(g_, e);
    return ok ? f : -1;
  };
  // Matrix-vector candidates by the activations they read (each unit reads them through its own view numbers).
  std::vector<std::vector<size_t>> keyed;
  for (size_t i = 0; i < ns; ++i) {
    if (!steps[i].matvec) continue;
    int64_t a = g_.node(steps[i].node).inputs[0].node;
    auto same = [&](const std::vector<size_t>& k) { return g_.node(steps[k[0]].node).inputs[0].node == a; };
    auto it = std::find_if(keyed.begin(), keyed.end(), same);
    if (it == keyed.end()) keyed.push_back({i});
    else it->push_back(i);
  }
  // The step computing activations `a` when it may be the prologue of a group of `members`: a row program of the
  // factored form (row_factors) whose output only they read, as their left operand. (Other row programs keep their
  // kernel: computing the rows first in every block of the group's kernel costs the weight streaming more.) A
  // prologue's activations stay in float32 registers, never rounded to a 16-bit type they would be stored in.
  auto prologue_of = [&](int64_t a, const std::vector<size_t>& members) -> long {
    long p = at[a];
    if (!opts_.prologues || p < 0) return -1;
    const Step& ps = steps[size_t(p)];
    int readers = 0;
    for (size_t m : members) {
      const Node& mn = g_.node(steps[m].node);
      if (mn.inputs[1].node == a) return -1;
      readers += mn.inputs[0].node == a;
    }
    bool ok = ps.kind == Step::Kernel && ps.program && row_factors(*ps.program) &&
              ps.program->reduce == Op::Input && !ps.matvec && !ps.absorbed && ps.perm.empty() && ps.group < 0 &&
              ps.producer < 0 && g_.node(a).op != Op::Output && is_float(g_.node(a).dtype) && reads[a] == readers;
    return ok ? p : -1;
  };
  struct Unit {
    std::vector<size_t> ms;
    long f = -1;
  };
  std::vector<std::vector<Unit>> found;
  std::vector<long> prologues;
  for (auto& cand : keyed) {
    size_t g0 = cand[0];
    std::vector<size_t> members;
    for (size_t m : cand)
      if (m == g0 || ready(m, g0, {})) members.push_back(m);
    std::vector<Unit> units;
    std::vector<char> placed(members.size(), 0);
    std::vector<long> ep(members.size());
    for (size_t j = 0; j < members.size(); ++j) ep[j] = epilogue_of(members[j]);
    for (size_t j = 0; j < members.size(); ++j) {
      if (placed[j]) continue;
      Unit u;
      long f = ep[j];
      for (size_t k = j; k < members.size() && f >= 0; ++k)
        if (!placed[k] && ep[k] == f) u.ms.push_back(k);
      std::vector<int64_t> ids;
      for (size_t k : u.ms) ids.push_back(steps[members[k]].node);
      if (f >= 0 && u.ms.size() <= 4 && ready(size_t(f), g0, ids)) {
        u.f = f;
      } else {
        u.ms = {j};
      }
      for (size_t& k : u.ms) {
        placed[k] = 1;
        k = members[k];
      }
      units.push_back(u);
    }
    bool any_epilogue = std::any_of(units.begin(), units.end(), [](const Unit& u) { return u.f >= 0; });
    long pro = prologue_of(g_.node(steps[g0].node).inputs[0].node, members);
    if (members.size() >= 2 || any_epilogue || pro >= 0) {
      found.push_back(std::move(units));
      prologues.push_back(pro);
    }
  }
  // Each group's steps together at its first member's place: members, then epilogues.
  std::vector<std::vector<size_t>> sets(found.size());
  for (size_t gi = 0; gi < found.size(); ++gi) {
    for (auto& u : found[gi]) sets[gi].insert(sets[gi].end(), u.ms.begin(), u.ms.end());
    for (auto& u : found[gi])
      if (u.f >= 0) sets[gi].push_back(size_t(u.f));
  }
  std::vector<size_t> now = move_together(sets);
  for (size_t gi = 0; gi < found.size(); ++gi) {
    Group G{Group::MatVec};
    for (auto& u : found[gi]) {
      G.units.push_back(G.members.size());
      for (size_t m : u.ms) G.members.push_back(now[m]);
      G.unit_epilogue.push_back(u.f >= 0 ? long(G.epilogues.size()) : -1);
      if (u.f >= 0) G.epilogues.push_back(now[size_t(u.f)]);
    }
    G.first = now[sets[gi][0]];
    G.last = G.first + sets[gi].size() - 1;
    for (size_t k = G.first; k <= G.last; ++k) steps[k].group = int(s_.groups.size());
    if (prologues[gi] >= 0) {
      G.prologue = long(now[size_t(prologues[gi])]);
      steps[size_t(G.prologue)].prologue_of = int(s_.groups.size());
    }
    s_.groups.push_back(std::move(G));
  }
}

// Steps that read none of each other's results, each an element-wise loop (a program, or a Scatter's row writes),
// become one batch: in a decode step such kernels (a layer's q and k rotations, its two cache writes) do little
// work, and each costs a launch and a wait for the one before. A step joins the batch opened last when everything
// it reads comes before that batch's first step (it is moved up to it), else opens a batch itself.
void Scheduler::batch_steps() {
  std::vector<Step>& steps = s_.steps;
  size_t ns = steps.size();
  std::vector<long> at(g_.size(), -1);
  for (size_t i = 0; i < ns; ++i) at[steps[i].node] = long(i);
  auto loop = [&](const Step& st) {
    if (st.kind != Step::Kernel || st.group >= 0 || st.absorbed) return false;
    return st.elementwise() || g_.node(st.node).op == Op::Scatter;
  };
  std::vector<std::vector<size_t>> batches;
  for (size_t i = 0; i < ns; ++i) {
    if (!loop(steps[i])) continue;
    size_t ready = 0;  // the first place it may move to
    for (int64_t r : kernel_reads(g_, steps[i]))
      if (at[r] >= 0 && !steps[size_t(at[r])].leaf()) ready = std::max(ready, size_t(at[r]) + 1);
    if (batches.empty() || batches.back()[0] < ready || batches.back().size() == 8) batches.push_back({});
    batches.back().push_back(i);
  }
  batches.erase(std::remove_if(batches.begin(), batches.end(), [](const std::vector<size_t>& b) { return b.size() < 2; }),
                batches.end());
  std::vector<size_t> now = move_together(batches);
  for (auto& b : batches) {
    Group G{Group::Batch};
    for (size_t m : b) G.batch.push_back(now[m]);
    G.first = G.batch[0];
    G.last = G.first + G.batch.size() - 1;
    for (size_t k = G.first; k <= G.last; ++k) steps[k].group = int(s_.groups.size());
    s_.groups.push_back(std::move(G));
  }
}

// Products whose only reader adds them to another tensor of their shape (Step::add_epilogue). Node ids, not step
// indices: the groups above have moved the steps already.
void Scheduler::mark_add_epilogues() {
  std::vector<long> at(g_.size(), -1), reader(g_.size(), -1);
  std::vector<int> reads(g_.size(), 0);
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    at[s_.steps[i].node] = long(i);
    for (auto& e : g_.node(s_.steps[i].node).inputs) {
      reads[e.node]++;
      reader[e.node] = long(i);
    }
  }
  auto f32 = [&](int64_t id) { return g_.node(id).dtype == DType::F32 && s_.storage[size_t(id)] == DType::F32; };
  for (Step& st : s_.steps) {
    const Node& n = g_.node(st.node);
    if (st.kind != Step::Kernel || !op_as<MatMulOp>(n) || !f32(st.node) || reads[st.node] != 1) continue;
    const Step& as = s_.steps[size_t(reader[st.node])];
    const Node& an = g_.node(as.node);
    if (!as.elementwise() || as.absorbed || an.op == Op::Output || an.inputs.size() != 2 || !f32(as.node) ||
        an.shape != n.shape || an.inputs[0].node == an.inputs[1].node)
      continue;
    // The program is exactly load + load + Add in float32 (a primop Add, or a fusion of nothing more).
    const std::vector<Instr>& c = as.program->code;
    bool add = c.size() == 3 && c[2].kind == Instr::Apply && c[2].op == Op::Add && c[2].dtype == DType::F32;
    for (int k = 0; add && k < 2; ++k) {
      int r = k ? c[2].b : c[2].a;
      add = r >= 0 && r < 2 && c[size_t(r)].kind == Instr::Load && c[size_t(r)].dtype == DType::F32;
    }
    add = add && c[size_t(c[2].a)].input != c[size_t(c[2].b)].input;
    const Edge& other = an.inputs[an.inputs[0].node == st.node ? 1 : 0];
    if (!add || !f32(other.node) || at[other.node] < 0) continue;
    bool plain = true;
    for (auto& e : an.inputs) plain = plain && is_plain(g_, e) && e.view.shape == an.shape;
    if (plain) st.add_epilogue = as.node;
  }
}

}  // namespace

Schedule make_schedule(const Graph& g, const ScheduleOptions& opts) { return Scheduler(g, opts).run(); }

std::vector<int64_t> kernel_reads(const Graph& g, const Step& st) {
  std::vector<int64_t> r;
  for (auto& e : g.node(st.node).inputs)
    if (e.node != st.producer) r.push_back(e.node);
  if (st.producer >= 0)
    for (auto& e : g.node(st.producer).inputs) r.push_back(e.node);
  return r;
}

std::optional<RowFactors> row_factors(const Program& prog) {
  const std::vector<Instr>& c = prog.code;
  if (prog.reduce != Op::Input || c.empty()) return std::nullopt;
  // Per register: whether it depends on a Reduce step, and whether on a Load other than through one.
  std::vector<char> red(c.size(), 0), load(c.size(), 0);
  RowFactors f;
  for (size_t i = 0; i < c.size(); ++i) {
    const Instr& in = c[i];
    // float registers only (the group kernel computes them as float), immediates exact in float
    if (in.kind == Instr::Load ? !is_float(in.dtype) : in.kind != Instr::Imm && in.dtype != DType::F32)
      return std::nullopt;
    if (in.kind == Instr::Imm && double(float(in.imm)) != in.imm) return std::nullopt;
    if (in.kind == Instr::Load) load[i] = 1;
    if (in.kind == Instr::Reduce) {
      if (in.op != Op::SumReduce || red[size_t(in.a)]) return std::nullopt;  // a sum of a k-wise register
      red[i] = 1;
      f.sums.push_back(int(i));
      continue;
    }
    for (int r : {in.a, in.b})
      if (r >= 0) {
        red[i] |= red[size_t(r)];
        load[i] |= load[size_t(r)];
      }
  }
  // The factors: the operands of the float32 products the output is, each k-wise or a row scalar.
  std::vector<int> todo{int(c.size() - 1)};
  while (!todo.empty()) {
    int r = todo.back();
    todo.pop_back();
    const Instr& in = c[size_t(r)];
    if (in.kind == Instr::Apply && in.op == Op::Mul && (red[size_t(in.a)] || red[size_t(in.b)])) {
      todo.push_back(in.a);
      todo.push_back(in.b);
    } else if (!red[size_t(r)]) {
      f.part.push_back(r);
    } else if (!load[size_t(r)] && in.kind != Instr::Load) {
      f.scalar.push_back(r);
    } else {
      return std::nullopt;
    }
  }
  if (f.scalar.empty() || f.part.empty()) return std::nullopt;
  return f;
}

}  // namespace luminal
