// A grid that zeroes its own amax word: no reset kernel (or memset) in front of the launch.
//
// A kernel that adds to an amax word with atomicMax needs the word zeroed before its first
// atomic and after the previous launch's last one. A launch in front does that but costs
// the stream a launch: ~0.5-1 us of a 150 us LayerNorm + FP8 launch, ~2 us of a few-row
// one. Here the grid does it itself, through 16 bytes of caller
// workspace (NormForwardParams::amax_sync) that stay consistent from launch to launch:
//   word 0-1: ticket, (generation << 32) | CTAs of this launch arrived so far;
//   word 2:   released, the generation whose amax is zeroed, plus one.
// Each CTA arrives once at its start (one 64-bit atomicAdd on the ticket). The CTA that
// arrives first zeroes the amax and then publishes released = generation + 1 (release);
// the CTA that arrives last turns the ticket over to (generation + 1, 0) for the next
// launch. Every CTA waits for released = its generation + 1 (acquire) before its first
// atomicMax, which in practice is long over (the first CTA's zeroing lands within ~2 us of
// the start; a tile takes longer). Nothing waits on arrivals, so the grid needs no co-
// residency. Launches on one stream run one after the other, so a launch's arrivals never
// mix with the next's; overlapping launches (two streams, PDL) must not share a workspace.
//
// Textual include (inside the including .cu's unnamed namespace), after cuda_runtime.h.
#ifndef TESERVE_KERNELS_CUDA_AMAX_SYNC_CUH_
#define TESERVE_KERNELS_CUDA_AMAX_SYNC_CUH_

// AmaxSyncWait gives up (trap) after this many polls (each an L2 round trip plus a short
// sleep: about a second in all), so that a workspace that was never zeroed, or one shared by
// overlapping launches, fails the launch instead of hanging it (a correct wait is over
// within microseconds).
constexpr uint32_t kAmaxSyncMaxPolls = 1u << 20;

// Arrives for this CTA (call once per CTA, from one thread) and returns the value of
// `released` that AmaxSyncWait must see. The first CTA of the grid zeroes *amax_bits.
// zero_delay_ns (tests only) holds the first CTA back between its arrival and the zero, so
// that every other CTA reaches its wait first.
__device__ __forceinline__ uint32_t AmaxSyncArrive(uint32_t* sync, uint32_t* amax_bits, uint32_t ctas,
                                                   uint32_t zero_delay_ns = 0) {
  auto* ticket = reinterpret_cast<unsigned long long*>(sync);
  const unsigned long long old = atomicAdd(ticket, 1ull);
  const uint32_t target = static_cast<uint32_t>(old >> 32) + 1u;
  const uint32_t arrival = static_cast<uint32_t>(old);
  if (arrival == 0u) {
    for (uint32_t slept = 0; slept < zero_delay_ns; slept += 1000u) __nanosleep(1000u);
    *reinterpret_cast<volatile uint32_t*>(amax_bits) = 0u;
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(sync + 2), "r"(target) : "memory");
  }
  if (arrival == ctas - 1u) atomicAdd(ticket, (1ull << 32) - ctas);  // next generation, 0 arrived
  return target;
}

// Waits until the first CTA has zeroed the amax of this launch (`target` from
// AmaxSyncArrive); the caller's later atomics on the word come after the zero.
__device__ __forceinline__ void AmaxSyncWait(const uint32_t* sync, uint32_t target) {
  for (uint32_t polls = 1;; ++polls) {
    uint32_t released;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(released) : "l"(sync + 2) : "memory");
    if (static_cast<int32_t>(released - target) >= 0) return;
    if (polls >= kAmaxSyncMaxPolls) __trap();
    __nanosleep(32);
  }
}

#endif  // TESERVE_KERNELS_CUDA_AMAX_SYNC_CUH_
