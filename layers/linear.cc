#include "layers/linear.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/tensor_checks.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::Copy;
using recipes::TensorRole;

// A GEMM operand as saved by the forward: either the FP32 tensor or its quantized
// copies (which is what a quantized backward must use).
struct SavedOperand {
  Tensor value;            // FP32, when not quantized
  QuantizedTensor quantized;
  bool is_quantized = false;

  // The copy a GEMM reads: rowwise [rows, cols] or columnwise [cols, rows].
  absl::StatusOr<Tensor> Read(const Context& ctx, Copy copy) const {
    if (!is_quantized) return value;
    return recipes::DequantizeCopy(ctx, quantized, copy);
  }

  // Per-tensor FP8 codes that a GEMM can read directly, with their scale_inv.
  bool IsPerTensor() const { return is_quantized && quantized.mode == ScalingMode::kPerTensor; }
  // FP8 block scaling (1x128 or 128x128 FP32 scales): also read directly, with the
  // copy's scale_inv as the quantizer made it.
  bool IsMxfp8() const { return is_quantized && quantized.mode == ScalingMode::kMxfp8_1D; }
  bool IsNvfp4() const {
    return is_quantized && (quantized.mode == ScalingMode::kNvfp4_1D || quantized.mode == ScalingMode::kNvfp4_2D);
  }
  bool IsBlockScaled() const {
    return is_quantized && (quantized.mode == ScalingMode::kBlock1D || quantized.mode == ScalingMode::kBlock2D);
  }
  kernels::GemmOperand Codes(Copy copy, bool transpose) const {
    const kernels::QuantizedCopy c = kernels::SelectCopy(quantized, copy);
    kernels::GemmOperand operand{c.data, transpose, c.scale_inv};
    if (quantized.mode == ScalingMode::kBlock1D) operand.scale_mode = kernels::GemmScaleMode::kBlock1D;
    if (quantized.mode == ScalingMode::kBlock2D) operand.scale_mode = kernels::GemmScaleMode::kBlock2D;
    if (quantized.mode == ScalingMode::kMxfp8_1D) operand.scale_mode = kernels::GemmScaleMode::kMxfp8;
    if (quantized.mode == ScalingMode::kNvfp4_1D) operand.scale_mode = kernels::GemmScaleMode::kNvfp4_1D;
    if (quantized.mode == ScalingMode::kNvfp4_2D) operand.scale_mode = kernels::GemmScaleMode::kNvfp4_2D;
    return operand;
  }
};

// The product of two NVFP4 operands' per-tensor decode scales (kernels/nvfp4.h's inv_S):
// the alpha of a GEMM that multiplies their codes times block scales.
float Nvfp4Alpha(const QuantizedTensor& a, const QuantizedTensor& b) {
  return (1.0f / a.global_encode_scale) * (1.0f / b.global_encode_scale);
}

// One GEMM of Linear, d = op(a) op(b) (+ beta d). The GEMM reads the quantized codes
// and their scales directly when
//   - both operands are per-tensor FP8 (delayed / current scaling) and the reduced
//     dimension suits the FP8 tensor cores (a multiple of 16), or
//   - both are block-scaled FP8 (the block recipe: x and dy 1D, W 2D), the GEMM accepts
//     the shapes and mode pair (kernels/gemm.h: k % 16, n % 8, m % 8 for a 1D a, not
//     2D x 2D) and the device runs block-scaled GEMMs (BlockScaledGemmSupport: the CPU
//     reference, Hopper with cuBLASLt >= 12.9). These run split accumulation, the fprop
//     included: block-scaled kernels have no fast mode;
//   - both are MXFP8, or both NVFP4, on a GPU with those GEMMs (MicroScaledGemmSupport:
//     Blackwell with cuBLASLt >= 12.8; the block scales are swizzled per GEMM, NVFP4's
//     per-tensor decode scales go into alpha) and the GEMM accepts the shapes (k % 32,
//     n % 8, m % 8; FP32 / BF16 d), also split.
// Natively on a GPU, and on the CPU reference as the decoded values, which equal the
// dequantized copies bit for bit (so CPU sessions compute exactly what the dequantized
// path below does). Otherwise the operands are read in high precision (calibration,
// unquantized sessions, MXFP8 / NVFP4 emulation, block scaling where the device or
// shapes do not suit): 16-bit values as they are when both are 16-bit, MXFP8's and
// NVFP4's dequantized values on a GPU as BF16 (exact, see below), else as FP32.
//
// With `bias` (FP32 [n], the fprop of a Linear that adds its bias), d = op(a) op(b) +
// bias. A 16-bit d takes it in the GEMM's epilogue, rounded to d's dtype (TE's 16-bit
// bias); an FP32 d gets it from AddBias after the GEMM, since cuBLASLt has no FP8
// kernel with an FP32 D and an FP32 BIAS epilogue. With `gelu_aux` as well (a 16-bit d of
// 16-bit operands: Linear::set_fprop_gelu), the epilogue is kGeluAuxBias: *gelu_aux gets
// the pre-activation op(a) op(b) + bias and d its gelu. With `bias_grad` instead (no
// bias) and `gelu_aux` (a 16-bit d of 16-bit operands: Linear::BackwardThroughGelu's
// dgrad), the epilogue is kDGeluBGrad: d = (op(a) op(b)) * gelu'(*gelu_aux) and
// *bias_grad (d's dtype, [n]) the column sums of d. With `bias_grad` alone (the wgrad of
// unquantized 16-bit operands, a = dy transposed), it is kBGradB: *bias_grad (d's dtype,
// [m]) gets the sums of op(a) over k, dy's column sums, from the GEMM's own read of dy.
absl::Status LinearGemm(const Context& ctx, const SavedOperand& a, Copy a_copy, bool transpose_a,
                        const SavedOperand& b, Copy b_copy, bool transpose_b, kernels::GemmAccumulation accumulation,
                        float beta, Tensor* d, const Tensor* bias = nullptr, Tensor* gelu_aux = nullptr,
                        Tensor* bias_grad = nullptr) {
  kernels::GemmOptions options;
  options.beta = beta;
  options.accumulation = accumulation;
  // An empty d has no row to add the bias to (and a GEMM of an empty product takes no
  // epilogue, kernels/gemm.h): a GroupedLinear group of no rows.
  if (d->numel() == 0) bias = nullptr;
  Tensor bias_d;  // the bias in d's dtype, for the epilogue
  if (bias != nullptr && d->dtype() != DType::kFloat32) {
    ASSIGN_OR_RETURN(bias_d, kernels::Convert(ctx, *bias, d->dtype()));
    options.epilogue = kernels::GemmEpilogue::kBias;
    options.bias = &bias_d;
    if (gelu_aux != nullptr) {
      options.epilogue = kernels::GemmEpilogue::kGeluAuxBias;
      options.aux = gelu_aux;
    }
  } else if (bias_grad != nullptr && gelu_aux != nullptr && bias == nullptr && d->dtype() != DType::kFloat32) {
    options.epilogue = kernels::GemmEpilogue::kDGeluBGrad;
    options.aux = gelu_aux;
    options.bias_grad = bias_grad;
  } else if (bias_grad != nullptr && gelu_aux == nullptr && bias == nullptr && !a.is_quantized && !b.is_quantized &&
             a.value.dtype() == b.value.dtype() && a.value.dtype() != DType::kFloat32 && d->numel() > 0) {
    options.epilogue = kernels::GemmEpilogue::kBGradB;
    options.bias_grad = bias_grad;
  } else if (gelu_aux != nullptr || bias_grad != nullptr) {
    return absl::InternalError(
        "LinearGemm: the gelu epilogues need a 16-bit d (and a bias in the forward only); kBGradB unquantized "
        "16-bit operands");
  }
  const bool add_bias_after = bias != nullptr && !bias_d.defined();
  auto run = [&](const kernels::GemmOperand& ga, const kernels::GemmOperand& gb, Tensor* out) -> absl::Status {
    RETURN_IF_ERROR(kernels::Gemm(ctx, ga, gb, out, options));
    if (add_bias_after) RETURN_IF_ERROR(kernels::AddBias(ctx, *bias, out));
    return absl::OkStatus();
  };
  if (a.IsPerTensor() && b.IsPerTensor()) {
    const kernels::GemmOperand ga = a.Codes(a_copy, transpose_a);
    const kernels::GemmOperand gb = b.Codes(b_copy, transpose_b);
    if (ga.data.dim(1) % 16 == 0 && gb.data.dim(1) % 16 == 0) return run(ga, gb, d);
  }
  if (a.IsBlockScaled() && b.IsBlockScaled()) {
    const kernels::GemmOperand ga = a.Codes(a_copy, transpose_a);
    const kernels::GemmOperand gb = b.Codes(b_copy, transpose_b);
    kernels::GemmOptions block_options = options;
    block_options.accumulation = kernels::GemmAccumulation::kSplit;
    if (kernels::CheckGemmArguments(ctx, ga, gb, d, block_options).ok() && kernels::BlockScaledGemmSupport(ctx).ok()) {
      options.accumulation = kernels::GemmAccumulation::kSplit;
      return run(ga, gb, d);
    }
  }
  const bool nvfp4 = a.IsNvfp4() && b.IsNvfp4();
  if (!ctx.device.is_cpu() && ((a.IsMxfp8() && b.IsMxfp8()) || nvfp4) && kernels::MicroScaledGemmSupport(ctx).ok()) {
    const kernels::GemmOperand ga = a.Codes(a_copy, transpose_a);
    const kernels::GemmOperand gb = b.Codes(b_copy, transpose_b);
    kernels::GemmOptions micro_options = options;
    micro_options.accumulation = kernels::GemmAccumulation::kSplit;
    if (nvfp4) {
      micro_options.alpha = Nvfp4Alpha(a.quantized, b.quantized);
    }
    if (kernels::CheckGemmArguments(ctx, ga, gb, d, micro_options).ok()) {
      const kernels::GemmOptions emulated_options = options;
      options = micro_options;
      const absl::Status native = run(ga, gb, d);
      // cuBLASLt without a kernel for this problem refuses it before writing d
      // (INVALID_ARGUMENT, "no algorithm"): the emulation below computes the same values.
      if (native.ok() || !absl::IsInvalidArgument(native)) return native;
      options = emulated_options;
    }
  }
  if (!ctx.device.is_cpu() && (nvfp4 || (a.IsMxfp8() && b.IsMxfp8())) && d->dtype() != DType::kFloat16) {
    // MXFP8 and NVFP4 emulated on a GPU without their block-scaled GEMMs (Hopper; NVFP4
    // everywhere, MXFP8 where the above does not apply):
    // the operands are dequantized straight to BF16 (one pass) and multiply on the BF16
    // tensor cores with FP32 accumulation, with no rounding of the values on the way:
    //   - MXFP8: an E4M3 / E5M2 code times a power of two, which BF16 holds exactly (its
    //     8 significant bits hold the code's 4 or 3, its exponent range is FP32's); only
    //     values below BF16's smallest subnormal (2^-133, a block scale near E8M0's
    //     minimum) are lost;
    //   - NVFP4: an E2M1 code (2 significant bits) times its E4M3 block scale (4) has at
    //     most 6 and lies within 2^-10 .. 2688; the per-tensor decode scales
    //     (kernels/nvfp4.h: inv_S = 1 / S, one S for both copies of a tensor) multiply
    //     the GEMM's result through alpha instead of every element.
    // The same products as the FP32 path, summed in another order: one Linear agrees with
    // the CPU reference's FP32 GEMM of the dequantized values within FP32 rounding
    // (tests/gpu/linear). A BF16 GEMM writes FP32 or BF16; an FP16 d takes the FP32 path.
    QuantizedTensor qa = a.quantized, qb = b.quantized;
    if (nvfp4) {
      options.alpha = Nvfp4Alpha(qa, qb);
      qa.global_encode_scale = 1.0f;
      qb.global_encode_scale = 1.0f;
    }
    ASSIGN_OR_RETURN(Tensor ua, recipes::DequantizeCopy(ctx, qa, a_copy, DType::kBFloat16));
    ASSIGN_OR_RETURN(Tensor ub, recipes::DequantizeCopy(ctx, qb, b_copy, DType::kBFloat16));
    return run(kernels::GemmOperand{ua, transpose_a}, kernels::GemmOperand{ub, transpose_b}, d);
  }
  ASSIGN_OR_RETURN(Tensor fa, a.Read(ctx, a_copy));
  ASSIGN_OR_RETURN(Tensor fb, b.Read(ctx, b_copy));
  if (fa.dtype() != fb.dtype()) {
    // Mixed operands (a dequantized copy against a 16-bit value) multiply in FP32.
    ASSIGN_OR_RETURN(fa, kernels::Convert(ctx, fa, DType::kFloat32));
    ASSIGN_OR_RETURN(fb, kernels::Convert(ctx, fb, DType::kFloat32));
  }
  if (fa.dtype() == DType::kFloat32 && d->dtype() != DType::kFloat32) {
    // FP32 operands give an FP32 product (the GEMM's rule): add the rounded bias in FP32
    // and round once to d's dtype, which is what the epilogue computes.
    ASSIGN_OR_RETURN(Tensor d32, Tensor::Empty(DType::kFloat32, d->shape(), ctx.device, ctx.stream));
    RETURN_IF_ERROR(kernels::Gemm(ctx, fa, transpose_a, fb, transpose_b, 1.0f, 0.0f, &d32));
    if (bias_d.defined()) {
      ASSIGN_OR_RETURN(Tensor bias32, kernels::Convert(ctx, bias_d, DType::kFloat32));
      RETURN_IF_ERROR(kernels::AddBias(ctx, bias32, &d32));
    }
    ASSIGN_OR_RETURN(*d, kernels::Convert(ctx, d32, d->dtype()));
    return absl::OkStatus();
  }
  return run(kernels::GemmOperand{fa, transpose_a}, kernels::GemmOperand{fb, transpose_b}, d);
}

struct LinearSaved : public SavedActivations {
  Shape input_shape;
  DType input_dtype = DType::kFloat32;  // dx comes back in it
  SavedOperand x;  // [N, in]
  SavedOperand w;  // [out, in]
};

// Quantizes `x` with `quantizer` when there is one into `operand` (the rowwise copy
// for the fprop, the columnwise one too when the backward will need it). Under
// calibration the quantizer only observes the amax and x stays FP32. An `immutable` x
// (a weight's compute copy) may reuse the quantizer's previous cast of it
// (Quantizer::QuantizeImmutable): a weight is cast once per update, not per forward.
absl::Status PrepareOperand(const Context& ctx, recipes::Quantizer* quantizer, bool calibrating, const Tensor& x,
                            bool save_for_backward, bool immutable, SavedOperand* saved) {
  saved->value = x;
  if (quantizer == nullptr || calibrating) {
    if (quantizer != nullptr) RETURN_IF_ERROR(quantizer->Observe(ctx, x));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(QuantizedTensor q,
                   immutable ? quantizer->QuantizeImmutable(ctx, x, /*rowwise=*/true, /*columnwise=*/save_for_backward)
                             : quantizer->Quantize(ctx, x, /*rowwise=*/true, /*columnwise=*/save_for_backward));
  saved->quantized = std::move(q);
  saved->is_quantized = true;
  return absl::OkStatus();
}

// fprop: y [N, out] = x W^T (+ bias) in `dtype`, fast accumulation. The GEMM (beta 0)
// writes every element of y, so no zero fill. With `gelu_aux`, y is the gelu of that and
// *gelu_aux (made here, [N, out] in `dtype`) the pre-activation.
absl::StatusOr<Tensor> FpropGemm(const Context& ctx, const SavedOperand& x, const SavedOperand& w, int64_t rows,
                                 int64_t out_features, DType dtype, const Tensor* bias, Tensor* gelu_aux = nullptr) {
  ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(dtype, {rows, out_features}, ctx.device, ctx.stream));
  if (gelu_aux != nullptr) {
    ASSIGN_OR_RETURN(*gelu_aux, Tensor::Empty(dtype, {rows, out_features}, ctx.device, ctx.stream));
  }
  RETURN_IF_ERROR(LinearGemm(ctx, x, Copy::kRowwise, false, w, Copy::kRowwise, true,
                             kernels::GemmAccumulation::kFast, 0.0f, &y, bias, gelu_aux));
  return y;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(std::string name, const LinearOptions& options,
                                                       const recipes::Recipe& recipe) {
  std::unique_ptr<Linear> layer(new Linear(name, options));
  ASSIGN_OR_RETURN(layer->weight_.value,
                   Tensor::Zeros(DType::kFloat32, {options.out_features, options.in_features}));
  ASSIGN_OR_RETURN(layer->weight_.grad,
                   Tensor::Zeros(DType::kFloat32, {options.out_features, options.in_features}));
  layer->weight_.name = options.weight_name.empty() ? absl::StrCat(name, ".weight") : options.weight_name;
  FillNormal(options.seed, options.init_std, layer->weight_.value.mutable_floats());
  // The GEMMs read the weight in params_dtype: a 16-bit one is kept as a compute copy
  // by the writers that maintain it (stale until the first of them runs).
  layer->weight_.compute_dtype = options.params_dtype;
  layer->weight_.grad_is_zero = true;
  if (options.bias) {
    ASSIGN_OR_RETURN(layer->bias_.value, Tensor::Zeros(DType::kFloat32, {options.out_features}));
    ASSIGN_OR_RETURN(layer->bias_.grad, Tensor::Zeros(DType::kFloat32, {options.out_features}));
    layer->bias_.name = options.bias_name.empty() ? absl::StrCat(name, ".bias") : options.bias_name;
    layer->bias_.grad_is_zero = true;
  }
  ASSIGN_OR_RETURN(layer->input_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kInput));
  ASSIGN_OR_RETURN(layer->weight_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kWeight));
  ASSIGN_OR_RETURN(layer->grad_output_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kGradOutput));
  layer->calibrating_ = recipe.calibrating;
  layer->row_multiple_ = recipe.block_multiple();
  return layer;
}

absl::StatusOr<std::vector<Shape>> Linear::OutputShapes(const std::vector<Shape>& input_shapes,
                                                        absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.in_features, absl::StrCat(field, "[0]"),
                                 absl::StrCat("in_features of layer ", Quoted(name()))));
  Shape out = input_shapes[0];
  int64_t rows = 1;  // tokens: the product of the leading dimensions
  for (size_t i = 0; i + 1 < out.size(); ++i) rows *= out[i];
  if (rows % row_multiple_ != 0) {
    return InvalidField(absl::StrCat(field, "[0].shape"),
                        absl::StrCat("a token count (product of the leading dimensions) divisible by ", row_multiple_,
                                     " (the recipe's block size, for layer ", Quoted(name()), ")"),
                        absl::StrCat(rows, " in ", ShapeToString(out)));
  }
  out.back() = options_.out_features;
  if (options_.bias && options_.return_bias) return std::vector<Shape>{out, {options_.out_features}};
  return std::vector<Shape>{out};
}

absl::StatusOr<ForwardOutput> Linear::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                              const ForwardOptions& options) {
  ASSIGN_OR_RETURN(Tensor x2d, inputs[0].As2D());
  ASSIGN_OR_RETURN(const Tensor x, kernels::Convert(ctx, x2d, options_.params_dtype));
  return ForwardFrom(ctx, x, nullptr, inputs[0].shape(), inputs[0].dtype(), options);
}

std::optional<recipes::FusedCast> Linear::PlanInputCast(int64_t rows, const ForwardOptions& options) {
  if (input_quantizer_ == nullptr || calibrating_) return std::nullopt;
  std::optional<recipes::FusedCast> cast = input_quantizer_->PlanFusedCast();
  if (cast.has_value() && cast->mode == ScalingMode::kMxfp8_1D) {
    // MXFP8's 1x32 blocks run along the copy's rows: in_features for the rowwise copy,
    // the tokens for the columnwise one. Shapes that do not divide take Forward's path
    // (and its error).
    const int64_t block = kernels::kMxfp8BlockSize;
    if (options_.in_features % block != 0 || (options.save_for_backward && rows % block != 0)) return std::nullopt;
  }
  return cast;
}

absl::StatusOr<ForwardOutput> Linear::ForwardQuantizedInput(const Context& ctx, QuantizedTensor x_q,
                                                            const Shape& input_shape, DType input_dtype,
                                                            const ForwardOptions& options) {
  if (input_quantizer_ == nullptr || !x_q.has_rowwise() || (options.save_for_backward && !x_q.has_columnwise())) {
    return absl::InternalError(absl::StrCat("Linear ", Quoted(name()),
                                            ": a quantized input needs an input quantizer and the rowwise copy "
                                            "(and the columnwise one when saving for the backward)"));
  }
  RETURN_IF_ERROR(input_quantizer_->RecordFusedCast(ctx, &x_q));
  return ForwardFrom(ctx, Tensor(), &x_q, input_shape, input_dtype, options);
}

absl::StatusOr<ForwardOutput> Linear::ForwardFrom(const Context& ctx, const Tensor& x, const QuantizedTensor* x_q,
                                                  const Shape& input_shape, DType input_dtype,
                                                  const ForwardOptions& options) {
  const DType dtype = options_.params_dtype;
  const int64_t rows = x_q != nullptr ? x_q->shape[0] : x.dim(0);
  std::unique_ptr<LinearSaved> saved;
  if (options.save_for_backward) {
    saved = std::make_unique<LinearSaved>();
    saved->input_shape = input_shape;
    saved->input_dtype = input_dtype;
  }
  ASSIGN_OR_RETURN(const Tensor w, GemmWeight(ctx));
  SavedOperand x_operand, w_operand;
  if (x_q != nullptr) {
    x_operand.quantized = *x_q;
    x_operand.is_quantized = true;
  } else {
    RETURN_IF_ERROR(PrepareOperand(ctx, input_quantizer_.get(), calibrating_, x, options.save_for_backward,
                                   /*immutable=*/false, &x_operand));
  }
  // A 16-bit weight is the compute copy (never written: its writers replace it) or a
  // conversion made just now; an FP32 one is the master itself, which the optimizer
  // writes in place.
  RETURN_IF_ERROR(PrepareOperand(ctx, weight_quantizer_.get(), calibrating_, w, options.save_for_backward,
                                 /*immutable=*/options_.params_dtype != DType::kFloat32, &w_operand));

  // Every output lives on the Context's device, ordered on its stream.
  Tensor gelu_aux;
  ASSIGN_OR_RETURN(Tensor y, FpropGemm(ctx, x_operand, w_operand, rows, options_.out_features, dtype, FpropBias(),
                                       fprop_gelu_ ? &gelu_aux : nullptr));
  if (saved) {
    // The backward reads the columnwise copies (and the FP32 tensors when unquantized).
    x_operand.quantized.rowwise_data = Tensor();
    w_operand.quantized.rowwise_data = Tensor();
    if (x_operand.is_quantized) x_operand.value = Tensor();
    if (w_operand.is_quantized) w_operand.value = Tensor();
    saved->x = std::move(x_operand);
    saved->w = std::move(w_operand);
  }

  ForwardOutput out;
  Shape y_shape = input_shape;
  y_shape.back() = options_.out_features;
  ASSIGN_OR_RETURN(Tensor y_full, y.Reshape(y_shape));
  out.outputs.push_back(std::move(y_full));
  if (fprop_gelu_) {
    ASSIGN_OR_RETURN(Tensor aux_full, gelu_aux.Reshape(y_shape));
    out.outputs.push_back(std::move(aux_full));
  }
  if (options_.bias && options_.return_bias) {
    // TE returns the bias parameter itself, in params_dtype.
    ASSIGN_OR_RETURN(Tensor bias_copy, dtype == DType::kFloat32 ? bias_.value.Clone(ctx.stream)
                                                                : kernels::Convert(ctx, bias_.value, dtype));
    out.outputs.push_back(std::move(bias_copy));
  }
  out.saved = std::move(saved);
  return out;
}

absl::StatusOr<std::vector<Tensor>> Linear::Backward(const Context& ctx, SavedActivations& saved_base,
                                                     const std::vector<Tensor>& grad_outputs,
                                                     SideGrads* side_grads) {
  return BackwardImpl(ctx, saved_base, grad_outputs, GeluBackward());
}

absl::StatusOr<Tensor> Linear::BackwardThroughGelu(const Context& ctx, SavedActivations& saved,
                                                   const std::vector<Tensor>& grad_outputs,
                                                   const Tensor& pre_activation, Tensor* pre_activation_bias_grad) {
  if (options_.params_dtype == DType::kFloat32 || grad_output_quantizer_ != nullptr ||
      weight_quantizer_ != nullptr || pre_activation.dtype() != options_.params_dtype) {
    return absl::InternalError(absl::StrCat(name(), ": the dgelu epilogue needs 16-bit params, unquantized "
                                            "operands and the pre-activation in params_dtype"));
  }
  GeluBackward gelu;
  ASSIGN_OR_RETURN(gelu.pre_activation, pre_activation.As2D());
  ASSIGN_OR_RETURN(*pre_activation_bias_grad,
                   Tensor::Empty(options_.params_dtype, {options_.in_features}, ctx.device, ctx.stream));
  gelu.bias_grad = pre_activation_bias_grad;
  ASSIGN_OR_RETURN(std::vector<Tensor> dx, BackwardImpl(ctx, saved, grad_outputs, gelu));
  return std::move(dx[0]);
}

absl::StatusOr<std::vector<Tensor>> Linear::BackwardWithBiasGrad(const Context& ctx, SavedActivations& saved,
                                                                 const std::vector<Tensor>& grad_outputs,
                                                                 const Tensor& bias_grad) {
  if (!options_.bias || options_.return_bias || grad_output_quantizer_ != nullptr) {
    return absl::InternalError(absl::StrCat(name(), ": a given bias gradient needs a bias added in the fprop and "
                                            "an unquantized dy"));
  }
  GeluBackward given;
  given.given_bias_grad = &bias_grad;
  return BackwardImpl(ctx, saved, grad_outputs, given);
}

absl::StatusOr<std::vector<Tensor>> Linear::BackwardImpl(const Context& ctx, SavedActivations& saved_base,
                                                         const std::vector<Tensor>& grad_outputs,
                                                         const GeluBackward& gelu) {
  auto& saved = static_cast<LinearSaved&>(saved_base);
  const DType dtype = options_.params_dtype;
  ASSIGN_OR_RETURN(Tensor dy2d, grad_outputs[0].As2D());
  ASSIGN_OR_RETURN(const Tensor dy, kernels::Convert(ctx, dy2d, dtype));

  // The bias gradient: from the second output's gradient when the bias was returned,
  // else the column sums of dy, fused into dy's quantization when it has one.
  Tensor dbias;  // FP32 [out] to add to bias_.grad
  const bool quantize_dy = grad_output_quantizer_ != nullptr && !calibrating_;
  if (options_.bias && options_.return_bias) {
    ASSIGN_OR_RETURN(Tensor db, grad_outputs[1].Reshape({1, options_.out_features}));
    ASSIGN_OR_RETURN(dbias, kernels::Convert(ctx, db, DType::kFloat32));
  } else if (gelu.given_bias_grad != nullptr) {
    ASSIGN_OR_RETURN(Tensor db, gelu.given_bias_grad->Reshape({1, options_.out_features}));
    ASSIGN_OR_RETURN(dbias, kernels::Convert(ctx, db, DType::kFloat32));
  }
  // Unquantized 16-bit operands: the wgrad GEMM sums dy's columns in its epilogue
  // (kBGradB, TE's BGRADB) as it reads dy, instead of a widening copy and a column sum;
  // whether it writes dW fresh or accumulates (beta 1), so the bias gradient's bits do not
  // depend on whether the weight gradient was known to be zero.
  const bool bias_in_wgrad = options_.bias && !options_.return_bias && gelu.given_bias_grad == nullptr &&
                             !quantize_dy && !saved.x.is_quantized && dy.dtype() != DType::kFloat32 &&
                             saved.x.value.dtype() == dy.dtype() && dy.dim(0) > 0;
  Tensor wgrad_dbias;  // FP32 [out], from the wgrad GEMM
  if (bias_in_wgrad) {
    ASSIGN_OR_RETURN(wgrad_dbias, Tensor::Empty(DType::kFloat32, {options_.out_features}, ctx.device, ctx.stream));
  } else if (options_.bias && !options_.return_bias && gelu.given_bias_grad == nullptr && !quantize_dy) {
    ASSIGN_OR_RETURN(Tensor dy32, kernels::Convert(ctx, dy, DType::kFloat32));
    RETURN_IF_ERROR(FillDeferredGrad(ctx, bias_));
    bias_.grad_is_zero = false;
    RETURN_IF_ERROR(kernels::ColumnSum(ctx, dy32, /*accumulate=*/true, &bias_.grad));
  }

  // dy for dgrad (rowwise [N, out]) and wgrad (columnwise [out, N] when quantized).
  SavedOperand dy_operand;
  dy_operand.value = dy;
  if (grad_output_quantizer_ != nullptr && calibrating_) {
    RETURN_IF_ERROR(grad_output_quantizer_->Observe(ctx, dy));
  } else if (quantize_dy) {
    Tensor fused_dbias;
    const bool fuse = options_.bias && !options_.return_bias;
    if (fuse) {
      ASSIGN_OR_RETURN(fused_dbias, Tensor::Empty(DType::kFloat32, {options_.out_features}, ctx.device, ctx.stream));
    }
    ASSIGN_OR_RETURN(dy_operand.quantized,
                     grad_output_quantizer_->Quantize(ctx, dy, true, true, fuse ? &fused_dbias : nullptr));
    dy_operand.is_quantized = true;
    if (fuse) {
      ASSIGN_OR_RETURN(dbias, fused_dbias.Reshape({1, options_.out_features}));
    }
  }
  if (dbias.defined()) {
    RETURN_IF_ERROR(FillDeferredGrad(ctx, bias_));
    bias_.grad_is_zero = false;
    RETURN_IF_ERROR(kernels::ColumnSum(ctx, dbias, /*accumulate=*/true, &bias_.grad));
  }

  // dgrad: dx [N, in] = dy [N, out] x W [out, in]; the columnwise W is W^T [in, out].
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(dtype, {dy.dim(0), options_.in_features}, ctx.device, ctx.stream));
  Tensor pre_activation = gelu.pre_activation;
  RETURN_IF_ERROR(LinearGemm(ctx, dy_operand, Copy::kRowwise, false, saved.w, Copy::kColumnwise,
                             saved.w.is_quantized, kernels::GemmAccumulation::kSplit, 0.0f, &dx, nullptr,
                             gelu.bias_grad != nullptr ? &pre_activation : nullptr, gelu.bias_grad));

  // wgrad: dW [out, in] += dy^T [out, N] x x [N, in]; columnwise copies are already
  // transposed ([out, N] and [in, N]). Onto a gradient known to be zero the GEMM writes
  // dW fresh (beta 0: D is not read) instead of adding to it, which also settles a
  // deferred zero fill (a beta-0 GEMM writes every element). Both give the same bits:
  // a GEMM either adds beta * D to its finished product p or, blocking over k, starts
  // its running sum from D, and starting from +0.0 changes nothing but turns a -0.0
  // element of p into +0.0 (which fresh keeps as -0.0; equal as values).
  RETURN_IF_ERROR(CheckGradIsZero(ctx, weight_));
  const float wgrad_beta = weight_.grad_is_zero ? 0.0f : 1.0f;
  weight_.grad_is_zero = false;
  weight_.grad_fill_deferred = false;
  RETURN_IF_ERROR(LinearGemm(ctx, dy_operand, Copy::kColumnwise, !dy_operand.is_quantized, saved.x,
                             Copy::kColumnwise, saved.x.is_quantized, kernels::GemmAccumulation::kSplit, wgrad_beta,
                             &weight_.grad, nullptr, nullptr, bias_in_wgrad ? &wgrad_dbias : nullptr));
  if (bias_in_wgrad) {
    RETURN_IF_ERROR(FillDeferredGrad(ctx, bias_));
    bias_.grad_is_zero = false;
    RETURN_IF_ERROR(kernels::AddInto(ctx, wgrad_dbias, &bias_.grad));
  }

  ASSIGN_OR_RETURN(Tensor dx_in, kernels::Convert(ctx, dx, saved.input_dtype));
  ASSIGN_OR_RETURN(Tensor dx_full, dx_in.Reshape(saved.input_shape));
  return std::vector<Tensor>{std::move(dx_full)};
}

// The weight the GEMMs read: the FP32 master, or its rounding to a 16-bit params_dtype
// (the valid compute copy when there is one, else converted now; the same bits).
absl::StatusOr<Tensor> Linear::GemmWeight(const Context& ctx) const { return ComputeValue(ctx, weight_); }

const Tensor* Linear::FpropBias() const {
  return options_.bias && !options_.return_bias ? &bias_.value : nullptr;
}

absl::Status Linear::set_fprop_gelu(bool on) {
  if (on && !(options_.bias && !options_.return_bias && options_.params_dtype != DType::kFloat32 &&
              input_quantizer_ == nullptr && weight_quantizer_ == nullptr)) {
    return absl::InternalError(absl::StrCat(name(), ": the gelu epilogue needs a bias added in the fprop, 16-bit "
                                            "params and unquantized operands"));
  }
  fprop_gelu_ = on;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Linear::Fprop(const Context& ctx, const Tensor& x, const QuantizedTensor* x_q,
                                     const Tensor& w, const QuantizedTensor* w_q, Tensor* gelu_aux) const {
  const DType dtype = options_.params_dtype;
  SavedOperand x_operand, w_operand;
  if (x.defined()) {
    ASSIGN_OR_RETURN(x_operand.value, kernels::Convert(ctx, x, dtype));
  }
  ASSIGN_OR_RETURN(w_operand.value, kernels::Convert(ctx, w, dtype));
  if (x_q != nullptr) {
    x_operand.quantized = *x_q;
    x_operand.is_quantized = true;
  }
  if (w_q != nullptr) {
    w_operand.quantized = *w_q;
    w_operand.is_quantized = true;
  }
  if (!x.defined() && x_q == nullptr) return absl::InternalError("Linear::Fprop: neither x nor its copies");
  const int64_t rows = x.defined() ? x.dim(0) : x_q->shape[0];
  if (fprop_gelu_ != (gelu_aux != nullptr)) {
    return absl::InternalError("Linear::Fprop: gelu_aux must be given exactly when the fprop applies gelu");
  }
  return FpropGemm(ctx, x_operand, w_operand, rows, options_.out_features, dtype, FpropBias(), gelu_aux);
}

std::vector<Parameter*> Linear::Parameters() {
  std::vector<Parameter*> params{&weight_};
  if (options_.bias) params.push_back(&bias_);
  return params;
}

std::vector<NamedQuantizer> Linear::Quantizers() {
  std::vector<NamedQuantizer> out;
  for (recipes::Quantizer* q : {input_quantizer_.get(), weight_quantizer_.get(), grad_output_quantizer_.get()}) {
    if (q != nullptr) out.push_back(NamedQuantizer{name(), q});
  }
  return out;
}

}  // namespace layers
}  // namespace teserve
