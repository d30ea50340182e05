// Fused dbias of the CUDA block quantizers (kernels/cuda/block_quantize/block_quantize_kernels.h): the
// column sums of x that LaunchBlockQuantize writes next to the MXFP8 / FP8 block-scaling
// copies, against FP64 column sums of the same (widened) values within the FP32 tolerance
// of tests/kernels/tolerances.h, judged on the sum of |x| over the column (the forward
// error scale of a sum). The copies written in the same launch must still equal the CPU
// reference bit for bit, so fusing dbias changes nothing else.
//
// Cases cover the register-tiled MXFP8 kernel (128-row slabs, partial tiles, FP32 and
// BF16), the generic kernel (forced, and for shapes the tile kernel does not take: 1 row,
// row or column tails) for MXFP8 and 1D/2D block scaling, rows == 0 (dbias zeroed) and
// NaN/Inf columns (propagated), and the op entry points (checked and kernels::cuda) with
// options.dbias against the CPU op's dbias.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
#include "kernels/block_quantize.h"
#include "kernels/cpu/block_quantize_cpu.h"
#include "kernels/cuda/block_quantize/block_quantize_cuda.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::cuda::BlockQuantizeKernel;
using kernels::cuda::BlockQuantizeLaunchParams;
using kernels::cuda::BlockRecipe;
using kernels::cuda::SourceType;
using testing::ExpectSameBytes;
using testing::OnDevice;
using testing::OnHost;

enum class Copies { kRowwise, kColumnwise, kBoth };

struct DbiasCase {
  BlockRecipe recipe;
  int64_t rows;
  int64_t cols;
  bool bf16;
  BlockQuantizeKernel kernel;
  Copies copies;
};

const char* RecipeName(BlockRecipe r) {
  switch (r) {
    case BlockRecipe::kMxfp8: return "Mxfp8";
    case BlockRecipe::kBlock1D: return "Block1D";
    default: return "Block2D";
  }
}

const char* CopiesName(Copies c) {
  switch (c) {
    case Copies::kRowwise: return "Rowwise";
    case Copies::kColumnwise: return "Columnwise";
    default: return "Both";
  }
}

std::string DbiasName(const ::testing::TestParamInfo<DbiasCase>& info) {
  const DbiasCase& c = info.param;
  return absl::StrCat(RecipeName(c.recipe), "_", c.bf16 ? "BFloat16" : "Float32", "_", c.rows,
                      "x", c.cols, "_", CopiesName(c.copies),
                      c.kernel == BlockQuantizeKernel::kGeneric ? "_Generic" : "_Auto");
}

// A device tensor of that dtype and shape with every byte 0xA5.
Tensor Poisoned(DType dtype, const Shape& shape) {
  kernels::cuda::RegisterCudaAllocator();
  Tensor t = Tensor::Zeros(dtype, shape, Device::Cuda(0)).value();
  EXPECT_EQ(cudaMemset(t.raw_data(), 0xA5, t.nbytes()), cudaSuccess);
  return t;
}

// The CPU quantization of `x` (FP32) with the case's recipe and copies.
QuantizedTensor CpuQuantized(const DbiasCase& c, const Tensor& x) {
  const bool rowwise = c.copies != Copies::kColumnwise;
  const bool columnwise = c.copies != Copies::kRowwise;
  if (c.recipe == BlockRecipe::kMxfp8) {
    kernels::Mxfp8QuantizeOptions o;
    o.rowwise = rowwise;
    o.columnwise = columnwise;
    return kernels::cpu::QuantizeMxfp8(Context::Cpu(), x, o).value();
  }
  kernels::BlockScalingQuantizeOptions o;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  o.two_d = c.recipe == BlockRecipe::kBlock2D;
  return kernels::cpu::QuantizeBlockScaling(Context::Cpu(), x, o).value();
}

class BlockQuantizeDbiasGpuTest : public ::testing::TestWithParam<DbiasCase> {};

TEST_P(BlockQuantizeDbiasGpuTest, ColumnSumsMatchFp64AndCopiesStayExact) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DbiasCase& c = GetParam();
  const int64_t n = c.rows * c.cols;
  const std::vector<float> values =
      testing::QuantizeTestValues(n, static_cast<uint32_t>(c.rows * 31 + c.cols), false);
  Tensor widened;
  Tensor device_x;
  testing::Bf16Input bf16;
  if (c.bf16) {
    testing::MakeBf16Input(values, c.rows, c.cols, &bf16);
    widened = bf16.widened;
    device_x = OnDevice(bf16.bf16);
  } else {
    widened = Tensor::FromFloats(values, {c.rows, c.cols}).value();
    device_x = OnDevice(widened);
  }
  // The codes are compared on every shape but the largest (its CPU quantization is slow
  // and other tests cover it).
  const bool compare_copies = n <= (int64_t{1} << 22);
  QuantizedTensor cpu;
  if (compare_copies) cpu = CpuQuantized(c, widened);
  const bool rowwise = c.copies != Copies::kColumnwise;
  const bool columnwise = c.copies != Copies::kRowwise;
  const DType scale_dtype = c.recipe == BlockRecipe::kMxfp8 ? DType::kFloat8E8M0 : DType::kFloat32;
  Tensor row = Poisoned(DType::kFloat8E4M3, {c.rows, c.cols});
  Tensor col = Poisoned(DType::kFloat8E4M3, {c.cols, c.rows});
  // Scale buffers large enough for any recipe (1 scale per 32 elements, FP32).
  Tensor row_scale = Poisoned(scale_dtype, {c.rows + 1, (c.cols + 31) / 32 + 1});
  Tensor col_scale = Poisoned(scale_dtype, {c.cols + 1, (c.rows + 31) / 32 + 1});
  Tensor amax = Tensor::Zeros(DType::kInt32, {1}, Device::Cuda(0)).value();
  Tensor dbias = Poisoned(DType::kFloat32, {c.cols});

  BlockQuantizeLaunchParams p;
  p.x = device_x.raw_data();
  p.type = c.bf16 ? SourceType::kBFloat16 : SourceType::kFloat32;
  p.rows = c.rows;
  p.cols = c.cols;
  p.recipe = c.recipe;
  p.kernel = c.kernel;
  p.rowwise = rowwise ? row.data<uint8_t>() : nullptr;
  p.rowwise_scale_inv = rowwise ? row_scale.raw_data() : nullptr;
  p.columnwise = columnwise ? col.data<uint8_t>() : nullptr;
  p.columnwise_scale_inv = columnwise ? col_scale.raw_data() : nullptr;
  p.amax_bits = amax.data<uint32_t>();
  p.dbias = dbias.data<float>();
  const int64_t slabs = kernels::cuda::BlockQuantizeDbiasSlabs(p);
  ASSERT_GE(slabs, (c.rows + 127) / 128);
  Tensor workspace = Poisoned(DType::kFloat32, {slabs, c.cols});
  p.dbias_workspace = workspace.data<float>();
  ASSERT_EQ(kernels::cuda::LaunchBlockQuantize(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<double> want(c.cols, 0.0);
  std::vector<double> magnitude(c.cols, 0.0);
  const float* x = widened.data<float>();
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.cols; ++j) {
      want[j] += x[r * c.cols + j];
      magnitude[j] += std::fabs(double{x[r * c.cols + j]});
    }
  }
  const Tensor got = OnHost(dbias);
  EXPECT_TRUE(testing_kernels::AllClose(got.floats(), want, DType::kFloat32, magnitude));

  if (compare_copies) {
    // Only the bytes the copies own (the buffers are compared through host views).
    auto prefix = [](const Tensor& device, const Tensor& like) {
      const Tensor host = OnHost(device);
      Tensor out = Tensor::Zeros(like.dtype(), like.shape()).value();
      std::memcpy(out.raw_data(), host.raw_data(), out.nbytes());
      return out;
    };
    if (rowwise) {
      ExpectSameBytes(prefix(row, cpu.rowwise_data), cpu.rowwise_data, "rowwise_data");
      ExpectSameBytes(prefix(row_scale, cpu.rowwise_scale_inv), cpu.rowwise_scale_inv,
                      "rowwise_scale_inv");
    }
    if (columnwise) {
      ExpectSameBytes(prefix(col, cpu.columnwise_data), cpu.columnwise_data, "columnwise_data");
      ExpectSameBytes(prefix(col_scale, cpu.columnwise_scale_inv), cpu.columnwise_scale_inv,
                      "columnwise_scale_inv");
    }
  }
}

std::vector<DbiasCase> DbiasCases() {
  constexpr BlockQuantizeKernel kAuto = BlockQuantizeKernel::kAuto;
  constexpr BlockQuantizeKernel kGeneric = BlockQuantizeKernel::kGeneric;
  return {
      // Register-tiled MXFP8 kernel: partial tiles, both sources, one-copy launches.
      {BlockRecipe::kMxfp8, 160, 352, true, kAuto, Copies::kBoth},
      {BlockRecipe::kMxfp8, 256, 96, false, kAuto, Copies::kBoth},
      {BlockRecipe::kMxfp8, 96, 64, true, kAuto, Copies::kRowwise},
      {BlockRecipe::kMxfp8, 4096, 1024, true, kAuto, Copies::kBoth},
      {BlockRecipe::kMxfp8, 16384, 8192, true, kAuto, Copies::kBoth},
      // Generic kernel: forced on a tile shape, and where the tile kernel does not apply.
      {BlockRecipe::kMxfp8, 160, 352, true, kGeneric, Copies::kBoth},
      {BlockRecipe::kMxfp8, 160, 352, false, kGeneric, Copies::kBoth},
      {BlockRecipe::kMxfp8, 1, 64, true, kAuto, Copies::kRowwise},
      {BlockRecipe::kMxfp8, 257, 96, false, kAuto, Copies::kRowwise},
      {BlockRecipe::kMxfp8, 96, 259, true, kAuto, Copies::kColumnwise},
      {BlockRecipe::kBlock1D, 257, 259, false, kAuto, Copies::kBoth},
      {BlockRecipe::kBlock1D, 1, 300, true, kAuto, Copies::kRowwise},
      {BlockRecipe::kBlock1D, 384, 512, true, kAuto, Copies::kBoth},
      {BlockRecipe::kBlock2D, 257, 259, true, kAuto, Copies::kBoth},
      {BlockRecipe::kBlock2D, 128, 129, false, kAuto, Copies::kBoth},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockQuantizeDbiasGpuTest, ::testing::ValuesIn(DbiasCases()),
                         DbiasName);

// ---- Through the op entry points ----

struct EntryCase {
  BlockRecipe recipe;
  bool bf16;  // BF16 x through kernels::cuda (the checked entry points take FP32 only)
};

// The op with options.dbias = dbias on ctx.
absl::StatusOr<QuantizedTensor> QuantizeWithDbias(BlockRecipe recipe, const Context& ctx,
                                                  const Tensor& x, Tensor* dbias, bool direct) {
  if (recipe == BlockRecipe::kMxfp8) {
    kernels::Mxfp8QuantizeOptions o;
    o.columnwise = true;
    o.dbias = dbias;
    return direct ? kernels::cuda::QuantizeMxfp8(ctx, x, o) : kernels::QuantizeMxfp8(ctx, x, o);
  }
  kernels::BlockScalingQuantizeOptions o;
  o.columnwise = true;
  o.two_d = recipe == BlockRecipe::kBlock2D;
  o.dbias = dbias;
  return direct ? kernels::cuda::QuantizeBlockScaling(ctx, x, o)
                : kernels::QuantizeBlockScaling(ctx, x, o);
}

class DbiasEntryPointGpuTest : public ::testing::TestWithParam<EntryCase> {};

TEST_P(DbiasEntryPointGpuTest, MatchesCpuOpDbiasAndCopies) {
  TESERVE_SKIP_WITHOUT_GPU();
  const EntryCase& c = GetParam();
  constexpr int64_t kRows = 192;
  constexpr int64_t kCols = 320;
  const std::vector<float> values = testing::QuantizeTestValues(kRows * kCols, 12345u, false);
  Tensor host;
  Tensor device;
  testing::Bf16Input bf16;
  if (c.bf16) {
    testing::MakeBf16Input(values, kRows, kCols, &bf16);
    host = bf16.widened;
    device = OnDevice(bf16.bf16);
  } else {
    host = Tensor::FromFloats(values, {kRows, kCols}).value();
    device = OnDevice(host);
  }
  Tensor cpu_dbias = Tensor::Zeros(DType::kFloat32, {kCols}).value();
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       QuantizeWithDbias(c.recipe, Context::Cpu(), host, &cpu_dbias, false));
  Tensor gpu_dbias = Poisoned(DType::kFloat32, {kCols});
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       QuantizeWithDbias(c.recipe, testing::GpuContext(), device, &gpu_dbias,
                                         /*direct=*/c.bf16));
  testing::ExpectSameAmax(gpu.amax, cpu.amax);
  ExpectSameBytes(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data");
  ExpectSameBytes(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectSameBytes(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data");
  ExpectSameBytes(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, "columnwise_scale_inv");
  std::vector<double> want(kCols);
  std::vector<double> magnitude(kCols, 0.0);
  for (int64_t j = 0; j < kCols; ++j) want[j] = cpu_dbias.floats()[j];
  for (int64_t i = 0; i < kRows * kCols; ++i) magnitude[i % kCols] += std::fabs(double{host.floats()[i]});
  EXPECT_TRUE(testing_kernels::AllClose(OnHost(gpu_dbias).floats(), want, DType::kFloat32,
                                        magnitude));
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, DbiasEntryPointGpuTest,
    ::testing::Values(EntryCase{BlockRecipe::kMxfp8, false}, EntryCase{BlockRecipe::kMxfp8, true},
                      EntryCase{BlockRecipe::kBlock1D, false},
                      EntryCase{BlockRecipe::kBlock1D, true},
                      EntryCase{BlockRecipe::kBlock2D, false}),
    [](const ::testing::TestParamInfo<EntryCase>& info) {
      return absl::StrCat(RecipeName(info.param.recipe),
                          info.param.bf16 ? "_BFloat16Direct" : "_Float32Checked");
    });

// A dbias that is not FP32 [cols] on x's device is refused naming options.dbias, before
// any launch (so this runs without a GPU too).
TEST(BlockQuantizeDbiasGpu, DirectEntryRejectsMisplacedDbias) {
  std::vector<float> storage(64 * 64);
  const Tensor x = Tensor::Borrow(storage.data(), DType::kFloat32, {64, 64}, Device::Cuda(0));
  std::vector<float> sums(64);
  Tensor on_host = Tensor::Borrow(sums.data(), DType::kFloat32, {64});
  Tensor short_one = Tensor::Borrow(sums.data(), DType::kFloat32, {32}, Device::Cuda(0));
  kernels::Mxfp8QuantizeOptions o;
  o.dbias = &on_host;
  const auto host_dbias = kernels::cuda::QuantizeMxfp8(testing::GpuContext(), x, o);
  EXPECT_THAT(host_dbias, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                    "options.dbias.device: expected a CUDA device"));
  kernels::BlockScalingQuantizeOptions b;
  b.dbias = &short_one;
  const auto wrong_shape = kernels::cuda::QuantizeBlockScaling(testing::GpuContext(), x, b);
  ASSERT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.status().message().find(
                "options.dbias: expected FLOAT32 [64] on cuda:0, got FLOAT32 [32] on cuda:0"),
            absl::string_view::npos)
      << wrong_shape.status();
}

// rows == 0: nothing to launch, dbias is zeros (and the workspace is never read).
TEST(BlockQuantizeDbiasGpu, ZeroRowsGiveZeroDbias) {
  TESERVE_SKIP_WITHOUT_GPU();
  kernels::cuda::RegisterCudaAllocator();  // Tensor::Zeros on cuda:0 below
  for (BlockRecipe recipe : {BlockRecipe::kMxfp8, BlockRecipe::kBlock1D}) {
    Tensor amax = Tensor::Zeros(DType::kInt32, {1}, Device::Cuda(0)).value();
    Tensor dbias = Poisoned(DType::kFloat32, {64});
    Tensor x = Tensor::Zeros(DType::kFloat32, {0, 64}, Device::Cuda(0)).value();
    BlockQuantizeLaunchParams p;
    p.x = x.raw_data();
    p.rows = 0;
    p.cols = 64;
    p.recipe = recipe;
    p.amax_bits = amax.data<uint32_t>();
    p.dbias = dbias.data<float>();
    EXPECT_EQ(kernels::cuda::BlockQuantizeDbiasSlabs(p), 0);
    ASSERT_EQ(kernels::cuda::LaunchBlockQuantize(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor got = OnHost(dbias);
    for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(got.floats()[j], 0.0f) << RecipeName(recipe) << j;
  }
}

// A NaN in a column makes its dbias NaN, +Inf makes it +Inf; other columns stay close.
TEST(BlockQuantizeDbiasGpu, NanAndInfPropagate) {
  TESERVE_SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 256;
  constexpr int64_t kCols = 128;
  for (BlockQuantizeKernel kernel : {BlockQuantizeKernel::kAuto, BlockQuantizeKernel::kGeneric}) {
    std::vector<float> values(kRows * kCols);
    for (int64_t i = 0; i < kRows * kCols; ++i) values[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    values[200 * kCols + 5] = std::numeric_limits<float>::quiet_NaN();
    values[3 * kCols + 7] = std::numeric_limits<float>::infinity();
    const Tensor host = Tensor::FromFloats(values, {kRows, kCols}).value();
    const Tensor x = OnDevice(host);
    Tensor row = Poisoned(DType::kFloat8E4M3, {kRows, kCols});
    Tensor row_scale = Poisoned(DType::kFloat8E8M0, {kRows, kCols / 32});
    Tensor amax = Tensor::Zeros(DType::kInt32, {1}, Device::Cuda(0)).value();
    Tensor dbias = Poisoned(DType::kFloat32, {kCols});
    BlockQuantizeLaunchParams p;
    p.x = x.raw_data();
    p.rows = kRows;
    p.cols = kCols;
    p.recipe = BlockRecipe::kMxfp8;
    p.kernel = kernel;
    p.rowwise = row.data<uint8_t>();
    p.rowwise_scale_inv = row_scale.raw_data();
    p.amax_bits = amax.data<uint32_t>();
    p.dbias = dbias.data<float>();
    Tensor workspace = Poisoned(DType::kFloat32, {kernels::cuda::BlockQuantizeDbiasSlabs(p), kCols});
    p.dbias_workspace = workspace.data<float>();
    ASSERT_EQ(kernels::cuda::LaunchBlockQuantize(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor got = OnHost(dbias);
    EXPECT_TRUE(std::isnan(got.floats()[5]));
    EXPECT_EQ(got.floats()[7], std::numeric_limits<float>::infinity());
    double want = 0.0;
    for (int64_t r = 0; r < kRows; ++r) want += values[r * kCols + 9];
    EXPECT_EQ(got.floats()[9], static_cast<float>(want));  // multiples of 0.25: exact
  }
}

#else  // !TESERVE_WITH_CUDA

TEST(BlockQuantizeDbiasGpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
