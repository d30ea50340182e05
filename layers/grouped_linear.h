// GroupedLinear: num_gemms independent linear maps over consecutive row groups of one
// input (TE's GroupedLinear, the expert GEMMs of a mixture of experts).
//
// Input x [..., in_features], N tokens (the product of the leading dimensions). The
// side input "m_splits" (INT64 [num_gemms], each >= 0, sum N) cuts the N rows into
// consecutive groups; group i (rows [s_i, s_i + m_i), s_i = m_0 + ... + m_{i-1}) uses
// weight i:   y[group i] = x[group i] W_i^T + b_i,   W_i [out, in], b_i [out].
// y has x's leading dimensions and out_features. With return_bias the biases are not
// added; the outputs are then {y, b_0, ..., b_{num_gemms-1}}.
//
// Each GEMM is a Linear sub-module, so every recipe quantizes it exactly as a Linear on
// that group's rows (its quantizers are named "<layer>.gemm<i>"); a group of m_i = 0
// rows runs as a Linear on an empty input. Block recipes need every m_i divisible by
// the recipe's block size (ValidateSide checks it). Parameters: "<layer>.weight<i>",
// "<layer>.bias<i>" (TE's names); weight i is initialized from DeriveSeed(seed, i).
//
// params_dtype (TE's; FLOAT32, BFLOAT16 or FLOAT16): x is converted to it once, the
// groups are cut from that copy and every GEMM is a Linear in params_dtype (x and the
// weight rounded from its FP32 master read in it, the quantizers reading the 16-bit
// rows); y and the returned biases come out in it, dx in the dtype x came in. Weights,
// biases and their gradients stay FP32.
#ifndef TESERVE_LAYERS_GROUPED_LINEAR_H_
#define TESERVE_LAYERS_GROUPED_LINEAR_H_

#include <memory>
#include <string>
#include <vector>

#include "layers/linear.h"
#include "layers/module.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

struct GroupedLinearOptions {
  int64_t num_gemms = 1;
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  bool return_bias = false;  // return the num_gemms biases instead of adding them
  float init_std = 0.023f;   // TE's default init_method: normal(0, 0.023)
  uint64_t seed = 0;
  DType params_dtype = DType::kFloat32;  // TE's params_dtype (see above)
};

class GroupedLinear : public Module {
 public:
  // INVALID_ARGUMENT naming "num_gemms" when it is < 1.
  static absl::StatusOr<std::unique_ptr<GroupedLinear>> Create(std::string name, const GroupedLinearOptions& options,
                                                               const recipes::Recipe& recipe);

  std::string kind() const override { return "GroupedLinear"; }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  // m_splits: present, INT64 [num_gemms] on the CPU, each >= 0 and a multiple of the
  // recipe's block size, summing to the token count; errors name "side_inputs.m_splits".
  absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;
  std::vector<NamedQuantizer> Quantizers() override;

 private:
  GroupedLinear(std::string name, const GroupedLinearOptions& options) : Module(std::move(name)), options_(options) {}

  // The group sizes from `side` after the checks ValidateSide documents; the sum is
  // checked only when `tokens` is not kUnknownTokens.
  static constexpr int64_t kUnknownTokens = -1;
  absl::StatusOr<std::vector<int64_t>> Splits(const SideInputs* side, int64_t tokens) const;

  GroupedLinearOptions options_;
  int64_t row_multiple_ = 1;  // group sizes must be multiples of the recipe's block size
  std::vector<std::unique_ptr<Linear>> gemms_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_GROUPED_LINEAR_H_
