// SessionSnapshot: a plain copy of a session's training counters and quantizer values,
// taken under the session's lock (Session::Snapshot). The server's metrics consume
// snapshots and never call into train::Session, so this header depends on no session
// code.
#ifndef TESERVE_TRAIN_SESSION_SNAPSHOT_H_
#define TESERVE_TRAIN_SESSION_SNAPSHOT_H_

#include <cstdint>
#include <vector>

#include "recipes/health.h"

namespace teserve {
namespace train {

// Counters and latest values of the training loop (what the server's metrics export).
struct TrainingStats {
  int64_t step = 0;            // steps that updated the parameters (SessionSummary.step)
  int64_t skipped_steps = 0;   // steps skipped for non-finite gradients
  bool has_loss = false;       // a ForwardBackward has run
  float loss = 0.0f;           // its loss; a client-side loss (Forward/Backward) is unknown
  bool has_grad_norm = false;  // a Step has run
  float grad_norm = 0.0f;      // of the latest Step, before clipping
  bool health_sampling = false;  // Session::SetHealthSampling's switch
};

// One quantizer's values for the metrics (QuantizerReport without names and history).
struct QuantizerSample {
  float amax = 0.0f;
  float window_max = 0.0f;  // max of the amax history (delayed scaling), else amax
  float scale = 1.0f;
  float scale_inv = 1.0f;
  int64_t quantize_calls = 0;
  recipes::HealthStats health;
};

struct SessionSnapshot {
  TrainingStats stats;
  // In Session::QuantizerNames() order; empty unless asked for.
  std::vector<QuantizerSample> quantizers;
};

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_SESSION_SNAPSHOT_H_
