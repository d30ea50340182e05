// Launchers of the RoPE kernels (rope_kernels.cu), contract kernels/rope.h. One thread
// per element of t (grid-stride); cos and sin of the frequency and the two-term sum in
// double, rounded to FP32, as the CPU reference does. Light header (CUDA runtime only);
// the launchers do not synchronize and return cudaGetLastError after the launch.
#ifndef TESERVE_KERNELS_CUDA_ROPE_KERNELS_H_
#define TESERVE_KERNELS_CUDA_ROPE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

// Layout of t (kernels::RopeFormat): position of a token is its s index (sbhd, bshd) or
// its offset in its cu_seqlens sequence (thd; tokens at or past cu_seqlens[batch] pass
// through).
enum class RopeLayout { kSbhd, kBshd, kThd };

struct RopeLaunchParams {
  const float* in = nullptr;     // t or dy: [s, b, h, d], [b, s, h, d] or [t, h, d]
  float* out = nullptr;          // shaped like in, distinct from it
  const float* freqs = nullptr;  // [>= positions, r]
  const int32_t* cu_seqlens = nullptr;  // [batch + 1] device copy, thd only
  RopeLayout layout = RopeLayout::kSbhd;
  bool interleaved = false;
  bool transpose = false;  // false: RopeForward; true: RopeBackward
  int64_t tokens = 0;      // s * b, or t for thd
  int64_t seq_dim = 1;     // the b dimension for sbhd (pos = token / b), s for bshd (pos = token % s)
  int64_t batch = 0;       // thd: cu_seqlens holds batch + 1 values
  int64_t heads = 0;
  int64_t d = 0;
  int64_t r = 0;           // even, 0 < r <= d
};

cudaError_t LaunchRope(const RopeLaunchParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ROPE_KERNELS_H_
