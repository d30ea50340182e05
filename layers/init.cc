#include "layers/init.h"

#include <cmath>

namespace teserve {
namespace layers {
namespace {

// SplitMix64: a bijective mixer, good enough for initialization streams.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1], never 0 so the logarithm below is finite.
double Uniform(uint64_t key, uint64_t counter) {
  return (static_cast<double>(SplitMix64(key ^ SplitMix64(counter)) >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace

uint64_t DeriveSeed(uint64_t seed, uint64_t stream) { return SplitMix64(seed ^ SplitMix64(stream + 1)); }

void FillNormal(uint64_t seed, float std, absl::Span<float> out) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < out.size(); i += 2) {
    // Box-Muller: two independent normals per pair of uniforms.
    const double u1 = Uniform(seed, i);
    const double u2 = Uniform(seed, i + 1);
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
  }
}

}  // namespace layers
}  // namespace teserve
