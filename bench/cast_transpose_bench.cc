// Per-tensor FP8 cast-transpose benchmark (kernels/cuda/cast/cast_kernels.h,
// LaunchQuantizePerTensor): one pass reads x and writes the rowwise codes, the transposed
// columnwise codes and the amax.
//   cast_transpose_bf16   BF16 x -> E4M3 rowwise + columnwise (2 + 1 + 1 bytes per element)
//   cast_transpose_fp32   FP32 x -> E4M3 rowwise + columnwise (4 + 1 + 1)
//   *_tiled64             the same with the 64 x 64 tile kernel forced
//                         (CastTransposeKernel::kTiled64); its config says whether its codes
//                         and amax equal the default kernel's on the benchmark input
//   cast_transpose_dbias_bf16  cast_transpose_bf16 plus the fused dbias (FP32 column sums
//                         of x: tile partials + FP64 reduce kernel); bytes count x, the
//                         codes and dbias, not the small workspace; its config says whether
//                         codes and amax equal cast_transpose_bf16's
//   copy_d2d              cudaMemcpyAsync of the BF16 x, for the copy-bandwidth reference
// Prints JSON (bench/bench_util.h); bench/run_bench.py adds torch.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace bench {
namespace {

using kernels::cuda::CastTransposeKernel;
using kernels::cuda::Fp8Format;
using kernels::cuda::QuantizeLaunchParams;
using kernels::cuda::SourceType;

// Rowwise codes, columnwise codes and amax bits of the last launch, on the host.
std::vector<uint8_t> Outputs(const uint8_t* rowwise, const uint8_t* columnwise,
                             const uint32_t* amax, int64_t numel) {
  std::vector<uint8_t> host(2 * numel + 4);
  BENCH_CHECK(cudaDeviceSynchronize());
  BENCH_CHECK(cudaMemcpy(host.data(), rowwise, numel, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(host.data() + numel, columnwise, numel, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(host.data() + 2 * numel, amax, 4, cudaMemcpyDeviceToHost));
  return host;
}

void Run(int64_t n, int64_t h, const Flags& flags, std::vector<Result>* results) {
  const int64_t numel = n * h;
  auto* rowwise = static_cast<uint8_t*>(DeviceBuffer(numel));
  auto* columnwise = static_cast<uint8_t*>(DeviceBuffer(numel));
  auto* scale_inv = static_cast<float*>(DeviceBuffer(8));
  auto* amax = static_cast<uint32_t*>(DeviceBuffer(4));
  for (const bool bf16 : {true, false}) {
    void* x = RandomDeviceBuffer(numel, bf16, 0.0f, 4.0f, bf16 ? 11 : 12);
    QuantizeLaunchParams p;
    p.x = x;
    p.type = bf16 ? SourceType::kBFloat16 : SourceType::kFloat32;
    p.rows = n;
    p.cols = h;
    p.scale = 64.0f;
    p.scale_inv = 1.0f / 64.0f;
    p.format = Fp8Format::kE4M3;
    p.rowwise = rowwise;
    p.columnwise = columnwise;
    p.rowwise_scale_inv = scale_inv;
    p.columnwise_scale_inv = scale_inv + 1;
    p.amax_bits = amax;
    const Timing t =
        TimeLaunches([&] { return kernels::cuda::LaunchQuantizePerTensor(p, nullptr); }, flags);
    const std::string op = bf16 ? "cast_transpose_bf16" : "cast_transpose_fp32";
    results->push_back({op, n, h, bf16 ? "bf16" : "fp32", t, numel * ((bf16 ? 2 : 4) + 2),
                        n % 8 == 0 && h % 8 == 0
                            ? "128x128 tiles, 8x8 codes per thread in registers, cvt.satfinite "
                              "(kernels/cuda/cast/cast_kernels.cu)"
                            : "64x64 tiles, integer-codec encoder (shape not a multiple of 8)"});
    const std::vector<uint8_t> fast = Outputs(rowwise, columnwise, amax, numel);
    p.kernel = CastTransposeKernel::kTiled64;
    BENCH_CHECK(kernels::cuda::LaunchQuantizePerTensor(p, nullptr));
    const bool same = Outputs(rowwise, columnwise, amax, numel) == fast;
    const Timing t64 =
        TimeLaunches([&] { return kernels::cuda::LaunchQuantizePerTensor(p, nullptr); }, flags);
    results->push_back({op + "_tiled64", n, h, bf16 ? "bf16" : "fp32", t64,
                        numel * ((bf16 ? 2 : 4) + 2),
                        std::string("64x64 tiles, integer-codec encoder; outputs equal to the "
                                    "default kernel's: ") +
                            (same ? "yes" : "NO")});
    if (bf16) {
      p.kernel = CastTransposeKernel::kAuto;
      p.dbias = static_cast<float*>(DeviceBuffer(h * sizeof(float)));
      p.dbias_workspace = static_cast<float*>(
          DeviceBuffer(kernels::cuda::QuantizeDbiasWorkspaceFloats(p) * sizeof(float)));
      BENCH_CHECK(kernels::cuda::LaunchQuantizePerTensor(p, nullptr));
      const bool same_codes = Outputs(rowwise, columnwise, amax, numel) == fast;
      const Timing td =
          TimeLaunches([&] { return kernels::cuda::LaunchQuantizePerTensor(p, nullptr); }, flags);
      results->push_back({"cast_transpose_dbias_bf16", n, h, "bf16", td, numel * 4 + h * 4,
                          std::string("cast-transpose + FP32 tile column sums, FP64 reduce kernel; "
                                      "codes and amax equal to cast_transpose_bf16's: ") +
                              (same_codes ? "yes" : "NO")});
      FreeDeviceBuffers({static_cast<void*>(p.dbias), static_cast<void*>(p.dbias_workspace)});
      p.dbias = nullptr;
      p.dbias_workspace = nullptr;
      void* copy = DeviceBuffer(numel * 2);
      const Timing c = TimeLaunches(
          [&] { return cudaMemcpyAsync(copy, x, numel * 2, cudaMemcpyDeviceToDevice, nullptr); }, flags);
      results->push_back({"copy_d2d", n, h, "bf16", c, numel * 4, "cudaMemcpyAsync device to device"});
      BENCH_CHECK(cudaFree(copy));
    }
    BENCH_CHECK(cudaFree(x));
  }
  FreeDeviceBuffers({static_cast<void*>(rowwise), static_cast<void*>(columnwise),
                    static_cast<void*>(scale_inv), static_cast<void*>(amax)});
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "cast_transpose_bench", teserve::bench::Run);
}
