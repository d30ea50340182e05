// A caching Allocator of host blocks for page-locked memory (core/tensor.h's pinned host
// allocator; kernels/cuda registers one over cudaHostAlloc / cudaFreeHost). Getting and
// returning such memory is slow (the driver maps the pages for the device, and the free
// waits for it), so freed blocks are kept by size class for the next request:
//   - a request is rounded up to a power of two from kSmallestBlock; past kLargestBlock
//     it is RESOURCE_EXHAUSTED (Tensor::EmptyPinnedHost then uses ordinary memory), as
//     when the underlying allocation fails;
//   - a freed block is kept while the cache holds at most kCachedBytes; to make room the
//     largest cached blocks are released first (the block just freed is the size being
//     served now: a cache full of one huge request's blocks must not make every later
//     request allocate and release);
//   - a freed block is handed out again at once: every host <-> device copy completes
//     before it returns (kernels/elementwise.h), so nothing still reads or writes it.
// Thread-safe. The primitives are injected so the policy is tested on any host
// (tests/core/host_block_cache_test.cc).
#ifndef TESERVE_CORE_HOST_BLOCK_CACHE_H_
#define TESERVE_CORE_HOST_BLOCK_CACHE_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace teserve {

class HostBlockCache : public Allocator {
 public:
  static constexpr int64_t kSmallestBlock = int64_t{64} << 10;
  static constexpr int64_t kLargestBlock = int64_t{1} << 30;
  static constexpr int64_t kCachedBytes = int64_t{512} << 20;

  // allocate(bytes) returns nullptr on failure; release(ptr) gives a block back.
  using AllocateFn = void* (*)(int64_t bytes);
  using ReleaseFn = void (*)(void* ptr);
  HostBlockCache(AllocateFn allocate, ReleaseFn release) : allocate_(allocate), release_(release) {}

  absl::StatusOr<void*> Allocate(int64_t bytes, int device_index, void* stream, bool zero) override;
  void Deallocate(void* ptr, int device_index, void* stream) override;
  absl::Status Copy(void* dst, const void* src, int64_t bytes, int device_index, void* stream) override;

  static int64_t SizeClass(int64_t bytes);
  int64_t cached_bytes() const;

 private:
  const AllocateFn allocate_;
  const ReleaseFn release_;
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, int64_t> sizes_;    // blocks handed out -> their size class
  int64_t cached_ = 0;
};

}  // namespace teserve

#endif  // TESERVE_CORE_HOST_BLOCK_CACHE_H_
