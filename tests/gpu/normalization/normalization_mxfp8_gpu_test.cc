// MXFP8 output of the CUDA LayerNorm / RMSNorm forward (part of normalization_gpu_test):
// the fused path (by default the stats-warp kernel, kernels/cuda/normalization/normalization_stats_warp.cu;
// the register-tile kernel, normalization_register_tile.cu, on request: both kMx, both
// through normalization_register_tile_mxfp8.cuh, and the direct-launch test asserts they
// write the same bytes) and the two-pass composition it replaces.
//
// The contract tested (kernels/normalization.h, kernels/block_quantize.h):
// - The codes, E8M0 scales and amax are exactly QuantizeMxfp8 (CPU reference) of the
//   GPU's own FP32 y from the same call, for every element and block, both copies.
// - The fused result equals the two-pass result on the GPU (FP32 norm, then QuantizeMxfp8
//   on the device) field for field and bit for bit: y, mu, rsigma, data and scale tensors
//   (dtype, shape, bytes), mode, format, amax.
// - Against the CPU op: y, mu, rsigma within tests/kernels/tolerances.h; a code or scale
//   differs only in a block where some FP32 y differs, and in few elements.
// - Which inputs take the fused path (cuda::FusesMxfp8), the switch's fallback for the
//   others, NaN / Inf / zero blocks, and a direct launch writing every output byte.
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
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/normalization/normalization_cuda.h"
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
using norm_gpu_test::AsDoubles;
using norm_gpu_test::Bits;
using norm_gpu_test::ForwardScale;
using norm_gpu_test::RandomInput;
using norm_gpu_test::RandomVector;
using norm_gpu_test::ShapeName;
using testing::Bytes;
using testing::Floats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing_kernels::AllClose;

constexpr int64_t kBlock = 32;

struct Mxfp8Case {
  NormType type;
  DType dtype;
  int64_t n, h;
  DType format;
  bool zero_centered;
  bool rowwise, columnwise;
  bool fused;  // expected cuda::FusesMxfp8
};

std::string Mxfp8Name(const ::testing::TestParamInfo<Mxfp8Case>& info) {
  const Mxfp8Case& c = info.param;
  return absl::StrCat(c.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(c.dtype), "_", ShapeName(c.n, c.h), "_",
                      c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2",
                      c.zero_centered ? "_ZeroCentered" : "",
                      c.rowwise && c.columnwise ? "_Both" : c.rowwise ? "_Rowwise" : "_Columnwise",
                      c.fused ? "_Fused" : "_TwoPass");
}

// Same bytes, dtype and shape (or both undefined).
void ExpectSameTensor(const Tensor& got, const Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.defined(), want.defined());
  if (!want.defined()) return;
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.shape(), want.shape());
  EXPECT_TRUE(Bytes(got) == Bytes(want)) << "bytes differ";
}

void ExpectSameQuantized(const QuantizedTensor& got, const QuantizedTensor& want) {
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.format, want.format);
  EXPECT_EQ(got.mode, want.mode);
  if (std::isnan(want.amax)) {  // NaN payloads are not part of the contract
    EXPECT_TRUE(std::isnan(got.amax)) << got.amax;
  } else {
    EXPECT_EQ(Bits(got.amax), Bits(want.amax)) << got.amax << " vs " << want.amax;
  }
  ExpectSameTensor(got.rowwise_data, want.rowwise_data, "rowwise_data");
  ExpectSameTensor(got.rowwise_scale_inv, want.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameTensor(got.columnwise_data, want.columnwise_data, "columnwise_data");
  ExpectSameTensor(got.columnwise_scale_inv, want.columnwise_scale_inv, "columnwise_scale_inv");
}

class NormMxfp8GpuTest : public ::testing::TestWithParam<Mxfp8Case> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const Mxfp8Case& c = GetParam();
    const uint64_t seed = static_cast<uint64_t>(c.n * 977 + c.h);
    host_x_ = RandomInput(c.dtype, c.n, c.h, seed);
    gamma_ = c.zero_centered ? RandomVector(c.h, -0.5f, 0.5f, seed + 1)
                             : RandomVector(c.h, 0.5f, 1.5f, seed + 1);
    if (layer_norm()) beta_ = RandomVector(c.h, -1.0f, 1.0f, seed + 2);
    x_ = OnDevice(host_x_);
    gamma_gpu_ = OnDevice(gamma_);
    if (layer_norm()) beta_gpu_ = OnDevice(beta_);
    options_.zero_centered_gamma = c.zero_centered;
    options_.y_dtype = DType::kFloat32;
    options_.mxfp8 = true;
    options_.mxfp8_options.format = c.format;
    options_.mxfp8_options.rowwise = c.rowwise;
    options_.mxfp8_options.columnwise = c.columnwise;
  }

  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }

  absl::StatusOr<NormForwardResult> Gpu(const NormForwardOptions& options) const {
    return kernels::NormalizationForward(GpuContext(), GetParam().type, x_, gamma_gpu_, beta_gpu_,
                                         options);
  }

  Tensor host_x_, gamma_, beta_;
  Tensor x_, gamma_gpu_, beta_gpu_;
  NormForwardOptions options_;
};

TEST_P(NormMxfp8GpuTest, IsTheBlockQuantizationOfItsOwnFp32YAndEqualsTheTwoPassPath) {
  const Mxfp8Case& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const bool fused, kernels::cuda::FusesMxfp8(c.type, x_, gamma_gpu_,
                                                                   beta_gpu_, options_));
  EXPECT_EQ(fused, c.fused);
  ASSERT_OK_AND_ASSIGN(const NormForwardResult gpu, Gpu(options_));
  ASSERT_EQ(gpu.y.dtype(), DType::kFloat32);

  // Exactly QuantizeMxfp8 (CPU) of the call's own FP32 y.
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor own,
                       kernels::QuantizeMxfp8(Context::Cpu(), OnHost(gpu.y), options_.mxfp8_options));
  ExpectSameQuantized(gpu.fp8, own);
  EXPECT_EQ(gpu.fp8.has_rowwise(), c.rowwise);
  EXPECT_EQ(gpu.fp8.has_columnwise(), c.columnwise);

  // The two-pass composition on the GPU: FP32 norm without MXFP8, QuantizeMxfp8 on the
  // device. Same statistics code, so the same y bits, and the same structure.
  NormForwardOptions plain = options_;
  plain.mxfp8 = false;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult norm, Gpu(plain));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor two_pass,
                       kernels::QuantizeMxfp8(GpuContext(), norm.y, options_.mxfp8_options));
  ExpectSameTensor(gpu.y, norm.y, "y");
  ExpectSameTensor(gpu.rsigma, norm.rsigma, "rsigma");
  ExpectSameTensor(gpu.mu, norm.mu, "mu");
  ExpectSameQuantized(gpu.fp8, two_pass);

  // Against the CPU op: statistics and y within tolerance; codes and scales move only in
  // blocks where some FP32 y moved.
  ASSERT_OK_AND_ASSIGN(const NormForwardResult cpu,
                       kernels::NormalizationForward(Context::Cpu(), c.type, host_x_, gamma_, beta_,
                                                     options_));
  const std::vector<float> y_gpu = Floats(gpu.y), y_cpu = Floats(cpu.y);
  const std::vector<float> rsigma_cpu = Floats(cpu.rsigma);
  std::vector<double> mean_abs;
  const std::vector<double> y_scale =
      ForwardScale(Floats(host_x_), c.n, c.h, rsigma_cpu, gamma_.data<float>(),
                   layer_norm() ? beta_.data<float>() : nullptr, c.zero_centered, &mean_abs);
  EXPECT_TRUE(AllClose(Floats(gpu.rsigma), AsDoubles(rsigma_cpu), DType::kFloat32));
  if (layer_norm()) {
    EXPECT_TRUE(AllClose(Floats(gpu.mu), AsDoubles(Floats(cpu.mu)), DType::kFloat32, mean_abs));
  }
  EXPECT_TRUE(AllClose(y_gpu, AsDoubles(y_cpu), DType::kFloat32, y_scale));
  // y_same[r * h + j]: the FP32 y agree bit for bit.
  std::vector<bool> y_same(c.n * c.h);
  for (int64_t i = 0; i < c.n * c.h; ++i) y_same[i] = Bits(y_gpu[i]) == Bits(y_cpu[i]);
  int64_t code_differs = 0, unexplained = 0;
  auto compare = [&](const Tensor& got, const Tensor& want, const Tensor& got_scales,
                     const Tensor& want_scales, bool transposed) {
    const std::vector<uint8_t> a = Bytes(got), b = Bytes(want);
    const std::vector<uint8_t> sa = Bytes(got_scales), sb = Bytes(want_scales);
    const int64_t rows = transposed ? c.h : c.n, cols = transposed ? c.n : c.h;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t blk = 0; blk < cols / kBlock; ++blk) {
        bool block_same = true;
        for (int64_t j = blk * kBlock; j < (blk + 1) * kBlock; ++j) {
          block_same = block_same && y_same[transposed ? j * c.h + r : r * c.h + j];
        }
        if (sa[r * (cols / kBlock) + blk] != sb[r * (cols / kBlock) + blk] && block_same) ++unexplained;
        for (int64_t j = blk * kBlock; j < (blk + 1) * kBlock; ++j) {
          if (a[r * cols + j] == b[r * cols + j]) continue;
          ++code_differs;
          if (block_same) ++unexplained;
        }
      }
    }
  };
  if (c.rowwise) {
    compare(gpu.fp8.rowwise_data, cpu.fp8.rowwise_data, gpu.fp8.rowwise_scale_inv,
            cpu.fp8.rowwise_scale_inv, false);
  }
  if (c.columnwise) {
    compare(gpu.fp8.columnwise_data, cpu.fp8.columnwise_data, gpu.fp8.columnwise_scale_inv,
            cpu.fp8.columnwise_scale_inv, true);
  }
  EXPECT_EQ(unexplained, 0) << "codes or scales differing in blocks whose FP32 y agree";
  const int64_t copies = (c.rowwise ? 1 : 0) + (c.columnwise ? 1 : 0);
  EXPECT_LE(code_differs, std::max<int64_t>(1, copies * c.n * c.h / 100));
}

TEST_P(NormMxfp8GpuTest, OutputVariantsAgreeWithTheFullRun) {
  const Mxfp8Case& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const NormForwardResult full, Gpu(options_));
  // No y: the same codes, scales, amax and statistics.
  NormForwardOptions codes_only = options_;
  codes_only.write_y = false;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult codes, Gpu(codes_only));
  EXPECT_FALSE(codes.y.defined());
  ExpectSameQuantized(codes.fp8, full.fp8);
  ExpectSameTensor(codes.rsigma, full.rsigma, "rsigma");
  // y in x's dtype: the FP32 y rounded once; codes unchanged.
  NormForwardOptions narrow = options_;
  narrow.y_dtype.reset();
  ASSERT_OK_AND_ASSIGN(const NormForwardResult narrow_out, Gpu(narrow));
  ASSERT_OK_AND_ASSIGN(const Tensor rounded,
                       kernels::cpu::CastFromFloat32(Context::Cpu(), OnHost(full.y), c.dtype));
  ExpectSameTensor(OnHost(narrow_out.y), rounded, "y in x's dtype");
  ExpectSameQuantized(narrow_out.fp8, full.fp8);
  // One copy at a time: each equals the full run's.
  if (c.rowwise && c.columnwise) {
    NormForwardOptions one = codes_only;
    one.mxfp8_options.columnwise = false;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult rows_only, Gpu(one));
    EXPECT_FALSE(rows_only.fp8.has_columnwise());
    ExpectSameTensor(rows_only.fp8.rowwise_data, full.fp8.rowwise_data, "rowwise only");
    ExpectSameTensor(rows_only.fp8.rowwise_scale_inv, full.fp8.rowwise_scale_inv, "rowwise only");
    one.mxfp8_options.columnwise = true;
    one.mxfp8_options.rowwise = false;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult cols_only, Gpu(one));
    EXPECT_FALSE(cols_only.fp8.has_rowwise());
    ExpectSameTensor(cols_only.fp8.columnwise_data, full.fp8.columnwise_data, "columnwise only");
    ExpectSameTensor(cols_only.fp8.columnwise_scale_inv, full.fp8.columnwise_scale_inv,
                     "columnwise only");
    EXPECT_EQ(Bits(cols_only.fp8.amax), Bits(full.fp8.amax));
  }
}

std::vector<Mxfp8Case> Mxfp8Cases() {
  const NormType ln = NormType::kLayerNorm, rms = NormType::kRmsNorm;
  const DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  const DType e4m3 = DType::kFloat8E4M3, e5m2 = DType::kFloat8E5M2;
  return {
      // Fused (the stats-warp kernel).
      {ln, bf16, 16384, 8192, e4m3, false, true, true, true},  // the benchmark shape
      {ln, bf16, 64, 64, e4m3, false, true, true, true},       // one warp per CTA
      {ln, f16, 32, 1024, e5m2, true, true, true, true},       // one tile, 16 warps
      {rms, bf16, 32, 1024, e4m3, true, true, true, true},
      {rms, f16, 96, 6400, e4m3, false, true, true, true},     // cluster of 7, last CTA 10 warps
      {ln, bf16, 4128, 2048, e5m2, false, true, true, true},   // many tiles per cluster
      {rms, bf16, 1024, 8192, e5m2, true, true, true, true},   // cluster of 8
      {ln, bf16, 40, 1536, e4m3, false, true, false, true},    // rowwise: partial row tile
      {ln, f16, 8, 64, e4m3, true, true, false, true},         // rowwise: one 8-row group
      {rms, bf16, 256, 512, e4m3, false, false, true, true},   // columnwise only
      // Two passes: shapes and dtypes the register tile does not take.
      {ln, bf16, 64, 96, e4m3, false, true, true, false},      // cols % 64 != 0
      {ln, f32, 64, 1024, e4m3, false, true, true, false},     // FP32 x
      {rms, bf16, 32, 8256, e5m2, false, true, true, false},   // wider than a cluster
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormMxfp8GpuTest, ::testing::ValuesIn(Mxfp8Cases()), Mxfp8Name);

// Non-finite and zero blocks through the fused kernel: a NaN row (LayerNorm of a row
// holding NaN or Inf is NaN throughout) gives scale 0xFF and code 0x7F everywhere in its
// rowwise blocks and in every column block it touches; a y that overflows to Inf (gamma
// 3e38) gives scale 0xFE; a constant row with beta 0 gives zero blocks (scale 0, codes 0).
// Everything still equals QuantizeMxfp8 of the call's own y.
TEST(NormMxfp8GpuEdgeTest, NanInfAndZeroBlocksOnTheFusedKernel) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int64_t n = 64, h = 1024;
  Tensor x32 = RandomInput(DType::kFloat32, n, h, 41);
  x32.data<float>()[5 * h + 7] = std::nanf("");
  x32.data<float>()[9 * h + 1000] = INFINITY;
  for (int64_t j = 0; j < h; ++j) x32.data<float>()[40 * h + j] = 1.5f;  // constant row
  const Tensor x = kernels::cpu::CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value();
  Tensor gamma = RandomVector(h, 0.5f, 1.5f, 42);
  gamma.data<float>()[300] = 3e38f;  // |xhat| > 1.14 overflows to Inf
  const Tensor beta = Tensor::Zeros(DType::kFloat32, {h}).value();
  NormForwardOptions options;
  options.y_dtype = DType::kFloat32;
  options.mxfp8 = true;
  options.mxfp8_options.rowwise = true;
  options.mxfp8_options.columnwise = true;
  const Tensor xg = OnDevice(x), gg = OnDevice(gamma), bg = OnDevice(beta);
  ASSERT_OK_AND_ASSIGN(const bool fused,
                       kernels::cuda::FusesMxfp8(NormType::kLayerNorm, xg, gg, bg, options));
  EXPECT_TRUE(fused);
  ASSERT_OK_AND_ASSIGN(const NormForwardResult out,
                       kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, xg, gg, bg,
                                                     options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor own,
                       kernels::QuantizeMxfp8(Context::Cpu(), OnHost(out.y), options.mxfp8_options));
  ExpectSameQuantized(out.fp8, own);
  EXPECT_TRUE(std::isnan(out.fp8.amax));

  const std::vector<float> y = Floats(out.y);
  const std::vector<uint8_t> rowwise = Bytes(out.fp8.rowwise_data);
  const std::vector<uint8_t> row_scales = Bytes(out.fp8.rowwise_scale_inv);
  const std::vector<uint8_t> columnwise = Bytes(out.fp8.columnwise_data);
  const std::vector<uint8_t> col_scales = Bytes(out.fp8.columnwise_scale_inv);
  int64_t nan_wrong = 0, zero_wrong = 0, inf_blocks = 0, inf_wrong = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const bool nan_row = r == 5 || r == 9;
      if (nan_row && (!std::isnan(y[r * h + j]) || rowwise[r * h + j] != 0x7F ||
                      columnwise[j * n + r] != 0x7F || col_scales[j * (n / kBlock) + r / kBlock] != 0xFF)) {
        ++nan_wrong;
      }
      if (r == 40 && (y[r * h + j] != 0.0f || rowwise[r * h + j] != 0x00)) ++zero_wrong;
    }
    for (int64_t blk = 0; blk < h / kBlock; ++blk) {
      const uint8_t s = row_scales[r * (h / kBlock) + blk];
      if (r == 5 || r == 9) {
        nan_wrong += s != 0xFF;
      } else if (r == 40) {
        zero_wrong += s != 0x00;
      } else if (std::isinf(y[r * h + 300]) && blk == 300 / kBlock) {
        ++inf_blocks;
        inf_wrong += s != 0xFE;
      }
    }
  }
  EXPECT_EQ(nan_wrong, 0);
  EXPECT_EQ(zero_wrong, 0);
  EXPECT_GT(inf_blocks, 0) << "no y overflowed to Inf: the case does not test that block";
  EXPECT_EQ(inf_wrong, 0);
}

// Which inputs cuda::FusesMxfp8 accepts, and that a direct launch with p.mxfp8 writes
// every output byte (buffers poisoned) or refuses an uncovered shape.
TEST(NormMxfp8GpuEdgeTest, FusedPathSelectionAndDirectLaunch) {
  TESERVE_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct Sel {
    DType dtype;
    int64_t n, h;
    bool rowwise, columnwise;
    int sm_margin;
    bool fused;
  };
  const DType bf16 = DType::kBFloat16, f32 = DType::kFloat32;
  for (const Sel& s : {Sel{bf16, 64, 8192, true, true, 0, true}, Sel{bf16, 40, 1536, true, false, 0, true},
                       Sel{bf16, 8, 64, true, false, 0, true},
                       Sel{bf16, 64, 8192, true, true, sms - 1, false},  // cluster of 8 needs 8 SMs
                       Sel{bf16, 96, 1024, false, true, 0, true},        // columnwise only
                       Sel{bf16, 64, 96, true, true, 0, false}, Sel{f32, 64, 1024, true, true, 0, false},
                       Sel{bf16, 32, 8256, true, false, 0, false}}) {
    SCOPED_TRACE(absl::StrCat(ShapeName(s.n, s.h), " margin ", s.sm_margin));
    const Tensor x = OnDevice(RandomInput(s.dtype, s.n, s.h, 7));
    const Tensor gamma = OnDevice(RandomVector(s.h, 0.5f, 1.5f, 8));
    const Tensor beta = OnDevice(RandomVector(s.h, -1.0f, 1.0f, 9));
    NormForwardOptions options;
    options.mxfp8 = true;
    options.mxfp8_options.rowwise = s.rowwise;
    options.mxfp8_options.columnwise = s.columnwise;
    options.sm_margin = s.sm_margin;
    ASSERT_OK_AND_ASSIGN(const bool fused,
                         kernels::cuda::FusesMxfp8(NormType::kLayerNorm, x, gamma, beta, options));
    EXPECT_EQ(fused, s.fused);
    // Whichever path: the op's codes are QuantizeMxfp8 of its own FP32 y.
    options.y_dtype = DType::kFloat32;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult out,
                         kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma,
                                                       beta, options));
    ASSERT_OK_AND_ASSIGN(const QuantizedTensor own, kernels::QuantizeMxfp8(
                                                        Context::Cpu(), OnHost(out.y), options.mxfp8_options));
    ExpectSameQuantized(out.fp8, own);

    // Direct launch into poisoned buffers.
    const int64_t numel = s.n * s.h;
    uint8_t *buffer = nullptr;
    const int64_t y_bytes = numel * 4, row_scale_bytes = s.n * (s.h / kBlock),
                  col_scale_bytes = s.h * (s.n / kBlock);
    const int64_t total = y_bytes + 2 * numel + row_scale_bytes + col_scale_bytes + 8 * s.n + 256 * 8;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), total), cudaSuccess);
    ASSERT_EQ(cudaMemset(buffer, 0xA5, total), cudaSuccess);
    int64_t offset = 0;  // 8 carves, each rounded up to 256 bytes
    auto carve = [&](int64_t bytes) {
      uint8_t* p = buffer + offset;
      offset += (bytes + 255) / 256 * 256;
      return p;
    };
    kernels::cuda::NormForwardParams p;
    p.x = x.raw_data();
    p.x_type = s.dtype == bf16 ? kernels::cuda::NormDType::kBFloat16 : kernels::cuda::NormDType::kFloat32;
    p.rows = s.n;
    p.cols = s.h;
    p.gamma = gamma.data<float>();
    p.beta = beta.data<float>();
    p.sm_margin = s.sm_margin;
    p.y = carve(y_bytes);
    p.y_type = kernels::cuda::NormDType::kFloat32;
    p.mu = reinterpret_cast<float*>(carve(4 * s.n));
    p.rsigma = reinterpret_cast<float*>(carve(4 * s.n));
    p.mxfp8 = true;
    if (s.rowwise) {
      p.rowwise = carve(numel);
      p.rowwise_e8m0 = carve(row_scale_bytes);
    }
    if (s.columnwise) {
      p.columnwise = carve(numel);
      p.columnwise_e8m0 = carve(col_scale_bytes);
    }
    p.amax_bits = reinterpret_cast<uint32_t*>(carve(4));
    // The default choice (the stats-warp kernel where it applies) and the register-tile
    // kernel: both must write the op's bytes (same tiles, arithmetic and merge order).
    for (const kernels::cuda::NormForwardKernel kernel :
         {kernels::cuda::NormForwardKernel::kAuto, kernels::cuda::NormForwardKernel::kRegisterTile}) {
      SCOPED_TRACE(kernel == kernels::cuda::NormForwardKernel::kAuto ? "kAuto" : "kRegisterTile");
      p.kernel = kernel;
      ASSERT_EQ(cudaMemset(buffer, 0xA5, total), cudaSuccess);
      const cudaError_t status = kernels::cuda::LaunchNormForward(p, nullptr);
      if (!s.fused) {
        EXPECT_EQ(status, cudaErrorNotSupported);
        continue;
      }
      ASSERT_EQ(status, cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      kernels::cuda::NormForwardPlan plan;
      ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
      EXPECT_EQ(plan.stats_warp, kernel == kernels::cuda::NormForwardKernel::kAuto);
      auto bytes_of = [](const void* device, int64_t count) {
        std::vector<uint8_t> host(count);
        EXPECT_EQ(cudaMemcpy(host.data(), device, count, cudaMemcpyDeviceToHost), cudaSuccess);
        return host;
      };
      EXPECT_TRUE(bytes_of(p.y, y_bytes) == Bytes(out.y));
      EXPECT_TRUE(bytes_of(p.mu, 4 * s.n) == Bytes(out.mu));
      EXPECT_TRUE(bytes_of(p.rsigma, 4 * s.n) == Bytes(out.rsigma));
      if (s.rowwise) {
        EXPECT_TRUE(bytes_of(p.rowwise, numel) == Bytes(out.fp8.rowwise_data));
        EXPECT_TRUE(bytes_of(p.rowwise_e8m0, row_scale_bytes) == Bytes(out.fp8.rowwise_scale_inv));
      }
      if (s.columnwise) {
        EXPECT_TRUE(bytes_of(p.columnwise, numel) == Bytes(out.fp8.columnwise_data));
        EXPECT_TRUE(bytes_of(p.columnwise_e8m0, col_scale_bytes) ==
                    Bytes(out.fp8.columnwise_scale_inv));
      }
      uint32_t amax = 0;
      ASSERT_EQ(cudaMemcpy(&amax, p.amax_bits, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(amax, Bits(out.fp8.amax));
    }
    cudaFree(buffer);
  }
}

#else

TEST(NormMxfp8Gpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
