// Bindings of the CUDA backend: availability, code generation (no GPU needed), NVRTC compilation, device arrays
// and the runtime. CUDA failures raise luminal.CudaError.
#include <map>
#include <optional>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/plan.h"
#include "cuda/api.h"
#include "cuda/codegen.h"
#include "cuda/contraction.h"
#include "cuda/cublaslt.h"
#include "cuda/runtime.h"

namespace py = pybind11;

namespace luminal {
namespace {

py::dtype np_dtype(DType d) {
  switch (d) {
    case DType::F32: return py::dtype::of<float>();
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype::of<uint16_t>();  // raw bits, as everywhere else
    case DType::I32: return py::dtype::of<int32_t>();
    case DType::U8: return py::dtype::of<uint8_t>();
    case DType::Bool: return py::dtype::of<bool>();
  }
  return py::dtype::of<float>();
}

Bindings bindings_of(const py::dict& d) {
  Bindings b;
  for (auto [k, v] : d) b[k.cast<std::string>()] = v.cast<int64_t>();
  return b;
}

std::string repr(const cuda::DeviceArray& a) {
  std::string s = "DeviceArray(shape=(";
  for (size_t i = 0; i < a.shape.size(); ++i) s += std::to_string(a.shape[i]) + (a.shape.size() == 1 || i + 1 < a.shape.size() ? "," : "");
  return s + "), dtype=" + dtype_name(a.dtype) + ")";
}

}  // namespace

void bind_cuda(py::module_& m) {
  using namespace cuda;
  py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
  m.def("cuda_set_nvrtc_dirs", &set_nvrtc_dirs, "Directories searched first for libnvrtc (the nvidia-cuda-nvrtc wheel).");
  m.def("cuda_unavailable_reason", &available_reason, "'' when a CUDA GPU can be used, else why not.");
  m.def("cuda_contraction_layout", [](const std::vector<int64_t>& shape, const std::vector<int64_t>& a_strides,
                                      const std::vector<int64_t>& b_strides, int axes, int bk, bool can_split, int sms) {
    ConcreteView a, b;
    a.shape = b.shape = shape;
    a.strides = a_strides;
    b.strides = b_strides;
    std::vector<int64_t> slots(size_t(contraction_extra(int(shape.size()) - axes)));
    unsigned grid[3] = {0, 0, 0};
    bool ok = contraction_layout(a, b, axes, bk, can_split, sms, slots.data(), grid);
    return py::make_tuple(ok, slots, py::make_tuple(grid[0], grid[1], grid[2]));
  }, "What a Contraction's implicit-GEMM kernels read after their views, and their grid (cuda/contraction.h; tests).");
  m.def("cuda_set_cublas_dirs", &set_cublas_dirs, "Directories searched first for libcublasLt (the nvidia-cublas wheels).");
  m.def("cublas_unavailable_reason", &blas_unavailable_reason, "'' when cuBLASLt opened, else why not.");
  m.def("cublas_path", &blas_path, "The cuBLASLt library opened and its version ('' if none).");
  m.def("cublas_copy_source", [](const std::string& from, const std::string& to) {
    return blas_copy_source(dtype_from_name(from), dtype_from_name(to));
  }, "The kernels copying a cuBLASLt operand into its workspace (NVRTC source without the prelude; tests).");
  m.def("cublas_q8_source", [](const std::string& to) { return blas_q8_source(dtype_from_name(to)); },
        "The kernel dequantising Q8_0 weight rows into cuBLASLt's workspace (NVRTC source without the prelude; tests).");
  m.def("cublas_copy_layout", [](const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                                 uint64_t in_addr, const std::string& from, int sms) {
    BlasCopy c = blas_copy_layout(shape, strides, in_addr, dtype_from_name(from), sms);
    return py::make_tuple(c.vec, c.rows, c.K, c.rank, std::vector<int64_t>(c.n, c.n + 8),
                          std::vector<int64_t>(c.s, c.s + 8), py::make_tuple(c.grid[0], c.grid[1]));
  }, "How that copy is launched: (vec, rows, K, rank, sizes, strides, grid) (tests).");
  m.def("cuda_device", [] {
    const Device& d = device();
    return py::dict(py::arg("name") = d.name, py::arg("compute_capability") = d.major * 10 + d.minor,
                    py::arg("multiprocessors") = d.sms);
  });
  m.def("nvrtc_path", &nvrtc_path);
  m.def("cuda_prelude", [] { return std::string(prelude()); });
  m.def("cuda_div_magic", &div_magic, "A dim's divider in a kernel's parameters (div_magic in cuda/codegen.h)");
  m.def("nvrtc_version", &nvrtc_version);
  m.def("cuda_compile", [](const std::string& src, int arch) {
    std::string bin;
    bool hit = false;
    {
      py::gil_scoped_release release;
      bin = compile_cubin(src, arch, &hit);
    }
    return py::make_tuple(py::bytes(bin), hit);
  }, py::arg("source"), py::arg("arch"), "Compiles CUDA C to a cubin for sm_<arch> (through the disk cache): (cubin, cache hit).");

  py::class_<Module>(m, "CudaSchedule", "The kernels and steps generated for a graph (no GPU needed).")
      .def_readonly("source", &Module::source)
      .def_readonly("kernel_texts", &Module::kernels)
      .def_readonly("q8_split", &Module::q8_split,
                    "Input nodes of Q8_0 weights the kernels read split: quants' rows, then scales' (q8_layout.h).")
      .def("storage_dtype", [](const Module& s, int64_t id) { return std::string(dtype_name(s.storage().at(id))); })
      .def("kernels", [](const Module& s) {
        py::list out;  // (node, [(variant, kernel name)], the Scatter rows' kernel or "")
        for (size_t i = 0; i < s.steps.size(); ++i) {
          if (s.sched.steps[i].kind != luminal::Step::Kernel) continue;
          py::list vs;
          for (auto& v : s.steps[i].variants) vs.append(py::make_tuple(variant_name(v.kind), v.fn));
          out.append(py::make_tuple(s.sched.steps[i].node, vs, s.steps[i].rows_fn));
        }
        return out;
      }, "Each kernel step: its node, its variants in order of preference (kind, kernel), a Scatter's rows kernel.")
      .def("prep_kernels", [](const Module& s) {
        py::dict out;  // node -> the kernel its variant may launch first (QDot's quantising, FlashMmaSkip's mask summary)
        for (size_t i = 0; i < s.steps.size(); ++i)
          if (!s.steps[i].prep_fn.empty()) out[py::int_(s.sched.steps[i].node)] = s.steps[i].prep_fn;
        return out;
      }, "Kernel steps whose variant launches a kernel before its own: node -> that kernel's name.")
      .def("kernel_ops", [](const Module& s, const Graph& g) {
        // Every kernel name -> the op kind(s) of the steps that may launch it (for profiles).
        std::map<std::string, std::string> out;
        auto add = [&](const std::string& name, const std::string& what) {
          std::string& o = out[name];
          if (o.find(what) == std::string::npos) o += (o.empty() ? "" : ",") + what;
        };
        for (size_t i = 0; i < s.steps.size(); ++i) {
          if (s.sched.steps[i].kind != luminal::Step::Kernel) continue;
          std::string op = op_label(g.node(s.sched.steps[i].node));
          for (auto& v : s.steps[i].variants) add(v.fn, op + "/" + variant_name(v.kind));
          if (!s.steps[i].rows_fn.empty()) add(s.steps[i].rows_fn, op + "/rows");
          if (!s.steps[i].prep_fn.empty()) add(s.steps[i].prep_fn, op + "/prep");
          if (!s.steps[i].combine_fn.empty()) add(s.steps[i].combine_fn, op + "/combine");
        }
        for (size_t k = 0; k < s.sched.groups.size(); ++k) {  // "MatMul x3/group", "Fused+Scatter x2/batch"
          const luminal::Group& G = s.sched.groups[k];
          if (G.kind == luminal::Group::MatVec) {
            add(s.group_fns[k], std::string(G.prologue >= 0 ? "Fused+" : "") + "MatMul x" + std::to_string(G.members.size()) +
                                    (G.epilogues.empty() ? "" : "+Fused") + "/group");
            continue;
          }
          std::string what;
          for (size_t i : G.batch) {
            std::string op = op_label(g.node(s.sched.steps[i].node));
            if (what.find(op) == std::string::npos) what += (what.empty() ? "" : "+") + op;
          }
          add(s.group_fns[k], what + " x" + std::to_string(G.batch.size()) + "/batch");
        }
        return out;
      })
      .def("add_epilogues", [](const Module& s) {
        py::list out;  // (product, Add): products whose only reader adds them to another tensor (Step::add_epilogue)
        for (auto& st : s.sched.steps)
          if (st.add_epilogue >= 0) out.append(py::make_tuple(st.node, st.add_epilogue));
        return out;
      }, "Products that cuBLASLt may add into their only reader, an Add: (product node, Add node).")
      .def("groups", [](const Module& s) {
        py::list out;  // (kernel, node ids): steps that run as one kernel
        for (size_t k = 0; k < s.sched.groups.size(); ++k) {
          std::vector<int64_t> ids;
          if (s.sched.groups[k].prologue >= 0) ids.push_back(s.sched.steps[size_t(s.sched.groups[k].prologue)].node);
          for (size_t i = s.sched.groups[k].first; i <= s.sched.groups[k].last; ++i) ids.push_back(s.sched.steps[i].node);
          out.append(py::make_tuple(s.group_fns[k], ids));
        }
        return out;
      }, "Steps that run as one kernel: (its name, their node ids), matrix-vector groups (a prologue's step first) and "
         "batches.")
      .def("host_steps", [](const Module& s) {
        std::vector<int64_t> out;
        for (auto& st : s.sched.steps)
          if (st.kind == luminal::Step::Host) out.push_back(st.node);
        return out;
      });
  m.def("cuda_generate", [](const Graph& g, const std::string& dtype, bool host_fallback) {
    return generate(g, dtype_from_name(dtype), host_fallback);
  }, py::arg("graph"), py::arg("dtype"), py::arg("host_fallback") = false);

  py::class_<Plan>(m, "CudaPlan", "The CUDA runtime's plan of a schedule (core/plan.h), with no GPU: update(dims) "
                                  "raises what a run with those dims would and returns the arena's bytes (tests).")
      .def(py::init([](const Graph& g, const Module& s) { return new Plan(g, s.sched); }), py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def("update", [](Plan& p, const py::dict& dims) {
        p.update(bindings_of(dims));  // (evaluates again only the steps whose dims changed, as a run does)
        return p.arena_bytes();
      });

  py::class_<DeviceArray>(m, "DeviceArray", "An array in GPU memory: a graph output, or data for Graph.set.")
      .def_property_readonly("shape", [](const DeviceArray& a) { return py::tuple(py::cast(a.shape)); })
      .def_property_readonly("dtype", [](const DeviceArray& a) { return std::string(dtype_name(a.dtype)); })
      .def_property_readonly("nbytes", &DeviceArray::nbytes)
      .def_property_readonly("ptr", [](const DeviceArray& a) { return uintptr_t(a.buf ? a.buf->ptr : 0); },
                             "The device address (e.g. to check that a run updated an array in place).")
      .def_property_readonly("ndim", [](const DeviceArray& a) { return a.shape.size(); })
      .def("numpy", [](const DeviceArray& a) {
        std::vector<py::ssize_t> shape(a.shape.begin(), a.shape.end());
        py::array out(np_dtype(a.dtype), shape);
        void* host = out.mutable_data();
        {
          py::gil_scoped_release release;  // (may wait for the run that writes it)
          download(a, host);
        }
        return out;
      }, "Copies the data to the host (bfloat16 as raw uint16 bits).")
      .def("astype", [](const DeviceArray& a, const std::string& d) { return convert(a, dtype_from_name(d)); })
      .def("__repr__", &repr);
  m.def("cuda_upload", [](py::array arr, const std::string& dtype) {
    DType d = dtype_from_name(dtype);
    py::array c = py::array::ensure(arr, py::array::c_style);
    if (!c || size_t(c.itemsize()) != dtype_size(d))
      throw std::invalid_argument(std::string("cuda_upload: array item size does not match ") + dtype_name(d));
    std::vector<int64_t> shape(c.shape(), c.shape() + c.ndim());
    return upload(c.data(), d, shape);
  });

  m.def("cuda_copy_from_device", [](uintptr_t ptr, const std::vector<int64_t>& shape, const std::string& dtype) {
    DeviceArray a;
    a.dtype = dtype_from_name(dtype);
    a.shape = shape;
    a.buf = device_alloc(a.nbytes());
    if (a.nbytes()) check(driver().cuMemcpyDtoD(a.buf->ptr, CUdeviceptr(ptr), a.nbytes()), "cuMemcpyDtoD");
    return a;
  }, "A device copy of `shape` elements of `dtype` at a device address of this process's context.");

  m.def("cuda_borrow", [](uintptr_t ptr, const std::vector<int64_t>& shape, const std::string& dtype,
                          py::object owner) {
    DeviceArray a;
    a.dtype = dtype_from_name(dtype);
    a.shape = shape;
    a.buf = std::make_shared<DeviceBuffer>(CUdeviceptr(ptr), a.nbytes());
    // The owner (a torch tensor) lives as long as the buffer; it may be let go without the GIL held.
    a.buf->owner = std::shared_ptr<void>(new py::object(std::move(owner)), [](void* o) {
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(o);
    });
    return a;
  }, "`shape` elements of `dtype` at a device address of this process's context, read in place (no copy); "
     "`owner` is kept alive while luminal holds the array.");

  py::class_<Runtime>(m, "CudaRuntime")
      .def(py::init([](const Graph& g, const Module& s) { return new Runtime(g, s); }))
      .def("in_place_inputs", &Runtime::in_place_inputs)
      .def("last_launches", &Runtime::last_launches, "Kernels the last run launched (or replayed in its CUDA graph).")
      .def("last_variants", &Runtime::last_variants, "node -> the variant each kernel step of the last run chose.")
      .def("last_times", &Runtime::last_times, "Host seconds of the last run: (plan, record, replay, wait for the device).")
      .def("run", [](Runtime& rt, const py::dict& inputs, const py::dict& dims, const std::vector<int64_t>& donated,
                     std::optional<py::dict> kept, bool wait) {
        std::unordered_map<int64_t, DeviceArray> in;
        for (auto [k, v] : inputs) in[k.cast<int64_t>()] = v.cast<DeviceArray>();
        Bindings b = bindings_of(dims);
        std::unordered_map<int64_t, DeviceArray> out;
        {
          py::gil_scoped_release release;  // host steps retake it for Python kernels
          out = rt.run(in, b, donated, wait);
        }
        // A result that is the same array as the object kept from the run before (a KV cache updated in place)
        // comes back as that object: a decode step then makes one new Python object (the logits), not ~65.
        py::dict r;
        for (auto& [id, a] : out) {
          py::int_ key(id);
          if (kept) {
            PyObject* o = PyDict_GetItem(kept->ptr(), key.ptr());  // borrowed; null when absent
            if (o && py::isinstance<DeviceArray>(o)) {
              const DeviceArray& old = py::handle(o).cast<const DeviceArray&>();
              if (old.buf == a.buf && old.shape == a.shape && old.dtype == a.dtype) {
                r[key] = py::handle(o);
                continue;
              }
            }
          }
          r[key] = py::cast(std::move(a));
        }
        if (kept) {  // keeps only those updated in place: holding any other result would delay its buffer's reuse
          kept->clear();
          for (int64_t id : rt.last_in_place_outputs()) {
            py::int_ key(id);
            (*kept)[key] = r[key];
          }
        }
        return r;
      }, py::arg("inputs"), py::arg("dims"), py::arg("donated") = std::vector<int64_t>{}, py::arg("kept") = py::none(),
      py::arg("wait") = true,
      "Runs with `inputs` (only those changed since the last run are needed) and returns {output id: DeviceArray}. "
      "`wait=False` returns once the run is queued: reading a result waits for it (and raises its device-side "
      "error). "
      "`kept` (a dict the caller keeps between runs) holds the results updated in place; a result that is the same "
      "array as the one kept is returned as that same object.");
}

}  // namespace luminal
