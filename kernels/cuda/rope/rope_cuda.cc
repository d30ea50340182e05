// Host side of the CUDA RoPE: cu_seqlens to the device (thd), one launch.
#include "kernels/cuda/rope/rope_cuda.h"

#include <cuda_runtime_api.h>

#include "core/status.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/rope/rope_kernels.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

RopeLayout LayoutOf(RopeFormat format) {
  switch (format) {
    case RopeFormat::kSbhd:
      return RopeLayout::kSbhd;
    case RopeFormat::kBshd:
      return RopeLayout::kBshd;
    case RopeFormat::kThd:
      break;
  }
  return RopeLayout::kThd;
}

absl::StatusOr<Tensor> Apply(const Context& ctx, const Tensor& in, const Tensor& freqs, RopeFormat format,
                             bool interleaved, const Tensor* cu_seqlens, bool transpose) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kFloat32, in.shape(), ctx.device, ctx.stream));
  RopeLaunchParams p;
  p.in = in.data<float>();
  p.out = out.data<float>();
  p.freqs = freqs.data<float>();
  p.layout = LayoutOf(format);
  p.interleaved = interleaved;
  p.transpose = transpose;
  p.heads = in.dim(-2);
  p.d = in.dim(-1);
  p.r = freqs.dim(1);
  Tensor cu_device;
  switch (format) {
    case RopeFormat::kSbhd:  // pos = token / b
    case RopeFormat::kBshd:  // pos = token % s
      p.tokens = in.dim(0) * in.dim(1);
      p.seq_dim = in.dim(1);
      break;
    case RopeFormat::kThd: {
      p.tokens = in.dim(0);
      p.batch = cu_seqlens->dim(0) - 1;
      ASSIGN_OR_RETURN(cu_device, Tensor::ZerosOn(DType::kInt32, {cu_seqlens->dim(0)}, ctx.device, ctx.stream));
      TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cu_device.raw_data(), cu_seqlens->data<int32_t>(),
                                                   cu_seqlens->dim(0) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                   StreamOf(ctx)));
      p.cu_seqlens = cu_device.data<int32_t>();
      break;
    }
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchRope(p, StreamOf(ctx)));
  // thd only: the cu_seqlens upload came from pageable host memory.
  if (cu_device.defined()) TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> RopeForward(const Context& ctx, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens) {
  return Apply(ctx, t, freqs, format, interleaved, cu_seqlens, /*transpose=*/false);
}

absl::StatusOr<Tensor> RopeBackward(const Context& ctx, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens) {
  return Apply(ctx, dy, freqs, format, interleaved, cu_seqlens, /*transpose=*/true);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
