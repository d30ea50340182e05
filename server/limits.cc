#include "server/limits.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace teserve {
namespace server {
namespace {

using google::protobuf::RepeatedPtrField;

// Shape dims as doubles, a 0 counted as 1; empty when a dim is negative (the decoder
// reports it). An empty tensor is no free pass: the layers still loop over its other
// dimensions and size side tensors by them (cu_seqlens [batch + 1], attention scratch),
// so [0, 2^40, 16] costs what [1, 2^40, 16] does here.
std::vector<double> DimsOf(const v1::Tensor& tensor) {
  std::vector<double> dims;
  for (int64_t d : tensor.shape()) {
    if (d < 0) return {};
    dims.push_back(d == 0 ? 1.0 : static_cast<double>(d));
  }
  return dims;
}

// " (a dimension of 0 counted as 1)" when `tensor` has one, else "".
std::string ZeroDimNote(const v1::Tensor& tensor) {
  for (int64_t d : tensor.shape()) {
    if (d == 0) return " (a dimension of 0 counted as 1)";
  }
  return "";
}

double Product(const std::vector<double>& dims, size_t begin, size_t end) {
  double p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p *= dims[i];
  return p;
}

// Exact while it fits in int64, else 3 digits. A spec that the session will reject can
// make an estimate negative or non-finite (negative sizes), and its refusal still prints.
std::string Count(double value) {
  if (std::abs(value) < 9.0e18) return absl::StrCat(static_cast<int64_t>(value));
  return absl::StrFormat("%.3g", value);
}

std::string Bytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%s bytes (%.1f GB)", Count(bytes), bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%s bytes (%.1f MB)", Count(bytes), bytes / 1e6);
  return absl::StrCat(Count(bytes), " bytes");
}

// Batch and sequence length of an attention input in `format` ("sbhd" default, "bshd",
// "thd"); `head_dims`: trailing dims that are not tokens (2 for DotProductAttention's
// [.., H, D], 1 for hidden states [.., hidden]). false when the rank does not fit.
bool BatchAndSeq(const std::vector<double>& dims, const std::string& format, int head_dims,
                 double* batch, double* seq) {
  const size_t token_dims = dims.size() >= static_cast<size_t>(head_dims) ? dims.size() - head_dims : 0;
  if (format == "thd") {
    if (token_dims != 1) return false;
    *batch = 1;  // thd: one packed sequence bounds the sum of per-sequence squares
    *seq = dims[0];
    return true;
  }
  if (token_dims != 2) return false;
  if (format == "bshd") {
    *batch = dims[0];
    *seq = dims[1];
  } else {
    *seq = dims[0];
    *batch = dims[1];
  }
  return true;
}

bool Gated(const std::string& activation) {
  return absl::StrContains(activation, "glu");  // geglu, reglu, swiglu, qgeglu, sreglu, clamped_swiglu
}

struct LayerShape {
  double parameters = 0;
  double activation_width = 0;  // features saved/produced per token (inputs, outputs, internals)
  double heads = 0;             // attention heads (0: no attention)
  int attention_blocks = 0;     // score matrices per forward
  double output_width = 0;      // last dim of the output (hidden or features)
};

double AttentionParameters(double hidden, double heads, double kv, double gqa, bool bias) {
  const double qkv_out = heads * kv + 2 * gqa * kv;
  return hidden * qkv_out + (bias ? qkv_out : 0) + heads * kv * hidden + (bias ? hidden : 0) + 2 * hidden;
}

// Parameters of an attention block besides its projections and input norm: the q and k
// norms over the head size (qk_norm_type RMSNorm: gamma; LayerNorm: gamma and beta) and
// the learnable softmax offset (one per head).
double AttentionExtraParameters(const std::string& qk_norm_type, const std::string& softmax_type, double heads,
                                double kv) {
  double p = 0;
  if (qk_norm_type == "RMSNorm") p += 2 * kv;
  if (qk_norm_type == "LayerNorm") p += 4 * kv;
  if (softmax_type == "learnable") p += heads;
  return p;
}

LayerShape ShapeOf(const v1::LayerSpec& layer) {
  LayerShape s;
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear: {
      const auto& l = layer.linear();
      const double in = l.in_features(), out = l.out_features();
      s.parameters = in * out + ((!l.has_bias() || l.bias()) ? out : 0);
      s.activation_width = in + out;
      s.output_width = out;
      break;
    }
    case v1::LayerSpec::kLayerNorm:
      s.parameters = 2.0 * layer.layer_norm().hidden_size();
      s.activation_width = 2.0 * layer.layer_norm().hidden_size();
      s.output_width = layer.layer_norm().hidden_size();
      break;
    case v1::LayerSpec::kRmsNorm:
      s.parameters = layer.rms_norm().hidden_size();
      s.activation_width = 2.0 * layer.rms_norm().hidden_size();
      s.output_width = layer.rms_norm().hidden_size();
      break;
    case v1::LayerSpec::kGroupedLinear: {
      const auto& l = layer.grouped_linear();
      const double g = l.num_gemms(), in = l.in_features(), out = l.out_features();
      s.parameters = g * (in * out + ((!l.has_bias() || l.bias()) ? out : 0));
      s.activation_width = in + out;
      s.output_width = out;
      break;
    }
    case v1::LayerSpec::kLayerNormLinear: {
      const auto& l = layer.layer_norm_linear();
      const double in = l.in_features(), out = l.out_features();
      s.parameters = 2 * in + in * out + ((!l.has_bias() || l.bias()) ? out : 0);
      s.activation_width = 2 * in + out;
      s.output_width = out;
      break;
    }
    case v1::LayerSpec::kLayerNormMlp: {
      const auto& l = layer.layer_norm_mlp();
      const double h = l.hidden_size(), f = l.ffn_hidden_size();
      const double g = Gated(l.activation()) ? 2 : 1;
      const bool bias = !l.has_bias() || l.bias();
      s.parameters = 2 * h + h * f * g + f * h + (bias ? f * g + h : 0);
      s.activation_width = 3 * h + 2 * f * g;
      s.output_width = h;
      break;
    }
    case v1::LayerSpec::kDotProductAttention: {
      const auto& l = layer.dot_product_attention();
      const double heads = l.num_attention_heads(), kv = l.kv_channels();
      const double kv_v = l.has_kv_channels_v() ? l.kv_channels_v() : kv;
      const double gqa = l.has_num_gqa_groups() ? l.num_gqa_groups() : heads;
      s.parameters = heads;  // a learnable softmax offset at most
      s.activation_width = heads * kv + gqa * (kv + kv_v) + heads * kv_v;
      s.heads = heads;
      s.attention_blocks = 1;
      s.output_width = heads * kv_v;
      break;
    }
    case v1::LayerSpec::kMultiheadAttention: {
      const auto& l = layer.multihead_attention();
      const double h = l.hidden_size(), heads = std::max<double>(1, l.num_attention_heads());
      const double kv = l.has_kv_channels() ? l.kv_channels() : std::floor(h / heads);
      const double gqa = l.has_num_gqa_groups() ? l.num_gqa_groups() : heads;
      s.parameters = AttentionParameters(h, heads, kv, gqa, !l.has_bias() || l.bias()) +
                     AttentionExtraParameters(l.qk_norm_type(), l.softmax_type(), heads, kv);
      s.activation_width = 3 * h + 2 * (heads * kv + 2 * gqa * kv);
      s.heads = heads;
      s.attention_blocks = 1;
      s.output_width = h;
      break;
    }
    case v1::LayerSpec::kTransformerLayer: {
      const auto& l = layer.transformer_layer();
      const double h = l.hidden_size(), f = l.ffn_hidden_size();
      const double heads = std::max<double>(1, l.num_attention_heads());
      const double kv = l.has_kv_channels() ? l.kv_channels() : std::floor(h / heads);
      const double gqa = l.has_num_gqa_groups() ? l.num_gqa_groups() : heads;
      const bool bias = !l.has_bias() || l.bias();
      const double g = Gated(l.activation()) ? 2 : 1;
      const int blocks = l.layer_type() == "decoder" ? 2 : 1;
      s.parameters = blocks * (AttentionParameters(h, heads, kv, gqa, bias) +
                               AttentionExtraParameters(l.qk_norm_type(), l.softmax_type(), heads, kv)) +
                     2 * h + h * f * g + f * h + (bias ? f * g + h : 0) + 2 * h;
      s.activation_width = blocks * (3 * h + 2 * (heads * kv + 2 * gqa * kv)) + 3 * h + 2 * f * g;
      s.heads = heads;
      s.attention_blocks = blocks;
      s.output_width = h;
      break;
    }
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return s;
}

std::string AttentionFormat(const v1::LayerSpec& layer) {
  std::string format;
  switch (layer.kind_case()) {
    case v1::LayerSpec::kDotProductAttention: format = layer.dot_product_attention().qkv_format(); break;
    case v1::LayerSpec::kMultiheadAttention: format = layer.multihead_attention().qkv_format(); break;
    case v1::LayerSpec::kTransformerLayer: format = layer.transformer_layer().attn_input_format(); break;
    default: break;
  }
  return format.empty() ? "sbhd" : format;
}

std::string LayerName(const v1::ModelSpec& model, int i) {
  const std::string& name = model.layers(i).name();
  return name.empty() ? absl::StrCat("layers.", i) : name.substr(0, 128);
}

}  // namespace

absl::Status CheckRequestCost(const v1::ModelSpec& model, const RepeatedPtrField<v1::Tensor>& inputs,
                              const RepeatedPtrField<v1::NamedTensor>& side_inputs, bool outputs_in_reply,
                              const RequestLimits& limits) {
  if (inputs.empty() || model.layers().empty()) return absl::OkStatus();
  const std::vector<double> dims = DimsOf(inputs[0]);
  if (dims.empty()) return absl::OkStatus();
  const bool dpa_first = model.layers(0).kind_case() == v1::LayerSpec::kDotProductAttention;
  const int feature_dims = dpa_first ? 2 : 1;
  const double tokens = Product(dims, 0, dims.size() > static_cast<size_t>(feature_dims) ? dims.size() - feature_dims : 0);
  if (tokens > static_cast<double>(limits.max_tokens_per_request)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "inputs[0].shape: expected at most ", limits.max_tokens_per_request,
        " tokens per request (--max_tokens_per_request), got ", Count(tokens), ZeroDimNote(inputs[0])));
  }
  // The kv sequence: DotProductAttention's key input, else the encoder output of a
  // decoder's cross attention, else the query's own.
  std::vector<double> kv_dims;
  if (dpa_first && inputs.size() > 1) kv_dims = DimsOf(inputs[1]);
  std::vector<double> encoder_dims;
  for (const v1::NamedTensor& side : side_inputs) {
    if (side.name() == "encoder_output") encoder_dims = DimsOf(side.tensor());
  }
  for (int i = 0; i < model.layers_size(); ++i) {
    const LayerShape shape = ShapeOf(model.layers(i));
    if (shape.attention_blocks == 0) continue;
    const std::string format = AttentionFormat(model.layers(i));
    const int head_dims = model.layers(i).kind_case() == v1::LayerSpec::kDotProductAttention ? 2 : 1;
    double batch = 0, seq_q = 0;
    if (!BatchAndSeq(dims, format, head_dims, &batch, &seq_q)) continue;  // the layer rejects the rank
    double seq_kv = seq_q, kv_batch = 0, other = 0;
    if (!kv_dims.empty() && BatchAndSeq(kv_dims, format, head_dims, &kv_batch, &other)) {
      seq_kv = std::max(seq_kv, other);
    }
    if (!encoder_dims.empty() && BatchAndSeq(encoder_dims, format, 1, &kv_batch, &other)) {
      seq_kv = std::max(seq_kv, other);
    }
    const double scores = batch * shape.heads * seq_q * seq_kv;
    if (scores > static_cast<double>(limits.max_attention_scores)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "inputs[0].shape: attention layer '", LayerName(model, i), "' would compute batch x heads x seq_q x seq_kv = ",
          Count(batch), " x ", Count(shape.heads), " x ", Count(seq_q), " x ", Count(seq_kv), " = ", Count(scores),
          " scores, over the limit of ", limits.max_attention_scores, " (--max_attention_scores)"));
    }
  }
  if (outputs_in_reply) {
    const LayerShape last = ShapeOf(model.layers(model.layers_size() - 1));
    const double out_bytes = tokens * last.output_width * 4.0;
    if (out_bytes > static_cast<double>(limits.max_message_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "inputs[0].shape: the reply would carry ", Bytes(out_bytes), " of outputs (", Count(tokens), " tokens x ",
          Count(last.output_width), " FP32 features), over the server's message limit of ", limits.max_message_bytes,
          " bytes (--max_message_bytes); send fewer tokens per request"));
    }
  }
  return absl::OkStatus();
}

std::string MemoryEstimate::ToString() const {
  return absl::StrCat("about ", Bytes(total()), ": ", Count(parameters), " parameters (", Bytes(parameter_bytes),
                      "), gradients ", Bytes(gradient_bytes), ", optimizer state ", Bytes(optimizer_bytes),
                      ", working copies ", Bytes(working_bytes), ", activations ", Bytes(activation_bytes));
}

MemoryEstimate EstimateSessionMemory(const v1::ModelSpec& model, const v1::OptimizerSpec& optimizer,
                                     int64_t tokens, int64_t max_attention_scores) {
  MemoryEstimate e;
  double optimizer_floats = 2;  // AdamW, and the unset case (the session rejects it anyway)
  if (optimizer.optimizer_case() == v1::OptimizerSpec::kSgd) {
    optimizer_floats = optimizer.sgd().momentum() > 0 ? 1 : 0;
  }
  const double t = static_cast<double>(std::max<int64_t>(tokens, 1));
  for (const v1::LayerSpec& layer : model.layers()) {
    const LayerShape s = ShapeOf(layer);
    e.parameters += s.parameters;
    // Saved for backward, the output, and the gradient flowing back: ~3 floats per
    // activation feature per token.
    e.activation_bytes += 3.0 * 4.0 * t * s.activation_width;
    if (s.attention_blocks > 0) {
      // Probabilities kept for backward plus their gradient, per block, at most
      // max_attention_scores each (CheckRequestCost refuses more).
      const double scores = std::min(s.heads * t * t, static_cast<double>(max_attention_scores));
      e.activation_bytes += s.attention_blocks * 2.0 * 4.0 * scores;
    }
  }
  e.parameter_bytes = 4.0 * e.parameters;
  e.gradient_bytes = 4.0 * e.parameters;
  e.optimizer_bytes = 4.0 * optimizer_floats * e.parameters;
  e.working_bytes = 4.0 * e.parameters;
  return e;
}

namespace {

int64_t MeminfoField(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    absl::string_view rest = absl::StripAsciiWhitespace(absl::string_view(line).substr(field.size() + 1));
    rest = absl::StripSuffix(rest, "kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) return kib * 1024;
  }
  return -1;
}

}  // namespace

int64_t HostAvailableMemoryBytes() { return MeminfoField("MemAvailable"); }

int64_t DefaultMemoryBudgetBytes() {
  const int64_t total = MeminfoField("MemTotal");
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string text;
  int64_t cgroup = -1;
  if (in >> text && text != "max") {
    if (!absl::SimpleAtoi(text, &cgroup)) cgroup = -1;
  }
  if (cgroup > 0 && (total < 0 || cgroup < total)) return cgroup;
  return total;
}

absl::Status AdmitSession(const MemoryEstimate& estimate, int64_t budget_bytes, int64_t committed_bytes,
                          int64_t host_available_bytes, int64_t admission_tokens) {
  double available = std::numeric_limits<double>::infinity();
  std::string why;
  if (budget_bytes >= 0) {
    available = static_cast<double>(budget_bytes) - static_cast<double>(committed_bytes);
    why = absl::StrCat("budget ", Bytes(static_cast<double>(budget_bytes)), " (--memory_budget_bytes) less ",
                       Bytes(static_cast<double>(committed_bytes)), " estimated for the live sessions");
  }
  if (host_available_bytes >= 0 && static_cast<double>(host_available_bytes) < available) {
    available = static_cast<double>(host_available_bytes);
    why = "the host's MemAvailable";
  }
  if (estimate.total() <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "model: the session would need ", estimate.ToString(), " for requests of up to ", admission_tokens,
      " tokens (--admission_tokens); available: ", Bytes(std::max(available, 0.0)), " (", why,
      "); use smaller layers or delete sessions"));
}

}  // namespace server
}  // namespace teserve
