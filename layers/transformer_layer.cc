#include "layers/transformer_layer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/dropout_math.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::QkvFormat;

// Random-draw copy ids of the three bias-dropout-add sites and of the two drop path
// sites (the attention's dropout uses kernels::kDropoutCopyId = 2; quantization uses 0
// and 1).
constexpr uint32_t kSelfAttentionSite = 16;
constexpr uint32_t kInterAttentionSite = 17;
constexpr uint32_t kMlpSite = 18;
constexpr uint32_t kMlpDropPathSite = 19;
constexpr uint32_t kSelfAttentionDropPathSite = 20;

// The outputs of an attention or MLP block: out, then its bias (when the blocks have
// biases), then its layernorm output (when asked for).
struct BlockOutputs {
  Tensor out;
  Tensor bias;  // undefined without biases
  Tensor ln;    // undefined unless returned
};

BlockOutputs SplitOutputs(std::vector<Tensor>& outputs, bool has_bias, bool has_ln) {
  BlockOutputs b;
  size_t i = 0;
  b.out = std::move(outputs[i++]);
  if (has_bias) b.bias = std::move(outputs[i++]);
  if (has_ln) b.ln = std::move(outputs[i++]);
  return b;
}

// Where a bias-dropout-add draws its random numbers; inactive in inference forwards.
struct BdaRandom {
  bool active = false;
  uint64_t seed = 0;    // ctx.seed
  uint64_t stream = 0;  // per layer and forward
  float dropout = 0.0f;
  float drop_path = 0.0f;
  QkvFormat format = QkvFormat::kSbhd;
};

// A bias-dropout-add site: its dropout draw and, where drop path applies (the self
// attention and MLP residuals, as TE; not the cross attention), its drop path draw.
struct BdaSite {
  uint32_t dropout;
  std::optional<uint32_t> drop_path;
};
constexpr BdaSite kSelfAttentionBda{kSelfAttentionSite, kSelfAttentionDropPathSite};
constexpr BdaSite kInterAttentionBda{kInterAttentionSite, std::nullopt};
constexpr BdaSite kMlpBda{kMlpSite, kMlpDropPathSite};

// The draw of a bias-dropout-add site for tensors of `shape` (kernels/dropout_math.h);
// nothing is dropped in inference forwards or where both rates are 0.
kernels::ResidualDropout Draw(const BdaRandom& random, const BdaSite& site, const Shape& shape) {
  kernels::ResidualDropout d;
  if (!random.active) return d;
  d.seed = random.seed;
  d.stream = random.stream;
  d.dropout = random.dropout;
  d.drop_path = site.drop_path.has_value() ? random.drop_path : 0.0f;
  d.dropout_site = site.dropout;
  d.drop_path_site = site.drop_path.value_or(0);
  // Samples: the B dimension of sbhd [S, B, H] or bshd [B, S, H] (thd is rejected).
  d.sbhd = random.format == QkvFormat::kSbhd;
  if (shape.size() >= 3) {
    d.batch = d.sbhd ? shape[1] : shape[0];
    d.seq = d.sbhd ? shape[0] : shape[1];
  }
  return d;
}

// The glue kernels (BiasDropoutAdd, DropoutScale, AddInto, ColumnSum) take FP32 only: a
// 16-bit operand is widened (exactly), the arithmetic runs in FP32 and the result is
// rounded once to params_dtype, as TE's fused bias-dropout-add computes in FP32 and
// writes BF16. The masks depend on the shape and the seeds only, never on the dtype.

// t widened to FP32: t itself (shared) when it is FP32 already or undefined.
absl::StatusOr<Tensor> Wide(const Context& ctx, const Tensor& t) {
  if (!t.defined()) return t;
  return kernels::Convert(ctx, t, DType::kFloat32);
}

// BiasDropoutAdd on the widened h, bias and residual, rounded once to `dtype`.
absl::StatusOr<Tensor> BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                                      const kernels::ResidualDropout& draw, DType dtype) {
  ASSIGN_OR_RETURN(const Tensor h32, Wide(ctx, h));
  ASSIGN_OR_RETURN(const Tensor bias32, Wide(ctx, bias));
  ASSIGN_OR_RETURN(const Tensor residual32, Wide(ctx, residual));
  ASSIGN_OR_RETURN(const Tensor out, kernels::BiasDropoutAdd(ctx, h32, bias32, residual32, draw));
  return kernels::Convert(ctx, out, dtype);
}

// Gradients of BiasDropoutAdd for dy: dh = factors * dy (computed in FP32, rounded once
// to `dtype`) and dbias = the FP32 column sums of the unrounded product (undefined when
// `with_bias` is false); the residual's gradient is dy itself.
struct BdaGrads {
  Tensor dh;
  Tensor dbias;
};

absl::StatusOr<BdaGrads> BiasDropoutAddBackward(const Context& ctx, const Tensor& dy,
                                                const kernels::ResidualDropout& draw, bool with_bias, DType dtype) {
  BdaGrads g;
  Tensor dh;
  if (dy.dtype() == DType::kFloat32) {
    ASSIGN_OR_RETURN(dh, dy.Clone(ctx.stream));
  } else {
    ASSIGN_OR_RETURN(dh, kernels::Convert(ctx, dy, DType::kFloat32));
  }
  RETURN_IF_ERROR(kernels::DropoutScale(ctx, draw, &dh));
  if (with_bias) {
    const int64_t hidden = dy.shape().back();
    ASSIGN_OR_RETURN(g.dbias, Tensor::Empty(DType::kFloat32, {hidden}, ctx.device, ctx.stream));
    ASSIGN_OR_RETURN(Tensor rows, dh.Reshape({dh.numel() / std::max<int64_t>(hidden, 1), hidden}));
    RETURN_IF_ERROR(kernels::ColumnSum(ctx, rows, /*accumulate=*/false, &g.dbias));
  }
  ASSIGN_OR_RETURN(g.dh, kernels::Convert(ctx, dh, dtype));
  return g;
}

// a + b in FP32 (both widened), as a new FP32 tensor on ctx's device.
absl::StatusOr<Tensor> AddWide(const Context& ctx, const Tensor& a, const Tensor& b) {
  ASSIGN_OR_RETURN(const Tensor a32, Wide(ctx, a));
  ASSIGN_OR_RETURN(Tensor out, a32.Clone(ctx.stream));
  ASSIGN_OR_RETURN(const Tensor b32, Wide(ctx, b));
  RETURN_IF_ERROR(kernels::AddInto(ctx, b32, &out));
  return out;
}

// *into += x: in place for FP32 operands, else summed in FP32 and rounded once to
// into's dtype.
absl::Status Accumulate(const Context& ctx, const Tensor& x, Tensor* into) {
  if (x.dtype() == DType::kFloat32 && into->dtype() == DType::kFloat32) return kernels::AddInto(ctx, x, into);
  ASSIGN_OR_RETURN(const Tensor sum, AddWide(ctx, *into, x));
  ASSIGN_OR_RETURN(*into, kernels::Convert(ctx, sum, into->dtype()));
  return absl::OkStatus();
}

absl::Status CheckRate(float value, absl::string_view field) {
  if (!(value >= 0.0f && value < 1.0f)) return InvalidField(field, "a probability in [0, 1)", value);
  return absl::OkStatus();
}

}  // namespace

struct TransformerLayer::Saved : public SavedActivations {
  std::unique_ptr<SavedActivations> self_attention;
  std::unique_ptr<SavedActivations> inter_attention;
  std::unique_ptr<SavedActivations> mlp;
  std::unique_ptr<SavedActivations> layernorm;
  BdaRandom random;
  Shape shape;
  DType input_dtype = DType::kFloat32;  // hidden_states' (its gradient goes back in it)
};

absl::Status ValidateTransformerLayerOptions(const TransformerLayerOptions& options, absl::string_view field) {
  RETURN_IF_ERROR(CheckRate(options.hidden_dropout, absl::StrCat(field, ".hidden_dropout")));
  RETURN_IF_ERROR(CheckRate(options.drop_path_rate, absl::StrCat(field, ".drop_path_rate")));
  if (options.params_dtype != DType::kFloat32 && options.params_dtype != DType::kBFloat16 &&
      options.params_dtype != DType::kFloat16) {
    return InvalidField(absl::StrCat(field, ".params_dtype"), "FLOAT32, BFLOAT16 or FLOAT16",
                        DTypeName(options.params_dtype));
  }
  const MultiheadAttentionOptions& sa = options.self_attention;
  if (options.drop_path_rate > 0.0f && sa.qkv_format == QkvFormat::kThd) {
    return InvalidField(absl::StrCat(field, ".drop_path_rate"),
                        "0 with attn_input_format thd (drop path drops whole samples of a batch dimension)",
                        options.drop_path_rate);
  }
  if (options.mlp.hidden_size != sa.hidden_size) {
    return InvalidField(absl::StrCat(field, ".layernorm_mlp.hidden_size"),
                        absl::StrCat(sa.hidden_size, " (the attention's hidden_size)"), options.mlp.hidden_size);
  }
  if (options.mlp.bias != sa.bias) {
    return InvalidField(absl::StrCat(field, ".bias"), "the same value for the attention and MLP blocks",
                        "different values");
  }
  if (options.parallel_attention_mlp) {
    if (options.inter_attention.has_value()) {
      return InvalidField(absl::StrCat(field, ".parallel_attention_mlp"),
                          "false for layer_type decoder (parallel blocks have no cross attention)", "true");
    }
    if (options.apply_residual_connection_post_layernorm) {
      return InvalidField(absl::StrCat(field, ".apply_residual_connection_post_layernorm"),
                          "false with parallel_attention_mlp (the two blocks normalize separately)", "true");
    }
  }
  if (options.inter_attention.has_value()) {
    const MultiheadAttentionOptions& ca = *options.inter_attention;
    if (ca.attention_type != AttentionType::kCross || ca.hidden_size != sa.hidden_size ||
        ca.qkv_format != sa.qkv_format) {
      return InvalidField(absl::StrCat(field, ".inter_attention"),
                          "cross attention with the self attention's hidden_size and format", "other options");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TransformerLayer>> TransformerLayer::Create(std::string name,
                                                                           const TransformerLayerOptions& options,
                                                                           const recipes::Recipe& recipe) {
  RETURN_IF_ERROR(ValidateTransformerLayerOptions(options, "options"));
  std::unique_ptr<TransformerLayer> layer(new TransformerLayer(name, options));

  MultiheadAttentionOptions sa = options.self_attention;
  sa.attention_type = AttentionType::kSelf;
  sa.input_layernorm = !options.output_layernorm;
  sa.return_bias = sa.bias;
  sa.return_layernorm_output = layer->post_ln_attention();
  sa.seed = DeriveSeed(options.seed, 1);
  sa.params_dtype = options.params_dtype;
  ASSIGN_OR_RETURN(layer->self_attention_,
                   MultiheadAttention::Create(absl::StrCat(name, ".self_attention"), sa, recipe));

  if (options.inter_attention.has_value()) {
    MultiheadAttentionOptions ca = *options.inter_attention;
    ca.input_layernorm = true;
    ca.return_bias = ca.bias;
    ca.return_layernorm_output = options.apply_residual_connection_post_layernorm;
    ca.seed = DeriveSeed(options.seed, 2);
    ca.params_dtype = options.params_dtype;
    ASSIGN_OR_RETURN(layer->inter_attention_,
                     MultiheadAttention::Create(absl::StrCat(name, ".inter_attention"), ca, recipe));
  }

  LayerNormMLPOptions mlp = options.mlp;
  mlp.return_bias = mlp.bias;
  mlp.return_layernorm_output = options.apply_residual_connection_post_layernorm;
  mlp.seed = DeriveSeed(options.seed, 3);
  mlp.params_dtype = options.params_dtype;
  ASSIGN_OR_RETURN(layer->layernorm_mlp_, LayerNormMLP::Create(absl::StrCat(name, ".layernorm_mlp"), mlp, recipe));

  if (options.output_layernorm) {
    NormOptions norm;
    norm.kind = options.mlp.normalization;
    norm.hidden_size = options.mlp.hidden_size;
    norm.eps = options.mlp.eps;
    norm.zero_centered_gamma = options.mlp.zero_centered_gamma;
    norm.params_dtype = options.params_dtype;
    ASSIGN_OR_RETURN(layer->layernorm_, Normalization::Create(absl::StrCat(name, ".layernorm"), norm));
  }
  return layer;
}

absl::StatusOr<std::vector<Shape>> TransformerLayer::OutputShapes(const std::vector<Shape>& input_shapes,
                                                                  absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  // The attention checks the layout and width; the MLP sees the same shape.
  RETURN_IF_ERROR(self_attention_->OutputShapes(input_shapes, field).status());
  RETURN_IF_ERROR(layernorm_mlp_->OutputShapes(input_shapes, field).status());
  return std::vector<Shape>{input_shapes[0]};
}

absl::Status TransformerLayer::ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
  RETURN_IF_ERROR(self_attention_->ValidateSide(side, input_shapes));
  if (inter_attention_ != nullptr) RETURN_IF_ERROR(inter_attention_->ValidateSide(side, input_shapes));
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> TransformerLayer::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                        const ForwardOptions& options) {
  const DType dtype = options_.params_dtype;
  // The residual stream travels in params_dtype (TE's), whatever dtype x came in.
  ASSIGN_OR_RETURN(const Tensor x, kernels::Convert(ctx, inputs[0], dtype));
  const bool save = options.save_for_backward;
  const bool bias = has_bias();
  const bool post_ln = options_.apply_residual_connection_post_layernorm;

  BdaRandom random;
  random.active = save && (options_.hidden_dropout > 0.0f || options_.drop_path_rate > 0.0f);
  random.seed = ctx.seed;
  random.dropout = options_.hidden_dropout;
  random.drop_path = options_.drop_path_rate;
  random.format = options_.self_attention.qkv_format;
  if (random.active) random.stream = DeriveSeed(options_.seed, dropout_calls_++);

  std::unique_ptr<Saved> saved;
  if (save) {
    saved = std::make_unique<Saved>();
    saved->random = random;
    saved->shape = x.shape();
    saved->input_dtype = inputs[0].dtype();
  }

  ASSIGN_OR_RETURN(ForwardOutput attn, self_attention_->Forward(ctx, {x}, options));
  if (save) saved->self_attention = std::move(attn.saved);
  BlockOutputs a = SplitOutputs(attn.outputs, bias, post_ln_attention());

  Tensor out;
  if (options_.parallel_attention_mlp) {
    RETURN_IF_ERROR(CheckInterruption(ctx, "forward", layernorm_mlp_->name()));
    ASSIGN_OR_RETURN(ForwardOutput mlp, layernorm_mlp_->Forward(ctx, {x}, options));
    if (save) saved->mlp = std::move(mlp.saved);
    BlockOutputs m = SplitOutputs(mlp.outputs, bias, false);
    // The blocks' sums in FP32, so the output is rounded once.
    ASSIGN_OR_RETURN(const Tensor sum, AddWide(ctx, a.out, m.out));
    Tensor bias_sum;
    if (bias) {
      ASSIGN_OR_RETURN(bias_sum, AddWide(ctx, a.bias, m.bias));
    }
    ASSIGN_OR_RETURN(out, BiasDropoutAdd(ctx, sum, bias_sum, x, Draw(random, kMlpBda, x.shape()), dtype));
  } else {
    ASSIGN_OR_RETURN(Tensor h, BiasDropoutAdd(ctx, a.out, a.bias, post_ln_attention() ? a.ln : x,
                                              Draw(random, kSelfAttentionBda, x.shape()), dtype));
    if (inter_attention_ != nullptr) {
      RETURN_IF_ERROR(CheckInterruption(ctx, "forward", inter_attention_->name()));
      ASSIGN_OR_RETURN(ForwardOutput cross, inter_attention_->Forward(ctx, {h}, options));
      if (save) saved->inter_attention = std::move(cross.saved);
      BlockOutputs c = SplitOutputs(cross.outputs, bias, post_ln);
      ASSIGN_OR_RETURN(h, BiasDropoutAdd(ctx, c.out, c.bias, post_ln ? c.ln : h,
                                         Draw(random, kInterAttentionBda, x.shape()), dtype));
    }
    RETURN_IF_ERROR(CheckInterruption(ctx, "forward", layernorm_mlp_->name()));
    ASSIGN_OR_RETURN(ForwardOutput mlp, layernorm_mlp_->Forward(ctx, {h}, options));
    if (save) saved->mlp = std::move(mlp.saved);
    BlockOutputs m = SplitOutputs(mlp.outputs, bias, post_ln);
    ASSIGN_OR_RETURN(out, BiasDropoutAdd(ctx, m.out, m.bias, post_ln ? m.ln : h, Draw(random, kMlpBda, x.shape()),
                                         dtype));
  }

  if (layernorm_ != nullptr) {
    ASSIGN_OR_RETURN(ForwardOutput norm, layernorm_->Forward(ctx, {out}, options));
    if (save) saved->layernorm = std::move(norm.saved);
    out = std::move(norm.outputs[0]);
  }

  ForwardOutput result;
  result.outputs.push_back(std::move(out));
  result.saved = std::move(saved);
  return result;
}

absl::StatusOr<std::vector<Tensor>> TransformerLayer::Backward(const Context& ctx, SavedActivations& saved_base,
                                                               const std::vector<Tensor>& grad_outputs,
                                                               SideGrads* side_grads) {
  auto& saved = static_cast<Saved&>(saved_base);
  const DType dtype = options_.params_dtype;
  const bool bias = has_bias();
  const bool post_ln = options_.apply_residual_connection_post_layernorm;

  // Gradients travel in params_dtype; dx goes back in hidden_states' dtype.
  ASSIGN_OR_RETURN(Tensor dy, kernels::Convert(ctx, grad_outputs[0], dtype));
  if (layernorm_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<Tensor> g, layernorm_->Backward(ctx, *saved.layernorm, {dy}, side_grads));
    dy = std::move(g[0]);
  }

  // The grad_outputs of a block: d(out), then d(bias), then d(ln) when returned.
  auto block_grads = [&](const BdaGrads& g, const Tensor* dln) {
    std::vector<Tensor> grads{g.dh};
    if (bias) grads.push_back(g.dbias);
    if (dln != nullptr) grads.push_back(*dln);
    return grads;
  };

  if (options_.parallel_attention_mlp) {
    ASSIGN_OR_RETURN(BdaGrads g,
                     BiasDropoutAddBackward(ctx, dy, Draw(saved.random, kMlpBda, saved.shape), bias, dtype));
    ASSIGN_OR_RETURN(std::vector<Tensor> dm, layernorm_mlp_->Backward(ctx, *saved.mlp, block_grads(g, nullptr),
                                                                      side_grads));
    RETURN_IF_ERROR(CheckInterruption(ctx, "backward", self_attention_->name()));
    ASSIGN_OR_RETURN(std::vector<Tensor> da, self_attention_->Backward(ctx, *saved.self_attention,
                                                                       block_grads(g, nullptr), side_grads));
    // dy + dm + da in FP32, rounded once.
    ASSIGN_OR_RETURN(Tensor dx, AddWide(ctx, dy, dm[0]));
    ASSIGN_OR_RETURN(const Tensor da32, Wide(ctx, da[0]));
    RETURN_IF_ERROR(kernels::AddInto(ctx, da32, &dx));
    ASSIGN_OR_RETURN(dx, kernels::Convert(ctx, dx, saved.input_dtype));
    return std::vector<Tensor>{std::move(dx)};
  }

  // MLP block: out = r + F (m + m_b), r = m_ln (post-LN residual) or h.
  ASSIGN_OR_RETURN(BdaGrads gm,
                   BiasDropoutAddBackward(ctx, dy, Draw(saved.random, kMlpBda, saved.shape), bias, dtype));
  ASSIGN_OR_RETURN(std::vector<Tensor> dm,
                   layernorm_mlp_->Backward(ctx, *saved.mlp, block_grads(gm, post_ln ? &dy : nullptr), side_grads));
  Tensor dh = std::move(dm[0]);
  if (!post_ln) RETURN_IF_ERROR(Accumulate(ctx, dy, &dh));

  if (inter_attention_ != nullptr) {
    RETURN_IF_ERROR(CheckInterruption(ctx, "backward", inter_attention_->name()));
    ASSIGN_OR_RETURN(BdaGrads gc, BiasDropoutAddBackward(ctx, dh, Draw(saved.random, kInterAttentionBda, saved.shape),
                                                         bias, dtype));
    ASSIGN_OR_RETURN(std::vector<Tensor> dc,
                     inter_attention_->Backward(ctx, *saved.inter_attention,
                                                block_grads(gc, post_ln ? &dh : nullptr), side_grads));
    if (!post_ln) RETURN_IF_ERROR(Accumulate(ctx, dh, &dc[0]));
    dh = std::move(dc[0]);
  }

  RETURN_IF_ERROR(CheckInterruption(ctx, "backward", self_attention_->name()));
  ASSIGN_OR_RETURN(BdaGrads ga, BiasDropoutAddBackward(ctx, dh, Draw(saved.random, kSelfAttentionBda, saved.shape),
                                                       bias, dtype));
  ASSIGN_OR_RETURN(std::vector<Tensor> da,
                   self_attention_->Backward(ctx, *saved.self_attention,
                                             block_grads(ga, post_ln_attention() ? &dh : nullptr), side_grads));
  if (!post_ln_attention()) RETURN_IF_ERROR(Accumulate(ctx, dh, &da[0]));
  ASSIGN_OR_RETURN(Tensor dx, kernels::Convert(ctx, da[0], saved.input_dtype));
  return std::vector<Tensor>{std::move(dx)};
}

void TransformerLayer::DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const {
  self_attention_->DescribeAttention(device, out);
  if (inter_attention_ != nullptr) inter_attention_->DescribeAttention(device, out);
}

std::vector<Parameter*> TransformerLayer::Parameters() {
  std::vector<Parameter*> params;
  std::vector<Module*> modules{self_attention_.get(), inter_attention_.get(), layernorm_mlp_.get(), layernorm_.get()};
  for (Module* m : modules) {
    if (m == nullptr) continue;
    for (Parameter* p : m->Parameters()) params.push_back(p);
  }
  return params;
}

std::vector<NamedQuantizer> TransformerLayer::Quantizers() {
  std::vector<NamedQuantizer> quantizers;
  std::vector<Module*> modules{self_attention_.get(), inter_attention_.get(), layernorm_mlp_.get()};
  for (Module* m : modules) {
    if (m == nullptr) continue;
    for (const NamedQuantizer& q : m->Quantizers()) quantizers.push_back(q);
  }
  return quantizers;
}

std::vector<RngCounter> TransformerLayer::RngCounters() {
  std::vector<RngCounter> counters{{name() + ".dropout_calls", &dropout_calls_}};
  for (MultiheadAttention* m : {self_attention_.get(), inter_attention_.get()}) {
    if (m == nullptr) continue;
    for (const RngCounter& c : m->RngCounters()) counters.push_back(c);
  }
  return counters;
}

}  // namespace layers
}  // namespace teserve
