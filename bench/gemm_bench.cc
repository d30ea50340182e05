// GEMM benchmark of kernels::Gemm (the checked entry the layers call, cuBLASLt behind
// it) on device tensors, in the layouts Linear uses (k contiguous in both operands).
// --shapes=RxC means m = R tokens, n = k = C features: 16384x8192 is Linear's 16384
// tokens 8192 -> 8192 forward GEMM, 8192x8192 the 8192^3 square one.
//   gemm_bf16             BF16 x BF16 -> BF16
//   gemm_fp8_fast         E4M3 x E4M3 -> BF16, per-tensor scales, fast accumulation (fprop)
//   gemm_fp8_split        the same with split accumulation (dgrad / wgrad)
//   gemm_fp8_block        E4M3 x E4M3 -> BF16, FP8 block scaling as the block recipe's
//                         fprop: A 1x128 blocks (VEC128_32F), B 128x128 tiles
//                         (BLK128x128_32F), scales already in cuBLASLt's layout (the
//                         pure GEMM; split accumulation, the only mode these kernels have)
//   gemm_fp8_block_qscales  the same with the scales as the quantizer makes them, so each
//                         call also converts them (two small kernels): what Linear runs
// Bytes are the operands read once and D written once; the JSON also carries flops
// (2 m n k) and TFLOP/s, the figure a GEMM is judged by (bf16 ~790, FP8 ~1500 peak-ish
// on an H200 with cuBLASLt). bench/run_bench.py times torch.matmul and
// torch._scaled_mm on the same shapes.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/gemm.h"

namespace teserve {
namespace bench {
namespace {

void* Fp8Buffer(int64_t count, uint64_t seed) {
  // E4M3 codes of small magnitudes (exponent field 5..9, any sign and mantissa), never 0.
  std::vector<uint8_t> host(count);
  for (int64_t i = 0; i < count; ++i) {
    const float u = Uniform(seed, static_cast<uint64_t>(i));
    const uint8_t mantissa = static_cast<uint8_t>(static_cast<int>((u + 1.0f) * 4.0f) & 7);
    const uint8_t exponent = static_cast<uint8_t>(5 + (static_cast<int>((u + 1.0f) * 37.0f) % 5));
    host[i] = static_cast<uint8_t>((u < 0 ? 0x80 : 0) | (exponent << 3) | mantissa);
  }
  void* device = DeviceBuffer(count);
  BENCH_CHECK(cudaMemcpy(device, host.data(), count, cudaMemcpyHostToDevice));
  return device;
}

void Run(int64_t rows, int64_t cols, const Flags& flags, std::vector<Result>* results) {
  const int64_t m = rows, n = cols, k = cols;
  const Device gpu = Device::Cuda(0);
  Context ctx;
  ctx.device = gpu;
  const int64_t flops = 2 * m * n * k;
  auto record = [&](const std::string& op, const std::string& dtype, int64_t operand_bytes,
                    const kernels::GemmOperand& a, const kernels::GemmOperand& b,
                    const kernels::GemmOptions& options, Tensor* d, const std::string& config) {
    Timing t = TimeLaunches(
        [&]() -> cudaError_t {
          const absl::Status status = kernels::Gemm(ctx, a, b, d, options);
          if (!status.ok()) {
            std::fprintf(stderr, "%s: %s\n", op.c_str(), status.ToString().c_str());
            return cudaErrorUnknown;
          }
          return cudaSuccess;
        },
        flags);
    Result r{op, m, k, dtype, t, operand_bytes * (m + n) * k + 2 * m * n, config};
    r.flops = flops;
    results->push_back(r);
  };

  void* a16 = RandomDeviceBuffer(m * k, /*bf16=*/true, 0.0f, 1.0f, 1);
  void* b16 = RandomDeviceBuffer(n * k, /*bf16=*/true, 0.0f, 1.0f, 2);
  void* d16 = DeviceBuffer(2 * m * n);
  Tensor d_bf16 = Tensor::Borrow(d16, DType::kBFloat16, {m, n}, gpu);
  record("gemm_bf16", "bf16", 2,
         kernels::GemmOperand{Tensor::Borrow(a16, DType::kBFloat16, {m, k}, gpu), false},
         kernels::GemmOperand{Tensor::Borrow(b16, DType::kBFloat16, {n, k}, gpu), true}, kernels::GemmOptions(),
         &d_bf16, "A [m,k] x B [n,k]^T, cuBLASLt heuristic's first algorithm");

  void* a8 = Fp8Buffer(m * k, 3);
  void* b8 = Fp8Buffer(n * k, 4);
  // Each scale in its own allocation, as the quantizers' scale tensors are.
  const float scale_a = 0.5f, scale_b = 0.25f;
  void* sa = DeviceBuffer(sizeof(float));
  void* sb = DeviceBuffer(sizeof(float));
  BENCH_CHECK(cudaMemcpy(sa, &scale_a, sizeof(float), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(sb, &scale_b, sizeof(float), cudaMemcpyHostToDevice));
  const kernels::GemmOperand a{Tensor::Borrow(a8, DType::kFloat8E4M3, {m, k}, gpu), false,
                               Tensor::Borrow(sa, DType::kFloat32, {1}, gpu)};
  const kernels::GemmOperand b{Tensor::Borrow(b8, DType::kFloat8E4M3, {n, k}, gpu), true,
                               Tensor::Borrow(sb, DType::kFloat32, {1}, gpu)};
  kernels::GemmOptions fast;
  fast.accumulation = kernels::GemmAccumulation::kFast;
  record("gemm_fp8_fast", "e4m3", 1, a, b, fast, &d_bf16, "E4M3 x E4M3 -> BF16, per-tensor scale_inv pointers");
  record("gemm_fp8_split", "e4m3", 1, a, b, kernels::GemmOptions(), &d_bf16,
         "E4M3 x E4M3 -> BF16, split accumulation");

  // FP8 block scaling. Scales are powers of two (the recipe's power_2_scale), varied per
  // block so that no kernel could fold them into one.
  auto scale_buffer = [](int64_t count, uint64_t seed) {
    std::vector<float> host(count);
    for (int64_t i = 0; i < count; ++i) {
      host[i] = 1.0f / static_cast<float>(1 << (static_cast<int>((Uniform(seed, i) + 1.0f) * 2.0f) % 4));
    }
    void* device = DeviceBuffer(count * static_cast<int64_t>(sizeof(float)));
    BENCH_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    return device;
  };
  const int64_t kb = (k + kernels::kGemmBlockSize - 1) / kernels::kGemmBlockSize;
  const int64_t nb = (n + kernels::kGemmBlockSize - 1) / kernels::kGemmBlockSize;
  const int64_t kb4 = (kb + 3) / 4 * 4, m4 = (m + 3) / 4 * 4;
  // cuBLASLt layout: A 1D [kb, roundup(m, 4)], B 2D [nb, roundup(kb, 4)].
  void* sa_gemm = scale_buffer(kb * m4, 5);
  void* sb_gemm = scale_buffer(nb * kb4, 6);
  // Quantizer layout: A 1D [m, kb], B 2D [nb, kb].
  void* sa_q = scale_buffer(m * kb, 7);
  void* sb_q = scale_buffer(nb * kb, 8);
  auto block_operand = [&](void* data, int64_t rows, bool transpose, kernels::GemmScaleMode mode,
                           kernels::GemmScaleLayout layout, void* scales, Shape scale_shape) {
    kernels::GemmOperand o{Tensor::Borrow(data, DType::kFloat8E4M3, {rows, k}, gpu), transpose,
                           Tensor::Borrow(scales, DType::kFloat32, scale_shape, gpu)};
    o.scale_mode = mode;
    o.scale_layout = layout;
    return o;
  };
  using kernels::GemmScaleLayout;
  using kernels::GemmScaleMode;
  record("gemm_fp8_block", "e4m3", 1,
         block_operand(a8, m, false, GemmScaleMode::kBlock1D, GemmScaleLayout::kGemm, sa_gemm, {kb, m4}),
         block_operand(b8, n, true, GemmScaleMode::kBlock2D, GemmScaleLayout::kGemm, sb_gemm, {nb, kb4}),
         kernels::GemmOptions(), &d_bf16,
         "E4M3 x E4M3 -> BF16, A 1x128 (VEC128_32F) x B 128x128 (BLK128x128_32F) FP32 block scales in "
         "cuBLASLt layout, split accumulation");
  record("gemm_fp8_block_qscales", "e4m3", 1,
         block_operand(a8, m, false, GemmScaleMode::kBlock1D, GemmScaleLayout::kQuantizer, sa_q, {m, kb}),
         block_operand(b8, n, true, GemmScaleMode::kBlock2D, GemmScaleLayout::kQuantizer, sb_q, {nb, kb}),
         kernels::GemmOptions(), &d_bf16,
         "gemm_fp8_block with the quantizer's scale layout, converted on every call (Linear's path)");
  FreeDeviceBuffers({a16, b16, d16, a8, b8, sa, sb, sa_gemm, sb_gemm, sa_q, sb_q});
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) { return teserve::bench::RunPerShape(argc, argv, "gemm_bench", teserve::bench::Run); }
