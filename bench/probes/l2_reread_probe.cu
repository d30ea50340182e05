// Probe (not part of the build): what does reading the same bytes a second time cost on the
// H200 when the second read comes `lag` chunks later on the same SM? Answers whether a
// two-pass LayerNorm (statistics pass, then a normalize pass that re-reads x from L2) can keep
// DRAM and L2-fabric traffic at the one-pass level. One CTA per SM streams 64 KiB chunks
// blockIdx.x, blockIdx.x + G, ...; mode copy: load chunk, store it; mode reread: load chunk k
// (kept only as an XOR), then load chunk k - lag again and store it; mode hinted: the same with
// L2 evict_last on the first read and evict_first on the second read and the stores.
// Build: nvcc -O3 -arch=sm_90a -o l2_reread_probe bench/probes/l2_reread_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_check.h"

constexpr int kThreads = 512;

__device__ __forceinline__ uint64_t Policy(bool last) {
  uint64_t pol;
  if (last) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  }
  return pol;
}

__device__ __forceinline__ uint4 LoadHint(const uint4* p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.cg.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}

__device__ __forceinline__ void StoreHint(uint4* p, uint4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w), "l"(pol)
               : "memory");
}
constexpr int kPerThread = 8;  // 16-byte loads per thread and chunk: 64 KiB chunks
constexpr int64_t kChunkU4 = kThreads * kPerThread;

__global__ void __launch_bounds__(kThreads, 1)
    Probe(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t chunks, int lag, int mode, uint32_t* sink) {
  const int64_t g = gridDim.x;
  const int64_t n = chunks > blockIdx.x ? (chunks - blockIdx.x + g - 1) / g : 0;
  uint32_t acc = 0;
  auto base = [&](int64_t k) { return (blockIdx.x + k * g) * kChunkU4 + threadIdx.x; };
  // mode 2: the first read keeps x in L2 (evict_last), the second read and the stores
  // let it go (evict_first).
  const uint64_t keep = Policy(true), drop = Policy(false);
  auto copy = [&](int64_t k) {
    uint4 v[kPerThread];
    const int64_t b = base(k);
    if (mode == 2) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) v[i] = LoadHint(x + b + i * kThreads, drop);
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) StoreHint(y + b + i * kThreads, v[i], drop);
      return;
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) v[i] = __ldcg(x + b + i * kThreads);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) y[b + i * kThreads] = v[i];
  };
  const int64_t end = n + (mode != 0 ? lag : 0);
  for (int64_t k = 0; k < end; ++k) {
    if (mode == 0) {
      copy(k);
    } else {
      if (k < n) {
        uint4 v[kPerThread];
        const int64_t b = base(k);
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
          v[i] = mode == 2 ? LoadHint(x + b + i * kThreads, keep) : __ldcg(x + b + i * kThreads);
        }
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
      }
      if (k >= lag && k - lag < n) copy(k - lag);
    }
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

int main(int argc, char** argv) {
  const int64_t bytes = int64_t{16384} * 8192 * 2;
  const int64_t chunks = bytes / (kChunkU4 * 16);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  uint4 *x, *y;
  uint32_t* sink;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(x, 1, bytes));
  // 100 KiB of dynamic shared memory so that one CTA runs per SM.
  const int smem = 100 * 1024;
  CHECK(cudaFuncSetAttribute(Probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  struct Case { const char* name; int mode, lag, grid; };
  std::vector<Case> cases = {{"copy", 0, 0, sms},       {"copy_120", 0, 0, 120},   {"reread_lag0", 1, 0, sms},
                             {"reread_lag1", 1, 1, sms}, {"reread_lag2", 1, 2, sms}, {"reread_lag4", 1, 4, sms},
                             {"reread_lag8", 1, 8, sms}, {"reread_lag16", 1, 16, sms},
                             {"hinted_lag1", 2, 1, sms}, {"hinted_lag2", 2, 2, sms}, {"hinted_lag4", 2, 4, sms}};
  const char* only = argc > 2 ? argv[2] : nullptr;
  std::printf("case,grid,lag,median_us,min_us,copy_equiv_TBps\n");
  for (const Case& c : cases) {
    if (only && std::string(only) != c.name) continue;
    std::vector<float> t;
    for (int i = 0; i < iters + 2; ++i) {
      CHECK(cudaEventRecord(a));
      Probe<<<c.grid, kThreads, smem>>>(x, y, chunks, c.lag, c.mode, sink);
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 2) t.push_back(ms * 1000.0f);
    }
    CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    const float med = t[t.size() / 2];
    std::printf("%s,%d,%d,%.1f,%.1f,%.3f\n", c.name, c.grid, c.lag, med, t[0], 2.0 * bytes / (med * 1e-6) / 1e12);
  }
  return 0;
}
