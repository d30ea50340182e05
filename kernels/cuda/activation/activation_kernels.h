// Launchers for the activation kernels in activation_kernels.cu (contract:
// kernels/activation.h). Light header: CUDA runtime types only (no abseil), so both nvcc
// and the host wrappers (activation_cuda.cc) and the benchmarks include it.
//
// Every launcher takes device pointers and a stream, returns the first CUDA error (launch
// status included) and does not synchronize. Callers validate shapes and dtypes.
//
// Shapes: the output width is K (`cols`); x is [rows, K] for element-wise functions and
// [rows, 2K] = [a | b] for gated ones (out = f(a') * (b' + offset), kernels/activation_math.h).
#ifndef TESERVE_KERNELS_CUDA_ACTIVATION_KERNELS_H_
#define TESERVE_KERNELS_CUDA_ACTIVATION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Element types of x, dy, dx and y.
enum class ActDType { kFloat32, kFloat16, kBFloat16 };

// The scalar function f (kernels/activation_math.h): kGelu = GeluOp, kSigmoidLinear =
// x * sigmoid(alpha x) (qgelu: alpha 1.702, silu: 1, clamped_swiglu: params.alpha),
// kRelu = ReluOp, kSquaredRelu = SquaredReluOp.
enum class ActFunction { kGelu, kSigmoidLinear, kRelu, kSquaredRelu };

// How the FP8 codes are produced; both give core/float_codec.h's codes:
//   kHardware: cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (RNE, finite overflow and +-Inf
//              saturate), NaN patched to the codec's 0x7F;
//   kCodec:    the integer codec itself.
enum class ActFp8Encoder { kHardware, kCodec };

struct ActivationFunctionParams {
  ActFunction function = ActFunction::kGelu;
  float alpha = 1.0f;    // kSigmoidLinear only
  bool gated = false;
  // Gate clamp (clamped_swiglu): a' = min(a, limit), b' = clamp(b, -limit, limit), offset 1.
  bool clamped = false;
  float limit = 0.0f;
  float offset = 0.0f;
};

// Which forward kernel LaunchActivationForward runs (benchmarks and tests compare them):
// kAuto takes the 128 x 128 register-tile kernel when rows and cols are positive
// multiples of 8, x and y are 16-byte and the codes 8-byte aligned (and the gate clamp,
// if set, goes with kSigmoidLinear), else the 64 x 64 shared-memory one; kTiled64 always takes the 64 x 64 one. Both give the same y, codes
// and amax.
enum class ActForwardKernel { kAuto, kTiled64 };

struct ActivationForwardParams {
  ActivationFunctionParams act;
  ActForwardKernel kernel = ActForwardKernel::kAuto;
  const void* x = nullptr;  // [rows, K] or [rows, 2K]
  ActDType x_type = ActDType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;         // K
  void* y = nullptr;        // [rows, K] or null
  ActDType y_type = ActDType::kFloat32;
  // Fused per-tensor FP8 output of the FP32 y (either copy may be null).
  Fp8Format format = Fp8Format::kE4M3;
  ActFp8Encoder encoder = ActFp8Encoder::kHardware;
  float scale = 1.0f;
  float scale_inv = 1.0f;                 // written as is
  uint8_t* rowwise = nullptr;             // [rows, K]
  uint8_t* columnwise = nullptr;          // [K, rows]
  float* rowwise_scale_inv = nullptr;     // [1]
  float* columnwise_scale_inv = nullptr;  // [1]
  uint32_t* amax_bits = nullptr;          // [1] FP32 bits of max |y|; zeroed by the launcher
};

cudaError_t LaunchActivationForward(const ActivationForwardParams& params, cudaStream_t stream);

struct ActivationBackwardParams {
  ActivationFunctionParams act;
  const void* dy = nullptr;  // [rows, K]
  const void* x = nullptr;   // [rows, K] or [rows, 2K], same type as dy
  ActDType type = ActDType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;          // K
  void* dx = nullptr;        // shaped like x, same type
  // Column sums of the FP32 dx (shape [cols of x]) or null. Per-block partial sums go to
  // `workspace` (ActivationBackwardWorkspaceFloats floats) and a second kernel adds them
  // in a fixed order (deterministic for a given shape).
  float* dbias = nullptr;
  float* workspace = nullptr;
};

// Floats of workspace LaunchActivationBackward needs (0 without dbias).
int64_t ActivationBackwardWorkspaceFloats(const ActivationBackwardParams& params);
cudaError_t LaunchActivationBackward(const ActivationBackwardParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ACTIVATION_KERNELS_H_
