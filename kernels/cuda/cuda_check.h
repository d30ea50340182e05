// TESERVE_CUDA_RETURN_IF_ERROR: turns a failed CUDA runtime call into an absl::Status
// that carries the statement, file and line, so a failure deep in a kernel launcher
// reaches the RPC handler as a readable error instead of an abort. Host (.cc) code
// only: .cu files stay free of abseil and return cudaError_t to their callers.
#ifndef TESERVE_KERNELS_CUDA_CUDA_CHECK_H_
#define TESERVE_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Status code for a CUDA error: out of memory is RESOURCE_EXHAUSTED, a missing or
// unusable GPU/driver is FAILED_PRECONDITION, bad arguments are INVALID_ARGUMENT,
// everything else (launch failures, illegal addresses) is INTERNAL.
inline absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

inline absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view statement,
                                      absl::string_view file, int line) {
  return absl::Status(CudaErrorCode(error),
                      absl::StrCat("CUDA error ", cudaGetErrorName(error), " (",
                                   cudaGetErrorString(error), ") in `", statement, "` at ",
                                   file, ":", line));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#define TESERVE_CUDA_RETURN_IF_ERROR(statement)                                          \
  do {                                                                                   \
    const cudaError_t teserve_cuda_error_ = (statement);                                 \
    if (teserve_cuda_error_ != cudaSuccess) {                                            \
      return ::teserve::kernels::cuda::CudaErrorToStatus(teserve_cuda_error_, #statement, \
                                                         __FILE__, __LINE__);            \
    }                                                                                    \
  } while (0)

#endif  // TESERVE_KERNELS_CUDA_CUDA_CHECK_H_
