// Activation benchmarks (kernels/cuda/activation/activation_kernels.h). A shape RxK is the output
// [R, K]; x is [R, K] or, for gated kinds, [R, 2K].
//   <kind>_fwd_fp8            every kind: BF16 x -> FP8 E4M3 rowwise + columnwise codes
//                             and amax, no y (read x; write 2 x R x K codes)
//   gelu_fwd_fp8_fp32         the same from FP32 x
//   gelu_fwd_fp8_codec        gelu with the integer-codec encoder
//   gelu_fwd_fp8_rowwise      gelu, rowwise codes only
//   gelu_fwd_bf16             gelu, y in BF16, no quantization
//   <kind>_fwd_fp8_tiled64    gelu, relu, swiglu: <kind>_fwd_fp8 with the 64 x 64 tile
//                             kernel forced (ActForwardKernel::kTiled64)
//   <kind>_bwd_dbias          gelu, swiglu: dx (BF16) and dbias (FP32) from dy, x (BF16)
//   <kind>_bwd                the same without dbias
// Launchers are called directly on preallocated buffers (no allocation or host sync in
// the timed region). Prints JSON (bench/bench_util.h); bench/run_bench.py adds torch.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cuda/activation/activation_kernels.h"

namespace teserve {
namespace bench {
namespace {

using kernels::cuda::ActDType;
using kernels::cuda::ActFp8Encoder;
using kernels::cuda::ActFunction;
using kernels::cuda::ActivationBackwardParams;
using kernels::cuda::ActivationForwardParams;
using kernels::cuda::ActivationFunctionParams;

struct Kind {
  const char* name;
  ActivationFunctionParams act;
};

ActivationFunctionParams Fn(ActFunction function, float alpha, bool gated, bool clamped = false) {
  ActivationFunctionParams f;
  f.function = function;
  f.alpha = alpha;
  f.gated = gated;
  if (clamped) {
    f.clamped = true;
    f.limit = 7.0f;
    f.offset = 1.0f;
  }
  return f;
}

std::vector<Kind> Kinds() {
  return {
      {"gelu", Fn(ActFunction::kGelu, 1.0f, false)},
      {"geglu", Fn(ActFunction::kGelu, 1.0f, true)},
      {"qgelu", Fn(ActFunction::kSigmoidLinear, 1.702f, false)},
      {"qgeglu", Fn(ActFunction::kSigmoidLinear, 1.702f, true)},
      {"relu", Fn(ActFunction::kRelu, 1.0f, false)},
      {"reglu", Fn(ActFunction::kRelu, 1.0f, true)},
      {"srelu", Fn(ActFunction::kSquaredRelu, 1.0f, false)},
      {"sreglu", Fn(ActFunction::kSquaredRelu, 1.0f, true)},
      {"silu", Fn(ActFunction::kSigmoidLinear, 1.0f, false)},
      {"swiglu", Fn(ActFunction::kSigmoidLinear, 1.0f, true)},
      {"clamped_swiglu", Fn(ActFunction::kSigmoidLinear, 1.702f, true, true)},
  };
}

void Run(int64_t rows, int64_t k, const Flags& flags, std::vector<Result>* results) {
  const int64_t n = rows * k;
  // Inputs sized for gated kinds (2K wide); element-wise kinds read the first R x K.
  void* x_bf16 = RandomDeviceBuffer(2 * n, /*bf16=*/true, 0.0f, 4.0f, 1);
  void* x_fp32 = RandomDeviceBuffer(n, /*bf16=*/false, 0.0f, 4.0f, 2);
  void* dy = RandomDeviceBuffer(n, /*bf16=*/true, 0.0f, 1.0f, 3);
  auto* rowwise = static_cast<uint8_t*>(DeviceBuffer(n));
  auto* columnwise = static_cast<uint8_t*>(DeviceBuffer(n));
  void* y = DeviceBuffer(2 * n);
  void* dx = DeviceBuffer(2 * 2 * n);
  auto* dbias = static_cast<float*>(DeviceBuffer(4 * 2 * k));
  auto* scale_inv = static_cast<float*>(DeviceBuffer(2 * sizeof(float)));
  auto* amax = static_cast<uint32_t*>(DeviceBuffer(sizeof(uint32_t)));

  auto forward_params = [&](const ActivationFunctionParams& act) {
    ActivationForwardParams p;
    p.act = act;
    p.x = x_bf16;
    p.x_type = ActDType::kBFloat16;
    p.rows = rows;
    p.cols = k;
    p.scale = 64.0f;
    p.scale_inv = 1.0f / 64.0f;
    p.rowwise = rowwise;
    p.columnwise = columnwise;
    p.rowwise_scale_inv = scale_inv;
    p.columnwise_scale_inv = scale_inv + 1;
    p.amax_bits = amax;
    return p;
  };
  auto forward = [&](const std::string& op, const ActivationForwardParams& p, const std::string& dtype,
                     int64_t bytes, const std::string& config) {
    const Timing t = TimeLaunches([&] { return kernels::cuda::LaunchActivationForward(p, nullptr); }, flags);
    results->push_back({op, rows, k, dtype, t, bytes, config});
  };

  for (const Kind& kind : Kinds()) {
    const int64_t in = kind.act.gated ? 2 * n : n;
    forward(std::string(kind.name) + "_fwd_fp8", forward_params(kind.act), "bf16", 2 * in + 2 * n,
            "E4M3 rowwise + columnwise + amax, cvt encoder");
  }
  for (int i : {0, 4, 9}) {  // gelu, relu, swiglu
    const Kind kind = Kinds()[i];
    const int64_t in = kind.act.gated ? 2 * n : n;
    ActivationForwardParams p = forward_params(kind.act);
    p.kernel = kernels::cuda::ActForwardKernel::kTiled64;
    forward(std::string(kind.name) + "_fwd_fp8_tiled64", p, "bf16", 2 * in + 2 * n,
            "E4M3 rowwise + columnwise + amax, cvt encoder, 64 x 64 tile kernel");
  }
  const ActivationFunctionParams gelu = Kinds()[0].act;
  {
    ActivationForwardParams p = forward_params(gelu);
    p.x = x_fp32;
    p.x_type = ActDType::kFloat32;
    forward("gelu_fwd_fp8_fp32", p, "fp32", 4 * n + 2 * n, "E4M3 rowwise + columnwise + amax, cvt encoder");
  }
  {
    ActivationForwardParams p = forward_params(gelu);
    p.encoder = ActFp8Encoder::kCodec;
    forward("gelu_fwd_fp8_codec", p, "bf16", 2 * n + 2 * n, "E4M3 rowwise + columnwise + amax, integer codec");
  }
  {
    ActivationForwardParams p = forward_params(gelu);
    p.columnwise = nullptr;
    p.columnwise_scale_inv = nullptr;
    forward("gelu_fwd_fp8_rowwise", p, "bf16", 2 * n + n, "E4M3 rowwise + amax");
  }
  {
    ActivationForwardParams p = forward_params(gelu);
    p.rowwise = nullptr;
    p.columnwise = nullptr;
    p.rowwise_scale_inv = nullptr;
    p.columnwise_scale_inv = nullptr;
    p.amax_bits = nullptr;
    p.y = y;
    p.y_type = ActDType::kBFloat16;
    forward("gelu_fwd_bf16", p, "bf16", 2 * n + 2 * n, "y in BF16, no quantization");
  }

  const std::vector<Kind> kinds = Kinds();
  for (const Kind& kind : {kinds[0], kinds[9]}) {  // gelu, swiglu
    const int64_t in = kind.act.gated ? 2 * n : n;
    for (bool with_dbias : {true, false}) {
      ActivationBackwardParams p;
      p.act = kind.act;
      p.dy = dy;
      p.x = x_bf16;
      p.type = ActDType::kBFloat16;
      p.rows = rows;
      p.cols = k;
      p.dx = dx;
      float* workspace = nullptr;
      if (with_dbias) {
        p.dbias = dbias;
        workspace = static_cast<float*>(DeviceBuffer(4 * kernels::cuda::ActivationBackwardWorkspaceFloats(p)));
        p.workspace = workspace;
      }
      const Timing t = TimeLaunches([&] { return kernels::cuda::LaunchActivationBackward(p, nullptr); }, flags);
      // dy + x read, dx written, dbias written.
      const int64_t bytes = 2 * n + 2 * in + 2 * in + (with_dbias ? 4 * (in / rows) : 0);
      results->push_back({std::string(kind.name) + (with_dbias ? "_bwd_dbias" : "_bwd"), rows, k, "bf16", t, bytes,
                          with_dbias ? "dx BF16 + dbias FP32 (two-stage column sums)" : "dx BF16"});
      if (workspace != nullptr) BENCH_CHECK(cudaFree(workspace));
    }
  }

  FreeDeviceBuffers({x_bf16, x_fp32, dy, static_cast<void*>(rowwise), static_cast<void*>(columnwise), y, dx,
                    static_cast<void*>(dbias), static_cast<void*>(scale_inv), static_cast<void*>(amax)});
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "activation_bench", teserve::bench::Run);
}
