// Host side of the CUDA attention: launch parameters from the checked call, output and
// scratch allocation on ctx.stream, launches. Reads only tensor metadata on the host.
#include "kernels/cuda/attention/attention_cuda.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/scoped_device.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

Shape WithLastDim(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

Shape WithoutLastDim(Shape shape) {
  shape.pop_back();
  return shape;
}

absl::Status CheckHeadSize(absl::string_view field, absl::string_view what, int64_t size) {
  if (size <= kMaxAttentionHeadDim) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(field, ": the CUDA attention kernels take head sizes ", what,
                                               " <= ", kMaxAttentionHeadDim, ", got ", size,
                                               " (the CPU reference has no limit)"));
}

bool HasBiasTensor(const AttentionConfig& config) {
  return config.bias_type == AttnBiasType::kPreScaleBias || config.bias_type == AttnBiasType::kPostScaleBias;
}

// The kernels' view of a call that kernels/attention.cc has checked. Reads only the side
// tensors the configuration uses.
absl::StatusOr<AttentionLaunchParams> ParamsOf(const AttentionConfig& config, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const AttentionSideTensors& side) {
  AttentionLaunchParams p;
  const bool thd = config.qkv_format == QkvFormat::kThd;
  const int head_dim = thd ? 1 : 2;
  p.heads = q.dim(head_dim);
  p.groups = k.dim(head_dim);
  p.d_qk = q.dim(-1);
  p.d_v = v.dim(-1);
  RETURN_IF_ERROR(CheckHeadSize("q.shape", "D_qk", p.d_qk));
  RETURN_IF_ERROR(CheckHeadSize("v.shape", "D_v", p.d_v));
  if (thd) {
    p.layout = AttnLayout::kThd;
    p.batch = side.cu_seqlens_q.dim(0) - 1;
    p.rows_q = q.dim(0);
    p.rows_kv = k.dim(0);
  } else {
    const bool sbhd = config.qkv_format == QkvFormat::kSbhd;
    p.layout = sbhd ? AttnLayout::kSbhd : AttnLayout::kBshd;
    p.batch = q.dim(sbhd ? 1 : 0);
    p.full_q = q.dim(sbhd ? 0 : 1);
    p.full_kv = k.dim(sbhd ? 0 : 1);
    p.rows_q = p.full_q * p.batch;
    p.rows_kv = p.full_kv * p.batch;
  }
  if (thd || HasPadding(config.mask_type)) {
    p.cu_q = side.cu_seqlens_q.data<int32_t>();
    p.cu_kv = side.cu_seqlens_kv.data<int32_t>();
  }
  if (thd) {
    p.off_q = side.cu_seqlens_q_padded.defined() ? side.cu_seqlens_q_padded.data<int32_t>() : p.cu_q;
    p.off_kv = side.cu_seqlens_kv_padded.defined() ? side.cu_seqlens_kv_padded.data<int32_t>() : p.cu_kv;
  }

  p.top_left = IsTopLeftAligned(config.mask_type);
  p.window_left = config.window_left;
  p.window_right = config.window_right;
  if (config.mask_type == AttnMaskType::kArbitrary) {
    p.mask = side.mask.data<uint8_t>();
    for (int d = 0; d < 4; ++d) p.mask_dims[d] = side.mask.dim(d);
  }

  p.scale = config.softmax_scale;
  switch (config.bias_type) {
    case AttnBiasType::kNoBias: p.bias_type = AttnBias::kNone; break;
    case AttnBiasType::kPreScaleBias: p.bias_type = AttnBias::kPreScale; break;
    case AttnBiasType::kPostScaleBias: p.bias_type = AttnBias::kPostScale; break;
    case AttnBiasType::kAlibi: p.bias_type = AttnBias::kAlibi; break;
  }
  if (HasBiasTensor(config)) {
    p.bias = side.bias.data<float>();
    for (int d = 0; d < 4; ++d) p.bias_dims[d] = side.bias.dim(d);
  }
  if (config.bias_type == AttnBiasType::kAlibi) {
    p.alibi_slopes = side.alibi_slopes.data<float>();
    p.alibi_per_batch = side.alibi_slopes.rank() == 2;
  }

  switch (config.softmax_type) {
    case SoftmaxType::kVanilla: p.sink = AttnSink::kNone; break;
    case SoftmaxType::kOffByOne: p.sink = AttnSink::kZero; break;
    case SoftmaxType::kLearnable:
      p.sink = AttnSink::kLearnable;
      p.softmax_offset = side.softmax_offset.data<float>();
      break;
  }

  if (config.dropout > 0.0f) {
    p.dropout = config.dropout;
    // 1 / (1 - p) rounded once from FP64, as the reference's multiplier rounds to FP32.
    p.dropout_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(config.dropout)));
    p.dropout_key = RandomKey(config.dropout_seed, config.dropout_stream, kDropoutCopyId);
  }
  return p;
}

absl::StatusOr<Tensor> EmptyOn(const Context& ctx, Shape shape) {
  return Tensor::Empty(DType::kFloat32, std::move(shape), ctx.device, ctx.stream);
}

}  // namespace

absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const AttentionLaunchParams p, ParamsOf(config, q, k, v, side));
  const cudaStream_t stream = StreamOf(ctx);
  AttentionForwardOutputs result;
  // The kernel writes every element of out and softmax_lse (padding rows included).
  ASSIGN_OR_RETURN(result.out, EmptyOn(ctx, WithLastDim(q.shape(), p.d_v)));
  ASSIGN_OR_RETURN(result.softmax_lse, EmptyOn(ctx, WithoutLastDim(q.shape())));
  Tensor row_max;  // scratch [rows_q, H], freed in stream order
  if (config.return_max_logit) {
    ASSIGN_OR_RETURN(row_max, EmptyOn(ctx, {p.rows_q, p.heads}));
    ASSIGN_OR_RETURN(result.max_logit, EmptyOn(ctx, {p.heads}));
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAttentionForward(p, q.data<float>(), k.data<float>(), v.data<float>(),
                                                      result.out.data<float>(), result.softmax_lse.data<float>(),
                                                      config.return_max_logit ? row_max.data<float>() : nullptr,
                                                      stream));
  if (config.return_max_logit) {
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchReducePerHead(HeadReduce::kMax, row_max.data<float>(), p.rows_q, p.heads,
                                                     result.max_logit.data<float>(), stream));
  }
  return result;
}

absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const AttentionLaunchParams p, ParamsOf(config, q, k, v, side));
  const cudaStream_t stream = StreamOf(ctx);
  const bool learnable = config.softmax_type == SoftmaxType::kLearnable;
  const float* q_data = q.data<float>();
  const float* k_data = k.data<float>();
  const float* v_data = v.data<float>();
  const float* dout_data = dout.data<float>();
  const float* lse_data = softmax_lse.data<float>();

  // Scratch [rows_q, H]: delta per row and, with a learnable sink, the rows' terms of
  // dsoftmax_offset (reduced per head in a fixed order).
  ASSIGN_OR_RETURN(Tensor delta, EmptyOn(ctx, {p.rows_q, p.heads}));
  Tensor sink_terms;
  if (learnable) {
    ASSIGN_OR_RETURN(sink_terms, EmptyOn(ctx, {p.rows_q, p.heads}));
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAttentionBackwardPrepare(p, out.data<float>(), dout_data, lse_data,
                                                              delta.data<float>(),
                                                              learnable ? sink_terms.data<float>() : nullptr, stream));

  // Every gradient element is written by its kernel, so no output needs zeroing.
  AttentionBackwardOutputs result;
  ASSIGN_OR_RETURN(result.dq, EmptyOn(ctx, q.shape()));
  ASSIGN_OR_RETURN(result.dk, EmptyOn(ctx, k.shape()));
  ASSIGN_OR_RETURN(result.dv, EmptyOn(ctx, v.shape()));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAttentionBackwardDq(p, q_data, k_data, v_data, dout_data, lse_data,
                                                         delta.data<float>(), result.dq.data<float>(), stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAttentionBackwardDkDv(p, q_data, k_data, v_data, dout_data, lse_data,
                                                           delta.data<float>(), result.dk.data<float>(),
                                                           result.dv.data<float>(), stream));
  if (learnable) {
    ASSIGN_OR_RETURN(result.dsoftmax_offset, EmptyOn(ctx, {p.heads}));
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchReducePerHead(HeadReduce::kSum, sink_terms.data<float>(), p.rows_q, p.heads,
                                                     result.dsoftmax_offset.data<float>(), stream));
  }
  if (HasBiasTensor(config)) {
    ASSIGN_OR_RETURN(result.dbias, EmptyOn(ctx, side.bias.shape()));
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchAttentionBackwardDbias(p, q_data, k_data, v_data, dout_data, lse_data,
                                                              delta.data<float>(), result.dbias.data<float>(),
                                                              stream));
  }
  return result;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
