#include "core/float_codec.h"

#include <cmath>

#include "gtest/gtest.h"

namespace teserve {
namespace {

TEST(FloatCodec, E4M3MaxRoundTrips) {
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
}

}  // namespace
}  // namespace teserve
