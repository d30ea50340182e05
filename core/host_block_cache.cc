#include "core/host_block_cache.h"

#include <cstring>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace teserve {

int64_t HostBlockCache::SizeClass(int64_t bytes) {
  int64_t size = kSmallestBlock;
  while (size < bytes && size <= kLargestBlock) size *= 2;
  return size;
}

absl::StatusOr<void*> HostBlockCache::Allocate(int64_t bytes, int, void*, bool zero) {
  const int64_t size = SizeClass(bytes);
  if (size > kLargestBlock) {
    return absl::ResourceExhaustedError(
        absl::StrCat(bytes, " bytes is past the page-locked block limit of ", kLargestBlock));
  }
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end()) {
      ptr = it->second.back();
      it->second.pop_back();
      cached_ -= size;
      if (it->second.empty()) free_.erase(it);
    }
  }
  if (ptr == nullptr) ptr = allocate_(size);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes of page-locked host memory"));
  }
  if (zero) std::memset(ptr, 0, static_cast<size_t>(size));
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[ptr] = size;
  return ptr;
}

void HostBlockCache::Deallocate(void* ptr, int, void*) {
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) return;
    const int64_t size = it->second;
    sizes_.erase(it);
    if (size > kCachedBytes) {
      evicted.push_back(ptr);
    } else {
      while (cached_ + size > kCachedBytes && !free_.empty()) {
        auto largest = std::prev(free_.end());
        evicted.push_back(largest->second.back());
        largest->second.pop_back();
        cached_ -= largest->first;
        if (largest->second.empty()) free_.erase(largest);
      }
      free_[size].push_back(ptr);
      cached_ += size;
    }
  }
  for (void* p : evicted) release_(p);  // outside the lock: a release may wait for the device
}

absl::Status HostBlockCache::Copy(void* dst, const void* src, int64_t bytes, int, void*) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

int64_t HostBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace teserve
