// Deterministic parameter initialization: the same seed gives the same parameters on
// every machine (no dependence on the standard library's distributions).
#ifndef TESERVE_LAYERS_INIT_H_
#define TESERVE_LAYERS_INIT_H_

#include <cstdint>

#include "absl/types/span.h"

namespace teserve {
namespace layers {

// Fills `out` with N(0, std^2) samples from a counter-based stream keyed by `seed`.
void FillNormal(uint64_t seed, float std, absl::Span<float> out);

// Mixes a model seed with a layer index into an independent stream key.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_INIT_H_
