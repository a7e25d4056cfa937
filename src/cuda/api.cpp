#include "cuda/api.h"

#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace luminal {
namespace cuda {
namespace {

std::recursive_mutex mu;
std::vector<std::string> nvrtc_dirs;
std::string opened_nvrtc;

void* open_first(const std::vector<std::string>& candidates, std::string* opened, std::string* errors) {
  for (auto& c : candidates) {
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (opened) *opened = c;
      return h;
    }
    const char* e = dlerror();
    *errors += "\n  " + c + ": " + (e ? e : "not found");
  }
  return nullptr;
}

template <class F>
void bind(void* lib, F& fn, const char* name, const char* lib_name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) throw CudaError(std::string(lib_name) + " lacks the entry point " + name);
}

const char* kNvrtcNames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

Nvrtc load_nvrtc() {
  std::vector<std::string> cands;
  const char* forced = std::getenv("LUMINAL_NVRTC");  // when set, the only candidate
  if (forced) cands.push_back(forced);
  if (!forced)
  for (auto& d : nvrtc_dirs)
    for (auto n : kNvrtcNames) cands.push_back(d + "/" + n);
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = forced ? nullptr : std::getenv(env))
      for (auto n : kNvrtcNames) {
        cands.push_back(std::string(root) + "/lib64/" + n);
        cands.push_back(std::string(root) + "/lib/" + n);
      }
  if (!forced)
    for (auto n : kNvrtcNames) cands.push_back(n);  // the system loader
  std::string errors;
  void* h = open_first(cands, &opened_nvrtc, &errors);
  if (!h)
    throw CudaError("cannot open NVRTC (install the nvidia-cuda-nvrtc wheel, or set CUDA_HOME or LUMINAL_NVRTC); tried:" +
                    errors);
  // NVRTC opens its builtins library by name at compile time; a wheel's folder is not on the loader's path, so
  // load it from beside libnvrtc first (a later dlopen by name then finds it loaded).
  size_t slash = opened_nvrtc.rfind('/');
  if (slash != std::string::npos) {
    glob_t gl;
    if (glob((opened_nvrtc.substr(0, slash) + "/libnvrtc-builtins.so.*").c_str(), 0, nullptr, &gl) == 0) {
      for (size_t i = 0; i < gl.gl_pathc; ++i)
        if (!std::strstr(gl.gl_pathv[i], ".alt.")) dlopen(gl.gl_pathv[i], RTLD_NOW | RTLD_LOCAL);
      globfree(&gl);
    }
  }
  Nvrtc n;
  const char* L = "NVRTC";
  bind(h, n.nvrtcVersion, "nvrtcVersion", L);
  bind(h, n.nvrtcCreateProgram, "nvrtcCreateProgram", L);
  bind(h, n.nvrtcCompileProgram, "nvrtcCompileProgram", L);
  bind(h, n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", L);
  bind(h, n.nvrtcGetProgramLog, "nvrtcGetProgramLog", L);
  bind(h, n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize", L);
  bind(h, n.nvrtcGetCUBIN, "nvrtcGetCUBIN", L);
  bind(h, n.nvrtcDestroyProgram, "nvrtcDestroyProgram", L);
  bind(h, n.nvrtcGetErrorString, "nvrtcGetErrorString", L);
  return n;
}

Driver load_driver() {
  std::vector<std::string> cands;
  if (const char* p = std::getenv("LUMINAL_LIBCUDA")) cands.push_back(p);
  else cands = {"libcuda.so.1", "libcuda.so"};
  std::string errors;
  void* h = open_first(cands, nullptr, &errors);
  if (!h) throw CudaError("cannot open the CUDA driver library (no NVIDIA driver on this machine?); tried:" + errors);
  Driver d;
  const char* L = "libcuda";
  bind(h, d.cuInit, "cuInit", L);
  bind(h, d.cuDriverGetVersion, "cuDriverGetVersion", L);
  bind(h, d.cuDeviceGetCount, "cuDeviceGetCount", L);
  bind(h, d.cuDeviceGet, "cuDeviceGet", L);
  bind(h, d.cuDeviceGetName, "cuDeviceGetName", L);
  bind(h, d.cuDeviceGetAttribute, "cuDeviceGetAttribute", L);
  bind(h, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", L);
  bind(h, d.cuCtxSetCurrent, "cuCtxSetCurrent", L);
  bind(h, d.cuCtxSynchronize, "cuCtxSynchronize", L);
  bind(h, d.cuModuleLoadData, "cuModuleLoadData", L);
  bind(h, d.cuModuleGetFunction, "cuModuleGetFunction", L);
  bind(h, d.cuFuncSetAttribute, "cuFuncSetAttribute", L);
  bind(h, d.cuMemAlloc, "cuMemAlloc_v2", L);
  bind(h, d.cuMemFree, "cuMemFree_v2", L);
  bind(h, d.cuMemcpyHtoD, "cuMemcpyHtoD_v2", L);
  bind(h, d.cuMemcpyDtoH, "cuMemcpyDtoH_v2", L);
  bind(h, d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", L);
  bind(h, d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", L);
  bind(h, d.cuStreamCreate, "cuStreamCreate", L);
  bind(h, d.cuStreamSynchronize, "cuStreamSynchronize", L);
  bind(h, d.cuEventCreate, "cuEventCreate", L);
  bind(h, d.cuEventRecord, "cuEventRecord", L);
  bind(h, d.cuEventSynchronize, "cuEventSynchronize", L);
  bind(h, d.cuEventDestroy, "cuEventDestroy_v2", L);
  bind(h, d.cuMemAllocHost, "cuMemAllocHost_v2", L);
  bind(h, d.cuMemFreeHost, "cuMemFreeHost", L);
  bind(h, d.cuMemcpyDtoD, "cuMemcpyDtoD_v2", L);
  bind(h, d.cuMemsetD8, "cuMemsetD8_v2", L);
  bind(h, d.cuMemGetInfo, "cuMemGetInfo_v2", L);
  bind(h, d.cuLaunchKernel, "cuLaunchKernel", L);
  bind(h, d.cuGetErrorName, "cuGetErrorName", L);
  bind(h, d.cuGraphCreate, "cuGraphCreate", L);
  bind(h, d.cuGraphAddKernelNode, "cuGraphAddKernelNode_v2", L);
  bind(h, d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", L);
  bind(h, d.cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2", L);
  bind(h, d.cuGraphLaunch, "cuGraphLaunch", L);
  bind(h, d.cuGraphExecDestroy, "cuGraphExecDestroy", L);
  bind(h, d.cuGraphDestroy, "cuGraphDestroy", L);
  bind(h, d.cuEventElapsedTime, "cuEventElapsedTime", L);
  d.cuGraphAddDependencies = reinterpret_cast<decltype(d.cuGraphAddDependencies)>(dlsym(h, "cuGraphAddDependencies_v2"));
  d.cuStreamBeginCapture = reinterpret_cast<decltype(d.cuStreamBeginCapture)>(dlsym(h, "cuStreamBeginCapture_v2"));
  d.cuStreamEndCapture = reinterpret_cast<decltype(d.cuStreamEndCapture)>(dlsym(h, "cuStreamEndCapture"));
  d.cuGraphAddChildGraphNode = reinterpret_cast<decltype(d.cuGraphAddChildGraphNode)>(dlsym(h, "cuGraphAddChildGraphNode"));
  d.cuGraphExecChildGraphNodeSetParams =
      reinterpret_cast<decltype(d.cuGraphExecChildGraphNodeSetParams)>(dlsym(h, "cuGraphExecChildGraphNodeSetParams"));
  d.cuTensorMapEncodeTiled = reinterpret_cast<decltype(d.cuTensorMapEncodeTiled)>(dlsym(h, "cuTensorMapEncodeTiled"));
  return d;
}

// Loaded once; a failure is remembered and rethrown (the reason does not change within a process).
template <class T>
struct Lazy {
  bool tried = false;
  std::string error;
  T value{};
  template <class F>
  const T& get(F load) {
    std::lock_guard<std::recursive_mutex> l(mu);
    if (!tried) {
      tried = true;
      try { value = load(); } catch (const std::exception& e) { error = e.what(); }
    }
    if (!error.empty()) throw CudaError(error);
    return value;
  }
};
Lazy<Nvrtc> nvrtc_lib;
Lazy<Driver> driver_lib;
Lazy<Device> the_device;

// Two independent 64-bit FNV-1a hashes: a 128-bit cache key.
std::string hash_key(const std::string& s) {
  uint64_t a = 1469598103934665603ull, b = 1099511628211ull * 7919;
  for (unsigned char c : s) {
    a = (a ^ c) * 1099511628211ull;
    b = (b ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
  return buf;
}

std::string cache_dir() {
  if (const char* c = std::getenv("LUMINAL_CACHE")) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/luminal/cuda";
}

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
}

// iostreams are avoided in this backend: a host process may hold another libstdc++ whose locale facets do not match
// the ones compiled in here (seen: a crash formatting an int inside a process that had imported torch).
std::string numbered(const std::string& src) {
  std::string out;
  int n = 1;
  size_t start = 0;
  while (start < src.size()) {
    size_t end = src.find('\n', start);
    if (end == std::string::npos) end = src.size();
    out += std::to_string(n++) + "\t" + src.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

bool read_file(const std::string& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[1 << 16];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, k);
  std::fclose(f);
  return !out->empty();
}

}  // namespace

void set_nvrtc_dirs(const std::vector<std::string>& dirs) {
  std::lock_guard<std::recursive_mutex> l(mu);
  nvrtc_dirs = dirs;
}

const Nvrtc& nvrtc() { return nvrtc_lib.get(load_nvrtc); }
const Driver& driver() { return driver_lib.get(load_driver); }

std::string nvrtc_path() {
  nvrtc();
  return opened_nvrtc;
}

int nvrtc_version() {
  int major = 0, minor = 0;
  nvrtc().nvrtcVersion(&major, &minor);
  return major * 1000 + minor * 10;
}

void check(CUresult r, const char* call, const std::string& kernel) {
  if (r == 0) return;
  const char* name = nullptr;
  if (driver_lib.tried && driver_lib.error.empty()) driver_lib.value.cuGetErrorName(r, &name);
  std::string msg = std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(r));
  if (!kernel.empty()) msg += " (kernel " + kernel + ")";
  throw CudaError(msg);
}

const Device& device() {
  return the_device.get([] {
    const Driver& d = driver();
    check(d.cuInit(0), "cuInit");
    int count = 0;
    check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) throw CudaError("the CUDA driver sees no GPU");
    Device dev;
    check(d.cuDeviceGet(&dev.dev, 0), "cuDeviceGet");
    char name[256] = {0};
    check(d.cuDeviceGetName(name, sizeof name, dev.dev), "cuDeviceGetName");
    dev.name = name;
    check(d.cuDeviceGetAttribute(&dev.major, 75, dev.dev), "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
    check(d.cuDeviceGetAttribute(&dev.minor, 76, dev.dev), "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
    check(d.cuDeviceGetAttribute(&dev.sms, 16, dev.dev), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
    check(d.cuDevicePrimaryCtxRetain(&dev.ctx, dev.dev), "cuDevicePrimaryCtxRetain");
    check(d.cuCtxSetCurrent(dev.ctx), "cuCtxSetCurrent");
    if (dev.major < 8)
      throw CudaError("GPU " + dev.name + " has compute capability " + std::to_string(dev.major) + "." +
                      std::to_string(dev.minor) + "; luminal's CUDA backend needs 8.0 or newer");
    return dev;
  });
}

std::string available_reason() {
  try {
    device();
    nvrtc();
    return "";
  } catch (const CudaError& e) {
    return e.what();
  }
}

std::string compile_cubin(const std::string& source, int arch, bool* cache_hit) {
  const Nvrtc& n = nvrtc();
  // (sm_90 as sm_90a: its wgmma instructions exist only there; such a cubin runs on sm_90 devices alone)
  std::string arch_opt = "--gpu-architecture=sm_" + std::to_string(arch) + (arch == 90 ? "a" : "");
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "-default-device"};
  std::string key = hash_key(source + "\n" + arch_opt + " --std=c++17 -default-device\nnvrtc " +
                             std::to_string(nvrtc_version()));
  std::string dir = cache_dir(), path = dir + "/" + key + ".cubin";
  {
    std::string bin;
    if (read_file(path, &bin)) {
      if (cache_hit) *cache_hit = true;
      return bin;
    }
  }
  if (cache_hit) *cache_hit = false;
  nvrtcProgram prog = nullptr;
  auto nv_check = [&](nvrtcResult r, const char* call) {
    if (r != 0) throw CudaError(std::string(call) + " failed: " + n.nvrtcGetErrorString(r));
  };
  nv_check(n.nvrtcCreateProgram(&prog, source.c_str(), "luminal.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  nvrtcResult r = n.nvrtcCompileProgram(prog, 3, opts);
  size_t log_size = 0;
  n.nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size) n.nvrtcGetProgramLog(prog, &log[0]);
  while (!log.empty() && log.back() == '\0') log.pop_back();  // the size counts the terminator
  if (r != 0) {
    n.nvrtcDestroyProgram(&prog);
    throw CudaError(std::string("NVRTC could not compile the generated kernels for sm_") + std::to_string(arch) +
                    " (" + n.nvrtcGetErrorString(r) + "):\n" + log + "\n---- source ----\n" + numbered(source));
  }
  size_t size = 0;
  nv_check(n.nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  std::string bin(size, '\0');
  nv_check(n.nvrtcGetCUBIN(prog, &bin[0]), "nvrtcGetCUBIN");
  n.nvrtcDestroyProgram(&prog);
  // Write to a temporary name and rename, so a concurrent reader never sees half a file.
  make_dirs(dir);
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "wb")) {
    bool ok = std::fwrite(bin.data(), 1, bin.size(), f) == bin.size();
    ok = std::fclose(f) == 0 && ok;
    if (ok) std::rename(tmp.c_str(), path.c_str());
    else std::remove(tmp.c_str());
  }  // an unwritable cache only costs a recompile next time
  return bin;
}

}  // namespace cuda
}  // namespace luminal
