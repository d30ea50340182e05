// CUDA MXFP8 and FP8 block scaling (kernels/cuda/block_quantize/block_quantize_cuda.h) against the CPU
// reference (kernels/cpu/block_quantize_cpu.h) on the same inputs. The contract is
// bit-exactness: codes, scale_inv (E8M0 codes or FP32 values), amax and dequantized
// values are compared bit for bit, never with a tolerance (a dequantized NaN only has to
// be a NaN: its payload is the arithmetic unit's).
//
// Inputs (quantize_gpu_test_util.h) span 2^-24 .. 2^8 with zero runs, FP32 subnormal
// runs, block amaxes exactly on a power-of-two boundary, FP8 rounding ties, NaN and
// +-Inf, so the E8M0 round-up, the epsilon and power-of-two options, saturation and the
// NaN policy are all exercised. Shapes cover 1 row, tails of 257x259 and 128x129 (where
// the recipe's divisibility allows), partial tiles and 16384x8192; both FP8 encoders
// (hardware cvt and the integer codec) and BF16 sources (compared with the CPU result
// on their exact FP32 widening).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
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
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/cpu/block_quantize_cpu.h"
#include "kernels/cuda/block_quantize/block_quantize_cuda.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::BlockScalingQuantizeOptions;
using kernels::Copy;
using kernels::Mxfp8QuantizeOptions;
using kernels::cuda::Fp8Encoder;
using testing::ExpectSameAmax;
using testing::ExpectSameBytes;
using testing::ExpectSameFloats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::QuantizeTestValues;

enum class Copies { kRowwise, kColumnwise, kBoth };
enum class Source { kFloat32, kBFloat16 };

bool WantsRowwise(Copies c) { return c != Copies::kColumnwise; }
bool WantsColumnwise(Copies c) { return c != Copies::kRowwise; }

const char* CopiesName(Copies c) {
  switch (c) {
    case Copies::kRowwise: return "Rowwise";
    case Copies::kColumnwise: return "Columnwise";
    default: return "Both";
  }
}

const char* FormatName(DType format) {
  return format == DType::kFloat8E4M3 ? "Float8E4M3" : "Float8E5M2";
}

void ExpectSameQuantized(const QuantizedTensor& gpu, const QuantizedTensor& cpu) {
  EXPECT_EQ(gpu.shape, cpu.shape);
  EXPECT_EQ(gpu.format, cpu.format);
  EXPECT_EQ(gpu.mode, cpu.mode);
  ExpectSameAmax(gpu.amax, cpu.amax);
  ExpectSameBytes(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data");
  ExpectSameBytes(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameBytes(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data");
  ExpectSameBytes(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, "columnwise_scale_inv");
}

// The dequantized copies of the GPU result equal the CPU's, bit for bit.
void ExpectSameDequantized(const QuantizedTensor& gpu, const QuantizedTensor& cpu) {
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    const bool present = copy == Copy::kRowwise ? cpu.has_rowwise() : cpu.has_columnwise();
    if (!present) continue;
    const std::string name = copy == Copy::kRowwise ? "rowwise" : "columnwise";
    auto cpu_out = kernels::cpu::DequantizeBlock(Context::Cpu(), cpu, copy);
    ASSERT_TRUE(cpu_out.ok()) << cpu_out.status();
    auto gpu_out = kernels::DequantizeBlock(GpuContext(), gpu, copy);
    ASSERT_TRUE(gpu_out.ok()) << gpu_out.status();
    EXPECT_EQ(gpu_out->device(), Device::Cuda(0));
    ExpectSameFloats(*gpu_out, *cpu_out, "dequantized " + name);
    // The one-pass BF16 output (an emulated GEMM's operand) is Convert of the FP32 values
    // the device wrote (bit for bit, NaN payloads included; those may differ from the
    // CPU's, which ExpectSameFloats allows).
    auto gpu_bf16 = kernels::DequantizeBlock(GpuContext(), gpu, copy, DType::kBFloat16);
    ASSERT_TRUE(gpu_bf16.ok()) << gpu_bf16.status();
    EXPECT_EQ(gpu_bf16->dtype(), DType::kBFloat16);
    ExpectSameBytes(*gpu_bf16, kernels::Convert(Context::Cpu(), OnHost(*gpu_out), DType::kBFloat16).value(),
                    "dequantized BF16 " + name);
  }
}

// ---- MXFP8 ----

struct MxCase {
  DType format;
  int64_t rows;
  int64_t cols;
  Copies copies;
  Fp8Encoder encoder;
  Source source;
};

std::string MxName(const ::testing::TestParamInfo<MxCase>& info) {
  const MxCase& c = info.param;
  return absl::StrCat(c.source == Source::kFloat32 ? "Float32" : "BFloat16", "_",
                      FormatName(c.format), "_", c.rows, "x", c.cols, "_", CopiesName(c.copies),
                      c.encoder == Fp8Encoder::kHardware ? "_Cvt" : "_IntegerCodec");
}

class Mxfp8GpuTest : public ::testing::TestWithParam<MxCase> {};

TEST_P(Mxfp8GpuTest, MatchesCpuBitExact) {
  TESERVE_SKIP_WITHOUT_GPU();
  const MxCase& c = GetParam();
  const std::vector<float> values = QuantizeTestValues(
      c.rows * c.cols, static_cast<uint32_t>(c.rows * 131 + c.cols), /*specials=*/true);
  Mxfp8QuantizeOptions options;
  options.format = c.format;
  options.rowwise = WantsRowwise(c.copies);
  options.columnwise = WantsColumnwise(c.copies);
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
                       kernels::cpu::QuantizeMxfp8(Context::Cpu(), cpu_input, options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       kernels::cuda::QuantizeMxfp8(GpuContext(), gpu_input, options, c.encoder));
  ExpectSameQuantized(gpu, cpu);
  ExpectSameDequantized(gpu, cpu);
}

std::vector<MxCase> MxCases() {
  std::vector<MxCase> cases;
  for (DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    for (Fp8Encoder encoder : {Fp8Encoder::kHardware, Fp8Encoder::kSoftware}) {
      for (Source source : {Source::kFloat32, Source::kBFloat16}) {
        cases.push_back({format, 1, 64, Copies::kRowwise, encoder, source});
        cases.push_back({format, 257, 96, Copies::kRowwise, encoder, source});
        cases.push_back({format, 128, 129, Copies::kColumnwise, encoder, source});
        cases.push_back({format, 96, 259, Copies::kColumnwise, encoder, source});
        cases.push_back({format, 32, 32, Copies::kBoth, encoder, source});
        cases.push_back({format, 64, 96, Copies::kRowwise, encoder, source});
        cases.push_back({format, 224, 32, Copies::kColumnwise, encoder, source});
        cases.push_back({format, 160, 352, Copies::kBoth, encoder, source});
        cases.push_back({format, 512, 1024, Copies::kBoth, encoder, source});
      }
    }
  }
  cases.push_back({DType::kFloat8E4M3, 16384, 8192, Copies::kBoth, Fp8Encoder::kHardware,
                   Source::kBFloat16});
  cases.push_back({DType::kFloat8E5M2, 16384, 8192, Copies::kBoth, Fp8Encoder::kHardware,
                   Source::kFloat32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mxfp8GpuTest, ::testing::ValuesIn(MxCases()), MxName);

// ---- Every BF16 magnitude as an MXFP8 block amax ----

// x [32768, 32] BF16 whose row i starts with magnitude bits i (every non-negative BF16
// pattern: zeros, subnormals, normals, Inf and every NaN) followed by 31 smaller
// magnitudes, signs pseudo-random: rowwise block i has amax pattern i. Transposed
// ([32, 32768]) the same holds for the columnwise blocks. So the register-tiled kernel's
// division-free E8M0 code meets every amax a BF16 source can have.
void MakeEveryBf16AmaxInput(bool transposed, testing::Bf16Input* out) {
  constexpr int64_t kPatterns = 32768;
  constexpr int64_t kBlock = 32;
  const int64_t rows = transposed ? kBlock : kPatterns;
  const int64_t cols = transposed ? kPatterns : kBlock;
  out->codes.assign(rows * cols, 0);
  std::vector<float> widened(rows * cols);
  for (int64_t i = 0; i < kPatterns; ++i) {
    for (int64_t j = 0; j < kBlock; ++j) {
      const int64_t step = 97 * j;
      const uint32_t magnitude =
          static_cast<uint32_t>(i >= step ? i - step : i / (j + 1));
      const uint32_t sign = ((i * 2654435761u + j * 40503u) >> 13) & 1u;
      const uint16_t code = static_cast<uint16_t>(magnitude | (sign << 15));
      const int64_t at = transposed ? j * cols + i : i * cols + j;
      out->codes[at] = code;
      const uint32_t bits = static_cast<uint32_t>(code) << 16;
      std::memcpy(&widened[at], &bits, sizeof(bits));
    }
  }
  out->bf16 = Tensor::Borrow(out->codes.data(), DType::kBFloat16, {rows, cols});
  out->widened = Tensor::FromFloats(widened, {rows, cols}).value();
}

class Mxfp8EveryBf16AmaxGpuTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(Mxfp8EveryBf16AmaxGpuTest, MatchesCpuBitExact) {
  TESERVE_SKIP_WITHOUT_GPU();
  const auto [format, transposed] = GetParam();
  testing::Bf16Input input;
  MakeEveryBf16AmaxInput(transposed, &input);
  Mxfp8QuantizeOptions options;
  options.format = format;
  options.rowwise = true;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizeMxfp8(Context::Cpu(), input.widened, options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       kernels::cuda::QuantizeMxfp8(GpuContext(), OnDevice(input.bf16), options));
  ExpectSameQuantized(gpu, cpu);
  // The input holds every E8M0 code a BF16 amax can produce, NaN (0xFF) included.
  const std::vector<uint8_t> codes =
      testing::Bytes(transposed ? cpu.columnwise_scale_inv : cpu.rowwise_scale_inv);
  EXPECT_NE(std::find(codes.begin(), codes.end(), uint8_t{0xFF}), codes.end());
  EXPECT_NE(std::find(codes.begin(), codes.end(), uint8_t{0xFE}), codes.end());
  EXPECT_NE(std::find(codes.begin(), codes.end(), uint8_t{0x00}), codes.end());
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Mxfp8EveryBf16AmaxGpuTest,
    ::testing::Combine(::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                       ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(FormatName(std::get<0>(info.param)),
                          std::get<1>(info.param) ? "_ColumnwiseBlocks" : "_RowwiseBlocks");
    });

// ---- FP8 block scaling ----

struct BlockCase {
  DType format;
  int64_t rows;
  int64_t cols;
  Copies copies;
  bool two_d;
  bool power_2_scale;
  float amax_epsilon;
  Fp8Encoder encoder;
  Source source;
};

std::string BlockName(const ::testing::TestParamInfo<BlockCase>& info) {
  const BlockCase& c = info.param;
  return absl::StrCat(c.source == Source::kFloat32 ? "Float32" : "BFloat16", "_",
                      FormatName(c.format), "_", c.rows, "x", c.cols, "_", CopiesName(c.copies),
                      c.two_d ? "_2D" : "_1D", c.power_2_scale ? "_Pow2" : "_AnyScale",
                      c.amax_epsilon > 0.0f ? "_Epsilon" : "",
                      c.encoder == Fp8Encoder::kHardware ? "_Cvt" : "_IntegerCodec");
}

class BlockScalingGpuTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(BlockScalingGpuTest, MatchesCpuBitExact) {
  TESERVE_SKIP_WITHOUT_GPU();
  const BlockCase& c = GetParam();
  const std::vector<float> values = QuantizeTestValues(
      c.rows * c.cols, static_cast<uint32_t>(c.rows * 977 + c.cols), /*specials=*/true);
  BlockScalingQuantizeOptions options;
  options.format = c.format;
  options.rowwise = WantsRowwise(c.copies);
  options.columnwise = WantsColumnwise(c.copies);
  options.two_d = c.two_d;
  options.power_2_scale = c.power_2_scale;
  options.amax_epsilon = c.amax_epsilon;
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
                       kernels::cpu::QuantizeBlockScaling(Context::Cpu(), cpu_input, options));
  ASSERT_OK_AND_ASSIGN(
      const QuantizedTensor gpu,
      kernels::cuda::QuantizeBlockScaling(GpuContext(), gpu_input, options, c.encoder));
  ExpectSameQuantized(gpu, cpu);
  ExpectSameDequantized(gpu, cpu);
}

std::vector<BlockCase> BlockCases() {
  struct Shape2 {
    int64_t rows;
    int64_t cols;
    Copies copies;
  };
  const Shape2 shapes[] = {{1, 300, Copies::kRowwise},  {1, 300, Copies::kBoth},
                           {257, 259, Copies::kBoth},   {128, 129, Copies::kBoth},
                           {300, 1, Copies::kColumnwise}, {384, 512, Copies::kBoth}};
  std::vector<BlockCase> cases;
  for (DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    for (bool two_d : {false, true}) {
      for (const Shape2& s : shapes) {
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, true, 0.0f,
                         Fp8Encoder::kHardware, Source::kFloat32});
      }
      // Options and encoders on one tail shape and one aligned shape.
      for (const Shape2& s : {shapes[2], shapes[5]}) {
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, false, 0.0f,
                         Fp8Encoder::kHardware, Source::kFloat32});
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, true, 1e-3f,
                         Fp8Encoder::kHardware, Source::kFloat32});
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, false, 1e-3f,
                         Fp8Encoder::kSoftware, Source::kFloat32});
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, true, 0.0f,
                         Fp8Encoder::kSoftware, Source::kBFloat16});
        cases.push_back({format, s.rows, s.cols, s.copies, two_d, false, 0.0f,
                         Fp8Encoder::kHardware, Source::kBFloat16});
      }
    }
  }
  cases.push_back({DType::kFloat8E4M3, 16384, 8192, Copies::kBoth, false, true, 0.0f,
                   Fp8Encoder::kHardware, Source::kBFloat16});
  cases.push_back({DType::kFloat8E4M3, 16384, 8192, Copies::kBoth, true, false, 0.0f,
                   Fp8Encoder::kHardware, Source::kFloat32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockScalingGpuTest, ::testing::ValuesIn(BlockCases()),
                         BlockName);

// ---- Every output byte is written ----

// Launches straight into buffers poisoned with 0xA5 (the wrappers hand the kernel zeroed
// memory, which would hide unwritten codes of zero-valued elements).
void ExpectLaunchWritesEverything(kernels::cuda::BlockRecipe recipe, int64_t rows, int64_t cols) {
  const std::vector<float> values = QuantizeTestValues(rows * cols, 99u, /*specials=*/true);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {rows, cols}));
  QuantizedTensor cpu;
  if (recipe == kernels::cuda::BlockRecipe::kMxfp8) {
    Mxfp8QuantizeOptions o;
    o.columnwise = true;
    ASSERT_OK_AND_ASSIGN(cpu, kernels::cpu::QuantizeMxfp8(Context::Cpu(), host, o));
  } else {
    BlockScalingQuantizeOptions o;
    o.columnwise = true;
    o.two_d = recipe == kernels::cuda::BlockRecipe::kBlock2D;
    ASSERT_OK_AND_ASSIGN(cpu, kernels::cpu::QuantizeBlockScaling(Context::Cpu(), host, o));
  }
  const Tensor x = OnDevice(host);
  auto poisoned_like = [](const Tensor& t) {
    Tensor d = OnDevice(t);
    EXPECT_EQ(cudaMemset(d.raw_data(), 0xA5, d.nbytes()), cudaSuccess);
    return d;
  };
  Tensor row = poisoned_like(cpu.rowwise_data);
  Tensor row_scale = poisoned_like(cpu.rowwise_scale_inv);
  Tensor col = poisoned_like(cpu.columnwise_data);
  Tensor col_scale = poisoned_like(cpu.columnwise_scale_inv);
  ASSERT_OK_AND_ASSIGN(Tensor amax, Tensor::Zeros(DType::kInt32, {1}, Device::Cuda(0)));
  ASSERT_EQ(cudaMemset(amax.raw_data(), 0xA5, 4), cudaSuccess);
  kernels::cuda::BlockQuantizeLaunchParams p;
  p.x = x.raw_data();
  p.rows = rows;
  p.cols = cols;
  p.recipe = recipe;
  p.rowwise = row.data<uint8_t>();
  p.rowwise_scale_inv = row_scale.raw_data();
  p.columnwise = col.data<uint8_t>();
  p.columnwise_scale_inv = col_scale.raw_data();
  p.amax_bits = amax.data<uint32_t>();
  ASSERT_EQ(kernels::cuda::LaunchBlockQuantize(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameBytes(row, cpu.rowwise_data, "rowwise_data");
  ExpectSameBytes(row_scale, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameBytes(col, cpu.columnwise_data, "columnwise_data");
  ExpectSameBytes(col_scale, cpu.columnwise_scale_inv, "columnwise_scale_inv");
  const Tensor amax_host = OnHost(amax);
  // NaN inputs: the device keeps the magnitude bits of the NaN it saw.
  EXPECT_GT(amax_host.data<uint32_t>()[0], 0x7F800000u);
}

TEST(BlockQuantizeGpu, Mxfp8LaunchWritesEveryOutputByte) {
  TESERVE_SKIP_WITHOUT_GPU();
  ExpectLaunchWritesEverything(kernels::cuda::BlockRecipe::kMxfp8, 96, 160);
}

TEST(BlockQuantizeGpu, Block1DLaunchWritesEveryOutputByte) {
  TESERVE_SKIP_WITHOUT_GPU();
  ExpectLaunchWritesEverything(kernels::cuda::BlockRecipe::kBlock1D, 257, 259);
}

TEST(BlockQuantizeGpu, Block2DLaunchWritesEveryOutputByte) {
  TESERVE_SKIP_WITHOUT_GPU();
  ExpectLaunchWritesEverything(kernels::cuda::BlockRecipe::kBlock2D, 257, 259);
}

// ---- Dispatch, streams, layouts ----

TEST(BlockQuantizeGpu, CheckedEntryPointsDispatchToCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
  const std::vector<float> values = QuantizeTestValues(64 * 96, 7u, /*specials=*/false);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {64, 96}));
  const Tensor device = OnDevice(host);
  Mxfp8QuantizeOptions mx;
  mx.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu, kernels::QuantizeMxfp8(Context::Cpu(), host, mx));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu, kernels::QuantizeMxfp8(GpuContext(), device, mx));
  EXPECT_EQ(gpu.rowwise_data.device(), Device::Cuda(0));
  ExpectSameQuantized(gpu, cpu);
  BlockScalingQuantizeOptions block;
  block.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu_block,
                       kernels::QuantizeBlockScaling(Context::Cpu(), host, block));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu_block,
                       kernels::QuantizeBlockScaling(GpuContext(), device, block));
  ExpectSameQuantized(gpu_block, cpu_block);
  // The checked entry point still rejects what the CPU path rejects, before any launch.
  const auto bad = kernels::QuantizeMxfp8(GpuContext(), OnDevice(Tensor::Zeros(DType::kFloat32, {33, 64}).value()), mx);
  EXPECT_THAT(bad, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                             "x.shape[0]: expected a multiple of 32"));
}

TEST(BlockQuantizeGpu, RunsOnANonDefaultStream) {
  TESERVE_SKIP_WITHOUT_GPU();
  const testing::ScopedStream owned;  // declared first: outlives the tensors below
  ASSERT_TRUE(owned.ok());
  const cudaStream_t stream = owned.get();
  Context ctx = GpuContext();
  ctx.stream = stream;
  const std::vector<float> values = QuantizeTestValues(256 * 384, 21u, /*specials=*/false);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {256, 384}));
  ASSERT_OK_AND_ASSIGN(const Tensor device,
                       kernels::cuda::CopyToDevice(ctx, host, Device::Cuda(0)));
  Mxfp8QuantizeOptions options;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizeMxfp8(Context::Cpu(), host, options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu, kernels::QuantizeMxfp8(ctx, device, options));
  ASSERT_OK_AND_ASSIGN(const Tensor swizzled,
                       kernels::SwizzleMxfp8Scales(ctx, gpu.columnwise_scale_inv));
  ASSERT_OK_AND_ASSIGN(const Tensor dequantized,
                       kernels::DequantizeBlock(ctx, gpu, Copy::kColumnwise));
  ASSERT_OK_AND_ASSIGN(const Tensor back, kernels::cuda::CopyToHost(ctx, dequantized));
  ASSERT_OK_AND_ASSIGN(const Tensor expected,
                       kernels::cpu::DequantizeBlock(Context::Cpu(), cpu, Copy::kColumnwise));
  ExpectSameFloats(back, expected, "dequantized columnwise on a stream");
  ASSERT_OK_AND_ASSIGN(const Tensor expected_swizzled,
                       kernels::cpu::SwizzleMxfp8Scales(Context::Cpu(), cpu.columnwise_scale_inv));
  ExpectSameBytes(swizzled, expected_swizzled, "swizzled columnwise scales on a stream");
}

Tensor RandomE8M0(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor t = Tensor::Zeros(DType::kFloat8E8M0, {rows, cols}).value();
  std::mt19937 rng(seed);
  uint8_t* p = t.data<uint8_t>();
  // 1..255, so the zero padding of the swizzled layout is distinguishable.
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(1 + rng() % 255);
  return t;
}

class SwizzleGpuTest : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(SwizzleGpuTest, MatchesCpuAndRoundTrips) {
  TESERVE_SKIP_WITHOUT_GPU();
  const auto [rows, cols] = GetParam();
  const Tensor scales = RandomE8M0(rows, cols, static_cast<uint32_t>(rows * 17 + cols));
  ASSERT_OK_AND_ASSIGN(const Tensor cpu, kernels::SwizzleMxfp8Scales(Context::Cpu(), scales));
  ASSERT_OK_AND_ASSIGN(const Tensor gpu, kernels::SwizzleMxfp8Scales(GpuContext(), OnDevice(scales)));
  ExpectSameBytes(gpu, cpu, "swizzled");
  ASSERT_OK_AND_ASSIGN(const Tensor back,
                       kernels::UnswizzleMxfp8Scales(GpuContext(), gpu, rows, cols));
  ExpectSameBytes(back, scales, "unswizzled");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwizzleGpuTest,
                         ::testing::Values(std::make_pair(int64_t{1}, int64_t{1}),
                                           std::make_pair(int64_t{128}, int64_t{4}),
                                           std::make_pair(int64_t{257}, int64_t{7}),
                                           std::make_pair(int64_t{8192}, int64_t{256})),
                         [](const auto& info) {
                           return absl::StrCat(info.param.first, "x", info.param.second);
                         });

TEST(BlockQuantizeGpu, GemmScaleLayoutsMatchCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : {std::make_pair(int64_t{5}, int64_t{7}),
                                   std::make_pair(int64_t{129}, int64_t{3}),
                                   std::make_pair(int64_t{64}, int64_t{64})}) {
    std::vector<float> values(rows * cols);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f + static_cast<float>(i);
    ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {rows, cols}));
    for (bool two_d : {false, true}) {
      ASSERT_OK_AND_ASSIGN(const Tensor cpu,
                           kernels::BlockScalesGemmLayout(Context::Cpu(), host, two_d));
      ASSERT_OK_AND_ASSIGN(const Tensor gpu,
                           kernels::BlockScalesGemmLayout(GpuContext(), OnDevice(host), two_d));
      ExpectSameBytes(gpu, cpu, absl::StrCat("gemm layout ", rows, "x", cols, two_d ? " 2D" : " 1D"));
    }
  }
}

TEST(BlockQuantizeGpu, EmptyTensorGivesZeroAmaxAndEmptyCopies) {
  TESERVE_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::Zeros(DType::kFloat32, {0, 64}));
  Mxfp8QuantizeOptions options;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor q,
                       kernels::QuantizeMxfp8(GpuContext(), OnDevice(host), options));
  EXPECT_EQ(q.amax, 0.0f);
  EXPECT_EQ(q.columnwise_data.shape(), (Shape{64, 0}));
  EXPECT_EQ(q.rowwise_scale_inv.shape(), (Shape{0, 2}));
}

// Metadata errors come before any CUDA call, so these run on machines without a GPU.
TEST(BlockQuantizeGpu, RejectsHostTensorsOtherDtypesAndIndivisibleShapes) {
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats({1, 2, 3, 4}, {2, 2}));
  const auto on_host = kernels::cuda::QuantizeMxfp8(GpuContext(), host, {});
  EXPECT_THAT(on_host, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                 "x.device: expected a CUDA device, got cpu"));
  std::vector<int32_t> ints(64);
  const Tensor int_view = Tensor::Borrow(ints.data(), DType::kInt32, {2, 32}, Device::Cuda(0));
  const auto wrong_dtype = kernels::cuda::QuantizeBlockScaling(GpuContext(), int_view, {});
  EXPECT_THAT(wrong_dtype, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                     "x.dtype: expected FLOAT32 or BFLOAT16, got INT32"));
  std::vector<float> floats(2 * 48);
  const Tensor odd = Tensor::Borrow(floats.data(), DType::kFloat32, {2, 48}, Device::Cuda(0));
  const auto indivisible = kernels::cuda::QuantizeMxfp8(GpuContext(), odd, {});
  EXPECT_THAT(indivisible, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                     "x.shape[1]: expected a multiple of 32"));
}

#else  // !TESERVE_WITH_CUDA

TEST(BlockQuantizeGpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
