// The stats-warp forward kernel (kernels/cuda/normalization/normalization_stats_warp.cu) against the
// register-tile kernel and the CPU, through direct launches into poisoned buffers:
// - plan: which kernel and row-group order each NormForwardKernel choice gets, and that the
//   grid fits the usable SMs with at most one cluster per 32-row group (the order itself is
//   not visible in the outputs);
// - the three choices (kAuto: stats warp, row groups y, y + clusters, ... per cluster,
//   taken in pairs of adjacent groups while every cluster has a pair left when the
//   columnwise copy is written without y, the pairs' columnwise codes stored together: the
//   codes-only launch checks those bytes too);
//   kStatsWarpContiguous: stats warp, one block of consecutive groups per cluster;
//   kStatsWarpQuads: as kAuto, the codes-only launch taking two adjacent pairs per cluster;
//   kRegisterTile) write the same bytes: y (FP32), rowwise and columnwise codes, mu,
//   rsigma, amax and the scale inverses (same tile arithmetic and merge order by
//   construction);
// - against the CPU: y within the FP32 tolerance on its forward-error scale, codes exactly
//   encode(y * scale) of the kernel's own y, the columnwise copy the transpose, amax
//   max |y| bitwise;
// - special rows: a NaN in a row (LayerNorm: also an Inf) makes the whole row NaN with code
//   0x7F (amax NaN); in RMSNorm an Inf makes rsigma 0, so y is NaN at the Inf and +0
//   elsewhere; a constant row (zero variance) gives y = beta exactly in LayerNorm, an
//   all-zero row y = +0 in RMSNorm.
// Shapes: the benchmark shape, partial 32-row groups, group counts that the clusters do not
// divide, clusters of 1..8 CTAs. These launches write FP32 y together with both code copies;
// the kernel's other output combinations (no y, BF16 / FP16 y, codes off) run through the
// op in normalization_gpu_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/normalization.h"
#include "tests/gpu/normalization/normalization_gpu_test_util.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::NormForwardOptions;
using kernels::NormForwardResult;
using kernels::NormType;
using kernels::cuda::NormForwardKernel;
using norm_gpu_test::AsDoubles;
using norm_gpu_test::Bits;
using norm_gpu_test::DeviceAlloc;
using norm_gpu_test::Encode;
using norm_gpu_test::ForwardBuffers;
using norm_gpu_test::ForwardScale;
using norm_gpu_test::RandomInput;
using norm_gpu_test::RandomVector;
using norm_gpu_test::ShapeName;
using norm_gpu_test::ToHost;
using testing::Floats;
using testing::OnDevice;
using testing_kernels::AllClose;

struct StatsWarpCase {
  NormType type;
  DType dtype;  // BF16 or FP16
  int64_t n, h;
  DType format;
  bool zero_centered;
};

std::string StatsWarpName(const ::testing::TestParamInfo<StatsWarpCase>& info) {
  const StatsWarpCase& c = info.param;
  return absl::StrCat(c.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(c.dtype), "_", ShapeName(c.n, c.h), "_",
                      c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2",
                      c.zero_centered ? "_ZeroCentered" : "");
}

// Host copy of every output of one direct launch.
struct Outputs {
  kernels::cuda::NormForwardPlan plan;
  std::vector<uint8_t> y, rowwise, columnwise, mu, rsigma, scale_inv, amax;
};

std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

class StatsWarpGpuTest : public ::testing::TestWithParam<StatsWarpCase> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const StatsWarpCase& c = GetParam();
    const uint64_t seed = static_cast<uint64_t>(c.n * 977 + c.h);
    Tensor x32 = RandomInput(DType::kFloat32, c.n, c.h, seed);
    float* v = x32.data<float>();
    // Special rows (all n >= 16 here): 1 holds a NaN, 2 an Inf, 4 a -Inf; 6 is constant
    // (LayerNorm: zero variance) or all zero (RMSNorm); the last row is constant too.
    v[1 * c.h + c.h / 3] = std::nanf("");
    v[2 * c.h + c.h - 1] = INFINITY;
    v[4 * c.h] = -INFINITY;
    const float constant = layer_norm() ? 3.25f : 0.0f;
    for (int64_t j = 0; j < c.h; ++j) {
      v[6 * c.h + j] = constant;
      v[(c.n - 1) * c.h + j] = constant;
    }
    special_ = {1, 2, 4};
    constant_ = {6, c.n - 1};
    host_x_ = kernels::cpu::CastFromFloat32(Context::Cpu(), x32, c.dtype).value();
    gamma_ = c.zero_centered ? RandomVector(c.h, -0.5f, 0.5f, seed + 1)
                             : RandomVector(c.h, 0.5f, 1.5f, seed + 1);
    if (layer_norm()) beta_ = RandomVector(c.h, -1.0f, 1.0f, seed + 2);
    x_ = OnDevice(host_x_);
    gamma_gpu_ = OnDevice(gamma_);
    if (layer_norm()) beta_gpu_ = OnDevice(beta_);
    scale_ = DTypeMaxFinite(c.format) / 4.0f;  // |y| beyond 4 saturates
  }

  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }

  // with_y false: codes only (the paired row-group order; out.y stays the poison);
  // with_columnwise false: no columnwise copy (out.columnwise stays the poison).
  Outputs Launch(NormForwardKernel kernel, kernels::cuda::NormDType y_type = kernels::cuda::NormDType::kFloat32,
                 bool with_y = true, bool with_columnwise = true) const {
    const StatsWarpCase& c = GetParam();
    const int64_t numel = c.n * c.h;
    const ForwardBuffers buffers(c.n, c.h);
    Outputs out;

    kernels::cuda::NormForwardParams p;
    p.rms = !layer_norm();
    p.x = x_.raw_data();
    p.x_type = c.dtype == DType::kFloat16 ? kernels::cuda::NormDType::kFloat16
                                          : kernels::cuda::NormDType::kBFloat16;
    p.rows = c.n;
    p.cols = c.h;
    p.gamma = gamma_gpu_.data<float>();
    p.beta = layer_norm() ? beta_gpu_.data<float>() : nullptr;
    p.eps = 1e-5f;
    p.zero_centered_gamma = c.zero_centered;
    buffers.Attach(&p, with_y);
    if (!with_columnwise) {
      p.columnwise = nullptr;
      p.columnwise_scale_inv = nullptr;
    }
    p.y_type = y_type;
    p.format = c.format == DType::kFloat8E4M3 ? kernels::cuda::Fp8Format::kE4M3
                                              : kernels::cuda::Fp8Format::kE5M2;
    p.scale = scale_;
    p.scale_inv = 1.0f / scale_;
    p.kernel = kernel;
    EXPECT_EQ(kernels::cuda::PlanNormForward(p, &out.plan), cudaSuccess);
    EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.y = ToHost(buffers.y, y_type == kernels::cuda::NormDType::kFloat32 ? numel * 4 : numel * 2);
    out.rowwise = ToHost(buffers.rowwise, numel);
    out.columnwise = ToHost(buffers.columnwise, numel);
    if (layer_norm()) out.mu = ToHost(buffers.mu, c.n * 4);
    out.rsigma = ToHost(buffers.rsigma, c.n * 4);
    out.scale_inv = ToHost(buffers.scale_inv, 8);
    out.amax = ToHost(buffers.amax, 4);
    return out;
  }

  bool IsSpecial(int64_t r) const {
    return std::find(special_.begin(), special_.end(), r) != special_.end();
  }

  Tensor host_x_, gamma_, beta_;
  Tensor x_, gamma_gpu_, beta_gpu_;
  float scale_ = 1.0f;
  std::vector<int64_t> special_, constant_;
};

TEST_P(StatsWarpGpuTest, PlansTheStatsWarpKernelWithItsRowGroupOrder) {
  const Outputs automatic = Launch(NormForwardKernel::kAuto);
  EXPECT_TRUE(automatic.plan.stats_warp);
  EXPECT_TRUE(automatic.plan.register_tile);
  EXPECT_FALSE(automatic.plan.contiguous_row_groups);
  EXPECT_EQ(automatic.plan.rows_per_cta, 32);
  EXPECT_LE(automatic.plan.ctas, automatic.plan.usable_sms * automatic.plan.ctas_per_sm);
  EXPECT_LE(automatic.plan.ctas / automatic.plan.cluster_size, (GetParam().n + 31) / 32);
  EXPECT_FALSE(automatic.plan.paired_row_groups);  // y is written
  // Codes only: adjacent pairs of groups while every cluster has one.
  const Outputs codes_only = Launch(NormForwardKernel::kAuto, kernels::cuda::NormDType::kFloat32, false);
  const int64_t clusters = codes_only.plan.ctas / codes_only.plan.cluster_size;
  EXPECT_EQ(codes_only.plan.paired_row_groups, GetParam().n / 32 / 2 / clusters > 0);
  EXPECT_FALSE(codes_only.plan.contiguous_row_groups);
  EXPECT_FALSE(codes_only.plan.quad_row_groups);
  const Outputs quads = Launch(NormForwardKernel::kStatsWarpQuads, kernels::cuda::NormDType::kFloat32, false);
  EXPECT_TRUE(quads.plan.stats_warp);
  EXPECT_EQ(quads.plan.paired_row_groups, codes_only.plan.paired_row_groups);
  EXPECT_EQ(quads.plan.quad_row_groups, GetParam().n / 32 / 4 / clusters > 0);
  EXPECT_FALSE(Launch(NormForwardKernel::kStatsWarpQuads).plan.quad_row_groups);  // y is written
  const Outputs contiguous = Launch(NormForwardKernel::kStatsWarpContiguous);
  EXPECT_TRUE(contiguous.plan.stats_warp);
  EXPECT_TRUE(contiguous.plan.contiguous_row_groups);
  EXPECT_FALSE(contiguous.plan.paired_row_groups);
  const Outputs register_tile = Launch(NormForwardKernel::kRegisterTile);
  EXPECT_FALSE(register_tile.plan.stats_warp);
  EXPECT_TRUE(register_tile.plan.register_tile);
  EXPECT_EQ(register_tile.plan.cluster_size, automatic.plan.cluster_size);
  EXPECT_EQ(register_tile.plan.cols_per_cta, automatic.plan.cols_per_cta);
}

// Every output but y byte for byte.
void ExpectSameCodesAndStatistics(const Outputs& got, const Outputs& want) {
  EXPECT_TRUE(got.rowwise == want.rowwise) << "rowwise codes";
  EXPECT_TRUE(got.columnwise == want.columnwise) << "columnwise codes";
  EXPECT_TRUE(got.mu == want.mu) << "mu";
  EXPECT_TRUE(got.rsigma == want.rsigma) << "rsigma";
  EXPECT_EQ(got.scale_inv, want.scale_inv);
  EXPECT_EQ(got.amax, want.amax);
}

TEST_P(StatsWarpGpuTest, WritesTheRegisterTileKernelsBytes) {
  const Outputs want = Launch(NormForwardKernel::kRegisterTile);
  for (NormForwardKernel kernel : {NormForwardKernel::kAuto, NormForwardKernel::kStatsWarpContiguous}) {
    SCOPED_TRACE(kernel == NormForwardKernel::kAuto ? "kAuto" : "kStatsWarpContiguous");
    const Outputs got = Launch(kernel);
    EXPECT_TRUE(got.y == want.y) << "y";
    ExpectSameCodesAndStatistics(got, want);
  }
  // Codes only (the paired row-group order where the shape has pairs for every cluster):
  // the same codes, statistics and amax as the register-tile kernel writes with y.
  SCOPED_TRACE("kAuto, codes only");
  ExpectSameCodesAndStatistics(Launch(NormForwardKernel::kAuto, kernels::cuda::NormDType::kFloat32, false), want);
  SCOPED_TRACE("kStatsWarpQuads, codes only");
  ExpectSameCodesAndStatistics(Launch(NormForwardKernel::kStatsWarpQuads, kernels::cuda::NormDType::kFloat32, false),
                               want);
}

// Up to 256 rows without a columnwise copy, kAuto takes the one-CTA-per-row kernel
// (NormForwardPlan::row_per_cta): the same y, rowwise codes, statistics, amax and scale
// inverse as the register-tile kernel and the stats-warp cluster kernel
// (kStatsWarpClusters), with FP32 or BF16 y or codes only, and the columnwise buffer left
// untouched.
TEST_P(StatsWarpGpuTest, FewRowsWithoutColumnwiseCodesTakeOneCtaPerRow) {
  const StatsWarpCase& c = GetParam();
  using kernels::cuda::NormDType;
  const Outputs want = Launch(NormForwardKernel::kRegisterTile);
  const bool few = c.n <= 256;
  auto expect_same = [&](const Outputs& got, const Outputs& ref, bool y) {
    if (y) EXPECT_TRUE(got.y == ref.y) << "y";
    EXPECT_TRUE(got.rowwise == ref.rowwise) << "rowwise codes";
    EXPECT_TRUE(got.mu == ref.mu) << "mu";
    EXPECT_TRUE(got.rsigma == ref.rsigma) << "rsigma";
    EXPECT_EQ(got.amax, ref.amax);
    EXPECT_EQ(std::vector<uint8_t>(got.scale_inv.begin(), got.scale_inv.begin() + 4),
              std::vector<uint8_t>(ref.scale_inv.begin(), ref.scale_inv.begin() + 4));
    EXPECT_TRUE(std::all_of(got.columnwise.begin(), got.columnwise.end(), [](uint8_t v) { return v == 0xA5; }))
        << "columnwise buffer written";
  };
  {
    SCOPED_TRACE("kAuto, FP32 y and rowwise codes");
    const Outputs got = Launch(NormForwardKernel::kAuto, NormDType::kFloat32, true, false);
    EXPECT_EQ(got.plan.row_per_cta, few);
    if (few) {
      EXPECT_EQ(got.plan.rows_per_cta, 1);
      EXPECT_EQ(got.plan.cluster_size, 1);
      EXPECT_LE(got.plan.ctas, std::min<int64_t>(c.n, got.plan.usable_sms * got.plan.ctas_per_sm));
    }
    expect_same(got, want, true);
    const Outputs clusters = Launch(NormForwardKernel::kStatsWarpClusters, NormDType::kFloat32, true, false);
    EXPECT_FALSE(clusters.plan.row_per_cta);
    EXPECT_TRUE(clusters.plan.stats_warp);
    expect_same(clusters, want, true);
  }
  {
    SCOPED_TRACE("kAuto, rowwise codes only");
    const Outputs got = Launch(NormForwardKernel::kAuto, NormDType::kFloat32, false, false);
    EXPECT_EQ(got.plan.row_per_cta, few);
    expect_same(got, want, false);
  }
  SCOPED_TRACE("kAuto against kStatsWarpClusters, BF16 y and rowwise codes");
  const Outputs bf16 = Launch(NormForwardKernel::kAuto, NormDType::kBFloat16, true, false);
  const Outputs bf16_clusters = Launch(NormForwardKernel::kStatsWarpClusters, NormDType::kBFloat16, true, false);
  expect_same(bf16, bf16_clusters, true);
}

// BF16 and FP16 y are the FP32 y converted per value (FloatToBf16 / the hardware RN
// conversion), NaN rows included: the kernel converts pairs in hardware and stores tiles
// holding a NaN again with the per-value conversion.
TEST_P(StatsWarpGpuTest, Writes16BitYAsItsFp32YConverted) {
  const Outputs wide = Launch(NormForwardKernel::kAuto);
  const std::vector<float> y = AsFloats(wide.y);
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "BF16 y" : "FP16 y");
    const Outputs narrow =
        Launch(NormForwardKernel::kAuto, bf16 ? kernels::cuda::NormDType::kBFloat16 : kernels::cuda::NormDType::kFloat16);
    ASSERT_EQ(narrow.y.size(), y.size() * 2);
    int64_t wrong = 0, nan_values = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      uint16_t got = 0;
      std::memcpy(&got, narrow.y.data() + 2 * i, 2);
      const uint16_t want = bf16 ? FloatToBf16(y[i]) : FloatToFp16(y[i]);
      if (std::isnan(y[i])) {
        ++nan_values;
        // FP16: the device RN conversion's NaN need not carry the host codec's payload.
        if (bf16 ? got != want : (got & 0x7C00u) != 0x7C00u || (got & 0x03FFu) == 0u) ++wrong;
      } else if (got != want) {
        ++wrong;
      }
    }
    EXPECT_GT(nan_values, 0) << "the NaN rows are part of this test";
    EXPECT_EQ(wrong, 0);
    EXPECT_TRUE(narrow.rowwise == wide.rowwise) << "codes do not depend on the y type";
  }
}

TEST_P(StatsWarpGpuTest, MatchesCpuAndEncodesItsOwnY) {
  const StatsWarpCase& c = GetParam();
  const Outputs gpu = Launch(NormForwardKernel::kAuto);
  NormForwardOptions options;
  options.eps = 1e-5f;
  options.zero_centered_gamma = c.zero_centered;
  options.y_dtype = DType::kFloat32;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult cpu,
                       kernels::NormalizationForward(Context::Cpu(), c.type, host_x_, gamma_, beta_,
                                                     options));
  const std::vector<float> x = Floats(host_x_);
  const std::vector<float> y = AsFloats(gpu.y);
  const std::vector<float> y_cpu = Floats(cpu.y);
  const std::vector<float> rsigma = AsFloats(gpu.rsigma);
  const std::vector<float> rsigma_cpu = Floats(cpu.rsigma);
  const float* g = gamma_.data<float>();
  const float* b = layer_norm() ? beta_.data<float>() : nullptr;

  // Finite rows against the CPU on the forward-error scale.
  std::vector<double> mean_abs;
  const std::vector<double> y_scale = ForwardScale(x, c.n, c.h, rsigma_cpu, g, b, c.zero_centered, &mean_abs);
  const std::vector<float> mu = layer_norm() ? AsFloats(gpu.mu) : std::vector<float>();
  const std::vector<float> mu_cpu = layer_norm() ? Floats(cpu.mu) : std::vector<float>();
  std::vector<float> got_y, got_rsigma, got_mu;
  std::vector<double> want_y, want_rsigma, want_mu, scale_y, scale_mu;
  for (int64_t r = 0; r < c.n; ++r) {
    if (IsSpecial(r)) continue;
    got_rsigma.push_back(rsigma[r]);
    want_rsigma.push_back(rsigma_cpu[r]);
    if (layer_norm()) {
      got_mu.push_back(mu[r]);
      want_mu.push_back(mu_cpu[r]);
      scale_mu.push_back(mean_abs[r]);
    }
    for (int64_t j = 0; j < c.h; ++j) {
      got_y.push_back(y[r * c.h + j]);
      want_y.push_back(y_cpu[r * c.h + j]);
      scale_y.push_back(y_scale[r * c.h + j]);
    }
  }
  EXPECT_TRUE(AllClose(got_rsigma, want_rsigma, DType::kFloat32));
  if (layer_norm()) {
    EXPECT_TRUE(AllClose(got_mu, want_mu, DType::kFloat32, scale_mu));
  }
  EXPECT_TRUE(AllClose(got_y, want_y, DType::kFloat32, scale_y));

  // Codes: exactly encode(y * scale) of the kernel's own y; columnwise the transpose.
  int64_t not_own = 0, not_transposed = 0, special_wrong = 0, constant_wrong = 0;
  float amax = 0.0f;
  bool amax_nan = false;
  for (int64_t r = 0; r < c.n; ++r) {
    const bool constant = std::find(constant_.begin(), constant_.end(), r) != constant_.end();
    for (int64_t j = 0; j < c.h; ++j) {
      const int64_t i = r * c.h + j;
      if (std::isnan(y[i])) {
        amax_nan = true;
      } else {
        amax = std::max(amax, std::fabs(y[i]));
      }
      if (gpu.rowwise[i] != Encode(c.format, y[i] * scale_)) ++not_own;
      if (gpu.columnwise[j * c.n + r] != gpu.rowwise[i]) ++not_transposed;
      if (IsSpecial(r)) {
        // All NaN, except RMSNorm rows holding only an Inf: NaN there, +0 elsewhere.
        const bool all_nan = layer_norm() || r == 1;
        const bool want_nan = all_nan || std::isinf(x[i]);
        if (want_nan ? !std::isnan(y[i]) || gpu.rowwise[i] != 0x7F : Bits(y[i]) != 0u) ++special_wrong;
      }
      if (constant) {
        // LayerNorm: x - mu == 0 exactly, so y == beta; RMSNorm: x == 0, so y == +0.
        const float want = layer_norm() ? b[j] : 0.0f;
        if (Bits(y[i]) != Bits(want)) ++constant_wrong;
      }
    }
  }
  EXPECT_EQ(not_own, 0) << "codes that are not encode(y * scale)";
  EXPECT_EQ(not_transposed, 0) << "columnwise codes that are not the transposed rowwise codes";
  EXPECT_EQ(special_wrong, 0) << "elements of NaN / Inf rows off their closed form";
  EXPECT_EQ(constant_wrong, 0) << "elements of constant rows that are not beta (LN) / +0 (RMS)";
  ASSERT_TRUE(amax_nan);
  uint32_t amax_bits = 0;
  std::memcpy(&amax_bits, gpu.amax.data(), 4);
  EXPECT_TRUE(std::isnan(AsFloats(gpu.amax)[0])) << "amax bits 0x" << std::hex << amax_bits;
  const std::vector<float> scale_inv = AsFloats(gpu.scale_inv);
  EXPECT_EQ(scale_inv[0], 1.0f / scale_);
  EXPECT_EQ(scale_inv[1], 1.0f / scale_);
  std::printf("[ %s ] max |y| of the finite rows %g\n", ShapeName(c.n, c.h).c_str(), amax);
}

std::vector<StatsWarpCase> StatsWarpCases() {
  const NormType ln = NormType::kLayerNorm, rms = NormType::kRmsNorm;
  const DType f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  const DType e4m3 = DType::kFloat8E4M3, e5m2 = DType::kFloat8E5M2;
  return {
      // The benchmark shape: cluster of 8 x 16 warps, 512 row groups.
      {ln, bf16, 16384, 8192, e4m3, false},
      {rms, bf16, 16384, 8192, e4m3, true},
      // 129 row groups, the last one 8 rows; 122 groups, FP16; clusters of 8.
      {ln, bf16, 4104, 8192, e5m2, false},
      {rms, f16, 3904, 8192, e4m3, false},
      // Cluster of 2 x 12 warps with a partial group, 7 CTAs of 15 warps with a 10-warp last
      // CTA, one warp in a one-CTA cluster, and a cluster of 2 x 16 warps over 129 row
      // groups (the last one 8 rows).
      {ln, bf16, 40, 1536, e4m3, true},
      {rms, f16, 64, 6400, e5m2, true},
      {ln, f16, 16, 64, e4m3, false},
      {ln, bf16, 4104, 2048, e5m2, false},
      // One-CTA clusters (16 warps) with enough groups for the paired order (two pairs per
      // cluster on 132 SMs), the partial last group among the single ones.
      {ln, f16, 17416, 1024, e4m3, false},
      // Few rows (the one-CTA-per-row kernel without a columnwise copy): 8 rows of 8192, 136
      // rows of 4096 (clusters of 4), 256 rows of 8192 (more rows than CTAs: each takes two);
      // 1024 rows of 8192 take the cluster kernel.
      {ln, bf16, 8, 8192, e4m3, false},
      {ln, f16, 136, 4096, e4m3, true},
      {rms, bf16, 256, 8192, e5m2, false},
      {ln, bf16, 1024, 8192, e4m3, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, StatsWarpGpuTest, ::testing::ValuesIn(StatsWarpCases()),
                         StatsWarpName);

// The one-CTA-per-row kernel also takes row counts the cluster kernels cannot (rows % 8 !=
// 0: decode-sized batches). A row's outputs depend only on that row and the column count, so
// the first n rows of an 8-row launch of the register-tile kernel on the same x are the
// reference for n = 1, 3, 5, 7: y, rowwise codes, mu and rsigma byte for byte, amax the
// largest |y| of those rows (NaN once the NaN row 2 is among them).
TEST(StatsWarpGpu, OneCtaPerRowTakesAnyRowCount) {
  TESERVE_SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 8, kCols = 8192;
  Tensor x32 = RandomInput(DType::kFloat32, kRows, kCols, 991);
  x32.data<float>()[2 * kCols + 7] = std::nanf("");
  const Tensor x = OnDevice(kernels::cpu::CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value());
  const Tensor gamma = OnDevice(RandomVector(kCols, 0.5f, 1.5f, 992));
  const Tensor beta = OnDevice(RandomVector(kCols, -1.0f, 1.0f, 993));
  auto launch = [&](int64_t n, NormForwardKernel kernel, bool with_columnwise) {
    const ForwardBuffers buffers(n, kCols);
    kernels::cuda::NormForwardParams p;
    p.x = x.raw_data();
    p.x_type = kernels::cuda::NormDType::kBFloat16;
    p.rows = n;
    p.cols = kCols;
    p.gamma = gamma.data<float>();
    p.beta = beta.data<float>();
    p.eps = 1e-5f;
    buffers.Attach(&p, true);
    if (!with_columnwise) {
      p.columnwise = nullptr;
      p.columnwise_scale_inv = nullptr;
    }
    p.y_type = kernels::cuda::NormDType::kFloat32;
    p.scale = 64.0f;
    p.scale_inv = 1.0f / 64.0f;
    p.kernel = kernel;
    Outputs out;
    EXPECT_EQ(kernels::cuda::PlanNormForward(p, &out.plan), cudaSuccess);
    EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.y = ToHost(buffers.y, n * kCols * 4);
    out.rowwise = ToHost(buffers.rowwise, n * kCols);
    out.mu = ToHost(buffers.mu, n * 4);
    out.rsigma = ToHost(buffers.rsigma, n * 4);
    out.amax = ToHost(buffers.amax, 4);
    return out;
  };
  const Outputs want = launch(kRows, NormForwardKernel::kRegisterTile, true);
  ASSERT_TRUE(want.plan.register_tile);
  auto head = [](const std::vector<uint8_t>& v, int64_t bytes) {
    return std::vector<uint8_t>(v.begin(), v.begin() + bytes);
  };
  for (const int64_t n : {1, 3, 5, 7}) {
    SCOPED_TRACE(absl::StrCat(n, " rows"));
    const Outputs got = launch(n, NormForwardKernel::kAuto, false);
    EXPECT_TRUE(got.plan.row_per_cta);
    EXPECT_LE(got.plan.ctas, n);
    EXPECT_TRUE(got.y == head(want.y, n * kCols * 4)) << "y";
    EXPECT_TRUE(got.rowwise == head(want.rowwise, n * kCols)) << "rowwise codes";
    EXPECT_TRUE(got.mu == head(want.mu, n * 4)) << "mu";
    EXPECT_TRUE(got.rsigma == head(want.rsigma, n * 4)) << "rsigma";
    const float amax = AsFloats(got.amax)[0];
    if (n > 2) {
      EXPECT_TRUE(std::isnan(amax)) << amax;
    } else {
      const std::vector<float> y = AsFloats(want.y);
      float largest = 0.0f;
      for (int64_t i = 0; i < n * kCols; ++i) largest = std::max(largest, std::fabs(y[i]));
      EXPECT_EQ(amax, largest);
    }
  }
  // With a columnwise copy such row counts are not the stats-warp kernels' (the op's tile
  // kernel takes them).
  EXPECT_FALSE(launch(3, NormForwardKernel::kAuto, true).plan.row_per_cta);
}

#else

TEST(StatsWarpGpu, SkippedWithoutCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
