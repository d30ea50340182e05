// CUDA backward kernels for the activations of kernels/activation.h (dx with the optional
// fused dbias); forward: activation_kernels.cu, shared helpers: activation_common.cuh.
//
// - A 256-thread block owns 128 output columns (32 threads x 4 columns) of a
//   chunk of rows (8 row lanes, 4 rows in flight per lane); dx = dy * f'(x) (gated: da,
//   db). With dbias each thread keeps FP32 column sums, the block adds its 8 row lanes
//   in shared memory and writes one partial row per chunk; a second kernel adds the
//   chunks in order. The chunk count depends on the shape only, so dbias is deterministic.
// - BF16 / FP16 with K % 8 == 0 and 16-byte aligned pointers take the wide kernel: 8
//   columns per thread (16-byte loads kept packed), 256 per block.
// - Vectorized access when K % 4 == 0 and the pointers are aligned; otherwise the same
//   kernel runs bounds-checked scalar accesses.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/activation_math.h"
#include "kernels/cuda/activation/activation_kernels.h"
#include "kernels/cuda/activation/activation_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// Backward tiling.
constexpr int kBackwardThreads = 256;
constexpr int kBackwardAcross = 32;                                 // threads across
constexpr int kBackwardCols = kBackwardAcross * kVec;               // 128 output columns
constexpr int kRowLanes = kBackwardThreads / kBackwardAcross;       // 8
constexpr int kRowsInFlight = 4;                                    // rows per lane per step
constexpr int kRowsPerStep = kRowLanes * kRowsInFlight;             // 32
constexpr int kTargetBackwardBlocks = 1056;                         // ~8 per SM on 132 SMs
constexpr int kReduceThreads = 256;
// Resident blocks per SM the compiler must allow (registers <= 65536 / (256 x blocks)).
// The kernels are bound by loads in flight (kRowsInFlight rows per thread), so occupancy
// is their speed: every kind on 16-bit x fits 3 blocks (71-80 registers), FP32 x 2
// (76-105), without spilling; 4 blocks (64 registers) spill. Left to itself ptxas gave
// the GELU one 124 registers (2 blocks), about a third slower than at 72 registers, and the
// gated ones 122-168.
template <ActDType kType>
constexpr int kBackwardMinBlocks = kType == ActDType::kFloat32 ? 2 : 3;

// ---------------------------------------------------------------------------------------
// Backward.

template <typename Op>
struct BackwardArgs {
  ActivationBackwardParams p;
  Op op;
  act::GateClamp clamp;
  bool vectorized;
  int64_t rows_per_chunk;  // multiple of kRowsPerStep
};

// The dbias epilogue of the backward kernels: each thread's column sums over its rows
// (sum_a; sum_b for the gate half) go to shared memory, the block adds its 8 row lanes in
// order and writes its row of the chunk workspace (chunk blockIdx.y). A block covers
// kBackwardAcross * kThreadCols columns from col0, this thread's from col0 + tc.
template <int kThreadCols, bool kGated>
__device__ __forceinline__ void WriteChunkSums(const ActivationBackwardParams& p, int64_t col0, int lane_down, int tc,
                                               const float (&sum_a)[kThreadCols],
                                               const float (&sum_b)[kThreadCols]) {
  constexpr int kBlockCols = kBackwardAcross * kThreadCols;
  constexpr int kHalves = kGated ? 2 : 1;
  const int64_t cols = p.cols;
  const int64_t in_cols = kHalves * cols;
  __shared__ float partial[kRowLanes][kHalves * kBlockCols];
#pragma unroll
  for (int k = 0; k < kThreadCols; ++k) {
    partial[lane_down][tc + k] = sum_a[k];
    if (kGated) partial[lane_down][kBlockCols + tc + k] = sum_b[k];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kHalves * kBlockCols; i += kBackwardThreads) {
    const int half = i / kBlockCols;
    const int64_t col = col0 + i % kBlockCols;
    if (col >= cols) continue;
    float s = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) s += partial[lane][i];
    p.workspace[static_cast<int64_t>(blockIdx.y) * in_cols + half * cols + col] = s;
  }
}

template <typename Op, bool kGated, ActDType kType>
__global__ void __launch_bounds__(kBackwardThreads, kBackwardMinBlocks<kType>)
    ActivationBackwardKernel(const BackwardArgs<Op> args) {
  const ActivationBackwardParams& p = args.p;
  const int64_t rows = p.rows;
  const int64_t cols = p.cols;
  const int64_t in_cols = kGated ? 2 * cols : cols;
  const int lane_across = threadIdx.x % kBackwardAcross;
  const int lane_down = threadIdx.x / kBackwardAcross;
  const int tc = lane_across * kVec;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBackwardCols;
  const int64_t c = col0 + tc;
  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.y) * args.rows_per_chunk;
  const int64_t chunk_end = chunk_begin + args.rows_per_chunk < rows ? chunk_begin + args.rows_per_chunk : rows;

  float sum_a[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
  float sum_b[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t step = chunk_begin; step < chunk_end; step += kRowsPerStep) {
    float g[kRowsInFlight][kVec];
    float a[kRowsInFlight][kVec];
    float b[kRowsInFlight][kVec];
    bool valid[kRowsInFlight][kVec];
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int64_t r = step + i * kRowLanes + lane_down;
#pragma unroll
      for (int k = 0; k < kVec; ++k) valid[i][k] = r < chunk_end && c + k < cols;
      LoadValues<kType>(p.dy, r * cols + c, valid[i], args.vectorized, g[i]);
      LoadValues<kType>(p.x, r * in_cols + c, valid[i], args.vectorized, a[i]);
      if (kGated) LoadValues<kType>(p.x, r * in_cols + cols + c, valid[i], args.vectorized, b[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int64_t r = step + i * kRowLanes + lane_down;
      float da[kVec];
      float db[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (kGated) {
          const float a_in = args.clamp.ActIn(a[i][k]);
          const float linear = args.clamp.LinearIn(b[i][k]) + args.clamp.offset;
          da[k] = g[i][k] * args.op.Grad(a_in) * args.clamp.ActInGrad(a[i][k]) * linear;
          db[k] = g[i][k] * args.op.Value(a_in) * args.clamp.LinearInGrad(b[i][k]);
        } else {
          da[k] = g[i][k] * args.op.Grad(a[i][k]);
          db[k] = 0.0f;
        }
        if (valid[i][k]) {
          sum_a[k] += da[k];
          sum_b[k] += db[k];
        }
      }
      StoreValues(p.dx, kType, r * in_cols + c, da, valid[i], args.vectorized);
      if (kGated) StoreValues(p.dx, kType, r * in_cols + cols + c, db, valid[i], args.vectorized);
    }
  }

  if (p.dbias == nullptr) return;  // uniform across the grid
  WriteChunkSums<kVec, kGated>(p, col0, lane_down, tc, sum_a, sum_b);
}

// The wide variant: 16-bit types with cols % 8 == 0 and 16-byte aligned dy / x / dx. A
// thread owns 8 columns (one 16-byte load of dy, of a and for gated kinds of b per row,
// kept packed until used, so kWideInFlight rows fit the 3-blocks-per-SM register budget
// with more bytes in flight than the 4-column kernel), a block 256 columns. Same
// arithmetic and the same dbias structure (a thread's rows in order, then the 8 row lanes,
// then the chunks in order: deterministic); 16-bit dx through the pair conversions for
// runs of 8 without NaN.
constexpr int kWideVec = 8;
constexpr int kWideCols = kBackwardAcross * kWideVec;  // 256

// 16-bit codes of the 8 values (pair conversions unless one of them is NaN).
template <ActDType kType>
__device__ __forceinline__ void StoreWide16(uint16_t* p, const float (&v)[kWideVec]) {
  bool nan = false;
#pragma unroll
  for (int e = 0; e < kWideVec; ++e) nan |= v[e] != v[e];
  uint32_t w[4];
  Pack8x16(kType, v, !nan, w);
  StoreGlobal16(p, w[0], w[1], w[2], w[3]);
}

// Value e of 8 packed 16-bit values.
template <ActDType kType>
__device__ __forceinline__ float WideValue(const uint4& v, int e) {
  const uint32_t word = e / 2 == 0 ? v.x : (e / 2 == 1 ? v.y : (e / 2 == 2 ? v.z : v.w));
  return Elem<kType>::Widen(static_cast<uint16_t>((word >> (16 * (e % 2))) & 0xFFFFu));
}

// Rows in flight per thread: 4 element-wise (dy, x), 3 gated (dy, a, b: 144 bytes, 1.5x the
// 4-column kernel's), within 80 registers. A thread's rows are still visited in order, so
// the dbias sums are those of the 4-column kernel.
template <bool kGated>
constexpr int kWideInFlight = kGated ? 3 : 4;

template <typename Op, bool kGated, ActDType kType>
__global__ void __launch_bounds__(kBackwardThreads, 3) ActivationBackwardWideKernel(const BackwardArgs<Op> args) {
  static_assert(kType != ActDType::kFloat32, "16-bit types only");
  constexpr int kInFlight = kWideInFlight<kGated>;
  const ActivationBackwardParams& p = args.p;
  const int64_t cols = p.cols;
  const int64_t in_cols = kGated ? 2 * cols : cols;
  const int lane_across = threadIdx.x % kBackwardAcross;
  const int lane_down = threadIdx.x / kBackwardAcross;
  const int tc = lane_across * kWideVec;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kWideCols;
  const int64_t c = col0 + tc;
  const bool col_valid = c < cols;  // cols % 8 == 0: all 8 columns or none
  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.y) * args.rows_per_chunk;
  const int64_t chunk_end =
      chunk_begin + args.rows_per_chunk < p.rows ? chunk_begin + args.rows_per_chunk : p.rows;
  const uint16_t* dy = static_cast<const uint16_t*>(p.dy);
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  uint16_t* dx = static_cast<uint16_t*>(p.dx);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

  float sum_a[kWideVec], sum_b[kWideVec];
#pragma unroll
  for (int e = 0; e < kWideVec; ++e) sum_a[e] = sum_b[e] = 0.0f;
  for (int64_t step = chunk_begin; step < chunk_end; step += kInFlight * kRowLanes) {
    uint4 g[kInFlight], a[kInFlight], b[kInFlight];
    bool valid[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int64_t r = step + i * kRowLanes + lane_down;
      valid[i] = col_valid && r < chunk_end;
      g[i] = valid[i] ? *reinterpret_cast<const uint4*>(dy + r * cols + c) : zero;
      a[i] = valid[i] ? *reinterpret_cast<const uint4*>(x + r * in_cols + c) : zero;
      if (kGated) b[i] = valid[i] ? *reinterpret_cast<const uint4*>(x + r * in_cols + cols + c) : zero;
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      float da[kWideVec], db[kWideVec];
#pragma unroll
      for (int e = 0; e < kWideVec; ++e) {
        const float gv = WideValue<kType>(g[i], e);
        const float av = WideValue<kType>(a[i], e);
        if (kGated) {
          const float bv = WideValue<kType>(b[i], e);
          const float a_in = args.clamp.ActIn(av);
          const float linear = args.clamp.LinearIn(bv) + args.clamp.offset;
          da[e] = gv * args.op.Grad(a_in) * args.clamp.ActInGrad(av) * linear;
          db[e] = gv * args.op.Value(a_in) * args.clamp.LinearInGrad(bv);
        } else {
          da[e] = gv * args.op.Grad(av);
          db[e] = 0.0f;
        }
        if (valid[i]) {
          sum_a[e] += da[e];
          sum_b[e] += db[e];
        }
      }
      if (!valid[i]) continue;
      const int64_t r = step + i * kRowLanes + lane_down;
      StoreWide16<kType>(dx + r * in_cols + c, da);
      if (kGated) StoreWide16<kType>(dx + r * in_cols + cols + c, db);
    }
  }

  if (p.dbias == nullptr) return;  // uniform across the grid
  WriteChunkSums<kWideVec, kGated>(p, col0, lane_down, tc, sum_a, sum_b);
}

// dbias[j] = sum over chunks (in order) of workspace[chunk, j].
__global__ void __launch_bounds__(kReduceThreads)
    ReduceChunksKernel(const float* workspace, int64_t chunks, int64_t width, float* dbias) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < width; j += stride) {
    float s = 0.0f;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) s += workspace[chunk * width + j];
    dbias[j] = s;
  }
}

// ---------------------------------------------------------------------------------------
// Launch helpers.

template <typename Op, bool kGated, ActDType kType>
cudaError_t LaunchBackwardTyped(const BackwardArgs<Op>& args, dim3 grid, cudaStream_t stream) {
  ActivationBackwardKernel<Op, kGated, kType><<<grid, kBackwardThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template <typename Op, bool kGated>
cudaError_t LaunchBackwardGated(const BackwardArgs<Op>& args, dim3 grid, cudaStream_t stream) {
  switch (args.p.type) {
    case ActDType::kFloat32: return LaunchBackwardTyped<Op, kGated, ActDType::kFloat32>(args, grid, stream);
    case ActDType::kFloat16: return LaunchBackwardTyped<Op, kGated, ActDType::kFloat16>(args, grid, stream);
    case ActDType::kBFloat16: return LaunchBackwardTyped<Op, kGated, ActDType::kBFloat16>(args, grid, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename Op, bool kGated>
cudaError_t LaunchBackwardWide(const BackwardArgs<Op>& args, dim3 grid, cudaStream_t stream) {
  if (args.p.type == ActDType::kBFloat16) {
    ActivationBackwardWideKernel<Op, kGated, ActDType::kBFloat16><<<grid, kBackwardThreads, 0, stream>>>(args);
  } else {
    ActivationBackwardWideKernel<Op, kGated, ActDType::kFloat16><<<grid, kBackwardThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

// Row chunks of the backward grid: about kTargetBackwardBlocks blocks in all, each chunk
// a multiple of kRowsPerStep rows. Depends on the shape only.
struct BackwardPlan {
  int64_t col_tiles = 0;
  int64_t rows_per_chunk = kRowsPerStep;
  int64_t chunks = 0;
};

// The wide kernel's kinds and shapes (pointer alignment aside: the chunk plan, and so the
// workspace size, must not depend on the pointers; misaligned ones take the 4-column
// kernel with the same chunks).
bool WideShape(const ActivationBackwardParams& p) {
  return p.type != ActDType::kFloat32 && p.cols % kWideVec == 0;
}

BackwardPlan PlanBackward(int64_t rows, int64_t cols, int64_t block_cols) {
  BackwardPlan plan;
  plan.col_tiles = (cols + block_cols - 1) / block_cols;
  if (rows == 0 || cols == 0) return plan;
  const int64_t steps = (rows + kRowsPerStep - 1) / kRowsPerStep;
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(steps, kTargetBackwardBlocks / plan.col_tiles));
  const int64_t steps_per_chunk = (steps + wanted - 1) / wanted;
  plan.rows_per_chunk = steps_per_chunk * kRowsPerStep;
  plan.chunks = (rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  return plan;
}

}  // namespace

int64_t ActivationBackwardWorkspaceFloats(const ActivationBackwardParams& p) {
  if (p.dbias == nullptr) return 0;
  const BackwardPlan plan = PlanBackward(p.rows, p.cols, WideShape(p) ? kWideCols : kBackwardCols);
  return plan.chunks * (p.act.gated ? 2 * p.cols : p.cols);
}

cudaError_t LaunchActivationBackward(const ActivationBackwardParams& p, cudaStream_t stream) {
  const bool wide_shape = WideShape(p);
  const BackwardPlan plan = PlanBackward(p.rows, p.cols, wide_shape ? kWideCols : kBackwardCols);
  const int64_t in_cols = p.act.gated ? 2 * p.cols : p.cols;
  if (plan.chunks > 0) {
    if (plan.col_tiles > INT32_MAX || plan.chunks > 65535) return cudaErrorInvalidConfiguration;
    const size_t bytes = ElementBytes(p.type);
    const bool vectorized = p.cols % kVec == 0 && IsAligned(p.dy, bytes * kVec) && IsAligned(p.x, bytes * kVec) &&
                            IsAligned(p.dx, bytes * kVec);
    const bool wide = wide_shape && IsAligned(p.dy, 16) && IsAligned(p.x, 16) && IsAligned(p.dx, 16);
    const int64_t col_tiles = wide ? plan.col_tiles : (p.cols + kBackwardCols - 1) / kBackwardCols;
    if (col_tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
    const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(plan.chunks));
    const act::GateClamp clamp = ClampOf(p.act);
    const cudaError_t status = WithOp(p.act, [&](const auto& op) -> cudaError_t {
      using Op = std::decay_t<decltype(op)>;
      BackwardArgs<Op> args{p, op, clamp, vectorized, plan.rows_per_chunk};
      if (wide) {
        return p.act.gated ? LaunchBackwardWide<Op, true>(args, grid, stream)
                           : LaunchBackwardWide<Op, false>(args, grid, stream);
      }
      return p.act.gated ? LaunchBackwardGated<Op, true>(args, grid, stream)
                         : LaunchBackwardGated<Op, false>(args, grid, stream);
    });
    if (status != cudaSuccess) return status;
  }
  if (p.dbias == nullptr || in_cols == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((in_cols + kReduceThreads - 1) / kReduceThreads, 4096);
  ReduceChunksKernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(p.workspace, plan.chunks, in_cols,
                                                                                   p.dbias);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
