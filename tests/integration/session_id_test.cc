// Session ids (server/session_registry.h) and the quoting of client text in errors
// (core/status.h Quoted / BoundedMessage).
#include <array>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/session_registry.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(SessionId, Is32LowercaseHexDigits) {
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> id = server::NewSessionId();
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->size(), 32u);
    EXPECT_EQ(server::kSessionIdLength, 32);
    EXPECT_THAT(*id, MatchesRegex("[0-9a-f]{32}"));
  }
}

// 10,000 ids are distinct, and every one of the 128 bits takes both values about
// equally often (a 64-bit generator such as mt19937_64 behind a 32-digit id would leave
// half of them fixed or copied). Unpredictability itself comes from the OS CSPRNG.
TEST(SessionId, TenThousandAreDistinctAndUseAll128Bits) {
  constexpr int kCount = 10000;
  absl::flat_hash_set<std::string> seen;
  std::array<int, 128> ones{};
  std::array<int, 64> halves_equal{};
  for (int i = 0; i < kCount; ++i) {
    absl::StatusOr<std::string> id = server::NewSessionId();
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(seen.insert(*id).second) << "repeated id " << *id;
    for (int bit = 0; bit < 128; ++bit) {
      const char c = (*id)[bit / 4];
      const int nibble = c <= '9' ? c - '0' : c - 'a' + 10;
      ones[bit] += (nibble >> (3 - bit % 4)) & 1;
    }
    for (int d = 0; d < 16; ++d) halves_equal[d] += (*id)[d] == (*id)[d + 16];
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kCount));
  // Binomial(10000, 0.5): sd 50; 4500..5500 is 10 sd.
  for (int bit = 0; bit < 128; ++bit) {
    EXPECT_GT(ones[bit], 4500) << "bit " << bit;
    EXPECT_LT(ones[bit], 5500) << "bit " << bit;
  }
  // The two 64-bit halves are independent: equal hex digits 1/16 of the time.
  for (int d = 0; d < 16; ++d) EXPECT_LT(halves_equal[d], kCount / 8) << "digit " << d;
}

TEST(SessionId, RegistryHandsOutDistinctIdsAndQuotesUnknownOnesShort) {
  server::SessionRegistry registry(/*max_sessions=*/4);
  const std::string huge(200000, 'a');
  auto missing = registry.Get(huge, "");
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.status().message().size(), 1024u);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("session_id: no session 'aaaa"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("...' (200000 bytes)"));
  EXPECT_EQ(registry.Remove(huge, "").code(), absl::StatusCode::kNotFound);
}

TEST(Quoted, ShortTextIsQuotedWhole) {
  EXPECT_EQ(Quoted("fc.weight"), "'fc.weight'");
  EXPECT_EQ(Quoted(""), "''");
  const std::string limit(kQuotedMaxBytes, 'z');
  EXPECT_EQ(Quoted(limit), "'" + limit + "'");
}

TEST(Quoted, LongTextKeepsAPrefixAndTheLength) {
  const std::string text = std::string(kQuotedMaxBytes, 'q') + "tail";
  EXPECT_EQ(Quoted(text), "'" + std::string(kQuotedMaxBytes, 'q') + "...' (" +
                              std::to_string(text.size()) + " bytes)");
  EXPECT_LT(Quoted(std::string(1 << 20, 'x')).size(), 200u);
}

TEST(Quoted, NeverSplitsAUtf8Sequence) {
  // 'é' is two bytes; an odd prefix would put the cut inside one.
  std::string text = "a";
  while (text.size() < 3 * kQuotedMaxBytes) text += "\xc3\xa9";
  const std::string quoted = Quoted(text);
  const size_t end = quoted.find("...'");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(end - 1, kQuotedMaxBytes - 1);  // 'a' plus whole two-byte characters
  EXPECT_NE(static_cast<unsigned char>(quoted[end - 1]), 0xc3);
}

TEST(BoundedMessage, CapsLongMessages) {
  EXPECT_EQ(BoundedMessage("short"), "short");
  const std::string bounded = BoundedMessage(std::string(100000, 'm'));
  EXPECT_LE(bounded.size(), kMaxStatusMessageBytes);
  EXPECT_THAT(bounded, HasSubstr("(message truncated, 100000 bytes in all)"));
}

}  // namespace
}  // namespace teserve
