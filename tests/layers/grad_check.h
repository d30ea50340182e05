// Finite-difference gradient checks for modules (high-precision path).
//
// The scalar loss is L = sum_k w_k * y_k over every output with fixed random weights w,
// so dL/dy = w is what Backward receives. Each input element and each parameter element
// (up to `max_checks` of each, spread over the tensor) is perturbed by +-h and the
// central difference is compared with the analytic gradient.
#ifndef TESERVE_TESTS_LAYERS_GRAD_CHECK_H_
#define TESERVE_TESTS_LAYERS_GRAD_CHECK_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/init.h"
#include "layers/module.h"

namespace teserve {
namespace testing_util {

inline Tensor RandomTensor(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, std, t.mutable_floats());
  return t;
}

inline double WeightedSum(const std::vector<Tensor>& outputs, const std::vector<Tensor>& weights) {
  double total = 0.0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    absl::Span<const float> y = outputs[i].floats();
    absl::Span<const float> w = weights[i].floats();
    for (size_t k = 0; k < y.size(); ++k) total += static_cast<double>(y[k]) * w[k];
  }
  return total;
}

inline double Loss(layers::Module& module, const std::vector<Tensor>& inputs, const std::vector<Tensor>& weights) {
  layers::ForwardOptions no_save;
  no_save.save_for_backward = false;
  auto out = module.Forward(Context(), inputs, no_save);
  EXPECT_TRUE(out.ok()) << out.status();
  return WeightedSum(out->outputs, weights);
}

struct GradCheckOptions {
  float h = 1e-2f;
  double rtol = 2e-3;
  double atol = 2e-3;
  int max_checks = 48;
};

// Perturbs up to options.max_checks elements of `values` (spread over the tensor) by
// +-h, restoring each, and expects analytic[i] to match (loss(+h) - loss(-h)) / 2h
// within atol + rtol |numeric|. `what` names the tensor in failure messages.
inline void ExpectCentralDifferences(absl::Span<float> values, absl::Span<const float> analytic,
                                     const std::string& what, const GradCheckOptions& options,
                                     const std::function<double()>& loss) {
  ASSERT_EQ(values.size(), analytic.size()) << what;
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t stride = std::max<int64_t>(1, n / options.max_checks);
  for (int64_t i = 0; i < n; i += stride) {
    const float saved = values[i];
    values[i] = saved + options.h;
    const double plus = loss();
    values[i] = saved - options.h;
    const double minus = loss();
    values[i] = saved;
    const double numeric = (plus - minus) / (2.0 * options.h);
    EXPECT_NEAR(analytic[i], numeric, options.atol + options.rtol * std::fabs(numeric)) << what << "[" << i << "]";
  }
}

// Compares analytic and numerical gradients of inputs[0] and every parameter.
inline void CheckGradients(layers::Module& module, std::vector<Tensor> inputs,
                           const GradCheckOptions& options = GradCheckOptions()) {
  // Analytic gradients.
  for (layers::Parameter* p : module.Parameters()) {
    for (float& g : p->grad.mutable_floats()) g = 0.0f;
  }
  auto forward = module.Forward(Context(), inputs, layers::ForwardOptions());
  ASSERT_TRUE(forward.ok()) << forward.status();
  std::vector<Tensor> weights;
  for (size_t i = 0; i < forward->outputs.size(); ++i) {
    weights.push_back(RandomTensor(forward->outputs[i].shape(), 1000 + i));
  }
  auto grads = module.Backward(Context(), *forward->saved, weights);
  ASSERT_TRUE(grads.ok()) << grads.status();

  auto loss = [&] { return Loss(module, inputs, weights); };
  for (size_t k = 0; k < inputs.size(); ++k) {
    ExpectCentralDifferences(inputs[k].mutable_floats(), (*grads)[k].floats(), "input" + std::to_string(k), options,
                             loss);
  }
  for (layers::Parameter* p : module.Parameters()) {
    ExpectCentralDifferences(p->value.mutable_floats(), p->grad.floats(), p->name, options, loss);
  }
}

}  // namespace testing_util
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_GRAD_CHECK_H_
