// Bindings of the rewrite engine and GenericCompiler's passes, so compilers can be written in Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/cpu/cpu.h"
#include "core/cpu/isa.h"
#include "core/lower/lower.h"
#include "core/cpu/simd.h"
#include "core/rewrite.h"

namespace py = pybind11;

namespace luminal {

void bind_compiler(py::module_& m) {
  py::list ops;  // the graph's op names, primops and plumbing (a pattern's `op`)
  for (int i = 0; i <= int(Op::Custom); ++i) ops.append(op_name(Op(i)));
  m.attr("OPS") = py::tuple(ops);
  py::class_<Pattern>(m, "Pattern", "A tree of ops with predicates; names bind matched (node, view) edges.")
      .def(py::init([](std::optional<std::string> op, const std::string& name, std::vector<Pattern> inputs,
                       std::optional<std::string> dtype, std::optional<double> value, const std::string& custom,
                       bool single_use, bool commutative, py::object where) {
             Pattern p;
             if (op) p.op = op_named(*op);
             p.name = name;
             p.inputs = std::move(inputs);
             if (dtype) p.dtype = dtype_from_name(*dtype);
             p.value = value;
             p.custom = custom;
             if (!custom.empty()) p.op = Op::Custom;
             p.single_use = single_use;
             p.commutative = commutative;
             if (!where.is_none()) {
               // The predicate is Python: called as where(graph, node_id, view) with the GIL held.
               auto fn = std::make_shared<py::object>(where);
               p.where = [fn](const Graph& g, int64_t id, const View& v) {
                 py::gil_scoped_acquire gil;
                 return (*fn)(py::cast(&g, py::return_value_policy::reference), id, v).cast<bool>();
               };
             }
             return p;
           }),
           py::arg("op") = py::none(), py::arg("name") = "", py::arg("inputs") = std::vector<Pattern>{},
           py::arg("dtype") = py::none(), py::arg("value") = py::none(), py::arg("custom") = "",
           py::arg("single_use") = false, py::arg("commutative") = true, py::arg("where") = py::none());

  py::class_<Match>(m, "Match")
      .def_readonly("root", &Match::root)
      .def("__getitem__", &Match::operator[])
      .def("__contains__", [](const Match& mm, const std::string& k) { return mm.bound.count(k) > 0; })
      .def("names", [](const Match& mm) {
        std::vector<std::string> out;
        for (auto& [k, _] : mm.bound) out.push_back(k);
        return out;
      });

  m.def("find", [](const Graph& g, const Pattern& p) {
    std::vector<Match> out;
    for (int64_t id : g.topo_order()) {
      Match mm;
      if (match(g, p, id, mm)) out.push_back(std::move(mm));
    }
    return out;
  }, "Every match of the pattern, producers first.");
  m.def("rewrite", [](Graph& g, const Pattern& p, py::function fn, const std::string& name) {
    Rule r{name, p, [fn](Graph& gg, const Match& mm) -> std::optional<int64_t> {
             py::gil_scoped_acquire gil;
             py::object res = fn(py::cast(&gg, py::return_value_policy::reference), mm);
             if (res.is_none()) return std::nullopt;
             return res.cast<int64_t>();
           }};
    return apply_rules(g, {r});
  }, py::arg("graph"), py::arg("pattern"), py::arg("fn"), py::arg("name") = "python rule",
     "One sweep: fn(graph, match) returns the replacement node id, or None to leave the match alone.");
  m.def("is_plain", &is_plain);
  m.def("remove_dead_nodes", &remove_dead_nodes);
  m.def("eliminate_common_subexpressions", &eliminate_common_subexpressions);
  m.def("apply_arithmetic_identities", [](Graph& g) { return apply_rules(g, arithmetic_rules()); });
  m.def("fold_constants", [](Graph& g) { return apply_rules(g, constant_folding_rules()); });
  m.def("lower_matmuls", &lower_matmuls);
  m.def("lower_contractions", &lower_contractions);
  m.def("lower_maximum", &lower_maximum);
  m.def("lower_quantized", &lower_quantized);
  m.def("stack_qmatmuls", &stack_qmatmuls);
  m.def("fuse_attention", &fuse_attention);
  m.def("store_matmul_inputs", [](Graph& g, const std::string& dtype) {
    return store_matmul_inputs(g, dtype_from_name(dtype));
  }, py::arg("graph"), py::arg("dtype"));
  m.def("fuse_elementwise", &fuse_elementwise, py::arg("graph"), py::arg("row_reductions") = false);
  m.def("set_num_threads", &set_num_threads, "Worker threads for the CPU kernels (0: one per core).");
  m.def("simd", [] { return isa_at_least_avx2() ? "avx2" : "portable"; },
        "Older name: 'avx2' where the x86 AVX2 (or AVX-512) kernels run, else 'portable'. See cpu_isa().");
  // The level is chosen here, at import: a LUMINAL_CPU_ISA the CPU cannot run is an ImportError naming it, never
  // an illegal instruction later.
  cpu_isa();
  m.def("cpu_isa", [] { return cpu_isa_name(cpu_isa()); },
        "The CPU kernels' instruction set: 'avx512', 'avx2', 'neon' or 'portable' (LUMINAL_CPU_ISA forces one).");
  m.def("cpu_isa_features", &cpu_isa_features, "Optional extensions the level uses: 'vnni' (x86), 'dotprod' (ARM).");
  m.def("supported_cpu_isas", &supported_cpu_isas, "The levels this CPU can run, best first.");
  m.def("_set_cpu_isa", &set_cpu_isa, py::arg("name"),
        "Switches the CPU kernels' level (tests, benchmarks); never while a graph runs. ValueError where the CPU "
        "lacks it.");
  m.def("num_threads", &num_threads);
}

}  // namespace luminal
