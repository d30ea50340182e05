// Host entries of Linear's FP32 bias helpers on CUDA (kernels/gemm.h, kernels in
// bias_kernels.cu): make the tensors' device current and enqueue on ctx.stream.
#include "absl/status/status.h"
#include "core/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm/bias_kernels.h"
#include "kernels/cuda/gemm/gemm_cuda.h"
#include "kernels/cuda/device_entry.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y) {
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(y->device().index));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAddBias(bias.data<float>(), y->dim(0), y->dim(1), y->data<float>(),
                                             StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out) {
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(out->device().index));
  // Double partials, one row per chunk of rows, in stream-ordered scratch.
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty(DType::kInt64, {ColumnSumScratch(x.dim(0), x.dim(1))}, out->device(),
                                                 ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchColumnSum(x.data<float>(), x.dim(0), x.dim(1), accumulate,
                                               static_cast<double*>(scratch.raw_data()), out->data<float>(),
                                               StreamOf(ctx)));
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
