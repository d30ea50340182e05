// Probe (not part of the build): do the lines a kernel stores under an L2 evict-last policy
// crowd out a later kernel's working set? The FP8 kernels store their transposed codes that
// way (device_common.cuh, StoreGlobal8EvictLast); their outputs (134 MB at 16384 x 8192) are
// larger than the L2, so whatever stays marked evict-last when they end is up to a whole L2.
// Each trial: a writer kernel stores `write_mb` MB with 8-byte stores (normal or evict-last),
// then a victim kernel reads a `victim_mb` MB buffer `passes` times (a working set that fits
// in L2, as a GEMM's tiles or an optimizer's small tensors would), timed alone with events.
// Mode `reset` calls cudaCtxResetPersistingL2Cache between the two.
// Build: nvcc -O3 -arch=sm_90a -o evict_last_aftermath_probe bench/probes/evict_last_aftermath_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

__global__ void Writer(uint2* out, int64_t n, bool evict_last) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t a = static_cast<uint32_t>(i), b = static_cast<uint32_t>(i >> 32);
    if (evict_last) {
      asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;" ::"l"(out + i), "r"(a), "r"(b),
                   "l"(policy));
    } else {
      out[i] = make_uint2(a, b);
    }
  }
}

__global__ void Victim(const uint4* in, int64_t n, int passes, uint32_t* sink) {
  uint32_t acc = 0;
  for (int p = 0; p < passes; ++p) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const uint4 v = in[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x12345678u) *sink = acc;
}

int main() {
  const int64_t write_bytes = 134LL << 20, victim_bytes = 24LL << 20;
  const int passes = 20;
  uint2* out = nullptr;
  uint4* victim = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&out, write_bytes));
  CHECK(cudaMalloc(&victim, victim_bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(victim, 1, victim_bytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const char* modes[] = {"normal", "evict_last", "evict_last+reset"};
  for (int round = 0; round < 3; ++round) {
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> us;
      for (int trial = 0; trial < 20; ++trial) {
        Writer<<<sms * 4, 512>>>(out, write_bytes / 8, mode > 0);
        CHECK(cudaGetLastError());
        if (mode == 2) CHECK(cudaCtxResetPersistingL2Cache());
        CHECK(cudaEventRecord(start));
        Victim<<<sms * 4, 512>>>(victim, victim_bytes / 16, passes, sink);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(ms * 1000.0f);
      }
      std::sort(us.begin(), us.end());
      std::printf("round %d writer %-17s victim (%lld MB x %d reads) median %.1f us min %.1f us\n", round,
                  modes[mode], static_cast<long long>(victim_bytes >> 20), passes, us[us.size() / 2], us[0]);
    }
  }
  return 0;
}
