#include "layers/dot_product_attention.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnBiasType;
using kernels::AttnMaskType;
using kernels::QkvFormat;
using kernels::SoftmaxType;

struct DotProductAttentionSaved : public SavedActivations {
  Tensor q, k, v;
  kernels::AttentionSideTensors side;  // softmax_offset is a copy of the forward's value
  kernels::AttentionConfig config;     // with the forward's dropout seed and stream
  Tensor out;                          // [.., H, D_v]; empty under checkpoint_core_attention
  Tensor softmax_lse;                  // empty under checkpoint_core_attention
};

int64_t ValueChannels(const DotProductAttentionOptions& o) {
  return o.kv_channels_v > 0 ? o.kv_channels_v : o.kv_channels;
}

int64_t Groups(const DotProductAttentionOptions& o) {
  return o.num_gqa_groups > 0 ? o.num_gqa_groups : o.num_attention_heads;
}

AttentionWindow ResolvedWindow(const DotProductAttentionOptions& o) {
  if (o.window_size.has_value()) return *o.window_size;
  return AttentionWindow{-1, kernels::IsCausal(o.attn_mask_type) ? 0 : -1};
}

std::string WindowText(const AttentionWindow& w) { return absl::StrCat("(", w.left, ", ", w.right, ")"); }

// The expected shape of one input, for messages: "[S_kv, B, 2, 16]".
std::string Layout(QkvFormat format, absl::string_view seq, int64_t heads, int64_t channels) {
  switch (format) {
    case QkvFormat::kSbhd: return absl::StrCat("[", seq, ", B, ", heads, ", ", channels, "]");
    case QkvFormat::kBshd: return absl::StrCat("[B, ", seq, ", ", heads, ", ", channels, "]");
    case QkvFormat::kThd: return absl::StrCat("[T", seq.substr(1), ", ", heads, ", ", channels, "]");
  }
  return "";
}

// sbhd/bshd padding mask [B, 1, 1, S] (true = padding, real tokens a prefix) -> cu_seqlens.
absl::StatusOr<Tensor> PaddingMaskToCuSeqlens(const Tensor& mask, int64_t batch, int64_t seq,
                                              absl::string_view field) {
  const Shape expected{batch, 1, 1, seq};
  if (mask.dtype() != DType::kBool) {
    return InvalidField(absl::StrCat(field, ".dtype"), "BOOL", DTypeName(mask.dtype()));
  }
  if (mask.shape() != expected || !mask.device().is_cpu()) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat(ShapeToString(expected), " (a padding mask [B, 1, 1, S], on the cpu)"),
                        absl::StrCat(ShapeToString(mask.shape()), " on ", mask.device().ToString()));
  }
  ASSIGN_OR_RETURN(Tensor cu, Tensor::Zeros(DType::kInt32, {batch + 1}));
  const uint8_t* m = mask.data<uint8_t>();
  int32_t* bounds = cu.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = 0;
    while (len < seq && m[b * seq + len] == 0) ++len;
    for (int64_t j = len; j < seq; ++j) {
      if (m[b * seq + j] == 0) {
        return InvalidField(field, "right padding (each sequence's unmasked tokens first, then only masked ones)",
                            absl::StrCat("sequence ", b, " unmasked at position ", j, " after a masked one at ", len));
      }
    }
    bounds[b + 1] = static_cast<int32_t>(bounds[b] + len);
  }
  return cu;
}

}  // namespace

absl::Status ValidateDotProductAttentionOptions(const DotProductAttentionOptions& o, absl::string_view field) {
  auto name = [&](absl::string_view option) { return absl::StrCat(field, ".", option); };
  if (o.num_attention_heads < 1) return InvalidField(name("num_attention_heads"), ">= 1", o.num_attention_heads);
  if (o.kv_channels < 1) return InvalidField(name("kv_channels"), ">= 1", o.kv_channels);
  if (o.kv_channels_v < 0) {
    return InvalidField(name("kv_channels_v"), ">= 1 (or 0: kv_channels)", o.kv_channels_v);
  }
  if (o.num_gqa_groups < 0 || (o.num_gqa_groups > 0 && o.num_attention_heads % o.num_gqa_groups != 0)) {
    return InvalidField(name("num_gqa_groups"),
                        absl::StrCat("a divisor of num_attention_heads ", o.num_attention_heads,
                                     " (or 0: num_attention_heads)"),
                        o.num_gqa_groups);
  }
  if (!(o.attention_dropout >= 0.0f && o.attention_dropout < 1.0f)) {
    return InvalidField(name("attention_dropout"), "a probability in [0, 1)", o.attention_dropout);
  }
  if (o.softmax_scale.has_value() && !(std::isfinite(*o.softmax_scale) && *o.softmax_scale > 0.0f)) {
    return InvalidField(name("softmax_scale"), "a finite value > 0", *o.softmax_scale);
  }
  const absl::string_view mask_name = kernels::AttnMaskTypeName(o.attn_mask_type);
  const AttentionWindow w = ResolvedWindow(o);
  if (w.left < -1) return InvalidField(name("window_size.left"), "-1 (unbounded) or >= 0", w.left);
  if (w.right < -1) return InvalidField(name("window_size.right"), "-1 (unbounded) or >= 0", w.right);
  if (kernels::IsCausal(o.attn_mask_type) && w.right != 0) {
    return InvalidField(name("window_size.right"),
                        absl::StrCat("0 for attn_mask_type ", mask_name, " (causal masks are windows (-1 or >= 0, 0))"),
                        w.right);
  }
  if (!kernels::IsCausal(o.attn_mask_type) && (w.left == -1) != (w.right == -1)) {
    return InvalidField(name("window_size"),
                        absl::StrCat("(-1, -1) or both sides >= 0 for attn_mask_type ", mask_name,
                                     " (a causal window needs a causal mask type)"),
                        WindowText(w));
  }
  if (o.qkv_format == QkvFormat::kThd) {
    if (!kernels::HasPadding(o.attn_mask_type)) {
      return InvalidField(name("attn_mask_type"),
                          "padding, padding_causal or padding_causal_bottom_right with qkv_format thd", mask_name);
    }
    if (o.core_attention_bias_type == AttnBiasType::kPreScaleBias ||
        o.core_attention_bias_type == AttnBiasType::kPostScaleBias) {
      return InvalidField(name("core_attention_bias_type"), "no_bias or alibi with qkv_format thd",
                          kernels::AttnBiasTypeName(o.core_attention_bias_type));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DotProductAttention>> DotProductAttention::Create(
    std::string name, const DotProductAttentionOptions& options) {
  RETURN_IF_ERROR(ValidateDotProductAttentionOptions(options, "options"));
  std::unique_ptr<DotProductAttention> layer(new DotProductAttention(name, options));
  kernels::AttentionConfig& c = layer->config_;
  c.qkv_format = options.qkv_format;
  c.mask_type = options.attn_mask_type;
  const AttentionWindow w = ResolvedWindow(options);
  c.window_left = w.left;
  c.window_right = w.right;
  c.softmax_scale = options.softmax_scale.has_value()
                        ? *options.softmax_scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(options.kv_channels)));
  c.softmax_type = options.softmax_type;
  c.bias_type = options.core_attention_bias_type;
  c.return_max_logit = options.return_max_logit;
  if (options.softmax_type == SoftmaxType::kLearnable) {
    // TE starts the learnable sink logits at zero.
    ASSIGN_OR_RETURN(layer->softmax_offset_.value, Tensor::Zeros(DType::kFloat32, {options.num_attention_heads}));
    ASSIGN_OR_RETURN(layer->softmax_offset_.grad, Tensor::Zeros(DType::kFloat32, {options.num_attention_heads}));
    layer->softmax_offset_.name = absl::StrCat(name, ".softmax_offset");
  }
  return layer;
}

absl::StatusOr<std::vector<Shape>> DotProductAttention::OutputShapes(const std::vector<Shape>& input_shapes,
                                                                     absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 3, field));
  const QkvFormat format = options_.qkv_format;
  const int64_t heads = options_.num_attention_heads;
  const int64_t groups = Groups(options_);
  const int64_t d_v = ValueChannels(options_);
  const bool thd = format == QkvFormat::kThd;
  const size_t rank = thd ? 3 : 4;
  const int head_dim = static_cast<int>(rank) - 2;
  const int batch_dim = format == QkvFormat::kBshd ? 0 : 1;  // sbhd/bshd
  const std::string layer = absl::StrCat(" (qkv_format ", kernels::QkvFormatName(format), " of layer ", Quoted(name()), ")");
  const struct {
    absl::string_view seq;
    int64_t heads;
    int64_t channels;
  } expected[3] = {{"S_q", heads, options_.kv_channels}, {"S_kv", groups, options_.kv_channels}, {"S_kv", groups, d_v}};
  for (int i = 0; i < 3; ++i) {
    const Shape& shape = input_shapes[i];
    bool ok = shape.size() == rank && shape[head_dim] == expected[i].heads && shape[head_dim + 1] == expected[i].channels;
    if (ok && i == 1 && !thd) ok = shape[batch_dim] == input_shapes[0][batch_dim];
    for (int d = 0; ok && i == 2 && d < head_dim; ++d) ok = shape[d] == input_shapes[1][d];
    if (!ok) {
      std::string want = Layout(format, expected[i].seq, expected[i].heads, expected[i].channels);
      if (i == 1 && !thd) absl::StrAppend(&want, " with the batch size of query");
      if (i == 2) absl::StrAppend(&want, " with the leading dimensions of key");
      return InvalidField(absl::StrCat(field, "[", i, "].shape"), absl::StrCat(want, layer), ShapeToString(shape));
    }
  }
  Shape out;
  if (thd) {
    out = {input_shapes[0][0], heads * d_v};
  } else {
    out = {input_shapes[0][0], input_shapes[0][1], heads * d_v};
  }
  std::vector<Shape> shapes{out};
  if (options_.return_max_logit) shapes.push_back({heads});
  return shapes;
}

absl::StatusOr<kernels::AttentionSideTensors> DotProductAttention::GatherSide(
    const SideInputs* side, const std::vector<Shape>& input_shapes) const {
  static const SideInputs kNoSide;
  const SideInputs& s = side != nullptr ? *side : kNoSide;
  auto get = [&](absl::string_view name) {
    const Tensor* t = s.Find(name);
    return t != nullptr ? *t : Tensor();
  };
  kernels::AttentionSideTensors out;
  const QkvFormat format = options_.qkv_format;
  const AttnMaskType mask_type = options_.attn_mask_type;
  const bool thd = format == QkvFormat::kThd;
  if (thd || kernels::HasPadding(mask_type)) {
    out.cu_seqlens_q = get("cu_seqlens_q");
    out.cu_seqlens_kv = get("cu_seqlens_kv");
    if (thd) {
      out.cu_seqlens_q_padded = get("cu_seqlens_q_padded");
      out.cu_seqlens_kv_padded = get("cu_seqlens_kv_padded");
    } else if (!out.cu_seqlens_q.defined() && !out.cu_seqlens_kv.defined()) {
      // A [B, 1, 1, S] padding mask stands for both sequence lengths (self-attention).
      const std::string field = absl::StrCat("side_inputs.", options_.attention_mask_input);
      const Tensor mask = get(options_.attention_mask_input);
      const int batch_dim = format == QkvFormat::kBshd ? 0 : 1;
      const int seq_dim = 1 - batch_dim;
      const int64_t s_q = input_shapes[0][seq_dim];
      const int64_t s_kv = input_shapes[1][seq_dim];
      if (!mask.defined()) {
        return InvalidField(field,
                            absl::StrCat("a BOOL padding mask [B, 1, 1, S] or side_inputs.cu_seqlens_q and "
                                         "side_inputs.cu_seqlens_kv (attn_mask_type ",
                                         kernels::AttnMaskTypeName(mask_type), ")"),
                            "neither");
      }
      if (s_q != s_kv) {
        return InvalidField(field,
                            absl::StrCat("no padding mask when S_q ", s_q, " != S_kv ", s_kv,
                                         " (a [B, 1, 1, S] mask describes self-attention; pass "
                                         "side_inputs.cu_seqlens_q and side_inputs.cu_seqlens_kv)"),
                            ShapeToString(mask.shape()));
      }
      ASSIGN_OR_RETURN(out.cu_seqlens_q, PaddingMaskToCuSeqlens(mask, input_shapes[0][batch_dim], s_q, field));
      out.cu_seqlens_kv = out.cu_seqlens_q;
    }
  }
  if (mask_type == AttnMaskType::kArbitrary) out.mask = get(options_.attention_mask_input);
  if (options_.core_attention_bias_type == AttnBiasType::kPreScaleBias ||
      options_.core_attention_bias_type == AttnBiasType::kPostScaleBias) {
    out.bias = get("core_attention_bias");
  }
  if (options_.core_attention_bias_type == AttnBiasType::kAlibi) {
    out.alibi_slopes = get("alibi_slopes");
    if (!out.alibi_slopes.defined()) {
      ASSIGN_OR_RETURN(out.alibi_slopes, Tensor::FromFloats(kernels::DefaultAlibiSlopes(options_.num_attention_heads),
                                                            {options_.num_attention_heads}));
    }
  }
  if (options_.softmax_type == SoftmaxType::kLearnable) out.softmax_offset = softmax_offset_.value;
  return out;
}

absl::Status DotProductAttention::ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
  RETURN_IF_ERROR(OutputShapes(input_shapes, "inputs").status());
  ASSIGN_OR_RETURN(kernels::AttentionSideTensors tensors, GatherSide(&side, input_shapes));
  kernels::AttentionSideNames names;
  names.cu_seqlens_q = "side_inputs.cu_seqlens_q";
  names.cu_seqlens_kv = "side_inputs.cu_seqlens_kv";
  names.mask = absl::StrCat("side_inputs.", options_.attention_mask_input);
  names.bias = "side_inputs.core_attention_bias";
  names.alibi_slopes = "side_inputs.alibi_slopes";
  names.softmax_offset = softmax_offset_.name;
  // Side inputs arrive decoded on the CPU. The learnable softmax offset is a parameter
  // that lives on the session's device; the check reads only its shape, so a host
  // stand-in of that shape takes its place.
  if (tensors.softmax_offset.defined() && !tensors.softmax_offset.device().is_cpu()) {
    ASSIGN_OR_RETURN(tensors.softmax_offset, Tensor::Zeros(DType::kFloat32, tensors.softmax_offset.shape()));
  }
  return kernels::CheckAttentionCall(Context::Cpu(), config_, input_shapes[0], input_shapes[1], input_shapes[2],
                                     tensors, names);
}

absl::StatusOr<ForwardOutput> DotProductAttention::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                           const ForwardOptions& options) {
  std::vector<Shape> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  ASSIGN_OR_RETURN(std::vector<Shape> out_shapes, OutputShapes(shapes, "inputs"));
  ASSIGN_OR_RETURN(kernels::AttentionSideTensors side, GatherSide(options.side, shapes));
  // Side inputs arrive (and the padding mask becomes cu_seqlens) on the host; the
  // attention kernels read them on ctx's device.
  for (Tensor* t : {&side.cu_seqlens_q, &side.cu_seqlens_kv, &side.cu_seqlens_q_padded, &side.cu_seqlens_kv_padded,
                    &side.mask, &side.bias, &side.alibi_slopes}) {
    ASSIGN_OR_RETURN(*t, OnDevice(ctx, *t));
  }
  kernels::AttentionConfig config = config_;
  config.alibi_default_slopes = options_.core_attention_bias_type == AttnBiasType::kAlibi &&
                                (options.side == nullptr || options.side->Find("alibi_slopes") == nullptr);
  const bool dropout = options_.attention_dropout > 0.0f && options.save_for_backward;
  if (dropout) {
    config.dropout = options_.attention_dropout;
    config.dropout_seed = ctx.seed;
    config.dropout_stream = DeriveSeed(options_.seed, dropout_calls_);
  }
  ASSIGN_OR_RETURN(kernels::AttentionForwardOutputs result,
                   kernels::AttentionForward(ctx, config, inputs[0], inputs[1], inputs[2], side));
  if (dropout) ++dropout_calls_;
  switch (result.path) {
    case kernels::AttentionPath::kCudnnFused:
      last_path_ = "cudnn_fused";
      last_reason_ = "cuDNN fused SDPA (flash attention) on the last forward";
      break;
    case kernels::AttentionPath::kCudaUnfused:
      last_path_ = "cuda_unfused";
      last_reason_ = absl::StrCat("unfused FP32 CUDA kernels on the last forward",
                                  result.unfused_reason.empty() ? "" : ": ", result.unfused_reason);
      break;
    case kernels::AttentionPath::kCpuReference:
      last_path_.clear();
      break;
  }

  ForwardOutput out;
  ASSIGN_OR_RETURN(Tensor flat, result.out.Reshape(out_shapes[0]));
  out.outputs.push_back(std::move(flat));
  if (options_.return_max_logit) {
    // Every output travels in the activations' dtype.
    if (inputs[0].dtype() != DType::kFloat32) {
      ASSIGN_OR_RETURN(result.max_logit, kernels::Convert(ctx, result.max_logit, inputs[0].dtype()));
    }
    out.outputs.push_back(result.max_logit);
  }
  if (options.save_for_backward) {
    auto saved = std::make_unique<DotProductAttentionSaved>();
    saved->q = inputs[0];
    saved->k = inputs[1];
    saved->v = inputs[2];
    if (side.softmax_offset.defined()) {
      ASSIGN_OR_RETURN(side.softmax_offset, side.softmax_offset.Clone(ctx.stream));
    }
    saved->side = std::move(side);
    saved->config = config;
    if (!options_.checkpoint_core_attention) {
      saved->out = std::move(result.out);
      saved->softmax_lse = std::move(result.softmax_lse);
    }
    out.saved = std::move(saved);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> DotProductAttention::Backward(const Context& ctx, SavedActivations& saved_base,
                                                                  const std::vector<Tensor>& grad_outputs,
                                                                  SideGrads* side_grads) {
  auto& saved = static_cast<DotProductAttentionSaved&>(saved_base);
  if (options_.checkpoint_core_attention) {
    // Recompute the forward: deterministic, so bit-identical to what was not kept.
    ASSIGN_OR_RETURN(kernels::AttentionForwardOutputs again,
                     kernels::AttentionForward(ctx, saved.config, saved.q, saved.k, saved.v, saved.side));
    saved.out = std::move(again.out);
    saved.softmax_lse = std::move(again.softmax_lse);
  }
  ASSIGN_OR_RETURN(Tensor dout, grad_outputs[0].Reshape(saved.out.shape()));
  if (dout.dtype() != saved.out.dtype()) {
    ASSIGN_OR_RETURN(dout, kernels::Convert(ctx, dout, saved.out.dtype()));
  }
  ASSIGN_OR_RETURN(kernels::AttentionBackwardOutputs grads,
                   kernels::AttentionBackward(ctx, saved.config, saved.q, saved.k, saved.v, saved.side, saved.out,
                                              saved.softmax_lse, dout));
  if (grads.path == kernels::AttentionPath::kCudaUnfused && last_path_ == "cudnn_fused") {
    // A fused forward whose backward cuDNN refused (a dbias shape, say): GetSession says so.
    last_reason_ = absl::StrCat("cuDNN fused SDPA on the last forward; its backward ran the unfused FP32 CUDA kernels",
                                grads.unfused_reason.empty() ? "" : ": ", grads.unfused_reason);
  }
  if (options_.softmax_type == SoftmaxType::kLearnable) {
    RETURN_IF_ERROR(FillDeferredGrad(ctx, softmax_offset_));
    RETURN_IF_ERROR(kernels::AddInto(ctx, grads.dsoftmax_offset, &softmax_offset_.grad));
  }
  return std::vector<Tensor>{std::move(grads.dq), std::move(grads.dk), std::move(grads.dv)};
}

kernels::AttentionConfig DotProductAttention::TrainingConfig() const {
  kernels::AttentionConfig config = config_;
  config.dropout = options_.attention_dropout;  // what a training forward runs with
  // and, for ALiBi, a call without side_inputs.alibi_slopes
  config.alibi_default_slopes = options_.core_attention_bias_type == AttnBiasType::kAlibi;
  return config;
}

void DotProductAttention::DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const {
  // The CUDA kernels' register tiles hold head sizes up to this (kernels/cuda/attention).
  constexpr int64_t kCudaMaxHeadSize = 256;
  AttentionPathInfo info;
  info.layer = name();
  const int64_t d_qk = options_.kv_channels;
  const int64_t d_v = options_.kv_channels_v > 0 ? options_.kv_channels_v : options_.kv_channels;
  if (device.is_cpu()) {
    info.path = "cpu_reference";
    info.reason = "the CPU backend's reference (scores, softmax and sums in FP64)";
  } else if (!last_path_.empty()) {
    info.path = last_path_;
    info.reason = last_reason_;
  } else if (const absl::Status fused = kernels::FusedAttentionEligible(device, TrainingConfig(),
                                                                      options_.activation_dtype, d_qk, d_v);
             fused.ok()) {
    info.path = "cudnn_fused";
    info.reason = absl::StrCat("cuDNN fused SDPA for ", DTypeName(options_.activation_dtype),
                               " q, k, v (the unfused kernels take over for a call whose shapes cuDNN refuses "
                               "or in which a query row has no key to attend)");
  } else if (d_qk > kCudaMaxHeadSize || d_v > kCudaMaxHeadSize) {
    info.path = "unavailable";
    info.reason = absl::StrCat("the CUDA attention kernels take head sizes up to ", kCudaMaxHeadSize, "; this layer has D_qk ",
                               d_qk, ", D_v ", d_v, " (its Forward answers UNIMPLEMENTED)");
  } else {
    info.path = "cuda_unfused";
    info.reason = absl::StrCat("unfused FP32 CUDA kernels (kernels/cuda/attention: every mask, bias, softmax and "
                               "dropout variant); ",
                               fused.message());
  }
  out->push_back(std::move(info));
}

std::vector<Parameter*> DotProductAttention::Parameters() {
  if (options_.softmax_type == SoftmaxType::kLearnable) return {&softmax_offset_};
  return {};
}

}  // namespace layers
}  // namespace teserve
