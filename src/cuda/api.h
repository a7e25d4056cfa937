// The CUDA driver API and NVRTC, opened at run time with dlopen: our own declarations of the few entry points used,
// so building needs no CUDA headers and the module imports on machines without a GPU. Every call is checked; a
// failure throws CudaError naming the call, the CUDA error and (where known) the kernel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace luminal {
namespace cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphNode = struct CUgraphNode_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUevent = struct CUevent_st*;
// CUgraphEdgeData: from_port 1 (CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC) with type 1
// (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC) lets the downstream kernel start once every upstream block has triggered.
struct GraphEdgeData {
  unsigned char from_port = 0, to_port = 0, type = 0, reserved[5] = {};
};
using nvrtcResult = int;

// cuda.h's CUDA_KERNEL_NODE_PARAMS_v2.
struct KernelNodeParams {
  CUfunction func;
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void** kernelParams;
  void** extra;
  void* kern;  // CUkernel: null (func is used)
  CUcontext ctx;  // null: the current context
};
using nvrtcProgram = struct _nvrtcProgram*;

// cuda.h's CUtensorMap: 128 opaque bytes (64-byte aligned) that cuTensorMapEncodeTiled fills and a kernel takes by
// value (the Hopper GEMM's operands).
struct alignas(64) TensorMap {
  unsigned long long words[16];
  bool operator==(const TensorMap& o) const {
    for (int k = 0; k < 16; ++k)
      if (words[k] != o.words[k]) return false;
    return true;
  }
};

// Driver entry points (the _v2 symbols where cuda.h maps a name onto one).
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);  // (a kernel's dynamic shared memory over 48 KB)
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  // Queued copies (no wait for the stream's earlier work): a run's uploads from page-locked staging, and reads.
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuMemAllocHost)(void**, size_t);  // page-locked host memory (the staging buffer of reads)
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGraphCreate)(CUgraph*, unsigned);
  CUresult (*cuGraphAddKernelNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const KernelNodeParams*);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode, const KernelNodeParams*);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  // CUDA 12.3+ (null before): edges with data, for programmatic dependent launch between kernel nodes.
  CUresult (*cuGraphAddDependencies)(CUgraph, const CUgraphNode*, const CUgraphNode*, const GraphEdgeData*, size_t);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);  // (timing the GEMM variants, runtime.cpp choose)
  // Optional (null when missing): cuBLASLt's calls captured into a graph that a chunk holds as a child graph node.
  CUresult (*cuStreamBeginCapture)(CUstream, int);  // (mode 2: CU_STREAM_CAPTURE_MODE_RELAXED)
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphAddChildGraphNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph);
  CUresult (*cuGraphExecChildGraphNodeSetParams)(CUgraphExec, CUgraphNode, CUgraph);
  // Optional (CUDA 12.0+): a tensor map of a tiled region (data type, rank, address, dims, byte strides of dims 1..,
  // box, element strides, interleave, swizzle, L2 promotion, out-of-bounds fill).
  CUresult (*cuTensorMapEncodeTiled)(TensorMap*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*, int, int, int, int);
};

struct Nvrtc {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
};

// Library search: `set_nvrtc_dirs` takes the directories Python found (the nvidia-cuda-nvrtc wheel); then
// CUDA_HOME / CUDA_PATH, then the system loader. Paths can be overridden with LUMINAL_LIBCUDA / LUMINAL_NVRTC.
void set_nvrtc_dirs(const std::vector<std::string>& dirs);
const Nvrtc& nvrtc();   // throws CudaError when NVRTC cannot be opened
const Driver& driver();  // throws CudaError when libcuda cannot be opened or initialised
std::string nvrtc_path();  // the library actually opened
int nvrtc_version();       // major * 1000 + minor * 10

// Throws CudaError "<call> failed: <CUDA_ERROR_NAME>[ in kernel <k>]" unless r is CUDA_SUCCESS.
void check(CUresult r, const char* call, const std::string& kernel = "");

// The device this process uses (device 0, its primary context made current on the calling thread).
struct Device {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  int major = 0, minor = 0, sms = 0;
  std::string name;
};
const Device& device();
std::string available_reason();  // "" when a GPU can be used, else why not

// Compiles CUDA C for `arch` (e.g. 90 -> sm_90) into a cubin, through the on-disk cache
// ($LUMINAL_CACHE or ~/.cache/luminal/cuda) keyed by a hash of source, arch, options and NVRTC version.
// A compile error throws CudaError carrying NVRTC's log and the numbered source.
std::string compile_cubin(const std::string& source, int arch, bool* cache_hit = nullptr);

}  // namespace cuda
}  // namespace luminal
