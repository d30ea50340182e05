// Times the block-scaled quantization kernels (MXFP8, FP8 block scaling, NVFP4) and
// their dequantization with CUDA events and prints JSON (bench/bench_util.h).
//
//   block_quantize_bench [--shapes=16384x8192] [--iters=50] [--warmup=10] [--json=PATH]
//
// Every op goes through the launchers in kernels/cuda on random (never zero) inputs; a
// device-to-device copy of the BF16 input is timed the same way as the ceiling. Bytes
// count each input read once and each output written once. Shapes must be multiples of
// 128 in both dimensions (every recipe's blocks tile them).
//
// bench/run_bench.py runs this binary and the PyTorch equivalents and prints the table.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "kernels/cuda/cast/cast_kernels.h"
#include "kernels/cuda/nvfp4/nvfp4_kernels.h"

namespace teserve {
namespace bench {
namespace {

using kernels::cuda::BlockDequantizeLaunchParams;
using kernels::cuda::BlockQuantizeLaunchParams;
using kernels::cuda::BlockQuantizeKernel;
using kernels::cuda::BlockRecipe;
using kernels::cuda::Fp8Encoder;
using kernels::cuda::Nvfp4QuantizeLaunchParams;
using kernels::cuda::SourceType;

constexpr uint64_t kSeed = 5;

// Times every op on one [rows, cols] shape and appends the results.
void RunShape(int64_t rows, int64_t cols, const Flags& flags, std::vector<Result>* results) {
  const int64_t n = rows * cols;
  // The same values as FP32 and as BF16.
  void* x32 = RandomDeviceBuffer(n, /*bf16=*/false, 0.0f, 3.0f, kSeed);
  void* x16 = RandomDeviceBuffer(n, /*bf16=*/true, 0.0f, 3.0f, kSeed);
  // Outputs sized for the largest use: FP8 codes and FP32 1x128 scales of both copies.
  auto* rowwise = static_cast<uint8_t*>(DeviceBuffer(n));
  auto* columnwise = static_cast<uint8_t*>(DeviceBuffer(n));
  void* rowwise_scales = DeviceBuffer(n / 16);
  void* columnwise_scales = DeviceBuffer(n / 16);
  auto* amax = static_cast<uint32_t*>(DeviceBuffer(2 * sizeof(uint32_t)));
  void* copy_out = DeviceBuffer(n * 2);
  auto* dequantized = static_cast<float*>(DeviceBuffer(n * 4));
  // dbias [cols] and the partial sums of 32-row slabs (the most any kernel uses).
  auto* dbias = static_cast<float*>(DeviceBuffer(cols * 4));
  auto* dbias_workspace = static_cast<float*>(DeviceBuffer((rows / 32) * cols * 4));

  auto add = [&](const std::string& op, const std::string& dtype, double bytes,
                 const std::function<cudaError_t()>& launch, const std::string& config) {
    Result r;
    r.op = op;
    r.rows = rows;
    r.cols = cols;
    r.dtype = dtype;
    r.timing = TimeLaunches(launch, flags);
    r.bytes = static_cast<int64_t>(bytes);
    r.config = config;
    results->push_back(r);
  };
  const double nd = static_cast<double>(n);
  add("copy_d2d", "bf16", 4.0 * nd, [&] {
    return cudaMemcpyAsync(copy_out, x16, n * 2, cudaMemcpyDeviceToDevice, nullptr);
  }, "cudaMemcpyAsync device to device, bytes read + written");

  auto quantize = [&](BlockRecipe recipe, SourceType type, Fp8Encoder encoder, bool both,
                      BlockQuantizeKernel kernel = BlockQuantizeKernel::kAuto,
                      bool with_dbias = false) {
    BlockQuantizeLaunchParams p;
    p.kernel = kernel;
    if (with_dbias) {
      p.dbias = dbias;
      p.dbias_workspace = dbias_workspace;
    }
    p.x = type == SourceType::kFloat32 ? x32 : x16;
    p.type = type;
    p.rows = rows;
    p.cols = cols;
    p.recipe = recipe;
    p.encoder = encoder;
    p.rowwise = rowwise;
    p.rowwise_scale_inv = rowwise_scales;
    p.columnwise = both ? columnwise : nullptr;
    p.columnwise_scale_inv = both ? columnwise_scales : nullptr;
    p.amax_bits = amax;
    return std::function<cudaError_t()>(
        [p] { return kernels::cuda::LaunchBlockQuantize(p, nullptr); });
  };
  const double in16 = 2.0 * nd;
  const double in32 = 4.0 * nd;
  const double mx_copy = nd + nd / 32.0;              // E4M3 codes + E8M0 scales
  const double block1d_copy = nd + nd / 128.0 * 4.0;  // E4M3 codes + FP32 scales
  const double block2d_copy = nd + nd / 16384.0 * 4.0;
  const std::string fused = "one pass: amax + rowwise + transposed columnwise, E4M3";
  add("mxfp8_quantize_rowwise_columnwise_bf16", "bf16", in16 + 2 * mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kHardware, true),
      fused + ", cvt encoder");
  add("mxfp8_quantize_rowwise_columnwise_fp32", "fp32", in32 + 2 * mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kFloat32, Fp8Encoder::kHardware, true),
      fused + ", cvt encoder");
  add("mxfp8_quantize_rowwise_columnwise_bf16_generic", "bf16", in16 + 2 * mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kHardware, true,
               BlockQuantizeKernel::kGeneric),
      fused + ", cvt encoder, generic 32-row kernel");
  add("mxfp8_quantize_rowwise_columnwise_fp32_generic", "fp32", in32 + 2 * mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kFloat32, Fp8Encoder::kHardware, true,
               BlockQuantizeKernel::kGeneric),
      fused + ", cvt encoder, generic 32-row kernel");
  // dbias adds cols FP32 written (the slab partials stay in L2-sized traffic, not counted).
  add("mxfp8_quantize_dbias_bf16", "bf16", in16 + 2 * mx_copy + 4.0 * cols,
      quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kHardware, true,
               BlockQuantizeKernel::kAuto, /*with_dbias=*/true),
      fused + " + fused dbias (FP32 column sums, slab partials + FP64 reduce)");
  add("block1d_quantize_dbias_bf16", "bf16", in16 + 2 * block1d_copy + 4.0 * cols,
      quantize(BlockRecipe::kBlock1D, SourceType::kBFloat16, Fp8Encoder::kHardware, true,
               BlockQuantizeKernel::kAuto, /*with_dbias=*/true),
      fused + ", 1x128 blocks + fused dbias");
  add("mxfp8_quantize_rowwise_columnwise_bf16_integer_codec", "bf16", in16 + 2 * mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kSoftware, true),
      fused + ", integer codec encoder");
  add("mxfp8_quantize_rowwise_bf16", "bf16", in16 + mx_copy,
      quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kHardware, false),
      "amax + rowwise only, cvt encoder");
  add("block1d_quantize_rowwise_columnwise_bf16", "bf16", in16 + 2 * block1d_copy,
      quantize(BlockRecipe::kBlock1D, SourceType::kBFloat16, Fp8Encoder::kHardware, true),
      fused + ", 1x128 blocks, power-of-two scales");
  add("block2d_quantize_rowwise_columnwise_bf16", "bf16", in16 + 2 * block2d_copy,
      quantize(BlockRecipe::kBlock2D, SourceType::kBFloat16, Fp8Encoder::kHardware, true),
      fused + ", 128x128 blocks, power-of-two scales");

  // MXFP8 dequantize of the rowwise copy just written.
  BENCH_CHECK(quantize(BlockRecipe::kMxfp8, SourceType::kBFloat16, Fp8Encoder::kHardware, true)());
  BlockDequantizeLaunchParams d;
  d.codes = rowwise;
  d.rows = rows;
  d.cols = cols;
  d.block_rows = 1;
  d.block_cols = 32;
  d.scale_inv = rowwise_scales;
  d.e8m0_scales = true;
  d.scale_cols = cols / 32;
  d.out = dequantized;
  add("mxfp8_dequantize_rowwise_fp32", "fp32", nd + nd / 32.0 + 4.0 * nd,
      [d] { return kernels::cuda::LaunchBlockDequantize(d, nullptr); }, "FP32 output");

  // NVFP4 1D with RHT on the columnwise copy: the amax pass (x and RHT(x^T)) and the
  // quantize pass back to back, with a fixed global scale (the op reads the amax back to
  // the host in between, which is not timed here). Any +-1 diagonal costs the same as
  // teserve's fixed one.
  kernels::cuda::HadamardSigns signs;
  for (int j = 0; j < kernels::cuda::kHadamardPoints; ++j) signs.d[j] = j % 3 == 0 ? -1.0f : 1.0f;
  Nvfp4QuantizeLaunchParams nv;
  nv.x = x16;
  nv.type = SourceType::kBFloat16;
  nv.rows = rows;
  nv.cols = cols;
  nv.random_hadamard = true;
  nv.signs = signs;
  nv.global_scale = 100.0f;
  nv.global_scale_inv = 0.01f;
  nv.rowwise = rowwise;
  nv.rowwise_scales = static_cast<uint8_t*>(rowwise_scales);
  nv.columnwise = columnwise;
  nv.columnwise_scales = static_cast<uint8_t*>(columnwise_scales);
  const double nv_copy = nd / 2.0 + nd / 16.0;  // packed E2M1 + E4M3 scales
  add("nvfp4_quantize_1d_rht_rowwise_columnwise_bf16", "bf16", 2.0 * in16 + 2.0 * nv_copy,
      [&] {
        const cudaError_t s = kernels::cuda::LaunchNvfp4Amax(x16, SourceType::kBFloat16, rows,
                                                             cols, signs, amax, amax + 1, nullptr);
        return s != cudaSuccess ? s : kernels::cuda::LaunchNvfp4Quantize(nv, nullptr);
      },
      "amax pass + quantize pass (x read twice, counted twice)");
  add("nvfp4_amax_pass_rht_bf16", "bf16", in16,
      [&] {
        return kernels::cuda::LaunchNvfp4Amax(x16, SourceType::kBFloat16, rows, cols, signs, amax,
                                              amax + 1, nullptr);
      },
      "amax pass only (x and RHT(x^T))");
  add("nvfp4_quantize_pass_1d_rht_rowwise_columnwise_bf16", "bf16", in16 + 2.0 * nv_copy,
      [nv] { return kernels::cuda::LaunchNvfp4Quantize(nv, nullptr); },
      "quantize pass only, round to nearest");
  Nvfp4QuantizeLaunchParams sr = nv;
  sr.random_hadamard = false;
  sr.stochastic_rounding = true;
  sr.rowwise_key = 1;
  sr.columnwise_key = 2;
  add("nvfp4_quantize_pass_1d_stochastic_rowwise_columnwise_bf16", "bf16", in16 + 2.0 * nv_copy,
      [sr] { return kernels::cuda::LaunchNvfp4Quantize(sr, nullptr); },
      "quantize pass only, stochastic rounding");

  FreeDeviceBuffers({x32, x16, static_cast<void*>(rowwise), static_cast<void*>(columnwise),
                    rowwise_scales, columnwise_scales, static_cast<void*>(amax), copy_out,
                    static_cast<void*>(dequantized), static_cast<void*>(dbias),
                    static_cast<void*>(dbias_workspace)});
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::vector<Result> results;
  for (const auto& [rows, cols] : flags.shapes) {
    if (rows <= 0 || cols <= 0 || rows % 128 != 0 || cols % 128 != 0) {
      std::fprintf(stderr, "shape %lldx%lld: both dimensions must be positive multiples of 128\n",
                   static_cast<long long>(rows), static_cast<long long>(cols));
      return 2;
    }
    RunShape(rows, cols, flags, &results);
  }
  WriteJson("block_quantize", results, flags);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) { return teserve::bench::Main(argc, argv); }
