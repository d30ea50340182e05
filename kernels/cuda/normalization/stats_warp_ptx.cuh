// Internal to normalization_stats_warp.cu: thin wrappers of the PTX it synchronizes and
// copies with (named barriers, mbarriers with transaction counts, distributed shared memory
// addresses and st.async pushes, bulk copies). Each is one or two instructions; the
// protocol that uses them is described in normalization_stats_warp.cu.
//
// Included inside namespace teserve::kernels::cuda::{anonymous}.
#ifndef TESERVE_KERNELS_CUDA_STATS_WARP_PTX_CUH_
#define TESERVE_KERNELS_CUDA_STATS_WARP_PTX_CUH_

// mbarrier waits give up (trap) after this many polls, so that a broken protocol fails the
// launch instead of hanging the process (a correct wait lasts microseconds).
constexpr uint32_t kMaxPolls = 1u << 24;

// Named barrier kBase + parity (immediate ids, so ptxas reserves only the ids used).
template <int kBase>
__device__ __forceinline__ void NamedArrive(int parity, int threads) {
  if (parity) {
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kBase + 1), "r"(threads) : "memory");
  } else {
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kBase), "r"(threads) : "memory");
  }
}

template <int kBase>
__device__ __forceinline__ void NamedSync(int parity, int threads) {
  if (parity) {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kBase + 1), "r"(threads) : "memory");
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kBase), "r"(threads) : "memory");
  }
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Address of this CTA's shared-memory location `local` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t ClusterAddress(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Arrives once on `bar` and raises its expected transaction bytes of the current phase.
__device__ __forceinline__ void MbarrierArriveExpect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits until the phase with `parity` of `bar` completed. kCluster: acquire at cluster scope
// (the bytes were written by other CTAs' st.async); it compiles to an L1 invalidation
// (CCTL.IVALL) after the wait, which ncu showed as the compute warps' largest stall when
// they used it per tile, so waits on what this CTA or its bulk copies wrote use the default
// CTA scope.
template <bool kCluster>
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  for (uint32_t polls = 0;; ++polls) {
    uint32_t done;
    if constexpr (kCluster) {
      asm volatile(
          "{\n"
          ".reg .pred p;\n"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n"
          "}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n"
          ".reg .pred p;\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n"
          "}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    }
    if (done) return;
    if (polls >= kMaxPolls) __trap();
  }
}

// 8 bytes (mean, m2) into shared::cluster address `remote`, completing 8 transaction bytes
// on the mbarrier at shared::cluster address `remote_bar` (same CTA as `remote`).
__device__ __forceinline__ void PushPartial(uint32_t remote, float2 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(
          remote),
      "f"(v.x), "f"(v.y), "r"(remote_bar)
      : "memory");
}

// Completes `bytes` transaction bytes on this CTA's mbarrier `bar` (the CTA's own partial,
// stored with a plain shared-memory store and read back by the same thread).
__device__ __forceinline__ void MbarrierCompleteLocal(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One plain arrive on this CTA's mbarrier `bar` (release at CTA scope).
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Bulk copy (the TMA unit) of `bytes` (a multiple of 16) from global `src` (16-byte
// aligned) into this CTA's shared memory at `dst`, completing the bytes on mbarrier `bar`.
__device__ __forceinline__ void BulkCopyRow(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

#endif  // TESERVE_KERNELS_CUDA_STATS_WARP_PTX_CUH_
