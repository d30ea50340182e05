// Host side of the CUDA cross entropy: labels to the device, launches, the mean on the
// host.
#include "kernels/cuda/loss/loss_cuda.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "core/status.h"
#include "kernels/loss_math.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/loss/loss_kernels.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// INT64 device copy of the host labels.
absl::StatusOr<Tensor> LabelsOnDevice(const Context& ctx, const Tensor& labels) {
  std::vector<int64_t> host(labels.numel());
  for (int64_t r = 0; r < labels.numel(); ++r) host[r] = loss_math::LabelAt(labels, r);
  ASSIGN_OR_RETURN(Tensor out, Tensor::ZerosOn(DType::kInt64, {labels.numel()}, ctx.device, ctx.stream));
  if (!host.empty()) {
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.raw_data(), host.data(), host.size() * sizeof(int64_t),
                                                 cudaMemcpyHostToDevice, StreamOf(ctx)));
  }
  return out;
}

CrossEntropyLaunchParams ParamsOf(const Tensor& logits, const Tensor& labels_device,
                                  const CrossEntropyOptions& options) {
  CrossEntropyLaunchParams p;
  p.logits = logits.data<float>();
  p.labels = labels_device.data<int64_t>();
  p.v = logits.dim(-1);
  p.n = logits.numel() / p.v;
  p.ignore_index = options.ignore_index;
  p.label_smoothing = options.label_smoothing;
  return p;
}

}  // namespace

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Context& ctx, const Tensor& logits,
                                                              const Tensor& labels,
                                                              const CrossEntropyOptions& options) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor labels_device, LabelsOnDevice(ctx, labels));
  const CrossEntropyLaunchParams p = ParamsOf(logits, labels_device, options);
  CrossEntropyForwardOutput out;
  ASSIGN_OR_RETURN(out.per_token_loss, Tensor::ZerosOn(DType::kFloat32, labels.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(out.lse, Tensor::ZerosOn(DType::kFloat32, {p.n}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchCrossEntropyForward(p, out.lse.data<float>(), out.per_token_loss.data<float>(), StreamOf(ctx)));
  std::vector<float> losses(p.n);
  if (p.n > 0) {
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(losses.data(), out.per_token_loss.raw_data(),
                                                 losses.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                                 StreamOf(ctx)));
  }
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));
  double total = 0.0;
  for (int64_t r = 0; r < p.n; ++r) {
    if (loss_math::LabelAt(labels, r) == options.ignore_index) continue;
    total += losses[r];
    ++out.num_valid;
  }
  out.loss = out.num_valid == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(out.num_valid));
  return out;
}

absl::StatusOr<Tensor> CrossEntropyBackward(const Context& ctx, const Tensor& logits, const Tensor& labels,
                                            const Tensor& lse, int64_t num_valid,
                                            const CrossEntropyOptions& options, float grad_loss) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor dx, Tensor::ZerosOn(DType::kFloat32, logits.shape(), ctx.device, ctx.stream));
  if (num_valid == 0) return dx;  // Zeros on the device are already zero-filled
  ASSIGN_OR_RETURN(Tensor labels_device, LabelsOnDevice(ctx, labels));
  const CrossEntropyLaunchParams p = ParamsOf(logits, labels_device, options);
  const float scale = static_cast<float>(static_cast<double>(grad_loss) / static_cast<double>(num_valid));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchCrossEntropyBackward(p, lse.data<float>(), scale, dx.data<float>(), StreamOf(ctx)));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));  // before labels_device is freed
  return dx;
}

absl::StatusOr<MseForwardOutput> MseForward(const Context& ctx, const Tensor& y, const Tensor& target) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor partials, Tensor::Empty(DType::kInt64, {kMseBlocks}, ctx.device, ctx.stream));  // doubles
  ASSIGN_OR_RETURN(Tensor loss, Tensor::Empty(DType::kFloat32, {1}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchMseForward(y.data<float>(), target.data<float>(), y.numel(),
                                                static_cast<double*>(partials.raw_data()), loss.data<float>(),
                                                StreamOf(ctx)));
  MseForwardOutput out;
  out.num_elements = y.numel();
  TESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&out.loss, loss.raw_data(), sizeof(float), cudaMemcpyDeviceToHost, StreamOf(ctx)));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> MseBackward(const Context& ctx, const Tensor& y, const Tensor& target, float grad_loss) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor dy, Tensor::Empty(DType::kFloat32, y.shape(), ctx.device, ctx.stream));
  // The CPU reference's scale, computed the same way.
  const double scale = y.numel() == 0 ? 0.0 : 2.0 * grad_loss / static_cast<double>(y.numel());
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchMseBackward(y.data<float>(), target.data<float>(), y.numel(), scale, dy.data<float>(), StreamOf(ctx)));
  return dy;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
