// Python bindings: thin wrappers over the core. C++ exceptions surface as Python exceptions
// (std::invalid_argument -> ValueError, std::out_of_range -> IndexError, others -> RuntimeError).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unordered_set>

#include "core/executor.h"
#include "core/graph.h"
#include "core/lower/ops.h"
#include "core/reference.h"

namespace py = pybind11;
using namespace luminal;

namespace luminal {
void bind_compiler(py::module_& m);  // compiler_bindings.cpp
void bind_cuda(py::module_& m);      // cuda_bindings.cpp
}


namespace {

Expr to_expr(const py::handle& h) {
  if (py::isinstance<Expr>(h)) return h.cast<Expr>();
  if (py::isinstance<py::str>(h)) return Expr::parse(h.cast<std::string>());
  if (py::isinstance<py::bool_>(h)) throw py::type_error("a dimension cannot be a bool");
  if (py::isinstance<py::int_>(h) || py::hasattr(h, "__index__")) return Expr(py::reinterpret_borrow<py::object>(h).attr("__index__")().cast<int64_t>());
  throw py::type_error("expected an int, a str or an Expr, got " + std::string(py::str(py::type::of(h))));
}

Shape to_shape(const py::iterable& seq) {
  Shape s;
  for (auto h : seq) s.push_back(to_expr(h));
  return s;
}

Bindings to_bindings(const py::dict& d) {
  Bindings b;
  for (auto [k, v] : d) b[k.cast<std::string>()] = v.cast<int64_t>();
  return b;
}

// numpy -> Buffer without a copy: the buffer keeps the array alive.
Buffer to_buffer(const py::array& arr, DType dtype) {
  if (!(arr.flags() & py::array::c_style)) throw std::invalid_argument("array must be C-contiguous");
  if (size_t(arr.itemsize()) != dtype_size(dtype))
    throw std::invalid_argument(std::string("array item size does not match ") + dtype_name(dtype));
  Buffer b;
  b.dtype = dtype;
  for (py::ssize_t i = 0; i < arr.ndim(); ++i) b.shape.push_back(arr.shape(i));
  auto* keep = new py::object(arr);
  b.data = std::shared_ptr<void>(const_cast<void*>(arr.data()), [keep](void*) {
    py::gil_scoped_acquire gil;
    delete keep;
  });
  return b;
}

py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::F32: return py::dtype::of<float>();
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype::of<uint16_t>();  // raw bits; Python converts
    case DType::I32: return py::dtype::of<int32_t>();
    case DType::U8: return py::dtype::of<uint8_t>();
    case DType::Bool: return py::dtype::of<bool>();
  }
  return py::dtype::of<float>();
}

py::array to_numpy(const Buffer& b) {
  auto* keep = new std::shared_ptr<void>(b.data);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  std::vector<py::ssize_t> shape(b.shape.begin(), b.shape.end());
  return py::array(numpy_dtype(b.dtype), shape, b.data.get(), owner);
}

// An Executor plus the buffers wrapping the arrays of the last run: an array passed again (a weight, a donated
// cache) is not wrapped again, and its reference is not dropped and retaken (under the GIL) on every run.
struct PyExecutor {
  Executor ex;
  BufferMap inputs;
  std::unordered_map<int64_t, py::object> arrays;
  explicit PyExecutor(const Graph& g) : ex(g) {}
};

DType dtype_of(const py::handle& h) { return dtype_from_name(py::str(h).cast<std::string>()); }

// A Python function as a HostOp's kernel: it takes the GIL, gets contiguous numpy arrays and the output dtype's
// name, and what it returns is checked.
CustomKernel python_kernel(const std::string& name, py::function fn) {
  auto f = std::make_shared<py::function>(std::move(fn));
  return [f, name](const std::vector<KernelArg>& ins, const Node& node, Buffer& out) {
    DType out_dtype = node.dtype;
    std::vector<Buffer> dense;  // Python kernels get contiguous arrays
    for (auto& a : ins) dense.push_back(materialize(*a.buf, a.view));
    py::gil_scoped_acquire gil;
    py::list args;
    for (auto& b : dense) args.append(to_numpy(b));
    py::object r = (*f)(*args, py::str(dtype_name(out_dtype)));
    py::array arr = py::array::ensure(r, py::array::c_style);
    if (!arr) throw std::runtime_error("custom op '" + name + "' must return a numpy array");
    auto want = numpy_dtype(out_dtype);
    if (!arr.dtype().is(want) && !arr.dtype().equal(want))
      throw std::runtime_error("custom op '" + name + "' returned " + std::string(py::str(arr.dtype())) +
                               ", expected " + dtype_name(out_dtype));
    if (!std::equal(out.shape.begin(), out.shape.end(), arr.shape(), arr.shape() + arr.ndim()))
      throw std::runtime_error("custom op '" + name + "' returned an array of the wrong shape");
    std::memcpy(out.data.get(), arr.data(), out.nbytes());
  };
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "luminal's C++ core: symbolic expressions, views, the graph and its executors";
  py::register_exception<std::domain_error>(m, "SymbolicError", PyExc_ZeroDivisionError);
  py::register_exception<UnboundDimension>(m, "UnboundDimensionError", PyExc_ValueError);
  py::register_exception<UnsupportedOpError>(m, "UnsupportedOpError", PyExc_NotImplementedError);

  py::class_<Expr>(m, "Expr", "A canonical symbolic integer expression.")
      .def(py::init([](const py::object& v) { return to_expr(v); }), py::arg("value"))
      .def_static("var", &Expr::var)
      .def_static("parse", &Expr::parse)
      .def("is_const", &Expr::is_const)
      .def("is_var", &Expr::is_var)
      .def("as_const", &Expr::as_const)
      .def("vars", &Expr::vars)
      .def("eval", [](const Expr& e, const py::dict& d) { return e.eval(to_bindings(d)); }, py::arg("bindings") = py::dict())
      .def("substitute", [](const Expr& e, const std::string& n, const py::object& v) { return e.substitute(n, to_expr(v)); })
      .def("__int__", &Expr::as_const)
      .def("__index__", &Expr::as_const)
      .def("__str__", &Expr::str)
      .def("__repr__", [](const Expr& e) { return "Expr('" + e.str() + "')"; })
      .def("__hash__", [](const Expr& e) -> py::ssize_t {
        // Equal to int's hash for constants, since Expr(3) == 3.
        return e.is_const() ? py::hash(py::int_(e.as_const())) : py::ssize_t(e.hash());
      })
      .def("__eq__", [](const Expr& a, const py::object& b) {
        try { return a == to_expr(b); } catch (const py::type_error&) { return false; }
      })
      .def("__ne__", [](const Expr& a, const py::object& b) {
        try { return a != to_expr(b); } catch (const py::type_error&) { return true; }
      })
#define LM_BINOP(name, rname, expr)                                                                \
  .def(name, [](const Expr& a, const py::object& b) { Expr x = a, y = to_expr(b); return expr; }) \
      .def(rname, [](const Expr& b, const py::object& a) { Expr x = to_expr(a), y = b; return expr; })
      LM_BINOP("__add__", "__radd__", x + y)
      LM_BINOP("__sub__", "__rsub__", x - y)
      LM_BINOP("__mul__", "__rmul__", x * y)
      LM_BINOP("__floordiv__", "__rfloordiv__", x / y)
      LM_BINOP("__mod__", "__rmod__", x % y)
#undef LM_BINOP
      .def("__neg__", [](const Expr& a) { return -a; })
      .def("__lt__", [](const Expr& a, const py::object& b) { return lt(a, to_expr(b)); })
      .def("min", [](const Expr& a, const py::object& b) { return min(a, to_expr(b)); })
      .def("max", [](const Expr& a, const py::object& b) { return max(a, to_expr(b)); });
  m.def("to_expr", &to_expr);

  py::class_<View>(m, "View", "Logical index -> physical offset and validity.")
      .def_static("contiguous", [](const py::iterable& s) { return View::contiguous(to_shape(s)); })
      .def_static("from_parts", [](const py::iterable& shape, const py::iterable& strides, const py::object& offset,
                                   const py::iterable& mask) {
        // Any view, from the fields it exposes (a saved graph's edges); the graph checks it when an edge uses it.
        View v{to_shape(shape), to_shape(strides), to_expr(offset), {}};
        for (auto r : mask) {
          auto lo_hi = r.cast<py::tuple>();
          v.mask.emplace_back(to_expr(lo_hi[0]), to_expr(lo_hi[1]));
        }
        if (v.strides.size() != v.shape.size() || (!v.mask.empty() && v.mask.size() != v.shape.size()))
          throw py::value_error("View.from_parts: shape, strides and mask (if any) need one entry per dim");
        return v;
      }, py::arg("shape"), py::arg("strides"), py::arg("offset"), py::arg("mask") = py::tuple())
      .def_readonly("shape", &View::shape)
      .def_readonly("strides", &View::strides)
      .def_readonly("offset", &View::offset)
      .def_readonly("mask", &View::mask)
      .def("is_contiguous", &View::is_contiguous)
      .def("has_mask", &View::has_mask)
      .def("permute", &View::permute)
      .def("expand", [](const View& v, int axis, const py::object& n) { return v.expand(axis, to_expr(n)); })
      .def("unsqueeze", &View::unsqueeze)
      .def("squeeze", &View::squeeze)
      .def("reshape", [](const View& v, const py::iterable& s) { return v.reshape(to_shape(s)); })
      .def("slice", [](const View& v, int axis, const py::object& a, const py::object& b, int64_t step) {
        return v.slice(axis, to_expr(a), to_expr(b), step);
      }, py::arg("axis"), py::arg("start"), py::arg("stop"), py::arg("step") = 1)
      .def("pad", [](const View& v, int axis, const py::object& a, const py::object& b) {
        return v.pad(axis, to_expr(a), to_expr(b));
      })
      .def("flip", &View::flip)
      .def("unfold", [](const View& v, int axis, const py::object& size, const py::object& step,
                        const py::object& dilation) {
        return v.unfold(axis, to_expr(size), to_expr(step), to_expr(dilation));
      }, py::arg("axis"), py::arg("size"), py::arg("step") = 1, py::arg("dilation") = 1)
      .def("__eq__", [](const View& a, const View& b) { return a == b; })
      .def("__hash__", &View::hash)
      .def("__repr__", [](const View& v) { return "View(" + v.str() + ")"; });

  py::class_<Edge>(m, "Edge")
      .def(py::init<int64_t, View>(), py::arg("node"), py::arg("view"))
      .def_readwrite("node", &Edge::node)
      .def_readwrite("view", &Edge::view);

  py::class_<Node>(m, "Node")
      .def_property_readonly("op", [](const Node& n) { return std::string(op_name(n.op)); })
      .def_property_readonly("dtype", [](const Node& n) { return std::string(dtype_name(n.dtype)); })
      .def_readonly("shape", &Node::shape)
      .def_readonly("inputs", &Node::inputs)
      .def_readonly("axis", &Node::axis)
      .def_readonly("value", &Node::value)
      .def_readonly("expr", &Node::expr)
      .def_property_readonly("name", [](const Node& n) { return n.kop ? n.kop->name() : n.name; })  // (a removed op: "")
      .def_readonly("alive", &Node::alive);


  py::class_<Graph>(m, "Graph", "The graph of primitive ops.")
      .def(py::init<>())
      .def("input", [](Graph& g, const py::iterable& s, const py::object& dt, const std::string& name) {
        return g.input(to_shape(s), dtype_of(dt), name);
      })
      .def("constant", [](Graph& g, double v, const py::object& dt) { return g.constant(v, dtype_of(dt)); })
      .def("output", &Graph::output)
      .def("unary", [](Graph& g, const std::string& op, const Edge& x) { return g.unary(op_named(op), x); })
      .def("binary", [](Graph& g, const std::string& op, const Edge& a, const Edge& b) {
        return g.binary(op_named(op), a, b);
      })
      .def("reduce", [](Graph& g, const std::string& op, const Edge& x, int axis) {
        return g.reduce(op_named(op), x, axis);
      })
      .def("iota", [](Graph& g, const py::object& e, const py::object& n) { return g.iota(to_expr(e), to_expr(n)); })
      .def("gather", &Graph::gather)
      .def("scatter", &Graph::scatter)
      .def("cast", [](Graph& g, const Edge& x, const py::object& dt) { return g.cast(x, dtype_of(dt)); })
      .def("custom", [](Graph& g, const std::string& name, const std::vector<Edge>& ins, const py::iterable& s,
                        const py::object& dt, py::function fn) {
        return g.backend_op(std::make_shared<HostOp>(name, python_kernel(name, fn)), ins, to_shape(s), dtype_of(dt));
      }, "A user's op (HostOp) run by the Python function `fn(*input_arrays, out_dtype_name)`.")
      .def("dequant", [](Graph& g, const std::string& format, const Edge& raw, const py::iterable& s) {
        auto f = quant_format(format);
        if (!f) throw std::invalid_argument("unknown quantised format '" + format + "' (Q8_0, Q4_0 or Q4_1)");
        return g.backend_op(std::make_shared<DequantOp>(*f), {raw}, to_shape(s), DType::F32);
      }, "Float32 weights unpacked from uint8 rows of GGUF blocks.")
      .def("copy", [](const Graph& g) { return Graph(g); }, "An independent copy (backend ops are shared: immutable).")
      .def("node", &Graph::node, py::return_value_policy::copy)
      .def("__len__", &Graph::size)
      .def("alive_count", &Graph::alive_count)
      .def("topo_order", &Graph::topo_order)
      .def("outputs", &Graph::outputs)
      .def("resolve", &Graph::resolve)
      .def("resolve_edge", &Graph::resolve_edge)
      .def("replace_uses", &Graph::replace_uses)
      .def("remove", &Graph::remove)
      .def("replace_uses_scalar", &Graph::replace_uses_scalar)
      .def("users", &Graph::users)
      .def("keep", &Graph::keep);

  py::class_<PyExecutor>(m, "Executor", "Runs a graph's outputs; keeps its schedule and memory plan between runs.")
      .def(py::init<const Graph&>(), py::keep_alive<1, 2>())
      .def("run", [](PyExecutor& self, const py::dict& dims, const py::dict& inputs, const py::iterable& donated) {
        const Graph& g = self.ex.graph();
        if (self.arrays.size() > inputs.size()) {  // forget inputs no longer given
          self.arrays.clear();
          self.inputs.clear();
        }
        for (auto [k, v] : inputs) {
          int64_t id = k.cast<int64_t>();
          auto it = self.arrays.find(id);
          if (it != self.arrays.end() && it->second.is(v)) continue;
          self.inputs[id] = to_buffer(v.cast<py::array>(), g.node(id).dtype);
          self.arrays[id] = py::reinterpret_borrow<py::object>(v);
        }
        std::unordered_set<int64_t> give;
        for (auto d : donated) give.insert(d.cast<int64_t>());
        Bindings b = to_bindings(dims);
        BufferMap out;
        {
          py::gil_scoped_release release;
          out = self.ex.run(b, self.inputs, give);
        }
        py::dict r;
        for (auto& [id, buf] : out) r[py::int_(id)] = to_numpy(buf);
        return r;
      }, py::arg("dims"), py::arg("inputs"), py::arg("donated") = py::tuple(),
         "Runs every Output with `inputs` ({input id: array}); `donated` input ids may be overwritten in place.")
      .def_property_readonly("arena_bytes", [](const PyExecutor& self) { return self.ex.arena_bytes(); });

  bind_compiler(m);
  bind_cuda(m);

}
