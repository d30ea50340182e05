#include "layers/multihead_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/l2_norm.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::QkvFormat;

// Seed streams of the sub-modules (DeriveSeed(options.seed, stream)).
enum SeedStream : uint64_t { kQkvSeed = 1, kKeyValueSeed, kProjSeed, kAttentionSeed };

// Column offsets of every head of q, k and v (parts 0, 1, 2) in one row of a fused
// projection output of `width` columns; a part without heads is absent.
struct FusedLayout {
  int64_t width = 0;
  std::vector<int64_t> offsets[3];
};

// Self-attention [hq + 2 hkv]: interleaved [G][H/G q, k, v][D], else [q | k | v].
FusedLayout QkvLayout(int64_t heads, int64_t groups, int64_t d, bool interleaved) {
  FusedLayout layout;
  const int64_t per_group = heads / groups;
  layout.width = (heads + 2 * groups) * d;
  for (int64_t h = 0; h < heads; ++h) {
    layout.offsets[0].push_back(interleaved ? ((h / per_group) * (per_group + 2) + h % per_group) * d : h * d);
  }
  for (int64_t g = 0; g < groups; ++g) {
    layout.offsets[1].push_back(interleaved ? (g * (per_group + 2) + per_group) * d : (heads + g) * d);
    layout.offsets[2].push_back(interleaved ? (g * (per_group + 2) + per_group + 1) * d : (heads + groups + g) * d);
  }
  return layout;
}

// Cross-attention key_value [2 hkv]: interleaved [G][k, v][D], else [k | v].
FusedLayout KeyValueLayout(int64_t groups, int64_t d, bool interleaved) {
  FusedLayout layout;
  layout.width = 2 * groups * d;
  for (int64_t g = 0; g < groups; ++g) {
    layout.offsets[1].push_back(interleaved ? 2 * g * d : g * d);
    layout.offsets[2].push_back(interleaved ? (2 * g + 1) * d : (groups + g) * d);
  }
  return layout;
}

// Runs of heads whose columns are contiguous in the fused layout: (first head, count).
// The [q | k | v] layout is one run per part; the interleaved one a run per group.
std::vector<std::pair<int64_t, int64_t>> ContiguousRuns(const std::vector<int64_t>& offsets, int64_t d) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t h = 0; h < offsets.size(); ++h) {
    if (!runs.empty() && offsets[h] == offsets[runs.back().first] + runs.back().second * d) {
      ++runs.back().second;
    } else {
      runs.emplace_back(static_cast<int64_t>(h), 1);
    }
  }
  return runs;
}

// Gathers the parts of `mixed` [.., width] into [.., heads_p * D] tensors (mixed's
// dtype and device; one strided copy per run of contiguous heads).
absl::StatusOr<std::vector<Tensor>> SplitFused(const Context& ctx, const Tensor& mixed, const FusedLayout& layout,
                                               int64_t d) {
  ASSIGN_OR_RETURN(Tensor rows, mixed.As2D());
  std::vector<Tensor> parts(3);
  for (int p = 0; p < 3; ++p) {
    if (layout.offsets[p].empty()) continue;
    const int64_t heads = static_cast<int64_t>(layout.offsets[p].size());
    Shape shape = mixed.shape();
    shape.back() = heads * d;
    ASSIGN_OR_RETURN(parts[p], Tensor::Empty(mixed.dtype(), shape, ctx.device, ctx.stream));
    ASSIGN_OR_RETURN(Tensor part_rows, parts[p].As2D());
    for (const auto& [first, count] : ContiguousRuns(layout.offsets[p], d)) {
      RETURN_IF_ERROR(kernels::CopyColumns(ctx, rows, layout.offsets[p][first], &part_rows, first * d, count * d));
    }
  }
  return parts;
}

// The inverse of SplitFused: scatters the parts' gradients into one [.., width] tensor
// of `shape` (whose last dimension is the width) and `dtype`, converting a part of
// another dtype first. The parts' columns cover the width (every fused layout is a
// partition of it), so every element is written.
absl::StatusOr<Tensor> MergeFused(const Context& ctx, const std::vector<const Tensor*>& parts,
                                  const FusedLayout& layout, int64_t d, const Shape& shape, DType dtype) {
  ASSIGN_OR_RETURN(Tensor merged, Tensor::Empty(dtype, shape, ctx.device, ctx.stream));
  const int64_t rows = layout.width > 0 ? merged.numel() / layout.width : 0;
  ASSIGN_OR_RETURN(Tensor merged_rows, merged.Reshape({rows, layout.width}));
  for (int p = 0; p < 3; ++p) {
    if (layout.offsets[p].empty()) continue;
    const int64_t heads = static_cast<int64_t>(layout.offsets[p].size());
    if (parts[p]->numel() != rows * heads * d) {
      return absl::InternalError(absl::StrCat("fused projection part ", p, " has ", parts[p]->numel(),
                                              " values, expected ", rows * heads * d));
    }
    ASSIGN_OR_RETURN(const Tensor part, kernels::Convert(ctx, *parts[p], dtype));
    ASSIGN_OR_RETURN(Tensor part_rows, part.Reshape({rows, heads * d}));
    for (const auto& [first, count] : ContiguousRuns(layout.offsets[p], d)) {
      RETURN_IF_ERROR(kernels::CopyColumns(ctx, part_rows, first * d, &merged_rows, layout.offsets[p][first], count * d));
    }
  }
  return merged;
}

// The same values with the last dimension replaced by `width` (a [.., H, D] tensor as
// the [.., H * D] rows a Linear reads or returns).
absl::StatusOr<Tensor> Flatten(const Tensor& t, const Shape& leading_like, int64_t width) {
  Shape shape = leading_like;
  shape.back() = width;
  return t.Reshape(shape);
}

// `kernel` (an FP32-only kernel: RoPE, L2Normalization) run on t widened to FP32, its
// result rounded once back to t's dtype. Both conversions are no-ops for FP32 t.
template <typename Kernel>
absl::StatusOr<Tensor> InFloat32(const Context& ctx, const Tensor& t, Kernel kernel) {
  ASSIGN_OR_RETURN(const Tensor wide, kernels::Convert(ctx, t, DType::kFloat32));
  ASSIGN_OR_RETURN(const Tensor result, kernel(wide));
  return kernels::Convert(ctx, result, t.dtype());
}

kernels::RopeFormat ToRopeFormat(QkvFormat format) {
  switch (format) {
    case QkvFormat::kSbhd:
      return kernels::RopeFormat::kSbhd;
    case QkvFormat::kBshd:
      return kernels::RopeFormat::kBshd;
    case QkvFormat::kThd:
      return kernels::RopeFormat::kThd;
  }
  return kernels::RopeFormat::kSbhd;
}

// Longest sequence of valid-looking INT32 cu_seqlens (0 otherwise: the RoPE kernel
// then reports the problem), capped at `tokens`.
int64_t LongestSequence(const Tensor& cu, int64_t tokens) {
  if (!cu.defined() || cu.dtype() != DType::kInt32 || cu.rank() != 1 || !cu.device().is_cpu()) return 0;
  const int32_t* c = cu.data<int32_t>();
  int64_t longest = 0;
  for (int64_t k = 0; k + 1 < cu.dim(0); ++k) longest = std::max<int64_t>(longest, int64_t{c[k + 1]} - c[k]);
  return std::min(longest, tokens);
}

DotProductAttentionOptions AttentionOptions(const MultiheadAttentionOptions& o) {
  DotProductAttentionOptions a;
  a.num_attention_heads = o.num_attention_heads;
  a.kv_channels = HeadDim(o);
  a.num_gqa_groups = o.num_gqa_groups;
  a.attention_dropout = o.attention_dropout;
  a.qkv_format = o.qkv_format;
  a.attn_mask_type = o.attn_mask_type;
  a.window_size = o.window_size;
  a.softmax_type = o.softmax_type;
  a.checkpoint_core_attention = o.checkpoint_core_attention;
  a.attention_mask_input = o.attention_type == AttentionType::kCross ? "enc_dec_attention_mask" : "attention_mask";
  a.seed = DeriveSeed(o.seed, kAttentionSeed);
  a.activation_dtype = o.params_dtype;
  return a;
}

kernels::RotaryOptions RopeOptions(const MultiheadAttentionOptions& o) {
  kernels::RotaryOptions r;
  r.dim = HeadDim(o);
  r.interleaved = o.rotary_pos_interleaved;
  if (o.rotary.has_value()) {
    r.rotary_percent = o.rotary->rotary_percent;
    r.rotary_base = o.rotary->rotary_base;
    r.seq_len_interpolation_factor = o.rotary->seq_len_interpolation_factor;
    r.pretrained_max_position_embeddings = o.rotary->pretrained_max_position_embeddings;
  }
  return r;
}

absl::Status CheckFiniteAtLeast(float value, float low, bool inclusive, absl::string_view field) {
  if (std::isfinite(value) && (inclusive ? value >= low : value > low)) return absl::OkStatus();
  return InvalidField(field, absl::StrCat("a finite value ", inclusive ? ">= " : "> ", low), value);
}

absl::StatusOr<std::unique_ptr<Linear>> CreateProjection(const std::string& name, const MultiheadAttentionOptions& o,
                                                         int64_t out_features, SeedStream stream,
                                                         const recipes::Recipe& recipe) {
  LinearOptions l;
  l.in_features = o.hidden_size;
  l.out_features = out_features;
  l.bias = o.bias;
  l.init_std = o.init_std;
  l.seed = DeriveSeed(o.seed, stream);
  l.params_dtype = o.params_dtype;
  return Linear::Create(name, l, recipe);
}

// "<linear>.<split>_weight" (then "_bias") row blocks of a Linear's weight and bias,
// weights first (as LayerNormLinear orders its split parameters).
std::vector<Parameter> SplitViews(Linear& linear, const ParametersSplit& split) {
  std::vector<Parameter> views;
  std::vector<Parameter*> whole = linear.Parameters();  // weight, [bias]
  for (size_t which = 0; which < whole.size(); ++which) {
    int64_t begin = 0;
    for (const auto& [stem, rows] : split) {
      views.push_back(
          RowBlock(*whole[which], absl::StrCat(linear.name(), ".", stem, which == 0 ? "_weight" : "_bias"), begin, rows));
      begin += rows;
    }
  }
  return views;
}

}  // namespace

absl::StatusOr<AttentionType> ParseAttentionType(absl::string_view text, absl::string_view field) {
  if (text == "self") return AttentionType::kSelf;
  if (text == "cross") return AttentionType::kCross;
  return InvalidField(field, "one of self, cross", Quoted(text));
}

absl::StatusOr<QkNormType> ParseQkNormType(absl::string_view text, absl::string_view field) {
  if (text.empty() || text == "none") return QkNormType::kNone;
  if (text == "L2Normalization") return QkNormType::kL2Normalization;
  if (text == "RMSNorm") return QkNormType::kRmsNorm;
  if (text == "LayerNorm") return QkNormType::kLayerNorm;
  return InvalidField(field, "one of none, L2Normalization, RMSNorm, LayerNorm", Quoted(text));
}

int64_t HeadDim(const MultiheadAttentionOptions& options) {
  if (options.kv_channels > 0) return options.kv_channels;
  return options.num_attention_heads > 0 ? options.hidden_size / options.num_attention_heads : 0;
}

absl::Status ValidateMultiheadAttentionOptions(const MultiheadAttentionOptions& o, absl::string_view field) {
  auto name = [&](absl::string_view option) { return absl::StrCat(field, ".", option); };
  if (o.hidden_size < 1) return InvalidField(name("hidden_size"), ">= 1", o.hidden_size);
  if (o.num_attention_heads < 1) return InvalidField(name("num_attention_heads"), ">= 1", o.num_attention_heads);
  if (o.kv_channels < 0) {
    return InvalidField(name("kv_channels"), ">= 1 (or 0: hidden_size / num_attention_heads)", o.kv_channels);
  }
  if (o.kv_channels == 0 && o.hidden_size % o.num_attention_heads != 0) {
    return InvalidField(name("num_attention_heads"),
                        absl::StrCat("a divisor of hidden_size ", o.hidden_size,
                                     " (the head size hidden_size / num_attention_heads; or set kv_channels)"),
                        o.num_attention_heads);
  }
  RETURN_IF_ERROR(CheckFiniteAtLeast(o.layernorm_epsilon, 0.0f, false, name("layernorm_epsilon")));
  RETURN_IF_ERROR(CheckFiniteAtLeast(o.qk_norm_eps, 0.0f, false, name("qk_norm_eps")));
  RETURN_IF_ERROR(CheckFiniteAtLeast(o.init_std, 0.0f, true, name("init_std")));
  RETURN_IF_ERROR(CheckFiniteAtLeast(o.output_layer_init_std, 0.0f, true, name("output_layer_init_std")));
  if (o.params_dtype != DType::kFloat32 && o.params_dtype != DType::kBFloat16 && o.params_dtype != DType::kFloat16) {
    return InvalidField(name("params_dtype"), "FLOAT32, BFLOAT16 or FLOAT16", DTypeName(o.params_dtype));
  }
  if (o.rotary.has_value()) {
    // The rotary dimension floor(kv_channels * rotary_percent) must be even and > 0.
    RETURN_IF_ERROR(kernels::RotaryDim(RopeOptions(o), name("rotary")).status());
  }
  // Heads, GQA groups, dropout, window and the mask/format combinations, under the
  // same argument names.
  return ValidateDotProductAttentionOptions(AttentionOptions(o), field);
}

struct MultiheadAttention::QkvTensors {
  Tensor q;                 // [.., H, D]
  Tensor k;                 // [.., G, D]
  Tensor v;                 // [.., G, D]
  Tensor layernorm_output;  // input_layernorm only
};

struct MultiheadAttention::Saved : public SavedActivations {
  Shape input_shape;     // hidden_states
  Shape kv_input_shape;  // hidden_states (self) or encoder_output (cross)
  std::unique_ptr<SavedActivations> query_proj, key_value;
  std::unique_ptr<SavedActivations> q_norm, k_norm;  // RMSNorm / LayerNorm qk norm
  // L2Normalization: rows [.. * heads, D] in the activations' dtype, rsigma [..] FP32.
  Tensor q_l2_x, q_l2_rsigma, k_l2_x, k_l2_rsigma;
  Tensor freqs, cu_q, cu_kv;                         // rotary embedding (cu_* for thd)
  std::unique_ptr<SavedActivations> attention, proj;
};

absl::StatusOr<std::unique_ptr<MultiheadAttention>> MultiheadAttention::Create(std::string name,
                                                                               const MultiheadAttentionOptions& options,
                                                                               const recipes::Recipe& recipe) {
  RETURN_IF_ERROR(ValidateMultiheadAttentionOptions(options, "options"));
  std::unique_ptr<MultiheadAttention> layer(new MultiheadAttention(name, options));
  MultiheadAttentionOptions& o = layer->options_;
  if (!o.fuse_qkv_params) o.qkv_weight_interleaved = false;  // as TE
  layer->heads_ = o.num_attention_heads;
  layer->groups_ = o.num_gqa_groups > 0 ? o.num_gqa_groups : o.num_attention_heads;
  layer->head_dim_ = HeadDim(o);
  layer->rope_format_ = ToRopeFormat(o.qkv_format);
  if (o.rotary.has_value()) {
    ASSIGN_OR_RETURN(layer->rotary_dim_, kernels::RotaryDim(RopeOptions(o), "options.rotary"));
  }
  const int64_t hq = layer->heads_ * layer->head_dim_;
  const int64_t hkv = layer->groups_ * layer->head_dim_;

  // TE's parameters_split when the QKV parameters are not fused.
  ParametersSplit split;
  if (!o.fuse_qkv_params) {
    split =
        layer->cross() ? ParametersSplit{{"query", hq}} : ParametersSplit{{"query", hq}, {"key", hkv}, {"value", hkv}};
  }
  const int64_t query_width = layer->cross() ? hq : hq + 2 * hkv;
  if (o.input_layernorm) {
    LayerNormLinearOptions l;
    l.in_features = o.hidden_size;
    l.out_features = query_width;
    l.eps = o.layernorm_epsilon;
    l.bias = o.bias;
    l.normalization = o.normalization;
    l.zero_centered_gamma = o.zero_centered_gamma;
    l.return_layernorm_output = o.return_layernorm_output;
    l.parameters_split = split;
    l.init_std = o.init_std;
    l.seed = DeriveSeed(o.seed, kQkvSeed);
    l.params_dtype = o.params_dtype;
    ASSIGN_OR_RETURN(
        layer->query_proj_,
        LayerNormLinear::Create(absl::StrCat(name, layer->cross() ? ".layernorm_query" : ".layernorm_qkv"), l, recipe));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Linear> linear,
                     CreateProjection(absl::StrCat(name, layer->cross() ? ".query_layer" : ".qkv"), o, query_width,
                                      kQkvSeed, recipe));
    // TE splits the self-attention qkv; the cross-attention query_layer keeps one weight.
    if (!layer->cross()) layer->query_split_ = SplitViews(*linear, split);
    layer->query_proj_ = std::move(linear);
  }
  if (layer->cross()) {
    ASSIGN_OR_RETURN(layer->key_value_,
                     CreateProjection(absl::StrCat(name, ".key_value"), o, 2 * hkv, kKeyValueSeed, recipe));
    if (!o.fuse_qkv_params) layer->key_value_split_ = SplitViews(*layer->key_value_, {{"key", hkv}, {"value", hkv}});
  }
  if (o.qk_norm_type == QkNormType::kRmsNorm || o.qk_norm_type == QkNormType::kLayerNorm) {
    NormOptions norm;
    norm.kind = o.qk_norm_type == QkNormType::kRmsNorm ? NormKind::kRmsNorm : NormKind::kLayerNorm;
    norm.hidden_size = layer->head_dim_;
    norm.eps = o.qk_norm_eps;
    norm.params_dtype = o.params_dtype;
    ASSIGN_OR_RETURN(layer->q_norm_, Normalization::Create(absl::StrCat(name, ".q_norm"), norm));
    ASSIGN_OR_RETURN(layer->k_norm_, Normalization::Create(absl::StrCat(name, ".k_norm"), norm));
  }
  ASSIGN_OR_RETURN(layer->core_attention_,
                   DotProductAttention::Create(absl::StrCat(name, ".core_attention"), AttentionOptions(o)));
  LinearOptions proj;
  proj.in_features = hq;
  proj.out_features = o.hidden_size;
  proj.bias = o.bias;
  proj.return_bias = o.return_bias;
  proj.init_std = o.output_layer_init_std;
  proj.seed = DeriveSeed(o.seed, kProjSeed);
  proj.params_dtype = o.params_dtype;
  ASSIGN_OR_RETURN(layer->proj_, Linear::Create(absl::StrCat(name, ".proj"), proj, recipe));
  return layer;
}

Shape MultiheadAttention::HeadShape(const Shape& input_shape, int64_t heads) const {
  Shape shape = input_shape;
  shape.back() = heads;
  shape.push_back(head_dim_);
  return shape;
}

absl::StatusOr<std::vector<Shape>> MultiheadAttention::OutputShapes(const std::vector<Shape>& input_shapes,
                                                                    absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  const Shape& x = input_shapes[0];
  const bool thd = options_.qkv_format == QkvFormat::kThd;
  const size_t rank = thd ? 2 : 3;
  if (x.size() != rank) {
    const char* layout = options_.qkv_format == QkvFormat::kSbhd   ? "[S, B, hidden_size]"
                         : options_.qkv_format == QkvFormat::kBshd ? "[B, S, hidden_size]"
                                                                   : "[T, hidden_size]";
    return InvalidField(
        absl::StrCat(field, "[0].shape"),
        absl::StrCat(layout, " (qkv_format ", kernels::QkvFormatName(options_.qkv_format), " of layer ", Quoted(name()), ")"),
        ShapeToString(x));
  }
  RETURN_IF_ERROR(ExpectFeatures(x, options_.hidden_size, absl::StrCat(field, "[0]"),
                                 absl::StrCat("hidden_size of layer ", Quoted(name()))));
  // The token-count divisibility of block recipes (the same for every projection of x).
  RETURN_IF_ERROR(query_proj_->OutputShapes({x}, field).status());
  std::vector<Shape> shapes{x};
  if (options_.bias && options_.return_bias) shapes.push_back({options_.hidden_size});
  if (returns_layernorm_output()) shapes.push_back(x);
  return shapes;
}

absl::StatusOr<Shape> MultiheadAttention::EncoderShape(const SideInputs* side, const Shape& input_shape) const {
  constexpr absl::string_view kField = "side_inputs.encoder_output";
  const Tensor* enc = side != nullptr ? side->Find("encoder_output") : nullptr;
  const bool thd = options_.qkv_format == QkvFormat::kThd;
  const std::string layout = absl::StrCat(options_.qkv_format == QkvFormat::kSbhd   ? "[S_kv, B, "
                                          : options_.qkv_format == QkvFormat::kBshd ? "[B, S_kv, "
                                                                                    : "[T_kv, ",
                                          options_.hidden_size, "]", thd ? "" : " with the batch size of hidden_states",
                                          " (cross-attention of layer ", Quoted(name()), ")");
  if (enc == nullptr) return InvalidField(kField, absl::StrCat("an FP32 tensor ", layout), "none");
  if (enc->dtype() != DType::kFloat32) {
    return InvalidField(absl::StrCat(kField, ".dtype"), "FLOAT32", DTypeName(enc->dtype()));
  }
  const Shape& e = enc->shape();
  const int batch_dim = options_.qkv_format == QkvFormat::kBshd ? 0 : 1;
  const bool ok = e.size() == input_shape.size() && e.back() == options_.hidden_size &&
                  (thd || e[batch_dim] == input_shape[batch_dim]);
  if (!ok) return InvalidField(absl::StrCat(kField, ".shape"), layout, ShapeToString(e));
  return e;
}

absl::Status MultiheadAttention::ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
  RETURN_IF_ERROR(OutputShapes(input_shapes, "inputs").status());
  const Shape& x = input_shapes[0];
  Shape kv = x;
  if (cross()) {
    ASSIGN_OR_RETURN(kv, EncoderShape(&side, x));
    RETURN_IF_ERROR(key_value_->OutputShapes({kv}, "side_inputs.encoder_output").status());
  }
  return core_attention_->ValidateSide(side, {HeadShape(x, heads_), HeadShape(kv, groups_), HeadShape(kv, groups_)});
}

absl::StatusOr<MultiheadAttention::QkvTensors> MultiheadAttention::Project(const Context& ctx, const Tensor& x,
                                                                           const Tensor* encoder_output, bool save,
                                                                           Saved* saved) {
  ForwardOptions sub;
  sub.save_for_backward = save;
  QkvTensors out;
  ASSIGN_OR_RETURN(ForwardOutput first, query_proj_->Forward(ctx, {x}, sub));
  if (returns_layernorm_output()) out.layernorm_output = first.outputs.back();
  if (save) saved->query_proj = std::move(first.saved);
  const Tensor& mixed = first.outputs[0];
  if (!cross()) {
    ASSIGN_OR_RETURN(
        std::vector<Tensor> parts,
        SplitFused(ctx, mixed, QkvLayout(heads_, groups_, head_dim_, options_.qkv_weight_interleaved), head_dim_));
    ASSIGN_OR_RETURN(out.q, parts[0].Reshape(HeadShape(x.shape(), heads_)));
    ASSIGN_OR_RETURN(out.k, parts[1].Reshape(HeadShape(x.shape(), groups_)));
    ASSIGN_OR_RETURN(out.v, parts[2].Reshape(HeadShape(x.shape(), groups_)));
    return out;
  }
  ASSIGN_OR_RETURN(out.q, mixed.Reshape(HeadShape(x.shape(), heads_)));
  ASSIGN_OR_RETURN(const Tensor encoder, OnDevice(ctx, *encoder_output));
  ASSIGN_OR_RETURN(ForwardOutput kv, key_value_->Forward(ctx, {encoder}, sub));
  if (save) saved->key_value = std::move(kv.saved);
  ASSIGN_OR_RETURN(
      std::vector<Tensor> parts,
      SplitFused(ctx, kv.outputs[0], KeyValueLayout(groups_, head_dim_, options_.qkv_weight_interleaved), head_dim_));
  ASSIGN_OR_RETURN(out.k, parts[1].Reshape(HeadShape(encoder_output->shape(), groups_)));
  ASSIGN_OR_RETURN(out.v, parts[2].Reshape(HeadShape(encoder_output->shape(), groups_)));
  return out;
}

absl::Status MultiheadAttention::NormalizeQk(const Context& ctx, bool save, Saved* saved, Tensor* q, Tensor* k) {
  if (options_.qk_norm_type == QkNormType::kNone) return absl::OkStatus();
  if (options_.qk_norm_type == QkNormType::kL2Normalization) {
    for (auto [t, keep_x, keep_rsigma] :
         {std::make_tuple(q, save ? &saved->q_l2_x : nullptr, save ? &saved->q_l2_rsigma : nullptr),
          std::make_tuple(k, save ? &saved->k_l2_x : nullptr, save ? &saved->k_l2_rsigma : nullptr)}) {
      ASSIGN_OR_RETURN(Tensor rows, t->As2D());  // [tokens * heads, D]
      // The FP32 kernel on the widened rows; y rounded back to the activations' dtype.
      // The rows are kept in their own dtype (the backward widens them again, exactly).
      ASSIGN_OR_RETURN(const Tensor wide, kernels::Convert(ctx, rows, DType::kFloat32));
      ASSIGN_OR_RETURN(kernels::L2NormForwardOutputs result,
                       kernels::L2NormalizationForward(ctx, wide, options_.qk_norm_eps));
      ASSIGN_OR_RETURN(const Tensor y_rows, kernels::Convert(ctx, result.y, t->dtype()));
      ASSIGN_OR_RETURN(Tensor y, y_rows.Reshape(t->shape()));
      if (keep_x != nullptr) {
        *keep_x = rows;
        *keep_rsigma = std::move(result.rsigma);
      }
      *t = std::move(y);
    }
    return absl::OkStatus();
  }
  ForwardOptions sub;
  sub.save_for_backward = save;
  ASSIGN_OR_RETURN(ForwardOutput qn, q_norm_->Forward(ctx, {*q}, sub));
  ASSIGN_OR_RETURN(ForwardOutput kn, k_norm_->Forward(ctx, {*k}, sub));
  *q = qn.outputs[0];
  *k = kn.outputs[0];
  if (save) {
    saved->q_norm = std::move(qn.saved);
    saved->k_norm = std::move(kn.saved);
  }
  return absl::OkStatus();
}

absl::Status MultiheadAttention::NormalizeQkBackward(const Context& ctx, Saved& saved, Tensor* dq, Tensor* dk) {
  if (options_.qk_norm_type == QkNormType::kNone) return absl::OkStatus();
  if (options_.qk_norm_type == QkNormType::kL2Normalization) {
    for (auto [d, x, rsigma] : {std::make_tuple(dq, &saved.q_l2_x, &saved.q_l2_rsigma),
                                std::make_tuple(dk, &saved.k_l2_x, &saved.k_l2_rsigma)}) {
      ASSIGN_OR_RETURN(Tensor rows, d->Reshape(x->shape()));
      ASSIGN_OR_RETURN(const Tensor dy_wide, kernels::Convert(ctx, rows, DType::kFloat32));
      ASSIGN_OR_RETURN(const Tensor x_wide, kernels::Convert(ctx, *x, DType::kFloat32));
      ASSIGN_OR_RETURN(const Tensor dx_wide, kernels::L2NormalizationBackward(ctx, dy_wide, x_wide, *rsigma));
      ASSIGN_OR_RETURN(const Tensor dx, kernels::Convert(ctx, dx_wide, d->dtype()));
      ASSIGN_OR_RETURN(*d, dx.Reshape(d->shape()));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<Tensor> gq, q_norm_->Backward(ctx, *saved.q_norm, {*dq}));
  ASSIGN_OR_RETURN(std::vector<Tensor> gk, k_norm_->Backward(ctx, *saved.k_norm, {*dk}));
  *dq = gq[0];
  *dk = gk[0];
  return absl::OkStatus();
}

absl::Status MultiheadAttention::Rotate(const Context& ctx, const SideInputs* side, bool save, Saved* saved, Tensor* q,
                                        Tensor* k) {
  if (rotary_dim_ == 0) return absl::OkStatus();
  auto find = [&](absl::string_view padded, absl::string_view plain) {
    const Tensor* t = side != nullptr ? side->Find(padded) : nullptr;
    if (t == nullptr && side != nullptr) t = side->Find(plain);
    return t != nullptr ? *t : Tensor();
  };
  Tensor cu_q, cu_kv;
  int64_t positions = 0;
  if (rope_format_ == kernels::RopeFormat::kThd) {
    cu_q = find("cu_seqlens_q_padded", "cu_seqlens_q");
    cu_kv = find("cu_seqlens_kv_padded", "cu_seqlens_kv");
    if (!cu_kv.defined() && !cross()) cu_kv = cu_q;
    positions = std::max(LongestSequence(cu_q, q->dim(0)), LongestSequence(cu_kv, k->dim(0)));
  } else {
    const int seq_dim = rope_format_ == kernels::RopeFormat::kSbhd ? 0 : 1;
    positions = std::max(q->dim(seq_dim), k->dim(seq_dim));
  }
  // The table is made on the host and read on ctx's device; RoPE reads cu_seqlens on
  // the host, where side inputs arrive.
  ASSIGN_OR_RETURN(Tensor host_freqs, kernels::RotaryFrequencies(RopeOptions(options_), positions));
  ASSIGN_OR_RETURN(Tensor freqs, OnDevice(ctx, host_freqs));
  const bool thd = rope_format_ == kernels::RopeFormat::kThd;
  // The FP32 kernel on widened q and k, rounded back to their dtype.
  auto rotate = [&](const Tensor& t, const Tensor* cu) {
    return InFloat32(ctx, t, [&](const Tensor& wide) {
      return kernels::RopeForward(ctx, wide, freqs, rope_format_, options_.rotary_pos_interleaved, cu);
    });
  };
  ASSIGN_OR_RETURN(*q, rotate(*q, thd ? &cu_q : nullptr));
  ASSIGN_OR_RETURN(*k, rotate(*k, thd ? &cu_kv : nullptr));
  if (save) {
    saved->freqs = std::move(freqs);
    if (thd) {
      // Copies: the caller's side inputs need not outlive the forward.
      ASSIGN_OR_RETURN(saved->cu_q, cu_q.Clone());
      ASSIGN_OR_RETURN(saved->cu_kv, cu_kv.Clone());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> MultiheadAttention::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                          const ForwardOptions& options) {
  std::vector<Shape> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  RETURN_IF_ERROR(OutputShapes(shapes, "inputs").status());
  const Tensor& x = inputs[0];
  const Tensor* encoder_output = nullptr;
  if (cross()) {
    RETURN_IF_ERROR(EncoderShape(options.side, x.shape()).status());
    encoder_output = options.side->Find("encoder_output");
  }
  const bool save = options.save_for_backward;
  std::unique_ptr<Saved> saved = save ? std::make_unique<Saved>() : nullptr;
  if (save) {
    saved->input_shape = x.shape();
    saved->kv_input_shape = cross() ? encoder_output->shape() : x.shape();
  }

  ASSIGN_OR_RETURN(QkvTensors qkv, Project(ctx, x, encoder_output, save, saved.get()));
  if (options_.qk_norm_before_rope) RETURN_IF_ERROR(NormalizeQk(ctx, save, saved.get(), &qkv.q, &qkv.k));
  RETURN_IF_ERROR(Rotate(ctx, options.side, save, saved.get(), &qkv.q, &qkv.k));
  if (!options_.qk_norm_before_rope) RETURN_IF_ERROR(NormalizeQk(ctx, save, saved.get(), &qkv.q, &qkv.k));

  ASSIGN_OR_RETURN(ForwardOutput attention, core_attention_->Forward(ctx, {qkv.q, qkv.k, qkv.v}, options));
  ForwardOptions sub;
  sub.save_for_backward = save;
  ASSIGN_OR_RETURN(ForwardOutput projected, proj_->Forward(ctx, {attention.outputs[0]}, sub));

  ForwardOutput out;
  out.outputs = std::move(projected.outputs);
  if (returns_layernorm_output()) out.outputs.push_back(qkv.layernorm_output);
  if (save) {
    saved->attention = std::move(attention.saved);
    saved->proj = std::move(projected.saved);
    out.saved = std::move(saved);
  }
  return out;
}

absl::StatusOr<Tensor> MultiheadAttention::ProjectBackward(const Context& ctx, Saved& saved, const Tensor& dq,
                                                           const Tensor& dk, const Tensor& dv,
                                                           const Tensor* dlayernorm_output, SideGrads* side_grads) {
  Tensor dmixed;
  if (!cross()) {
    const FusedLayout layout = QkvLayout(heads_, groups_, head_dim_, options_.qkv_weight_interleaved);
    Shape shape = saved.input_shape;
    shape.back() = layout.width;
    ASSIGN_OR_RETURN(dmixed, MergeFused(ctx, {&dq, &dk, &dv}, layout, head_dim_, shape, options_.params_dtype));
  } else {
    ASSIGN_OR_RETURN(dmixed, Flatten(dq, saved.input_shape, heads_ * head_dim_));
    const FusedLayout layout = KeyValueLayout(groups_, head_dim_, options_.qkv_weight_interleaved);
    Shape shape = saved.kv_input_shape;
    shape.back() = layout.width;
    ASSIGN_OR_RETURN(Tensor dkv,
                     MergeFused(ctx, {nullptr, &dk, &dv}, layout, head_dim_, shape, options_.params_dtype));
    ASSIGN_OR_RETURN(std::vector<Tensor> denc, key_value_->Backward(ctx, *saved.key_value, {dkv}));
    if (side_grads != nullptr) {
      // encoder_output is an FP32 side input, so its gradient accumulates in FP32 whatever
      // the layers' params_dtype (key_value hands dx back in its input's dtype already).
      ASSIGN_OR_RETURN(Tensor denc32, kernels::Convert(ctx, denc[0], DType::kFloat32));
      if (side_grads->encoder_output.defined()) {
        ASSIGN_OR_RETURN(side_grads->encoder_output,
                         kernels::Convert(ctx, side_grads->encoder_output, DType::kFloat32));
        RETURN_IF_ERROR(kernels::AddInto(ctx, denc32, &side_grads->encoder_output));
      } else {
        side_grads->encoder_output = std::move(denc32);
      }
    }
  }
  std::vector<Tensor> grads{std::move(dmixed)};
  if (dlayernorm_output != nullptr) grads.push_back(*dlayernorm_output);
  ASSIGN_OR_RETURN(std::vector<Tensor> dx, query_proj_->Backward(ctx, *saved.query_proj, grads));
  return dx[0];
}

absl::StatusOr<std::vector<Tensor>> MultiheadAttention::Backward(const Context& ctx, SavedActivations& saved_base,
                                                                 const std::vector<Tensor>& grad_outputs,
                                                                 SideGrads* side_grads) {
  auto& saved = static_cast<Saved&>(saved_base);
  std::vector<Tensor> proj_grads{grad_outputs[0]};
  if (options_.bias && options_.return_bias) proj_grads.push_back(grad_outputs[1]);
  ASSIGN_OR_RETURN(std::vector<Tensor> dcontext, proj_->Backward(ctx, *saved.proj, proj_grads));
  ASSIGN_OR_RETURN(std::vector<Tensor> dqkv, core_attention_->Backward(ctx, *saved.attention, {dcontext[0]}));
  Tensor dq = dqkv[0], dk = dqkv[1], dv = dqkv[2];

  if (!options_.qk_norm_before_rope) RETURN_IF_ERROR(NormalizeQkBackward(ctx, saved, &dq, &dk));
  if (rotary_dim_ > 0) {
    const bool thd = rope_format_ == kernels::RopeFormat::kThd;
    auto unrotate = [&](const Tensor& d, const Tensor* cu) {
      return InFloat32(ctx, d, [&](const Tensor& wide) {
        return kernels::RopeBackward(ctx, wide, saved.freqs, rope_format_, options_.rotary_pos_interleaved, cu);
      });
    };
    ASSIGN_OR_RETURN(dq, unrotate(dq, thd ? &saved.cu_q : nullptr));
    ASSIGN_OR_RETURN(dk, unrotate(dk, thd ? &saved.cu_kv : nullptr));
  }
  if (options_.qk_norm_before_rope) RETURN_IF_ERROR(NormalizeQkBackward(ctx, saved, &dq, &dk));

  ASSIGN_OR_RETURN(Tensor dx, ProjectBackward(ctx, saved, dq, dk, dv,
                                              returns_layernorm_output() ? &grad_outputs.back() : nullptr, side_grads));
  ASSIGN_OR_RETURN(Tensor dx_full, dx.Reshape(saved.input_shape));
  return std::vector<Tensor>{std::move(dx_full)};
}

void MultiheadAttention::DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const {
  core_attention_->DescribeAttention(device, out);
}

std::vector<Parameter*> MultiheadAttention::Parameters() {
  std::vector<Parameter*> params;
  auto add = [&](Module* module, std::vector<Parameter>& split) {
    if (module == nullptr) return;
    if (split.empty()) {
      for (Parameter* p : module->Parameters()) params.push_back(p);
    } else {
      for (Parameter& p : split) params.push_back(&p);
    }
  };
  std::vector<Parameter> none;
  add(query_proj_.get(), query_split_);
  add(key_value_.get(), key_value_split_);
  for (Module* m : std::initializer_list<Module*>{q_norm_.get(), k_norm_.get(), core_attention_.get(), proj_.get()}) {
    add(m, none);
  }
  return params;
}

std::vector<NamedQuantizer> MultiheadAttention::Quantizers() {
  std::vector<NamedQuantizer> quantizers;
  for (Module* m : std::initializer_list<Module*>{query_proj_.get(), key_value_.get(), proj_.get()}) {
    if (m == nullptr) continue;
    for (const NamedQuantizer& q : m->Quantizers()) quantizers.push_back(q);
  }
  return quantizers;
}

}  // namespace layers
}  // namespace teserve
