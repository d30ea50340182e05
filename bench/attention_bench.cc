// kernels::AttentionForward / AttentionBackward on the GPU as a session's attention layer
// runs them: BF16 q, k, v in bshd ([B, S, H, D]), causal mask, softmax scale 1/sqrt(D),
// B = 4 sequences and H = 32 heads; `--shapes=SxD` gives the sequence length and the head
// size (default 4096x128). BF16 runs cuDNN's fused SDPA (the op's config says which path
// ran); the torch side is F.scaled_dot_product_attention(is_causal=True) on [B, H, S, D].
//   attention_bf16_causal_fwd      forward
//   attention_bf16_causal_fwd_bwd  forward + backward (dq, dk, dv), deterministic
//   attention_bf16_causal_fwd_bwd_nondeterministic  the same with config.deterministic false
//   attention_bf16_padding_causal_fwd_bwd  padding_causal, sequences of S, 3S/4, S/2 and S/4
//                                  real tokens (right padding), forward + backward
//   attention_fp32_padding_causal_fwd_bwd_unfused  the same on FP32 q, k, v: the unfused
//                                  kernels, which every padded 16-bit call ran before the
//                                  padding types were wired to cuDNN
//   attention_bf16_causal_alibi_fwd_bwd  causal with ALiBi, the default slopes (a
//                                  DotProductAttention without alibi_slopes), forward + backward
// The padded variants count the FLOPs of the real tokens only.
// FLOPs count the causal half of the score matrix: forward 2 * 2 * B * H * S^2 * D / 2,
// backward 2.5x the forward.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_status.h"
#include "bench/bench_util.h"
#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "layers/init.h"

namespace teserve {
namespace bench {
namespace {

constexpr int64_t kBatch = 4;
constexpr int64_t kHeads = 32;

const char* PathName(kernels::AttentionPath path) {
  switch (path) {
    case kernels::AttentionPath::kCudnnFused:
      return "cudnn_fused";
    case kernels::AttentionPath::kCudaUnfused:
      return "cuda_unfused";
    case kernels::AttentionPath::kCpuReference:
      return "cpu_reference";
  }
  return "?";
}

void Run(int64_t seq, int64_t head_dim, const Flags& flags, std::vector<Result>* results) {
  const GpuStream gpu;
  const Context& ctx = gpu.context();
  const Shape shape = {kBatch, seq, kHeads, head_dim};
  auto random_bf16 = [&](uint64_t seed) {
    Tensor host = OrDie(Tensor::Zeros(DType::kFloat32, shape), "host");
    layers::FillNormal(seed, 1.0f, host.mutable_floats());
    return OrDie(kernels::Convert(ctx, OrDie(kernels::CopyTo(ctx, host, ctx.device), "to the GPU"), DType::kBFloat16),
                 "bf16");
  };
  const Tensor q = random_bf16(1), k = random_bf16(2), v = random_bf16(3), dout = random_bf16(4);
  kernels::AttentionConfig config;
  config.qkv_format = kernels::QkvFormat::kBshd;
  config.mask_type = kernels::AttnMaskType::kCausal;
  config.window_right = 0;
  config.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const kernels::AttentionSideTensors side;
  kernels::AttentionForwardOutputs fwd =
      OrDie(kernels::AttentionForward(ctx, config, q, k, v, side), "attention forward");
  const std::string path = PathName(fwd.path);
  const std::string config_text =
      absl::StrCat("kernels::Attention ", path, fwd.unfused_reason.empty() ? "" : " (", fwd.unfused_reason,
                   fwd.unfused_reason.empty() ? "" : ")", ", bshd BF16 causal, B=", kBatch, " H=", kHeads);
  const int64_t forward_flops = 2 * 2 * kBatch * kHeads * seq * seq * head_dim / 2;
  const int64_t qkvo_bytes = 4 * kBatch * seq * kHeads * head_dim * 2;

  Timing t_fwd = TimeLaunches(
      [&]() -> cudaError_t {
        Check(kernels::AttentionForward(ctx, config, q, k, v, side).status(), "forward");
        return cudaSuccess;
      },
      flags);
  Result r_fwd{"attention_bf16_causal_fwd", seq, head_dim, "bf16", t_fwd, qkvo_bytes, config_text};
  r_fwd.flops = forward_flops;
  results->push_back(r_fwd);

  // Forward + backward of one configuration on these tensors (the default ones: q, k, v,
  // dout in BF16).
  auto time_fwd_bwd = [&](const kernels::AttentionConfig& cfg, const kernels::AttentionSideTensors& s,
                          const Tensor& tq, const Tensor& tk, const Tensor& tv, const Tensor& tdout) {
    return TimeLaunches(
        [&]() -> cudaError_t {
          auto out = kernels::AttentionForward(ctx, cfg, tq, tk, tv, s);
          Check(out.status(), "forward");
          Check(kernels::AttentionBackward(ctx, cfg, tq, tk, tv, s, out->out, out->softmax_lse, tdout).status(),
                "backward");
          return cudaSuccess;
        },
        flags);
  };
  const Timing t_fb = time_fwd_bwd(config, side, q, k, v, dout);
  Result r_fb{"attention_bf16_causal_fwd_bwd", seq, head_dim, "bf16", t_fb, 2 * qkvo_bytes, config_text};
  r_fb.flops = forward_flops + forward_flops * 5 / 2;
  results->push_back(r_fb);

  kernels::AttentionConfig fast = config;
  fast.deterministic = false;
  const Timing t_nd = time_fwd_bwd(fast, side, q, k, v, dout);
  Result r_nd{"attention_bf16_causal_fwd_bwd_nondeterministic", seq, head_dim, "bf16", t_nd, 2 * qkvo_bytes,
              config_text + ", deterministic = false (cuDNN's atomic dq)"};
  r_nd.flops = r_fb.flops;
  results->push_back(r_nd);

  // Right padding: sequence b has S * (4 - b) / 4 real tokens.
  kernels::AttentionConfig padded = config;
  padded.mask_type = kernels::AttnMaskType::kPaddingCausal;
  kernels::AttentionSideTensors padded_side;
  Tensor cu = OrDie(Tensor::Zeros(DType::kInt32, {kBatch + 1}), "cu_seqlens");
  int64_t padded_flops = 0;
  for (int64_t b = 0; b < kBatch; ++b) {
    const int64_t len = seq * (kBatch - b) / kBatch;
    cu.data<int32_t>()[b + 1] = static_cast<int32_t>(cu.data<int32_t>()[b] + len);
    padded_flops += 2 * 2 * kHeads * len * len * head_dim / 2;
  }
  padded_side.cu_seqlens_q = OrDie(kernels::CopyTo(ctx, cu, ctx.device), "cu_seqlens to the GPU");
  padded_side.cu_seqlens_kv = padded_side.cu_seqlens_q;
  const kernels::AttentionForwardOutputs padded_fwd =
      OrDie(kernels::AttentionForward(ctx, padded, q, k, v, padded_side), "padded forward");
  const Timing t_pad = time_fwd_bwd(padded, padded_side, q, k, v, dout);
  Result r_pad{"attention_bf16_padding_causal_fwd_bwd", seq, head_dim, "bf16", t_pad, 2 * qkvo_bytes,
               absl::StrCat("kernels::Attention ", PathName(padded_fwd.path), " ", padded_fwd.unfused_reason,
                            ", bshd BF16 padding_causal, lengths S, 3S/4, S/2, S/4")};
  r_pad.flops = padded_flops + padded_flops * 5 / 2;
  results->push_back(r_pad);

  kernels::AttentionConfig alibi = config;
  alibi.bias_type = kernels::AttnBiasType::kAlibi;
  alibi.alibi_default_slopes = true;
  kernels::AttentionSideTensors alibi_side;
  alibi_side.alibi_slopes = OrDie(
      kernels::CopyTo(ctx, OrDie(Tensor::FromFloats(kernels::DefaultAlibiSlopes(kHeads), {kHeads}), "slopes"),
                      ctx.device),
      "slopes to the GPU");
  const kernels::AttentionForwardOutputs alibi_fwd =
      OrDie(kernels::AttentionForward(ctx, alibi, q, k, v, alibi_side), "alibi forward");
  const Timing t_alibi = time_fwd_bwd(alibi, alibi_side, q, k, v, dout);
  Result r_alibi{"attention_bf16_causal_alibi_fwd_bwd", seq, head_dim, "bf16", t_alibi, 2 * qkvo_bytes,
                 absl::StrCat("kernels::Attention ", PathName(alibi_fwd.path), " ", alibi_fwd.unfused_reason,
                              ", bshd BF16 causal, ALiBi with the default slopes")};
  r_alibi.flops = r_fb.flops;
  results->push_back(r_alibi);

  auto wide = [&](const Tensor& t) { return OrDie(kernels::Convert(ctx, t, DType::kFloat32), "fp32"); };
  const Tensor q32 = wide(q), k32 = wide(k), v32 = wide(v), dout32 = wide(dout);
  Result r_unfused{"attention_fp32_padding_causal_fwd_bwd_unfused", seq, head_dim, "fp32",
                   time_fwd_bwd(padded, padded_side, q32, k32, v32, dout32), 4 * qkvo_bytes,
                   "kernels::Attention cuda_unfused, bshd FP32 padding_causal, lengths S, 3S/4, S/2, S/4"};
  r_unfused.flops = r_pad.flops;
  results->push_back(r_unfused);
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "attention_bench", teserve::bench::Run);
}
