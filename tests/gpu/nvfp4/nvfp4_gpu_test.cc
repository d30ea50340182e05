// CUDA NVFP4 (kernels/cuda/nvfp4/nvfp4_cuda.h) against the CPU reference
// (kernels/cpu/nvfp4_cpu.h) on the same inputs and Context seed: packed codes, E4M3
// block scales, amax and the global encode scale are compared byte for byte, and so
// are the dequantized copies (NaN payloads aside), the unscaled E2M1 casts and the
// Hadamard transform.
// Stochastic rounding must reproduce the CPU's draws exactly (same counter-based RNG,
// same keys and element indices), so it is held to the same bit-exact standard.
//
// Most inputs carry no NaN/Inf, so the global scale S = 2688 / amax is a real scale;
// the cases marked Specials add NaN and +-Inf (S = 1, NaN blocks, saturation).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/cpu/nvfp4_cpu.h"
#include "kernels/cuda/nvfp4/nvfp4_cuda.h"
#include "kernels/cuda/nvfp4/nvfp4_kernels.h"
#include "kernels/hadamard.h"
#include "kernels/nvfp4.h"
#include "kernels/stochastic_rounding.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::Copy;
using kernels::Nvfp4QuantizeOptions;
using testing::ExpectSameAmax;
using testing::ExpectSameBytes;
using testing::ExpectSameFloats;
using testing::FloatBitsOf;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::QuantizeTestValues;

constexpr uint64_t kSeed = 0x1234ABCDull;

enum class Copies { kRowwise, kColumnwise, kBoth };
enum class Source { kFloat32, kBFloat16 };

struct Nvfp4Case {
  int64_t rows;
  int64_t cols;
  Copies copies;
  bool two_d;
  bool random_hadamard;
  bool stochastic;
  bool specials;
  Source source;
};

std::string CaseName(const ::testing::TestParamInfo<Nvfp4Case>& info) {
  const Nvfp4Case& c = info.param;
  const char* copies = c.copies == Copies::kRowwise      ? "Rowwise"
                       : c.copies == Copies::kColumnwise ? "Columnwise"
                                                         : "Both";
  return absl::StrCat(c.source == Source::kFloat32 ? "Float32" : "BFloat16", "_", c.rows, "x",
                      c.cols, "_", copies, c.two_d ? "_2D" : "_1D", c.random_hadamard ? "_Rht" : "",
                      c.stochastic ? "_Stochastic" : "_Nearest", c.specials ? "_Specials" : "");
}

Context SeededGpuContext() {
  Context ctx = GpuContext();
  ctx.seed = kSeed;
  return ctx;
}

Context SeededCpuContext() {
  Context ctx = Context::Cpu();
  ctx.seed = kSeed;
  return ctx;
}

class Nvfp4GpuTest : public ::testing::TestWithParam<Nvfp4Case> {};

TEST_P(Nvfp4GpuTest, MatchesCpuBitExact) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Nvfp4Case& c = GetParam();
  const std::vector<float> values = QuantizeTestValues(
      c.rows * c.cols, static_cast<uint32_t>(c.rows * 313 + c.cols), c.specials);
  Nvfp4QuantizeOptions options;
  options.rowwise = c.copies != Copies::kColumnwise;
  options.columnwise = c.copies != Copies::kRowwise;
  options.two_d = c.two_d;
  options.random_hadamard = c.random_hadamard;
  options.stochastic_rounding = c.stochastic;
  options.rng_stream = 7;
  Tensor cpu_input;
  Tensor gpu_input;
  testing::Bf16Input bf16;
  if (c.source == Source::kFloat32) {
    ASSERT_OK_AND_ASSIGN(cpu_input, Tensor::FromFloats(values, {c.rows, c.cols}));
    gpu_input = OnDevice(cpu_input);
  } else {
    testing::MakeBf16Input(values, c.rows, c.cols, &bf16);
    cpu_input = bf16.widened;
    gpu_input = OnDevice(bf16.bf16);
  }
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizeNvfp4(SeededCpuContext(), cpu_input, options));
  // FP32 through the checked entry point (dispatch), BF16 straight to the CUDA op.
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       c.source == Source::kFloat32
                           ? kernels::QuantizeNvfp4(SeededGpuContext(), gpu_input, options)
                           : kernels::cuda::QuantizeNvfp4(SeededGpuContext(), gpu_input, options));
  EXPECT_EQ(gpu.shape, cpu.shape);
  EXPECT_EQ(gpu.mode, cpu.mode);
  EXPECT_EQ(gpu.format, DType::kFloat4E2M1);
  ExpectSameAmax(gpu.amax, cpu.amax);
  EXPECT_EQ(FloatBitsOf(gpu.global_encode_scale), FloatBitsOf(cpu.global_encode_scale))
      << "gpu S " << gpu.global_encode_scale << " cpu S " << cpu.global_encode_scale;
  ExpectSameBytes(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data");
  ExpectSameBytes(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameBytes(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data");
  ExpectSameBytes(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, "columnwise_scale_inv");
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    if (!(copy == Copy::kRowwise ? cpu.has_rowwise() : cpu.has_columnwise())) continue;
    ASSERT_OK_AND_ASSIGN(const Tensor cpu_out,
                         kernels::cpu::DequantizeNvfp4(Context::Cpu(), cpu, copy));
    ASSERT_OK_AND_ASSIGN(const Tensor gpu_out, kernels::DequantizeNvfp4(GpuContext(), gpu, copy));
    ExpectSameFloats(gpu_out, cpu_out,
                     copy == Copy::kRowwise ? "dequantized rowwise" : "dequantized columnwise");
    // The one-pass BF16 output (an emulated GEMM's operand) is Convert of the FP32 values
    // the device wrote (bit for bit, NaN payloads included; those may differ from the
    // CPU's, which ExpectSameFloats allows).
    ASSERT_OK_AND_ASSIGN(const Tensor gpu_bf16, kernels::DequantizeNvfp4(GpuContext(), gpu, copy, DType::kBFloat16));
    EXPECT_EQ(gpu_bf16.dtype(), DType::kBFloat16);
    ASSERT_OK_AND_ASSIGN(const Tensor cpu_bf16, kernels::Convert(Context::Cpu(), OnHost(gpu_out), DType::kBFloat16));
    ExpectSameBytes(gpu_bf16, cpu_bf16, copy == Copy::kRowwise ? "BF16 rowwise" : "BF16 columnwise");
  }
}

std::vector<Nvfp4Case> Cases() {
  std::vector<Nvfp4Case> cases;
  for (Source source : {Source::kFloat32, Source::kBFloat16}) {
    for (bool stochastic : {false, true}) {
      // 1D: one row, tails, odd widths for the columnwise copy, aligned shapes.
      cases.push_back({1, 64, Copies::kRowwise, false, false, stochastic, false, source});
      cases.push_back({257, 48, Copies::kRowwise, false, false, stochastic, false, source});
      cases.push_back({16, 259, Copies::kColumnwise, false, false, stochastic, false, source});
      cases.push_back({128, 129, Copies::kColumnwise, false, true, stochastic, false, source});
      cases.push_back({128, 144, Copies::kBoth, false, false, stochastic, false, source});
      cases.push_back({128, 144, Copies::kBoth, false, true, stochastic, false, source});
      cases.push_back({256, 512, Copies::kBoth, false, true, stochastic, true, source});
      cases.push_back({256, 512, Copies::kBoth, false, false, stochastic, true, source});
      // 2D: both copies from one set of 16x16 scales.
      cases.push_back({16, 16, Copies::kBoth, true, false, stochastic, false, source});
      cases.push_back({144, 272, Copies::kBoth, true, false, stochastic, false, source});
      cases.push_back({144, 272, Copies::kColumnwise, true, false, stochastic, true, source});
    }
  }
  cases.push_back({16384, 8192, Copies::kBoth, false, true, true, false, Source::kBFloat16});
  cases.push_back({16384, 8192, Copies::kBoth, true, false, false, false, Source::kFloat32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4GpuTest, ::testing::ValuesIn(Cases()), CaseName);

TEST(Nvfp4Gpu, LaunchWritesEveryOutputByte) {
  TESERVE_SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 80;
  constexpr int64_t kCols = 144;
  const std::vector<float> values = QuantizeTestValues(kRows * kCols, 5u, /*specials=*/false);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {kRows, kCols}));
  Nvfp4QuantizeOptions options;
  options.columnwise = true;
  options.random_hadamard = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizeNvfp4(Context::Cpu(), host, options));
  auto poisoned_like = [](const Tensor& t) {
    Tensor d = OnDevice(t);
    EXPECT_EQ(cudaMemset(d.raw_data(), 0xA5, d.nbytes()), cudaSuccess);
    return d;
  };
  Tensor row = poisoned_like(cpu.rowwise_data);
  Tensor row_scales = poisoned_like(cpu.rowwise_scale_inv);
  Tensor col = poisoned_like(cpu.columnwise_data);
  Tensor col_scales = poisoned_like(cpu.columnwise_scale_inv);
  const Tensor x = OnDevice(host);
  kernels::cuda::Nvfp4QuantizeLaunchParams p;
  p.x = x.raw_data();
  p.rows = kRows;
  p.cols = kCols;
  p.random_hadamard = true;
  for (int j = 0; j < kernels::kHadamardSize; ++j) p.signs.d[j] = kernels::kHadamardSigns[j];
  p.global_scale = cpu.global_encode_scale;
  p.global_scale_inv = 1.0f / cpu.global_encode_scale;
  p.rowwise = row.data<uint8_t>();
  p.rowwise_scales = row_scales.data<uint8_t>();
  p.columnwise = col.data<uint8_t>();
  p.columnwise_scales = col_scales.data<uint8_t>();
  ASSERT_EQ(kernels::cuda::LaunchNvfp4Quantize(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameBytes(row, cpu.rowwise_data, "rowwise_data");
  ExpectSameBytes(row_scales, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameBytes(col, cpu.columnwise_data, "columnwise_data");
  ExpectSameBytes(col_scales, cpu.columnwise_scale_inv, "columnwise_scale_inv");
}

TEST(Nvfp4Gpu, StochasticRoundingDependsOnSeedLikeTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const std::vector<float> values = QuantizeTestValues(64 * 64, 17u, /*specials=*/false);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {64, 64}));
  const Tensor device = OnDevice(host);
  Nvfp4QuantizeOptions options;
  options.stochastic_rounding = true;
  Context gpu_a = SeededGpuContext();
  Context gpu_b = SeededGpuContext();
  gpu_b.seed = kSeed + 1;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor a, kernels::QuantizeNvfp4(gpu_a, device, options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor b, kernels::QuantizeNvfp4(gpu_b, device, options));
  EXPECT_FALSE(BitwiseEqual(OnHost(a.rowwise_data), OnHost(b.rowwise_data)))
      << "a different seed must change some stochastic roundings";
  Context cpu_b = SeededCpuContext();
  cpu_b.seed = kSeed + 1;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor expected,
                       kernels::cpu::QuantizeNvfp4(cpu_b, host, options));
  ExpectSameBytes(b.rowwise_data, expected.rowwise_data, "rowwise_data with seed + 1");
}

TEST(Nvfp4Gpu, UnscaledE2M1CastsMatchCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{4096}}) {
    std::vector<float> values = QuantizeTestValues(n, static_cast<uint32_t>(n), n > 100);
    for (int64_t i = 0; i < n; ++i) values[i] = values[i] * 0.01f;  // around the E2M1 range
    ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {n}));
    ASSERT_OK_AND_ASSIGN(const Tensor cpu, kernels::CastToFloat4E2M1(Context::Cpu(), host));
    ASSERT_OK_AND_ASSIGN(const Tensor gpu, kernels::CastToFloat4E2M1(GpuContext(), OnDevice(host)));
    ExpectSameBytes(gpu, cpu, absl::StrCat("packed E2M1 of ", n));
    ASSERT_OK_AND_ASSIGN(const Tensor cpu_back, kernels::Float4E2M1ToFloat32(Context::Cpu(), cpu));
    ASSERT_OK_AND_ASSIGN(const Tensor gpu_back, kernels::Float4E2M1ToFloat32(GpuContext(), gpu));
    ExpectSameBytes(gpu_back, cpu_back, absl::StrCat("decoded E2M1 of ", n));
  }
}

TEST(Nvfp4Gpu, HadamardTransformMatchesCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const std::vector<float> values = QuantizeTestValues(33 * 48, 23u, /*specials=*/false);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {33, 48}));
  const Tensor device = OnDevice(host);
  ASSERT_OK_AND_ASSIGN(const Tensor cpu, kernels::ApplyHadamard16(Context::Cpu(), host));
  ASSERT_OK_AND_ASSIGN(const Tensor gpu, kernels::ApplyHadamard16(GpuContext(), device));
  ExpectSameBytes(gpu, cpu, "forward RHT");
  ASSERT_OK_AND_ASSIGN(const Tensor cpu_inverse,
                       kernels::ApplyInverseHadamard16(Context::Cpu(), cpu));
  ASSERT_OK_AND_ASSIGN(const Tensor gpu_inverse, kernels::ApplyInverseHadamard16(GpuContext(), gpu));
  ExpectSameBytes(gpu_inverse, cpu_inverse, "inverse RHT");
}

TEST(Nvfp4Gpu, EmptyTensorGivesZeroAmaxAndUnitScale) {
  TESERVE_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::Zeros(DType::kFloat32, {0, 32}));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor q,
                       kernels::QuantizeNvfp4(GpuContext(), OnDevice(host), Nvfp4QuantizeOptions{}));
  EXPECT_EQ(q.amax, 0.0f);
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_EQ(q.rowwise_scale_inv.shape(), (Shape{0, 2}));
}

// Metadata errors come before any CUDA call, so these run on machines without a GPU.
TEST(Nvfp4Gpu, RejectsHostTensorsAndIndivisibleShapes) {
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(std::vector<float>(256), {16, 16}));
  const auto on_host = kernels::cuda::QuantizeNvfp4(GpuContext(), host, {});
  EXPECT_THAT(on_host, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                 "x.device: expected a CUDA device, got cpu"));
  std::vector<float> floats(16 * 40);
  const Tensor odd = Tensor::Borrow(floats.data(), DType::kFloat32, {16, 40}, Device::Cuda(0));
  const auto indivisible = kernels::cuda::QuantizeNvfp4(GpuContext(), odd, {});
  EXPECT_THAT(indivisible, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                     "x.shape[1]: expected a multiple of 16"));
}

#else  // !TESERVE_WITH_CUDA

TEST(Nvfp4Gpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
