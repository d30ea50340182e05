// Helpers the layer tests share: parameter lookup and initialization, the session's
// quantizer region ends and quantizer-state comparison, cu_seqlens side inputs, error
// norms, and ModelSpec error cases checked through BuildStack.
#ifndef TESERVE_TESTS_LAYERS_LAYER_TEST_UTIL_H_
#define TESERVE_TESTS_LAYERS_LAYER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/init.h"
#include "layers/module.h"
#include "layers/spec.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace testing_util {

// Parameter names in Parameters() order.
inline std::vector<std::string> ParameterNames(layers::Module& m) {
  std::vector<std::string> names;
  for (layers::Parameter* p : m.Parameters()) names.push_back(p->name);
  return names;
}

// The parameter called `name`; a test failure and nullptr when there is none.
inline layers::Parameter* FindParameter(layers::Module& m, absl::string_view name) {
  for (layers::Parameter* p : m.Parameters()) {
    if (p->name == name) return p;
  }
  ADD_FAILURE() << "no parameter " << name;
  return nullptr;
}

// Rank-1 parameters (norm weights, biases; zero-centered gamma, beta and biases start at
// 0) replaced by N(0, 0.3^2) draws, streams seed, seed + 1, ...
inline void RandomizeParameters(layers::Module& m, uint64_t seed) {
  for (layers::Parameter* p : m.Parameters()) {
    if (p->value.rank() == 1) layers::FillNormal(seed++, 0.3f, p->value.mutable_floats());
  }
}

// N(0, 0.1^2) added to every rank-1 parameter (streams 100, 101, ...), so biases and
// norm parameters are non-zero but stay near their initial values.
inline void PerturbSmallParameters(layers::Module& m) {
  uint64_t stream = 100;
  for (layers::Parameter* p : m.Parameters()) {
    if (p->value.rank() != 1) continue;
    std::vector<float> delta(p->value.numel());
    layers::FillNormal(stream++, 0.1f, absl::MakeSpan(delta));
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.mutable_floats()[i] += delta[i];
  }
}

// Ends a forward or backward region of every quantizer of `m` the way the session does.
inline void EndRegion(layers::Module& m, bool forward) {
  for (const layers::NamedQuantizer& q : m.Quantizers()) {
    if (recipes::IsForwardRole(q.quantizer->role()) == forward) q.quantizer->EndRegion();
  }
}

// The same quantizers in order (layer names) in the same state: amax, scale, quantize
// calls and amax history.
inline void ExpectSameQuantizerState(const std::vector<layers::NamedQuantizer>& qa,
                                     const std::vector<layers::NamedQuantizer>& qb) {
  ASSERT_EQ(qa.size(), qb.size());
  for (size_t i = 0; i < qa.size(); ++i) {
    const recipes::QuantizerSnapshot sa = qa[i].quantizer->Snapshot(), sb = qb[i].quantizer->Snapshot();
    EXPECT_EQ(qa[i].layer, qb[i].layer);
    EXPECT_EQ(sa.amax, sb.amax) << qa[i].layer << " " << i;
    EXPECT_EQ(sa.scale, sb.scale) << qa[i].layer << " " << i;
    EXPECT_EQ(sa.quantize_calls, sb.quantize_calls) << qa[i].layer << " " << i;
    EXPECT_EQ(sa.amax_history, sb.amax_history) << qa[i].layer << " " << i;
  }
}

inline void ExpectSameQuantizerState(layers::Module& a, layers::Module& b) {
  ExpectSameQuantizerState(a.Quantizers(), b.Quantizers());
}

// INT32 [n] tensor of cumulative sequence lengths (side inputs cu_seqlens_*).
inline Tensor CuSeqlens(const std::vector<int32_t>& cu) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(cu.size())}).value();
  for (size_t i = 0; i < cu.size(); ++i) t.data<int32_t>()[i] = cu[i];
  return t;
}

// ||got - want|| / ||want|| over FP32 tensors of equal size.
// The unit roundoff of a 16-bit dtype: 2^-8 for BFLOAT16, 2^-11 for FLOAT16.
inline double UnitRoundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// Per parameter (same order): ||got.grad - want.grad|| / max(||want.grad||, r sqrt(n)),
// r the RMS over every gradient entry of `want`: a gradient that vanishes analytically
// is judged against the size a typical gradient of its n entries has.
inline std::vector<double> GradientErrors(const std::vector<layers::Parameter*>& got,
                                          const std::vector<layers::Parameter*>& want) {
  double all = 0.0;
  int64_t entries = 0;
  for (const layers::Parameter* p : want) {
    for (float v : p->grad.floats()) all += static_cast<double>(v) * v;
    entries += p->grad.numel();
  }
  const double rms = std::sqrt(all / std::max<int64_t>(entries, 1));
  std::vector<double> errors;
  for (size_t i = 0; i < want.size(); ++i) {
    double diff = 0.0, norm = 0.0;
    for (int64_t j = 0; j < want[i]->grad.numel(); ++j) {
      diff += std::pow(static_cast<double>(got[i]->grad.floats()[j]) - want[i]->grad.floats()[j], 2);
      norm += std::pow(static_cast<double>(want[i]->grad.floats()[j]), 2);
    }
    const double floor = rms * std::sqrt(static_cast<double>(want[i]->grad.numel()));
    errors.push_back(std::sqrt(diff) / std::max(std::sqrt(norm), floor));
  }
  return errors;
}

inline double RelativeError(const Tensor& got, const Tensor& want) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    num += std::pow(static_cast<double>(got.floats()[i]) - want.floats()[i], 2);
    den += std::pow(static_cast<double>(want.floats()[i]), 2);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// A 16-bit module against the FP32 one with the same masters, on an FP32 input of
// `shape` (random, seed `seed`) and a gradient of std 0.1 (seed + 1): the output has
// `dtype`, the input gradient comes back FP32 (the input's dtype), and both are within
// forward_units / backward_units of `dtype`'s unit roundoff of the FP32 module's.
inline void ExpectNearFloat32Module(layers::Module& low, layers::Module& full, const Shape& shape, uint64_t seed,
                                   DType dtype, double forward_units, double backward_units) {
  const Context cpu = Context::Cpu();
  auto random = [&shape](uint64_t s, float std) {
    Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
    layers::FillNormal(s, std, t.mutable_floats());
    return t;
  };
  const Tensor x = random(seed, 1.0f);
  auto y_low = low.Forward(cpu, {x}, layers::ForwardOptions());
  auto y_full = full.Forward(cpu, {x}, layers::ForwardOptions());
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs[0].dtype(), dtype);
  const double u = UnitRoundoff(dtype);
  const Tensor y32 = kernels::Convert(cpu, y_low->outputs[0], DType::kFloat32).value();
  EXPECT_LT(RelativeError(y32, y_full->outputs[0]), forward_units * u);
  const Tensor dy = random(seed + 1, 0.1f);
  auto dx_low = low.Backward(cpu, *y_low->saved, {dy});
  auto dx_full = full.Backward(cpu, *y_full->saved, {dy});
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  ASSERT_EQ((*dx_low)[0].dtype(), DType::kFloat32);
  EXPECT_LT(RelativeError((*dx_low)[0], (*dx_full)[0]), backward_units * u);
}

inline bool AllFinite(const Tensor& t) {
  for (float v : t.floats()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// A ModelSpec error case: `mutate` changes one layer's spec (type Spec) of a valid
// model; BuildStack under `recipe` must then fail with a message containing `message`.
template <typename Spec>
struct BadLayerSpec {
  std::string name;
  std::function<void(Spec*)> mutate;
  std::string message;
  recipes::Recipe recipe = recipes::Recipe();
};

template <typename Spec>
void PrintTo(const BadLayerSpec<Spec>& c, std::ostream* os) {
  *os << c.name;
}

// BuildStack(spec, recipe) fails with INVALID_ARGUMENT whose message contains `message`.
inline void ExpectSpecError(const v1::ModelSpec& spec, const recipes::Recipe& recipe, const std::string& message) {
  auto stack = layers::BuildStack(spec, recipe);
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(stack.status().message()), ::testing::HasSubstr(message));
}

}  // namespace testing_util
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_LAYER_TEST_UTIL_H_
