// Internal to normalization_register_tile.cu and normalization_stats_warp.cu: the tile
// geometry and the helpers both register-tile forward kernels share (cp.async staging of
// the register-tile kernel, per-lane moments and their warp reduction, Chan merges, the
// gamma/beta load, y stores, and the host-side planning and launch). Both kernels run
// exactly this arithmetic in the same order, so they produce the same mu, rsigma, y and
// codes bit for bit.
//
// Included inside namespace teserve::kernels::cuda::{anonymous}, after
// normalization_common.cuh.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_COMMON_CUH_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_COMMON_CUH_

constexpr int kRtRows = 32;          // rows per tile: 4 row groups of 8
constexpr int kRtColsPerWarp = 64;   // 8 column groups of 8
constexpr int kRtMaxWarps = 16;
constexpr int kRtMaxCluster = 8;     // portable cluster size

struct RtGeometry {
  int warps = 0;    // warps per CTA that own columns (64 each)
  int cluster = 0;  // CTAs per cluster (gridDim.x)
  int units = 0;    // cols / 64
  int64_t row_groups = 0;
};

__device__ __forceinline__ int64_t CeilDivDevice(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float MaxNaN(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Chan's merge weights for merging nb values into na (both > 0): (nb / n, na nb / n) with an
// approximate reciprocal of n = na + nb (a few ulp, deterministic: the weights only scale
// the correction terms). A merge chain whose counts are known ahead computes them once and
// applies them with MergeWeighted; MergeMoments does both per merge, with the same bits.
__device__ __forceinline__ float2 MergeWeights(float na, float nb) {
  const float inv_n = __fdividef(1.0f, na + nb);
  return make_float2(nb * inv_n, na * nb * inv_n);
}

template <bool kRms>
__device__ __forceinline__ void MergeWeighted(float& mean_a, float& m2_a, float mean_b, float m2_b, float2 w) {
  if constexpr (kRms) {
    m2_a += m2_b;
  } else {
    const float d = mean_b - mean_a;
    mean_a = fmaf(d, w.x, mean_a);
    m2_a = fmaf(d * d, w.y, m2_a + m2_b);
  }
}

// Chan's merge of (mean_b, m2_b) over nb values into (mean_a, m2_a) over na values
// (either count may be 0). For RMSNorm m2 is a plain sum of squares.
template <bool kRms>
__device__ __forceinline__ void MergeMoments(float& mean_a, float& m2_a, float& na, float mean_b,
                                             float m2_b, float nb) {
  if constexpr (kRms) {
    m2_a += m2_b;
  } else {
    const float n = na + nb;
    if (nb > 0.0f) {
      if (na > 0.0f) {
        MergeWeighted<false>(mean_a, m2_a, mean_b, m2_b, MergeWeights(na, nb));
      } else {
        mean_a = mean_b;
        m2_a = m2_b;
      }
    }
    na = n;
  }
}

// Stages rows row .. row + 7 at columns col .. col + 7 into this thread's slots of a
// staging buffer (16 bytes per row, slot k at stage[k * blockDim.x]); zeros when !valid.
__device__ __forceinline__ void StageBlock(const uint16_t* x, int64_t row, int64_t cols, int64_t col,
                                           bool valid, uint4* stage) {
  const uint16_t* src = valid ? x + row * cols + col : x;
  const uint32_t fill = valid ? 16u : 0u;  // 0: zero-fill
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(stage + k * blockDim.x));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(fill)
                 : "memory");
    if (valid) src += cols;
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// This lane's 8 columns of the weight (+1 with zero_centered_gamma) and bias (0 for
// RMSNorm) from column `col` (a warp with no columns reads column 0 and never uses them).
template <bool kRms>
__device__ __forceinline__ void LoadAffine8(const NormForwardParams& p, int64_t col, float w[8], float b[8]) {
  const float4* gamma4 = reinterpret_cast<const float4*>(p.gamma + col);
  const float4 g0 = __ldg(gamma4), g1 = __ldg(gamma4 + 1);
  w[0] = g0.x, w[1] = g0.y, w[2] = g0.z, w[3] = g0.w;
  w[4] = g1.x, w[5] = g1.y, w[6] = g1.z, w[7] = g1.w;
  if (p.zero_centered_gamma) {
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e] += 1.0f;
  }
  if constexpr (kRms) {
#pragma unroll
    for (int e = 0; e < 8; ++e) b[e] = 0.0f;
  } else {
    const float4* beta4 = reinterpret_cast<const float4*>(p.beta + col);
    const float4 b0 = __ldg(beta4), b1 = __ldg(beta4 + 1);
    b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w;
    b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
  }
}

// y[index .. index + 8) = v in `type` (index a multiple of 8, y 16-byte aligned).
__device__ __forceinline__ void StoreY8(void* y, NormDType type, int64_t index, const float v[8]) {
  if (type == NormDType::kFloat32) {
    float* out = static_cast<float*>(y) + index;
    StoreGlobal16(out, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    StoreGlobal16(out + 4, __float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]),
                  __float_as_uint(v[7]));
  } else {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      words[i] = FloatTo16(type, v[2 * i]) | (static_cast<uint32_t>(FloatTo16(type, v[2 * i + 1])) << 16);
    }
    StoreGlobal16(static_cast<uint16_t*>(y) + index, words[0], words[1], words[2], words[3]);
  }
}

// Equal-count merge (n values on each side): symmetric, no division.
template <bool kRms>
__device__ __forceinline__ void MergeEqual(float& mean, float& m2, float other_mean, float other_m2,
                                           float half_n) {
  if constexpr (kRms) {
    m2 += other_m2;
  } else {
    const float d = other_mean - mean;
    m2 = fmaf(d * d, half_n, m2 + other_m2);
    mean = (mean + other_mean) * 0.5f;
  }
}

// One step of the warp's transposing reduction: lanes whose `bit` is set keep the upper
// half of their kRowsHeld row partials and send the lower half to the partner lane (lane
// ^ bit), the others the reverse; each merges what it kept with what it received.
template <bool kRms, int kRowsHeld>
__device__ __forceinline__ void ReduceHalf(float* mean, float* m2, int lane, int bit, float half_n) {
  constexpr int kHalf = kRowsHeld / 2;
  const bool upper = (lane & bit) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float send_m2 = upper ? m2[j] : m2[kHalf + j];
    const float keep_m2 = upper ? m2[kHalf + j] : m2[j];
    const float recv_m2 = __shfl_xor_sync(0xFFFFFFFFu, send_m2, bit);
    float keep_mean = 0.0f, recv_mean = 0.0f;
    if constexpr (!kRms) {
      const float send_mean = upper ? mean[j] : mean[kHalf + j];
      keep_mean = upper ? mean[kHalf + j] : mean[j];
      recv_mean = __shfl_xor_sync(0xFFFFFFFFu, send_mean, bit);
    }
    mean[j] = keep_mean;  // index j < kHalf: not read again in this step
    m2[j] = keep_m2;
    MergeEqual<kRms>(mean[j], m2[j], recv_mean, recv_m2, half_n);
  }
}

// Moments of one lane's 8 values per row of its tile block (mean and M2; RMSNorm: sum of
// squares; row k of the block at tile[k * row_stride]), reduced over the warp's 8 column
// groups by three transposing steps (4, 2, then 1 row kept), after which the lane with
// column group c holds row 8 rg + c of the tile; every lane writes that row's warp
// partial. kCgLane: the lane-index weight of one column group (the register-tile kernel's
// lanes have cg8 = lane / 4, so 4; the stats-warp kernel's cg8 = lane % 8, so 1): the steps
// exchange across lane bits 4 kCgLane, 2 kCgLane, kCgLane, i.e. always across column-group
// bits 4, 2, 1, so both lane layouts merge the same partials in the same order.
// WarpMoments' per-lane step for one row's 8 values: mean and M2 (RMSNorm: 0 and the sum of
// squares), for the one-CTA-per-row kernel. WarpMoments keeps its own loop body: written
// through this helper it moved the SASS of the stats-warp kernel's paired RMSNorm instantiations.
template <NormDType kType, bool kRms>
__device__ __forceinline__ void LaneMoments(const uint4& chunk, float& mean, float& m2) {
  float v[8];
  Unpack16<kType>(chunk, v);
  if constexpr (kRms) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = fmaf(v[i], v[i], s);
    mean = 0.0f;
    m2 = s;
  } else {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += v[i];
    const float m = s * 0.125f;
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float d = v[i] - m;
      q = fmaf(d, d, q);
    }
    mean = m;
    m2 = q;
  }
}

template <NormDType kType, bool kRms, int kCgLane>
__device__ __forceinline__ void WarpMoments(const uint4* tile, int row_stride, int lane, int rg, int cg8,
                                            int warp, float2 (*warp_stats)[kRtRows]) {
  float mean[8], m2[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float v[8];
    Unpack16<kType>(tile[k * row_stride], v);
    if constexpr (kRms) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s = fmaf(v[i], v[i], s);
      mean[k] = 0.0f;
      m2[k] = s;
    } else {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s += v[i];
      const float m = s * 0.125f;
      float q = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = v[i] - m;
        q = fmaf(d, d, q);
      }
      mean[k] = m;
      m2[k] = q;
    }
  }
  ReduceHalf<kRms, 8>(mean, m2, lane, 4 * kCgLane, 4.0f);  // rows 4b .. 4b + 3 (b = cg8 bit 4)
  ReduceHalf<kRms, 4>(mean, m2, lane, 2 * kCgLane, 8.0f);  // rows 4b + 2c + {0, 1}
  ReduceHalf<kRms, 2>(mean, m2, lane, kCgLane, 16.0f);     // row 4b + 2c + e = column group
  warp_stats[warp][8 * rg + cg8] = make_float2(mean[0], m2[0]);
}

// ---- Host side of both launchers.

// 64 columns per warp, as few CTAs per row as kRtMaxWarps warps per CTA allow, the warps
// spread evenly (every CTA gets at least one), 32-row groups.
inline RtGeometry RtGeometryFor(int64_t rows, int64_t cols) {
  RtGeometry g;
  g.units = static_cast<int>(cols / kRtColsPerWarp);
  const int min_cluster = static_cast<int>(CeilDiv(g.units, kRtMaxWarps));
  g.warps = static_cast<int>(CeilDiv(g.units, min_cluster));
  g.cluster = static_cast<int>(CeilDiv(g.units, g.warps));
  g.row_groups = CeilDiv(rows, kRtRows);
  return g;
}

// Resident CTAs per SM and active clusters of `kernel` with `threads` threads and
// `shared_bytes` of dynamic shared memory per CTA in clusters of `cluster`, cached; raises
// the kernel's dynamic shared-memory limit to `max_shared_bytes` first.
template <typename Kernel>
cudaError_t RtOccupancy(Kernel kernel, int threads, int shared_bytes, int max_shared_bytes, int cluster,
                        int* ctas_per_sm, int* clusters) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int>, std::pair<int, int>> cache;
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), threads, cluster);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_bytes);
    if (status != cudaSuccess) return status;
    int per_sm = 0;
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes);
    if (status != cudaSuccess) return status;
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterLaunchConfig(dim3(cluster, 1, 1), cluster, threads, shared_bytes, nullptr, &attribute);
    int active = 0;
    status = cudaOccupancyMaxActiveClusters(&active, kernel, &config);
    if (status != cudaSuccess) return status;
    it = cache.emplace(key, std::make_pair(per_sm, active)).first;
  }
  *ctas_per_sm = it->second.first;
  *clusters = it->second.second;
  return cudaSuccess;
}

// Clusters to launch: as many as are active at once and fit on usable_sms, at most one per
// row group (and 65535); 0 when none fits.
inline int64_t RtClusters(const RtGeometry& g, int usable_sms, int ctas_per_sm, int active_clusters) {
  const int64_t fitting = static_cast<int64_t>(usable_sms) * ctas_per_sm / g.cluster;
  if (ctas_per_sm < 1 || active_clusters < 1 || fitting < 1) return 0;
  const int64_t clusters = std::min<int64_t>(active_clusters, fitting);
  return std::min<int64_t>(std::min<int64_t>(clusters, g.row_groups), 65535);
}

// The plan fields both kernels fill alike (the caller sets stats_warp and
// contiguous_row_groups).
inline void FillRtPlan(const RtGeometry& g, int64_t clusters, int ctas_per_sm, int usable_sms, int shared_bytes,
                       NormForwardPlan* plan) {
  plan->rows_per_cta = kRtRows;
  plan->cols_per_cta = g.warps * kRtColsPerWarp;
  plan->slices = g.cluster;
  plan->cluster_size = g.cluster;
  plan->separate_stats = false;
  plan->register_tile = true;
  plan->ctas = static_cast<int>(clusters * g.cluster);
  plan->ctas_per_sm = ctas_per_sm;
  plan->usable_sms = usable_sms;
  plan->shared_bytes = shared_bytes;
}

// The amax reset as a programmatic dependent launch (sm_90). A one-thread kernel zeroes the
// word after letting the next launch on the stream start at once (launch_dependents); the
// norm kernel is launched as that dependent, so its CTAs are placed and work through their
// tiles while the reset is still in flight, and only the thread that adds to the word waits
// for it (WaitPrerequisiteGrids: griddepcontrol.wait returns once every prerequisite grid has
// completed and its writes are visible). Everything else the kernel reads was written before
// the reset kernel started, so it is complete. A cudaMemsetAsync put the reset on the
// critical path: on 16384 x 8192 LN + FP8 this costs ~0.3% against no reset at all, a third of
// what the reset launch it replaced cost.
__global__ void ZeroWordLetDependentsStart(uint32_t* word) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  *word = 0u;
}

// Waits for the grids this launch depends on (the amax reset); a no-op for a launch that
// was not made a programmatic dependent.
__device__ __forceinline__ void WaitPrerequisiteGrids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Zeroes the amax word (when given: the kernel must call WaitPrerequisiteGrids before it
// adds to it) and launches `kernel` on `clusters` clusters of g.cluster CTAs (grid
// g.cluster x clusters).
template <typename... Params, typename... Args>
cudaError_t LaunchRtClusters(void (*kernel)(Params...), const RtGeometry& g, int64_t clusters, int threads,
                             int shared_bytes, uint32_t* amax_bits, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = ClusterLaunchConfig(dim3(g.cluster, static_cast<unsigned>(clusters), 1), g.cluster,
                                                  threads, shared_bytes, stream, &attributes[0]);
  if (amax_bits != nullptr) {
    ZeroWordLetDependentsStart<<<1, 1, 0, stream>>>(amax_bits);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[1].val.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 2;
  }
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, args...);
  if (status != cudaSuccess) return status;
  return cudaGetLastError();
}

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_COMMON_CUH_
