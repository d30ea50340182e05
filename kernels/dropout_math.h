// The factor TransformerLayer's bias-dropout-add multiplies each element by, one
// header for the CPU reference and the CUDA kernels (TESERVE_HD), so both draw the same
// masks bit for bit (TE's hidden dropout and drop path):
//   factor(i) = keep(i) * sample_keep(b(i))
//   keep(i)        = uniform(dropout_site, i) >= dropout ? 1 / (1 - dropout) : 0   (1 when dropout is 0)
//   sample_keep(b) = uniform(drop_path_site, b) >= drop_path ? 1 / (1 - drop_path) : 0
//                    (1 when drop_path is 0)
//   uniform(site, n) = Uniform24ToFloat(RandomBits24(RandomKey(seed, stream, site), n))
// b(i) is the sample of element i: with row = i / hidden, row % batch for sbhd [S, B, H]
// and row / seq for bshd [B, S, H]. Each product is one FP32 rounding in the order
// written.
#ifndef TESERVE_KERNELS_DROPOUT_MATH_H_
#define TESERVE_KERNELS_DROPOUT_MATH_H_

#include <cstdint>

#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {

struct ResidualDropout {
  uint64_t seed = 0;
  uint64_t stream = 0;
  float dropout = 0.0f;    // in [0, 1)
  float drop_path = 0.0f;  // in [0, 1)
  uint32_t dropout_site = 0;
  uint32_t drop_path_site = 0;
  bool sbhd = true;  // else bshd
  int64_t batch = 1;
  int64_t seq = 1;

  // False when every factor is 1 (nothing dropped): callers skip the multiply.
  TESERVE_HD bool active() const { return dropout > 0.0f || drop_path > 0.0f; }
};

TESERVE_HD float ResidualDropoutFactor(const ResidualDropout& d, int64_t i, int64_t hidden) {
  float factor = 1.0f;
  if (d.dropout > 0.0f) {
    const uint64_t key = RandomKey(d.seed, d.stream, d.dropout_site);
    const float u = Uniform24ToFloat(RandomBits24(key, static_cast<uint64_t>(i)));
    factor = u >= d.dropout ? 1.0f / (1.0f - d.dropout) : 0.0f;
  }
  if (d.drop_path > 0.0f) {
    const int64_t row = i / hidden;
    const int64_t b = d.sbhd ? row % d.batch : row / d.seq;
    const uint64_t key = RandomKey(d.seed, d.stream, d.drop_path_site);
    const float u = Uniform24ToFloat(RandomBits24(key, static_cast<uint64_t>(b)));
    factor *= u >= d.drop_path ? 1.0f / (1.0f - d.drop_path) : 0.0f;
  }
  return factor;
}

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_DROPOUT_MATH_H_
