// QueryDeviceInfo (kernels/device_info.h).
//
// Design choices:
// - The CUDA runtime and cuBLASLt are linked (the CUDA backend needs them anyway); on a
//   machine without a driver, cudaGetDeviceCount returns an error instead of failing,
//   and that error becomes no_gpu_reason.
// - cuDNN and NCCL are only reported, never required: they are opened with dlopen and
//   their version functions looked up with dlsym, so the server starts on machines that
//   lack them (the version stays empty). The handles are closed right away.
// - CPU builds (TESERVE_WITH_CUDA=0) compile none of this and say why gpu_count is 0.
#include "kernels/device_info.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if TESERVE_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/attention/cudnn_attention.h"
#include "kernels/cuda/gemm/gemm_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

#if TESERVE_WITH_CUDA

// CUDA encodes versions as 1000 * major + 10 * minor ("13.0" for 13000).
std::string CudaVersionString(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// cuBLASLt, cuDNN 9 and NCCL encode versions as 10000 * major + 100 * minor + patch.
std::string MajorMinorPatchString(size_t version) {
  return absl::StrCat(version / 10000, ".", (version / 100) % 100, ".", version % 100);
}

// Closes a dlopen handle when it goes out of scope.
class SharedLibrary {
 public:
  explicit SharedLibrary(const char* name) : handle_(dlopen(name, RTLD_LAZY | RTLD_LOCAL)) {}
  ~SharedLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  void* Symbol(const char* name) const {
    return handle_ == nullptr ? nullptr : dlsym(handle_, name);
  }

 private:
  void* handle_;
};

std::string CudnnVersion() {
  const SharedLibrary cudnn("libcudnn.so.9");
  using GetVersionFn = size_t (*)();
  const auto get_version = reinterpret_cast<GetVersionFn>(cudnn.Symbol("cudnnGetVersion"));
  if (get_version == nullptr) return "";
  return MajorMinorPatchString(get_version());
}

std::string NcclVersion() {
  const SharedLibrary nccl("libnccl.so.2");
  using GetVersionFn = int (*)(int*);  // ncclResult_t ncclGetVersion(int*); 0 = success
  const auto get_version = reinterpret_cast<GetVersionFn>(nccl.Symbol("ncclGetVersion"));
  int version = 0;
  if (get_version == nullptr || get_version(&version) != 0 || version <= 0) return "";
  return MajorMinorPatchString(static_cast<size_t>(version));
}

void FillCudaInfo(DeviceInfo& info) {
  info.cuda_compiled = true;
  int runtime_version = 0;
  if (cudaRuntimeGetVersion(&runtime_version) == cudaSuccess) {
    info.cuda_runtime_version = CudaVersionString(runtime_version);
  }
  int driver_version = 0;
  if (cudaDriverGetVersion(&driver_version) == cudaSuccess && driver_version > 0) {
    info.driver_version = CudaVersionString(driver_version);
  }
  info.cublaslt_version = MajorMinorPatchString(cublasLtGetVersion());
  info.cudnn_version = CudnnVersion();
  info.nccl_version = NcclVersion();

  int count = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&count);
  if (count_status != cudaSuccess) {
    // Clear the (non-sticky) error so later CUDA calls on this thread start clean.
    cudaGetLastError();
    info.no_gpu_reason = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(count_status),
                                      " (", cudaGetErrorString(count_status), ")");
    return;
  }
  if (count == 0) {
    info.no_gpu_reason = "the CUDA driver reports no devices";
    return;
  }
  cudaDeviceProp props;
  const cudaError_t props_status = cudaGetDeviceProperties(&props, 0);
  if (props_status != cudaSuccess) {
    cudaGetLastError();
    info.no_gpu_reason = absl::StrCat("cudaGetDeviceProperties(0) failed: ",
                                      cudaGetErrorName(props_status), " (",
                                      cudaGetErrorString(props_status), ")");
    return;
  }
  info.gpu_count = count;
  info.device_name = props.name;
  info.cc_major = props.major;
  info.cc_minor = props.minor;
}

#endif  // TESERVE_WITH_CUDA

}  // namespace

DeviceInfo QueryDeviceInfo() {
  DeviceInfo info;
#if TESERVE_WITH_CUDA
  FillCudaInfo(info);
#else
  info.cuda_compiled = false;
  info.no_gpu_reason = "teserve was built without CUDA (--config=cpu or no toolkit found)";
#endif
  return info;
}

absl::StatusOr<DeviceMemory> QueryDeviceMemory(int index) {
#if TESERVE_WITH_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t status = cudaSetDevice(index);
  if (status == cudaSuccess) status = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cudaMemGetInfo on cuda:", index, " failed: ",
                                               cudaGetErrorName(status)));
  }
  DeviceMemory memory;
  memory.total_bytes = static_cast<int64_t>(total_bytes);
  memory.used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
  absl::StatusOr<cuda::DevicePoolMemory> pool = cuda::PoolMemory(index);
  if (pool.ok()) {
    memory.pool_reserved_bytes = static_cast<int64_t>(pool->reserved);
    memory.pool_used_bytes = static_cast<int64_t>(pool->used);
  }
  return memory;
#else
  return absl::FailedPreconditionError(
      absl::StrCat("device memory of cuda:", index, ": teserve was built without CUDA"));
#endif
}

absl::StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::Create(int device_index) {
#if TESERVE_WITH_CUDA
  // A session on the device allocates tensors there before any op runs.
  cuda::RegisterCudaAllocator();
  int previous = 0;
  cudaGetDevice(&previous);
  cudaError_t status = cudaSetDevice(device_index);
  cudaStream_t stream = nullptr;
  if (status == cudaSuccess) status = cudaStreamCreate(&stream);
  cudaSetDevice(previous);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cannot create a stream on cuda:", device_index, ": ",
                                               cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"));
  }
  return std::unique_ptr<DeviceStream>(new DeviceStream(device_index, stream));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("a stream on cuda:", device_index, ": teserve was built without CUDA"));
#endif
}

DeviceStream::~DeviceStream() {
#if TESERVE_WITH_CUDA
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  cudaStreamSynchronize(stream);
  cuda::ReleaseGemmWorkspace(device_index_, stream_);
  cuda::ReleaseCudnnHandle(device_index_, stream_);
  cudaStreamDestroy(stream);
#endif
}

absl::Status DeviceStream::Synchronize() const {
#if TESERVE_WITH_CUDA
  const cudaError_t status = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (status != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamSynchronize on cuda:", device_index_, ": ",
                                            cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"));
  }
#endif
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace teserve
