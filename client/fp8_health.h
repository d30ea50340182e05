// The table of `teserve_cli fp8-health SESSION`: the FP8 scaling health of every
// quantized GEMM operand of a session, from GetQuantizationState.
//
// Columns: layer, tensor, format, amax (latest quantization), window max (max of the
// amax history for delayed scaling, else the amax), scale, underflow % and overflow %
// (of the latest sampled health statistics, "-" when the session has none), MSE, and
// execution (emulated or native).
#ifndef TESERVE_CLIENT_FP8_HEALTH_H_
#define TESERVE_CLIENT_FP8_HEALTH_H_

#include <string>

#include "teserve/v1/service.pb.h"

namespace teserve {
namespace client {

// max(amax_history), or amax when there is no history.
float AmaxWindowMax(const v1::QuantizedTensorState& tensor);

// "session ID at step N" and one row per tensor, each line ending in '\n'. A session
// without quantized tensors gets a line saying so instead of the rows.
std::string FormatFp8HealthTable(const v1::QuantizationState& state);

}  // namespace client
}  // namespace teserve

#endif  // TESERVE_CLIENT_FP8_HEALTH_H_
