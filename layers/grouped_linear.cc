#include "layers/grouped_linear.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

constexpr char kSplitsField[] = "side_inputs.m_splits";

struct GroupedSaved : public SavedActivations {
  Shape input_shape;
  DType input_dtype = DType::kFloat32;  // dx comes back in it
  std::vector<int64_t> splits;
  std::vector<std::unique_ptr<SavedActivations>> per_gemm;
};

// Rows [begin, begin + count) of the 2-D x, as a tensor of its own on x's device (a
// group's saved activations outlive the request's input).
absl::StatusOr<Tensor> SliceRows(const Context& ctx, const Tensor& x, int64_t begin, int64_t count) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.dtype(), {count, x.dim(1)}, x.device(), ctx.stream));
  if (count > 0) RETURN_IF_ERROR(kernels::CopyInto(ctx, Rows(x, begin, count), &out));
  return out;
}

// Writes the 2-D src into the rows of dst starting at `begin` (same column count).
absl::Status PasteRows(const Context& ctx, const Tensor& src, int64_t begin, Tensor* dst) {
  ASSIGN_OR_RETURN(Tensor src2d, src.As2D());
  if (src2d.dim(1) != dst->dim(1) || begin + src2d.dim(0) > dst->dim(0)) {
    return absl::InternalError(absl::StrCat("GroupedLinear: group result ", ShapeToString(src.shape()),
                                            " does not fit rows ", begin, ".. of ", ShapeToString(dst->shape())));
  }
  if (src2d.dim(0) == 0) return absl::OkStatus();
  Tensor rows = Rows(*dst, begin, src2d.dim(0));
  return kernels::CopyInto(ctx, src2d, &rows);
}

int64_t TokenCount(const Shape& shape) {
  int64_t tokens = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) tokens *= shape[i];
  return tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GroupedLinear>> GroupedLinear::Create(std::string name,
                                                                     const GroupedLinearOptions& options,
                                                                     const recipes::Recipe& recipe) {
  if (options.num_gemms < 1) return InvalidField("num_gemms", "at least 1", options.num_gemms);
  std::unique_ptr<GroupedLinear> layer(new GroupedLinear(name, options));
  layer->row_multiple_ = recipe.block_multiple();
  for (int64_t i = 0; i < options.num_gemms; ++i) {
    LinearOptions gemm;
    gemm.in_features = options.in_features;
    gemm.out_features = options.out_features;
    gemm.bias = options.bias;
    gemm.return_bias = options.return_bias;
    gemm.init_std = options.init_std;
    gemm.seed = DeriveSeed(options.seed, static_cast<uint64_t>(i));
    gemm.weight_name = absl::StrCat(name, ".weight", i);
    gemm.bias_name = absl::StrCat(name, ".bias", i);
    gemm.params_dtype = options.params_dtype;
    ASSIGN_OR_RETURN(std::unique_ptr<Linear> linear, Linear::Create(absl::StrCat(name, ".gemm", i), gemm, recipe));
    layer->gemms_.push_back(std::move(linear));
  }
  return layer;
}

absl::StatusOr<std::vector<Shape>> GroupedLinear::OutputShapes(const std::vector<Shape>& input_shapes,
                                                               absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.in_features, absl::StrCat(field, "[0]"),
                                 absl::StrCat("in_features of layer ", Quoted(name()))));
  Shape out = input_shapes[0];
  out.back() = options_.out_features;
  std::vector<Shape> shapes{out};
  if (options_.bias && options_.return_bias) {
    for (int64_t i = 0; i < options_.num_gemms; ++i) shapes.push_back({options_.out_features});
  }
  return shapes;
}

absl::StatusOr<std::vector<int64_t>> GroupedLinear::Splits(const SideInputs* side, int64_t tokens) const {
  const Tensor* splits = side == nullptr ? nullptr : side->Find("m_splits");
  const std::string layer = absl::StrCat("layer ", Quoted(name()));
  if (splits == nullptr || !splits->defined()) {
    return InvalidField(kSplitsField,
                        absl::StrCat("an INT64 tensor [", options_.num_gemms, "] (the group sizes of GroupedLinear ",
                                     layer, ")"),
                        "none");
  }
  if (splits->dtype() != DType::kInt64) {
    return InvalidField(absl::StrCat(kSplitsField, ".dtype"), "INT64", DTypeName(splits->dtype()));
  }
  if (splits->shape() != Shape{options_.num_gemms}) {
    return InvalidField(absl::StrCat(kSplitsField, ".shape"),
                        absl::StrCat("[", options_.num_gemms, "] (num_gemms of ", layer, ")"),
                        ShapeToString(splits->shape()));
  }
  if (!splits->device().is_cpu()) {
    return InvalidField(absl::StrCat(kSplitsField, ".device"), "cpu", splits->device().ToString());
  }
  std::vector<int64_t> sizes(splits->data<int64_t>(), splits->data<int64_t>() + options_.num_gemms);
  int64_t sum = 0;
  for (int64_t i = 0; i < options_.num_gemms; ++i) {
    const std::string field = absl::StrCat(kSplitsField, "[", i, "]");
    if (sizes[i] < 0) return InvalidField(field, "a group size >= 0", sizes[i]);
    if (sizes[i] % row_multiple_ != 0) {
      return InvalidField(field,
                          absl::StrCat("a multiple of ", row_multiple_, " (the recipe's block size, for ", layer, ")"),
                          sizes[i]);
    }
    if (tokens != kUnknownTokens && sizes[i] > tokens - sum) {
      return InvalidField(kSplitsField, absl::StrCat("group sizes summing to ", tokens, " (the token count of the input to ", layer, ")"),
                          absl::StrCat("more than ", tokens, " by group ", i));
    }
    sum += sizes[i];
  }
  if (tokens != kUnknownTokens && sum != tokens) {
    return InvalidField(kSplitsField,
                        absl::StrCat("group sizes summing to ", tokens, " (the token count of the input to ", layer, ")"),
                        sum);
  }
  return sizes;
}

absl::Status GroupedLinear::ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
  // Without a usable input shape there is no token count to check the sum against;
  // OutputShapes reports the shape.
  const bool has_tokens = input_shapes.size() == 1 && !input_shapes[0].empty();
  return Splits(&side, has_tokens ? TokenCount(input_shapes[0]) : kUnknownTokens).status();
}

absl::StatusOr<ForwardOutput> GroupedLinear::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                     const ForwardOptions& options) {
  std::vector<Shape> input_shapes;
  for (const Tensor& t : inputs) input_shapes.push_back(t.shape());
  RETURN_IF_ERROR(OutputShapes(input_shapes, "inputs").status());
  const DType dtype = options_.params_dtype;
  ASSIGN_OR_RETURN(Tensor x2d, inputs[0].As2D());
  // One conversion for all groups (a no-op when x comes in params_dtype).
  ASSIGN_OR_RETURN(const Tensor x, kernels::Convert(ctx, x2d, dtype));
  ASSIGN_OR_RETURN(std::vector<int64_t> splits, Splits(options.side, x.dim(0)));

  std::unique_ptr<GroupedSaved> saved;
  if (options.save_for_backward) {
    saved = std::make_unique<GroupedSaved>();
    saved->input_shape = inputs[0].shape();
    saved->input_dtype = inputs[0].dtype();
    saved->splits = splits;
  }
  ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(dtype, {x.dim(0), options_.out_features}, ctx.device, ctx.stream));
  std::vector<Tensor> biases;
  int64_t row = 0;
  for (size_t i = 0; i < gemms_.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor x_i, SliceRows(ctx, x, row, splits[i]));
    ASSIGN_OR_RETURN(ForwardOutput out_i, gemms_[i]->Forward(ctx, {x_i}, options));
    RETURN_IF_ERROR(PasteRows(ctx, out_i.outputs[0], row, &y));
    if (options_.bias && options_.return_bias) biases.push_back(std::move(out_i.outputs[1]));
    if (saved) saved->per_gemm.push_back(std::move(out_i.saved));
    row += splits[i];
  }

  Shape y_shape = inputs[0].shape();
  y_shape.back() = options_.out_features;
  ForwardOutput result;
  ASSIGN_OR_RETURN(Tensor y_full, y.Reshape(y_shape));
  result.outputs.push_back(std::move(y_full));
  for (Tensor& b : biases) result.outputs.push_back(std::move(b));
  result.saved = std::move(saved);
  return result;
}

absl::StatusOr<std::vector<Tensor>> GroupedLinear::Backward(const Context& ctx, SavedActivations& saved_base,
                                                            const std::vector<Tensor>& grad_outputs,
                                                            SideGrads* side_grads) {
  auto& saved = static_cast<GroupedSaved&>(saved_base);
  if (saved.per_gemm.size() != gemms_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GroupedLinear '", name(), "': backward without a complete forward"));
  }
  const DType dtype = options_.params_dtype;
  ASSIGN_OR_RETURN(Tensor dy2d, grad_outputs[0].As2D());
  if (TokenCount(saved.input_shape) != dy2d.dim(0)) {
    return InvalidField("grad_outputs[0].shape", absl::StrCat(TokenCount(saved.input_shape), " rows (the forward's tokens)"),
                        ShapeToString(grad_outputs[0].shape()));
  }
  // dy in params_dtype, as each group's Linear reads it; every group's dx comes back in
  // it (its input's dtype) and the whole dx goes back to x's dtype at the end.
  ASSIGN_OR_RETURN(const Tensor dy, kernels::Convert(ctx, dy2d, dtype));
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(dtype, {dy.dim(0), options_.in_features}, ctx.device, ctx.stream));
  int64_t row = 0;
  for (size_t i = 0; i < gemms_.size(); ++i) {
    std::vector<Tensor> grads_i;
    ASSIGN_OR_RETURN(Tensor dy_i, SliceRows(ctx, dy, row, saved.splits[i]));
    grads_i.push_back(std::move(dy_i));
    if (options_.bias && options_.return_bias) grads_i.push_back(grad_outputs[1 + i]);
    ASSIGN_OR_RETURN(std::vector<Tensor> dx_i, gemms_[i]->Backward(ctx, *saved.per_gemm[i], grads_i, side_grads));
    RETURN_IF_ERROR(PasteRows(ctx, dx_i[0], row, &dx));
    row += saved.splits[i];
  }
  ASSIGN_OR_RETURN(const Tensor dx_in, kernels::Convert(ctx, dx, saved.input_dtype));
  ASSIGN_OR_RETURN(Tensor dx_full, dx_in.Reshape(saved.input_shape));
  return std::vector<Tensor>{std::move(dx_full)};
}

std::vector<Parameter*> GroupedLinear::Parameters() {
  // TE's order: weight0 .. weight{n-1}, then bias0 .. bias{n-1}.
  std::vector<Parameter*> weights, biases;
  for (const auto& gemm : gemms_) {
    std::vector<Parameter*> p = gemm->Parameters();
    weights.push_back(p[0]);
    if (p.size() > 1) biases.push_back(p[1]);
  }
  weights.insert(weights.end(), biases.begin(), biases.end());
  return weights;
}

std::vector<NamedQuantizer> GroupedLinear::Quantizers() {
  std::vector<NamedQuantizer> quantizers;
  for (const auto& gemm : gemms_) {
    for (const NamedQuantizer& q : gemm->Quantizers()) quantizers.push_back(q);
  }
  return quantizers;
}

}  // namespace layers
}  // namespace teserve
