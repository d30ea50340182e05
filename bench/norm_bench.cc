// LayerNorm / RMSNorm benchmarks (kernels/cuda/normalization/normalization_kernels.h), BF16 input:
//   layernorm_fwd_fp8        LN forward, FP8 E4M3 rowwise + columnwise + amax, no y
//                            (read x; write 2 x n x h codes; mu, rsigma); the default
//                            kernel choice (NormForwardKernel::kAuto: the stats-warp
//                            kernel, row groups y, y + clusters, ... per cluster, where
//                            it applies)
//                            The forward rows pass an amax_sync workspace (a caller that
//                            keeps one per stream), so the stats-warp and one-CTA-per-row
//                            kernels zero the amax themselves: no reset launch in front.
//   layernorm_fwd_fp8_reset_kernel  the same without amax_sync: the amax reset kernel in
//                            front (any caller without a workspace)
//   layernorm_fwd_fp8_register_tile  the same on the register-tile kernel (kRegisterTile)
//   layernorm_fwd_fp8_contiguous     the same on the stats-warp kernel with one block of
//                            consecutive row groups per cluster (kStatsWarpContiguous)
//   layernorm_fwd_fp8_codec  the same with the integer-codec encoder (always the shared-
//                            memory tile kernel; the others take the register tile)
//   rmsnorm_fwd_fp8          RMSNorm forward, same outputs (no mu)
//   layernorm_fwd_fp8_rowwise  LN forward, rowwise codes only
//   layernorm_fwd_mxfp8      LN forward, MXFP8 E4M3 rowwise 1x32 + columnwise 32x1 codes,
//                            E8M0 scales and amax, no y (fused: the stats-warp kernel)
//   layernorm_fwd_mxfp8_register_tile  the same on the register-tile kernel
//   layernorm_fwd_bf16       LN forward, y in BF16, no quantization
//   layernorm_bwd            dx (BF16), dgamma, dbeta from dy, x (BF16), mu, rsigma
//   rmsnorm_bwd              dx (BF16), dgamma from dy, x (BF16), rsigma
// Launchers are called directly on preallocated buffers (no allocation or host sync in
// the timed region). Prints JSON (bench/bench_util.h); bench/run_bench.py adds torch.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cuda/normalization/normalization_kernels.h"

namespace teserve {
namespace bench {
namespace {

using kernels::cuda::Fp8Encoder;
using kernels::cuda::Fp8Format;
using kernels::cuda::NormBackwardParams;
using kernels::cuda::NormDType;
using kernels::cuda::NormForwardParams;

std::string ForwardConfig(const NormForwardParams& p) {
  kernels::cuda::NormForwardPlan plan;
  BENCH_CHECK(kernels::cuda::PlanNormForward(p, &plan));
  return std::string(plan.row_per_cta ? "one CTA per row "
                     : plan.stats_warp ? (plan.contiguous_row_groups ? "stats-warp register tile (contiguous row groups) "
                                        : plan.quad_row_groups     ? "stats-warp register tile (quad row groups) "
                                        : plan.paired_row_groups   ? "stats-warp register tile (paired row groups) "
                                                                   : "stats-warp register tile (strided row groups) ")
                     : plan.register_tile ? "register tile "
                                          : "smem tile ") +
         std::to_string(plan.rows_per_cta) + "x" + std::to_string(plan.cols_per_cta) +
         ", cluster " + std::to_string(plan.cluster_size) + ", " + std::to_string(plan.ctas) +
         " CTAs (" + std::to_string(plan.ctas_per_sm) + "/SM), smem " +
         std::to_string(plan.shared_bytes / 1024) + " KiB" +
         (plan.separate_stats ? ", separate stats" : "") +
         (p.amax_bits == nullptr             ? ""
          : plan.amax_zeroed_in_kernel ? ", amax zeroed in the kernel"
                                       : ", amax reset launched in front");
}

void Run(int64_t n, int64_t h, const Flags& flags, std::vector<Result>* results) {
  const int64_t numel = n * h;
  void* x = RandomDeviceBuffer(numel, /*bf16=*/true, 0.5f, 3.0f, 1);
  void* dy = RandomDeviceBuffer(numel, /*bf16=*/true, 0.0f, 1.0f, 2);
  float* gamma = static_cast<float*>(RandomDeviceBuffer(h, false, 1.0f, 0.5f, 3));
  float* beta = static_cast<float*>(RandomDeviceBuffer(h, false, 0.0f, 0.5f, 4));
  void* y = DeviceBuffer(numel * 2);
  auto* rowwise = static_cast<uint8_t*>(DeviceBuffer(numel));
  auto* columnwise = static_cast<uint8_t*>(DeviceBuffer(numel));
  auto* mu = static_cast<float*>(DeviceBuffer(n * 4));
  auto* rsigma = static_cast<float*>(DeviceBuffer(n * 4));
  auto* scale_inv = static_cast<float*>(DeviceBuffer(8));
  auto* amax = static_cast<uint32_t*>(DeviceBuffer(4));
  auto* amax_sync = static_cast<uint32_t*>(DeviceBuffer(16));
  BENCH_CHECK(cudaMemset(amax_sync, 0, 16));  // zeroed once, then the kernels' own
  auto* rowwise_e8m0 = static_cast<uint8_t*>(DeviceBuffer(numel / 32));
  auto* columnwise_e8m0 = static_cast<uint8_t*>(DeviceBuffer(numel / 32));

  NormForwardParams base;
  base.x = x;
  base.x_type = NormDType::kBFloat16;
  base.rows = n;
  base.cols = h;
  base.gamma = gamma;
  base.beta = beta;
  base.mu = mu;
  base.rsigma = rsigma;
  base.format = Fp8Format::kE4M3;
  base.scale = 64.0f;
  base.scale_inv = 1.0f / 64.0f;
  base.rowwise = rowwise;
  base.columnwise = columnwise;
  base.rowwise_scale_inv = scale_inv;
  base.columnwise_scale_inv = scale_inv + 1;
  base.amax_bits = amax;
  base.amax_sync = amax_sync;

  auto forward = [&](const std::string& op, const NormForwardParams& p, int64_t bytes) {
    const Timing t = TimeLaunches([&] { return kernels::cuda::LaunchNormForward(p, nullptr); }, flags);
    results->push_back({op, n, h, "bf16", t, bytes, ForwardConfig(p)});
  };
  const int64_t stats_ln = n * 8, stats_rms = n * 4;
  forward("layernorm_fwd_fp8", base, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams reset_kernel = base;
  reset_kernel.amax_sync = nullptr;
  forward("layernorm_fwd_fp8_reset_kernel", reset_kernel, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams register_tile = base;
  register_tile.kernel = kernels::cuda::NormForwardKernel::kRegisterTile;
  forward("layernorm_fwd_fp8_register_tile", register_tile, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams contiguous = base;
  contiguous.kernel = kernels::cuda::NormForwardKernel::kStatsWarpContiguous;
  forward("layernorm_fwd_fp8_contiguous", contiguous, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams quads = base;
  quads.kernel = kernels::cuda::NormForwardKernel::kStatsWarpQuads;
  forward("layernorm_fwd_fp8_quads", quads, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams codec = base;
  codec.encoder = Fp8Encoder::kCodec;
  forward("layernorm_fwd_fp8_codec", codec, numel * 2 + numel * 2 + stats_ln);
  NormForwardParams rms = base;
  rms.rms = true;
  rms.beta = nullptr;
  rms.mu = nullptr;
  forward("rmsnorm_fwd_fp8", rms, numel * 2 + numel * 2 + stats_rms);
  NormForwardParams rowwise_only = base;
  rowwise_only.columnwise = nullptr;
  rowwise_only.columnwise_scale_inv = nullptr;
  forward("layernorm_fwd_fp8_rowwise", rowwise_only, numel * 2 + numel + stats_ln);
  if (n <= 1024) {  // kAuto takes the one-CTA-per-row kernel up to 256 rows: the cluster kernel for comparison
    NormForwardParams rowwise_clusters = rowwise_only;
    rowwise_clusters.kernel = kernels::cuda::NormForwardKernel::kStatsWarpClusters;
    forward("layernorm_fwd_fp8_rowwise_clusters", rowwise_clusters, numel * 2 + numel + stats_ln);
    NormForwardParams rowwise_reset_kernel = rowwise_only;
    rowwise_reset_kernel.amax_sync = nullptr;
    forward("layernorm_fwd_fp8_rowwise_reset_kernel", rowwise_reset_kernel, numel * 2 + numel + stats_ln);
  }
  if (h % 64 == 0 && n % 32 == 0) {  // shapes the fused MXFP8 path takes
    NormForwardParams mxfp8 = base;
    mxfp8.mxfp8 = true;
    mxfp8.rowwise_scale_inv = mxfp8.columnwise_scale_inv = nullptr;
    mxfp8.rowwise_e8m0 = rowwise_e8m0;
    mxfp8.columnwise_e8m0 = columnwise_e8m0;
    forward("layernorm_fwd_mxfp8", mxfp8, numel * 2 + numel * 2 + numel / 16 + stats_ln);
    NormForwardParams mxfp8_register_tile = mxfp8;
    mxfp8_register_tile.kernel = kernels::cuda::NormForwardKernel::kRegisterTile;
    forward("layernorm_fwd_mxfp8_register_tile", mxfp8_register_tile, numel * 2 + numel * 2 + numel / 16 + stats_ln);
  }
  NormForwardParams plain = base;
  plain.rowwise = plain.columnwise = nullptr;
  plain.rowwise_scale_inv = plain.columnwise_scale_inv = nullptr;
  plain.amax_bits = nullptr;
  plain.y = y;
  plain.y_type = NormDType::kBFloat16;
  forward("layernorm_fwd_bf16", plain, numel * 2 + numel * 2 + stats_ln);

  // Backward: statistics from a forward pass first.
  BENCH_CHECK(kernels::cuda::LaunchNormForward(plain, nullptr));
  auto* dgamma = static_cast<float*>(DeviceBuffer(h * 4));
  auto* dbeta = static_cast<float*>(DeviceBuffer(h * 4));
  NormBackwardParams grad;
  grad.dy = dy;
  grad.x = x;
  grad.type = NormDType::kBFloat16;
  grad.rows = n;
  grad.cols = h;
  grad.mu = mu;
  grad.rsigma = rsigma;
  grad.gamma = gamma;
  grad.dx = y;
  grad.dgamma = dgamma;
  grad.dbeta = dbeta;
  int64_t workspace_floats = 0;
  BENCH_CHECK(kernels::cuda::NormBackwardWorkspaceFloats(grad, &workspace_floats));
  grad.workspace = static_cast<float*>(DeviceBuffer(workspace_floats * 4));
  auto backward = [&](const std::string& op, const NormBackwardParams& p, int64_t bytes) {
    kernels::cuda::NormBackwardPlan plan;
    BENCH_CHECK(kernels::cuda::PlanNormBackward(p, &plan));
    const std::string config = std::string(plan.register_resident ? "registers" : "streaming") +
                               ", " + std::to_string(plan.vectors_per_thread) + " x 16 B/thread, " +
                               std::to_string(plan.ctas) + " CTAs (" +
                               std::to_string(plan.ctas_per_sm) + "/SM), two-stage dgamma";
    const Timing t = TimeLaunches([&] { return kernels::cuda::LaunchNormBackward(p, nullptr); }, flags);
    results->push_back({op, n, h, "bf16", t, bytes, config});
  };
  backward("layernorm_bwd", grad, numel * 6 + stats_ln + h * 4 * 3);
  NormBackwardParams rms_grad = grad;
  rms_grad.rms = true;
  rms_grad.mu = nullptr;
  rms_grad.dbeta = nullptr;
  backward("rmsnorm_bwd", rms_grad, numel * 6 + stats_rms + h * 4 * 2);

  FreeDeviceBuffers({x, dy, static_cast<void*>(gamma), static_cast<void*>(beta), y,
                    static_cast<void*>(rowwise), static_cast<void*>(columnwise),
                    static_cast<void*>(mu), static_cast<void*>(rsigma), static_cast<void*>(scale_inv),
                    static_cast<void*>(amax), static_cast<void*>(amax_sync), static_cast<void*>(rowwise_e8m0),
                    static_cast<void*>(columnwise_e8m0), static_cast<void*>(dgamma), static_cast<void*>(dbeta),
                    static_cast<void*>(grad.workspace)});
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "norm_bench", teserve::bench::Run);
}
