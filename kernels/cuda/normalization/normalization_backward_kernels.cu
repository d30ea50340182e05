// CUDA LayerNorm / RMSNorm (contract: kernels/normalization.h; launchers:
// normalization_kernels.h).
//
// Backward: one CTA per row (persistent over rows). When the row fits in registers
// (16-byte vectors, up to 8 per thread) it is read once: the two row reductions
// (sum(dy w), sum(dy w xhat)) are block reductions in a fixed order, then dx is written.
// dgamma / dbeta partials accumulate in registers per CTA over its rows, are written
// once to a workspace [ctas, h], and a second kernel sums the ctas in a fixed order
// (two-stage, deterministic for a given grid). Other shapes use a streaming variant
// (two reads of the row; partials accumulate in the CTA's own workspace row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/cuda/normalization/normalization_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kMaxBackwardIters = 8;    // 16-byte vectors per thread in the backward kernel

// ---------------------------------------------------------------------------------------
// Backward kernels.

// One row per iteration, held in registers: kIters 16-byte vectors of dy and of x per
// thread. Partials: workspace[blockIdx.x, :] = dgamma part, workspace[gridDim.x +
// blockIdx.x, :] = dbeta part (LayerNorm).
template <NormDType kType, int kIters, bool kRms>
__global__ void __launch_bounds__(kThreads, kIters >= 8 ? 1 : 2)
    NormBackwardRowKernel(NormBackwardParams p) {
  using Storage = typename Elem<kType>::Storage;
  constexpr int kVec = 16 / sizeof(Storage);
  const int64_t nvec = p.cols / kVec;
  __shared__ float warp_sums[2][kWarps][2];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  float dgamma[kIters][kVec];
  float dbeta[kRms ? 1 : kIters][kVec];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      dgamma[k][e] = 0.0f;
      if (!kRms) dbeta[kRms ? 0 : k][e] = 0.0f;
    }
  }
  const float w_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  int parity = 0;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const uint4* dy_row = reinterpret_cast<const uint4*>(static_cast<const Storage*>(p.dy) + row * p.cols);
    const uint4* x_row = reinterpret_cast<const uint4*>(static_cast<const Storage*>(p.x) + row * p.cols);
    uint4 dy_v[kIters];
    uint4 x_v[kIters];
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v < nvec) {
        dy_v[k] = __ldcs(dy_row + v);
        x_v[k] = __ldcs(x_row + v);
      }
    }
    const float mean = kRms ? 0.0f : p.mu[row];
    const float rsigma = p.rsigma[row];
    float sum_dyw = 0.0f;
    float sum_dyw_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v >= nvec) continue;
      float dy[kVec], x[kVec], w[kVec];
      Unpack16<kType>(dy_v[k], dy);
      Unpack16<kType>(x_v[k], x);
      const float4* g4 = reinterpret_cast<const float4*>(p.gamma + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const float4 gv = __ldg(g4 + j);
        w[4 * j] = gv.x;
        w[4 * j + 1] = gv.y;
        w[4 * j + 2] = gv.z;
        w[4 * j + 3] = gv.w;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float xhat = (x[e] - mean) * rsigma;
        const float dyw = dy[e] * (w[e] + w_shift);
        sum_dyw += dyw;
        sum_dyw_xhat = fmaf(dyw, xhat, sum_dyw_xhat);
        dgamma[k][e] = fmaf(dy[e], xhat, dgamma[k][e]);
        if (!kRms) dbeta[kRms ? 0 : k][e] += dy[e];
      }
    }
    sum_dyw = WarpSum(sum_dyw);
    sum_dyw_xhat = WarpSum(sum_dyw_xhat);
    if (lane == 0) {
      warp_sums[parity][warp][0] = sum_dyw;
      warp_sums[parity][warp][1] = sum_dyw_xhat;
    }
    __syncthreads();
    float total_dyw = 0.0f;
    float total_dyw_xhat = 0.0f;
    for (int i = 0; i < kWarps; ++i) {
      total_dyw += warp_sums[parity][i][0];
      total_dyw_xhat += warp_sums[parity][i][1];
    }
    parity ^= 1;
    const float mean_dyw = kRms ? 0.0f : total_dyw * inv_cols;
    const float mean_dyw_xhat = total_dyw_xhat * inv_cols;

    uint4* dx_row = reinterpret_cast<uint4*>(static_cast<Storage*>(p.dx) + row * p.cols);
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v >= nvec) continue;
      float dy[kVec], x[kVec], dx[kVec];
      Unpack16<kType>(dy_v[k], dy);
      Unpack16<kType>(x_v[k], x);
      const float4* g4 = reinterpret_cast<const float4*>(p.gamma + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const float4 gv = __ldg(g4 + j);
        const float w[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = 4 * j + i;
          const float xhat = (x[e] - mean) * rsigma;
          const float dyw = dy[e] * (w[i] + w_shift);
          dx[e] = rsigma * (dyw - mean_dyw - xhat * mean_dyw_xhat);
        }
      }
      uint4 out;
      if constexpr (kType == NormDType::kFloat32) {
        out = make_uint4(__float_as_uint(dx[0]), __float_as_uint(dx[1]), __float_as_uint(dx[2]),
                         __float_as_uint(dx[3]));
      } else {
        uint32_t words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          words[i] = FloatTo16<kType>(dx[2 * i]) |
                     (static_cast<uint32_t>(FloatTo16<kType>(dx[2 * i + 1])) << 16);
        }
        out = make_uint4(words[0], words[1], words[2], words[3]);
      }
      __stcs(dx_row + v, out);
    }
  }

  // Partials of this CTA (zeros if it had no rows).
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (v >= nvec) continue;
    float4* dg = reinterpret_cast<float4*>(p.workspace + blockIdx.x * p.cols + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j) {
      dg[j] = make_float4(dgamma[k][4 * j], dgamma[k][4 * j + 1], dgamma[k][4 * j + 2],
                          dgamma[k][4 * j + 3]);
    }
    if (!kRms) {
      float4* db = reinterpret_cast<float4*>(p.workspace + (gridDim.x + blockIdx.x) * p.cols + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const int kk = kRms ? 0 : k;
        db[j] = make_float4(dbeta[kk][4 * j], dbeta[kk][4 * j + 1], dbeta[kk][4 * j + 2],
                            dbeta[kk][4 * j + 3]);
      }
    }
  }
}

// Any shape: two passes over the row in memory; partials accumulate in the CTA's own
// (zeroed) workspace rows, each column always touched by the same thread.
template <NormDType kType>
__global__ void __launch_bounds__(kThreads) NormBackwardStreamKernel(NormBackwardParams p) {
  using Storage = typename Elem<kType>::Storage;
  __shared__ float warp_sums[2][kWarps][2];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  const float w_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  float* dgamma = p.workspace + blockIdx.x * p.cols;
  float* dbeta = p.workspace + (gridDim.x + blockIdx.x) * p.cols;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const Storage* dy = static_cast<const Storage*>(p.dy) + row * p.cols;
    const Storage* x = static_cast<const Storage*>(p.x) + row * p.cols;
    const float mean = p.rms ? 0.0f : p.mu[row];
    const float rsigma = p.rsigma[row];
    float sum_dyw = 0.0f;
    float sum_dyw_xhat = 0.0f;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float d = Elem<kType>::ToFloat(dy[c]);
      const float xhat = (Elem<kType>::ToFloat(x[c]) - mean) * rsigma;
      const float dyw = d * (p.gamma[c] + w_shift);
      sum_dyw += dyw;
      sum_dyw_xhat = fmaf(dyw, xhat, sum_dyw_xhat);
      dgamma[c] = fmaf(d, xhat, dgamma[c]);
      if (!p.rms) dbeta[c] += d;
    }
    sum_dyw = WarpSum(sum_dyw);
    sum_dyw_xhat = WarpSum(sum_dyw_xhat);
    if (lane == 0) {
      warp_sums[parity][warp][0] = sum_dyw;
      warp_sums[parity][warp][1] = sum_dyw_xhat;
    }
    __syncthreads();
    float total_dyw = 0.0f;
    float total_dyw_xhat = 0.0f;
    for (int i = 0; i < kWarps; ++i) {
      total_dyw += warp_sums[parity][i][0];
      total_dyw_xhat += warp_sums[parity][i][1];
    }
    parity ^= 1;
    const float mean_dyw = p.rms ? 0.0f : total_dyw * inv_cols;
    const float mean_dyw_xhat = total_dyw_xhat * inv_cols;
    Storage* dx = static_cast<Storage*>(p.dx) + row * p.cols;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float xhat = (Elem<kType>::ToFloat(x[c]) - mean) * rsigma;
      const float dyw = Elem<kType>::ToFloat(dy[c]) * (p.gamma[c] + w_shift);
      const float v = rsigma * (dyw - mean_dyw - xhat * mean_dyw_xhat);
      if constexpr (kType == NormDType::kFloat32) {
        dx[c] = v;
      } else {
        dx[c] = FloatTo16<kType>(v);
      }
    }
  }
}

// out[c] = sum over parts b (in order of b, 8 strided lanes then a fixed 8-way sum) of
// partials[b, c]. Block (32, 8); blockIdx.y selects dgamma (0) or dbeta (1).
constexpr int kSumLanes = 8;

__global__ void __launch_bounds__(32 * kSumLanes)
    ColumnSumKernel(const float* workspace, int parts, int64_t cols, float* dgamma, float* dbeta) {
  __shared__ float sums[kSumLanes][33];
  const float* partials = workspace + static_cast<int64_t>(blockIdx.y) * parts * cols;
  float* out = blockIdx.y == 0 ? dgamma : dbeta;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    int b = threadIdx.y;
    for (; b + 3 * kSumLanes < parts; b += 4 * kSumLanes) {
      const float a0 = partials[b * cols + c];
      const float a1 = partials[(b + kSumLanes) * cols + c];
      const float a2 = partials[(b + 2 * kSumLanes) * cols + c];
      const float a3 = partials[(b + 3 * kSumLanes) * cols + c];
      s += ((a0 + a1) + (a2 + a3));
    }
    for (; b < parts; b += kSumLanes) s += partials[b * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int i = 0; i < kSumLanes; ++i) total += sums[i][threadIdx.x];
    out[c] = total;
  }
}

// ---------------------------------------------------------------------------------------
// Encoder comparison (test hook).

template <Fp8Format kFormat>
__global__ void CompareEncodersKernel(uint64_t first, uint64_t count,
                                      unsigned long long* mismatches, uint32_t* first_mismatch) {
  unsigned long long local = 0;
  uint32_t smallest = 0xFFFFFFFFu;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const uint32_t bits = static_cast<uint32_t>(first + i);
    // Each pattern in the low byte, and its negation in the high byte.
    const float a = __uint_as_float(bits);
    const float b = __uint_as_float(bits ^ 0x80000000u);
    const uint32_t hw = Encode2<kFormat, Fp8Encoder::kHardware>(a, b);
    const uint32_t codec = Encode2<kFormat, Fp8Encoder::kCodec>(a, b);
    if (hw != codec) {
      ++local;
      smallest = min(smallest, bits);
    }
  }
  if (local != 0) {
    atomicAdd(mismatches, local);
    atomicMin(first_mismatch, smallest);
  }
}

// Backward.

struct BackwardChoice {
  bool register_resident = false;
  int iters = 0;
};

BackwardChoice ChooseBackward(const NormBackwardParams& p) {
  const int bytes = BytesOf(p.type);
  const int vec = 16 / bytes;
  BackwardChoice choice;
  const bool aligned = (p.cols * bytes) % 16 == 0 && IsAligned(p.dy, 16) && IsAligned(p.x, 16) &&
                       IsAligned(p.dx, 16) && IsAligned(p.gamma, 16);
  if (!aligned) return choice;
  const int64_t nvec = p.cols / vec;
  for (int iters = 1; iters <= kMaxBackwardIters; iters *= 2) {
    if (nvec <= static_cast<int64_t>(kThreads) * iters) {
      choice.register_resident = true;
      choice.iters = iters;
      return choice;
    }
  }
  return choice;
}

template <NormDType kType, int kIters>
const void* RowKernelFor(bool rms) {
  return rms ? reinterpret_cast<const void*>(NormBackwardRowKernel<kType, kIters, true>)
             : reinterpret_cast<const void*>(NormBackwardRowKernel<kType, kIters, false>);
}

template <NormDType kType>
const void* BackwardKernelFor(const NormBackwardParams& p, const BackwardChoice& choice) {
  if (!choice.register_resident) return reinterpret_cast<const void*>(NormBackwardStreamKernel<kType>);
  switch (choice.iters) {
    case 1: return RowKernelFor<kType, 1>(p.rms);
    case 2: return RowKernelFor<kType, 2>(p.rms);
    case 4: return RowKernelFor<kType, 4>(p.rms);
    default: return RowKernelFor<kType, 8>(p.rms);
  }
}

const void* BackwardKernel(const NormBackwardParams& p, const BackwardChoice& choice) {
  switch (p.type) {
    case NormDType::kFloat32: return BackwardKernelFor<NormDType::kFloat32>(p, choice);
    case NormDType::kFloat16: return BackwardKernelFor<NormDType::kFloat16>(p, choice);
    case NormDType::kBFloat16: return BackwardKernelFor<NormDType::kBFloat16>(p, choice);
  }
  return nullptr;
}

cudaError_t PlanBackward(const NormBackwardParams& p, NormBackwardPlan* plan, const void** kernel) {
  if (p.cols <= 0 || p.rows < 0) return cudaErrorInvalidValue;
  DeviceLimits limits;
  cudaError_t status = GetDeviceLimits(&limits);
  if (status != cudaSuccess) return status;
  if (p.sm_margin < 0 || p.sm_margin >= limits.sms) return cudaErrorInvalidValue;
  const BackwardChoice choice = ChooseBackward(p);
  *kernel = BackwardKernel(p, choice);
  int ctas_per_sm = 0;
  status = ResidentCtasPerSm(*kernel, 0, &ctas_per_sm);
  if (status != cudaSuccess) return status;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  plan->register_resident = choice.register_resident;
  plan->threads = kThreads;
  plan->vectors_per_thread = choice.iters;
  plan->usable_sms = limits.sms - p.sm_margin;
  plan->ctas_per_sm = ctas_per_sm;
  plan->ctas = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(p.rows, static_cast<int64_t>(plan->usable_sms) * ctas_per_sm)));
  return cudaSuccess;
}

template <Fp8Format kFormat>
cudaError_t LaunchCompare(uint64_t first, uint64_t count, unsigned long long* mismatches,
                          uint32_t* first_mismatch, cudaStream_t stream) {
  const int blocks = 132 * 8;
  CompareEncodersKernel<kFormat><<<blocks, kThreads, 0, stream>>>(first, count, mismatches, first_mismatch);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PlanNormBackward(const NormBackwardParams& params, NormBackwardPlan* plan) {
  const void* kernel = nullptr;
  return PlanBackward(params, plan, &kernel);
}

cudaError_t NormBackwardWorkspaceFloats(const NormBackwardParams& params, int64_t* floats) {
  NormBackwardPlan plan;
  const void* kernel = nullptr;
  const cudaError_t status = PlanBackward(params, &plan, &kernel);
  if (status != cudaSuccess) return status;
  *floats = static_cast<int64_t>(plan.ctas) * params.cols * (params.rms ? 1 : 2);
  return cudaSuccess;
}

cudaError_t LaunchNormBackward(const NormBackwardParams& p, cudaStream_t stream) {
  NormBackwardPlan plan;
  const void* kernel = nullptr;
  cudaError_t status = PlanBackward(p, &plan, &kernel);
  if (status != cudaSuccess) return status;
  const int parts_per_output = plan.ctas;
  if (p.rows == 0) {
    status = cudaMemsetAsync(p.dgamma, 0, p.cols * sizeof(float), stream);
    if (status == cudaSuccess && !p.rms) {
      status = cudaMemsetAsync(p.dbeta, 0, p.cols * sizeof(float), stream);
    }
    return status;
  }
  if (!plan.register_resident) {
    status = cudaMemsetAsync(p.workspace, 0,
                             static_cast<size_t>(plan.ctas) * p.cols * (p.rms ? 1 : 2) * sizeof(float),
                             stream);
    if (status != cudaSuccess) return status;
  }
  NormBackwardParams args = p;
  void* kernel_args[] = {&args};
  status = cudaLaunchKernel(kernel, dim3(plan.ctas), dim3(kThreads), kernel_args, 0, stream);
  if (status != cudaSuccess) return status;
  status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const dim3 sum_grid(static_cast<unsigned>(CeilDiv(p.cols, 32)), p.rms ? 1 : 2, 1);
  ColumnSumKernel<<<sum_grid, dim3(32, kSumLanes), 0, stream>>>(p.workspace, parts_per_output,
                                                                 p.cols, p.dgamma, p.dbeta);
  return cudaGetLastError();
}

cudaError_t LaunchCompareFp8Encoders(Fp8Format format, uint64_t first, uint64_t count,
                                     unsigned long long* mismatches, uint32_t* first_mismatch,
                                     cudaStream_t stream) {
  return format == Fp8Format::kE4M3
             ? LaunchCompare<Fp8Format::kE4M3>(first, count, mismatches, first_mismatch, stream)
             : LaunchCompare<Fp8Format::kE5M2>(first, count, mismatches, first_mismatch, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
