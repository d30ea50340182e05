// core/host_block_cache.h's policy with malloc / free standing in for the page-locked
// primitives: size classes, reuse of a freed block, the cache limit and which blocks go
// to make room, refusals past the block limit and when the primitive fails.
#include "core/host_block_cache.h"

#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace teserve {
namespace {

int allocations = 0, releases = 0;
bool fail_next = false;
void* CountingAllocate(int64_t bytes) {
  if (fail_next) {
    fail_next = false;
    return nullptr;
  }
  ++allocations;
  return std::malloc(static_cast<size_t>(bytes));
}
void CountingRelease(void* ptr) {
  ++releases;
  std::free(ptr);
}

class HostBlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { allocations = releases = 0; }
  HostBlockCache cache_{&CountingAllocate, &CountingRelease};
};

constexpr int64_t kMiB = int64_t{1} << 20;

TEST_F(HostBlockCacheTest, RoundsUpToPowerOfTwoClassesFrom64KiB) {
  EXPECT_EQ(HostBlockCache::SizeClass(0), 64 << 10);
  EXPECT_EQ(HostBlockCache::SizeClass(1), 64 << 10);
  EXPECT_EQ(HostBlockCache::SizeClass((64 << 10) + 1), 128 << 10);
  EXPECT_EQ(HostBlockCache::SizeClass(4 * kMiB), 4 * kMiB);
  EXPECT_EQ(HostBlockCache::SizeClass(4 * kMiB + 1), 8 * kMiB);
}

TEST_F(HostBlockCacheTest, AFreedBlockServesTheNextRequestOfItsClass) {
  void* a = cache_.Allocate(3 * kMiB, 0, nullptr, false).value();
  cache_.Deallocate(a, 0, nullptr);
  EXPECT_EQ(cache_.cached_bytes(), 4 * kMiB);
  void* b = cache_.Allocate(4 * kMiB, 0, nullptr, true).value();  // same class
  EXPECT_EQ(b, a);
  EXPECT_EQ(allocations, 1);
  EXPECT_EQ(static_cast<unsigned char*>(b)[4 * kMiB - 1], 0) << "zero asked, zero given";
  void* c = cache_.Allocate(5 * kMiB, 0, nullptr, false).value();  // another class
  EXPECT_NE(c, a);
  EXPECT_EQ(allocations, 2);
  cache_.Deallocate(b, 0, nullptr);
  cache_.Deallocate(c, 0, nullptr);
  EXPECT_EQ(releases, 0);
  EXPECT_EQ(cache_.cached_bytes(), 12 * kMiB);
}

// After one huge request filled the cache, the next smaller blocks evict it instead of
// being allocated and released on every request.
TEST_F(HostBlockCacheTest, MakesRoomByReleasingTheLargestCachedBlocks) {
  void* huge = cache_.Allocate(HostBlockCache::kCachedBytes, 0, nullptr, false).value();
  cache_.Deallocate(huge, 0, nullptr);
  EXPECT_EQ(cache_.cached_bytes(), HostBlockCache::kCachedBytes);
  for (int round = 0; round < 3; ++round) {
    void* small = cache_.Allocate(4 * kMiB, 0, nullptr, false).value();
    cache_.Deallocate(small, 0, nullptr);
  }
  EXPECT_EQ(allocations, 2) << "the small block is cached after its first use";
  EXPECT_EQ(releases, 1) << "the huge block made room";
  EXPECT_EQ(cache_.cached_bytes(), 4 * kMiB);
}

TEST_F(HostBlockCacheTest, ABlockLargerThanTheCacheIsReleasedAtOnce) {
  void* big = cache_.Allocate(HostBlockCache::kCachedBytes + 1, 0, nullptr, false).value();
  cache_.Deallocate(big, 0, nullptr);
  EXPECT_EQ(releases, 1);
  EXPECT_EQ(cache_.cached_bytes(), 0);
}

TEST_F(HostBlockCacheTest, RefusesPastTheBlockLimitAndWhenThePrimitiveFails) {
  EXPECT_TRUE(absl::IsResourceExhausted(
      cache_.Allocate(HostBlockCache::kLargestBlock + 1, 0, nullptr, false).status()));
  fail_next = true;
  EXPECT_TRUE(absl::IsResourceExhausted(cache_.Allocate(kMiB, 0, nullptr, false).status()));
  EXPECT_EQ(allocations, 0);
  cache_.Deallocate(reinterpret_cast<void*>(0x1234), 0, nullptr);  // not ours: ignored
  EXPECT_EQ(releases, 0);
}

}  // namespace
}  // namespace teserve
