// Launchers for the LayerNorm / RMSNorm kernels (normalization_forward_kernels.cu,
// normalization_register_tile.cu, normalization_backward_kernels.cu). Light
// header: CUDA runtime types only (no abseil), so both nvcc and the host wrappers
// (normalization_cuda.cc) and the benchmarks include it.
//
// Every launcher takes device pointers and a stream, returns the first CUDA error (launch
// status included) and does not synchronize. Callers validate shapes and dtypes; the
// launchers pick grids and kernel variants. Contract: kernels/normalization.h.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_KERNELS_H_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Element types of x, dy, dx and y.
enum class NormDType { kFloat32, kFloat16, kBFloat16 };

// How FP8 codes are produced. Both give the codes of core/float_codec.h bit for bit
// (tests/gpu/normalization/normalization_gpu_test.cc checks every FP32 input of both formats):
//   kHardware: Hopper's cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (finite overflow and +-Inf
//              saturate to +-max), NaN mapped to 0x7F afterwards;
//   kCodec:    the integer codec itself (~30 integer ops per element).
enum class Fp8Encoder { kHardware, kCodec };

// Forward kernel choice for the shapes the register-tile kernels cover (outputs are equal
// bit for bit; benchmarks and tests A/B them):
//   kAuto:                the stats-warp kernel (normalization_stats_warp.cu) where it
//                         applies, with the register-tile kernel's row-group order
//                         (cluster y takes groups y, y + clusters, ...); else the
//                         register-tile kernel;
//   kRegisterTile:        never the stats-warp kernel;
//   kStatsWarpContiguous: the stats-warp kernel, each cluster taking one block of
//                         consecutive 32-row groups (measured slower);
//   kStatsWarpQuads:      as kAuto, but where kAuto takes adjacent pairs of row groups
//                         (codes without y) each cluster takes two adjacent pairs, so one
//                         CTA writes whole 128-byte columnwise lines (measured slower);
//   kStatsWarpClusters:   as kAuto, but the stats-warp cluster kernel also where kAuto takes
//                         the one-CTA-per-row kernel (few rows, no columnwise copy:
//                         NormForwardPlan::row_per_cta).
enum class NormForwardKernel { kAuto, kRegisterTile, kStatsWarpContiguous, kStatsWarpQuads, kStatsWarpClusters };

struct NormForwardParams {
  bool rms = false;              // RMSNorm (no mean, no beta) instead of LayerNorm
  const void* x = nullptr;       // [rows, cols]
  NormDType x_type = NormDType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* gamma = nullptr;  // [cols]
  const float* beta = nullptr;   // [cols], LayerNorm only
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  void* y = nullptr;             // [rows, cols] or null
  NormDType y_type = NormDType::kFloat32;
  float* mu = nullptr;           // [rows], LayerNorm only
  float* rsigma = nullptr;       // [rows]
  // Fused per-tensor FP8 output of the FP32 y (either copy may be null).
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Encoder encoder = Fp8Encoder::kHardware;
  float scale = 1.0f;
  float scale_inv = 1.0f;                 // written as is
  uint8_t* rowwise = nullptr;             // [rows, cols]
  uint8_t* columnwise = nullptr;          // [cols, rows]
  float* rowwise_scale_inv = nullptr;     // [1]
  float* columnwise_scale_inv = nullptr;  // [1]
  uint32_t* amax_bits = nullptr;          // [1] FP32 bits of max |y|; zeroed by the launch
  int sm_margin = 0;
  // MXFP8 output instead of the per-tensor one (kernels/block_quantize.h's QuantizeMxfp8 of
  // the FP32 y): rowwise / columnwise receive the codes of 1x32 / 32x1 blocks, the E8M0
  // scales below, amax_bits max |y|; scale, scale_inv and the FP32 *_scale_inv are unused.
  // Only the register-tile kernels compute it (the stats-warp kernel by default, the
  // register-tile one with kRegisterTile; normalization_register_tile.h says which shapes);
  // Plan/LaunchNormForward return cudaErrorNotSupported for any other shape.
  bool mxfp8 = false;
  uint8_t* rowwise_e8m0 = nullptr;     // [rows, cols / 32], with rowwise
  uint8_t* columnwise_e8m0 = nullptr;  // [cols, rows / 32], with columnwise (rows % 32 == 0)
  NormForwardKernel kernel = NormForwardKernel::kAuto;
  // Optional: 16 bytes of device memory, 8-byte aligned, zeroed once by the caller and then
  // left to the kernels, used by one stream at a time (launches of several streams that may
  // overlap each need their own). With it the stats-warp and one-CTA-per-row kernels zero
  // amax_bits themselves (the first CTA to start does, the others wait for it before adding
  // to the word: kernels/cuda/amax_sync.cuh) instead of a reset kernel launched in front,
  // which costs ~0.5-1 us on a 150 us launch and ~2 us on a few rows; the other kernels
  // ignore it. Must stay zero-initialized or as the last launch left it; never shared by
  // launches that may overlap (a broken workspace fails the launch, cudaErrorLaunchFailure,
  // after about a second). Rejected (cudaErrorInvalidValue) when not 8-byte aligned or overlapping
  // amax_bits.
  uint32_t* amax_sync = nullptr;
};

// How LaunchNormForward splits the work (for tests and benchmarks).
struct NormForwardPlan {
  int rows_per_cta = 0;     // rows of one tile
  int cols_per_cta = 0;     // columns of one tile (a slice of the row)
  int slices = 0;           // tiles across a row
  int cluster_size = 0;     // CTAs sharing row statistics through distributed shared memory
  bool separate_stats = false;  // statistics by a separate kernel (rows too long for a cluster)
  bool register_tile = false;   // normalization_register_tile.cu's kernel (else the shared-
                                // memory tile kernel)
  bool stats_warp = false;      // normalization_stats_warp.cu's kernel (register_tile is set too:
                                // same tile geometry, plus one stats warp per CTA)
  bool contiguous_row_groups = false;  // each cluster takes one block of consecutive 32-row
                                       // groups (else groups y, y + clusters, ...)
  bool paired_row_groups = false;  // stats-warp kernel, per-tensor columnwise codes and no y:
                                   // groups taken in adjacent pairs, whose columnwise codes
                                   // are stored as 64-byte runs
  bool quad_row_groups = false;  // paired, and two adjacent pairs per cluster first
                                 // (NormForwardKernel::kStatsWarpQuads)
  bool row_per_cta = false;  // few rows without a columnwise copy (kAuto): one CTA per row at a
                             // time, the stats-warp kernel's merge order, no cluster (a tile of
                             // one row; rows_per_cta 1)
  bool amax_zeroed_in_kernel = false;  // the kernel zeroes amax_bits itself (amax_sync, or the
                                       // one-CTA-per-row kernel as one cluster); else a reset
                                       // runs in front of it
  int ctas = 0;             // CTAs launched (persistent: each loops over row groups)
  int ctas_per_sm = 0;      // resident CTAs per SM the grid was sized with
  int usable_sms = 0;       // SMs - sm_margin
  int shared_bytes = 0;     // dynamic shared memory per CTA
};

cudaError_t PlanNormForward(const NormForwardParams& params, NormForwardPlan* plan);
cudaError_t LaunchNormForward(const NormForwardParams& params, cudaStream_t stream);

struct NormBackwardParams {
  bool rms = false;
  const void* dy = nullptr;      // [rows, cols]
  const void* x = nullptr;       // [rows, cols], same type as dy
  NormDType type = NormDType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* mu = nullptr;     // [rows], LayerNorm only
  const float* rsigma = nullptr; // [rows]
  const float* gamma = nullptr;  // [cols]
  bool zero_centered_gamma = false;
  void* dx = nullptr;            // [rows, cols], same type as x
  float* dgamma = nullptr;       // [cols]
  float* dbeta = nullptr;        // [cols], LayerNorm only
  // Per-CTA partial sums of dgamma (and dbeta), reduced by a second kernel (two-stage,
  // deterministic for a given grid). NormBackwardWorkspaceFloats says how many floats.
  float* workspace = nullptr;
  int sm_margin = 0;
};

struct NormBackwardPlan {
  bool register_resident = false;  // row held in registers (else streamed twice from memory)
  int threads = 0;
  int vectors_per_thread = 0;
  int ctas = 0;
  int ctas_per_sm = 0;
  int usable_sms = 0;
};

cudaError_t PlanNormBackward(const NormBackwardParams& params, NormBackwardPlan* plan);
// Floats of workspace LaunchNormBackward needs for `params` (grid-dependent).
cudaError_t NormBackwardWorkspaceFloats(const NormBackwardParams& params, int64_t* floats);
cudaError_t LaunchNormBackward(const NormBackwardParams& params, cudaStream_t stream);

// Test hook: for every FP32 bit pattern in [first, first + count), compares the
// kHardware encoder with the codec for `format`; counts mismatches into *mismatches
// (device uint64, accumulated, not zeroed) and records the smallest mismatching pattern
// in *first_mismatch (device uint32, min-accumulated).
cudaError_t LaunchCompareFp8Encoders(Fp8Format format, uint64_t first, uint64_t count,
                                     unsigned long long* mismatches, uint32_t* first_mismatch,
                                     cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_KERNELS_H_
