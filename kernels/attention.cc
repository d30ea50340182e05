// Checked entry points of kernels/attention.h: validate the configuration, every
// tensor's metadata and the cu_seqlens values (errors name the argument and say expected
// vs got), then run the CPU reference or, for tensors on a CUDA device, the unfused
// kernels of kernels/cuda/attention. Device cu_seqlens ([B + 1] INT32) are copied to the
// host for the value checks: the one host synchronization of a CUDA call.
#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#include "kernels/cast.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/attention/attention_cuda.h"
#include "kernels/cuda/attention/cudnn_attention.h"
#endif

namespace teserve {
namespace kernels {
namespace {

template <typename Enum>
struct NamedValue {
  absl::string_view name;
  Enum value;
};

constexpr NamedValue<QkvFormat> kQkvFormats[] = {
    {"sbhd", QkvFormat::kSbhd}, {"bshd", QkvFormat::kBshd}, {"thd", QkvFormat::kThd}};

constexpr NamedValue<AttnMaskType> kMaskTypes[] = {
    {"no_mask", AttnMaskType::kNoMask},
    {"padding", AttnMaskType::kPadding},
    {"causal", AttnMaskType::kCausal},
    {"padding_causal", AttnMaskType::kPaddingCausal},
    {"causal_bottom_right", AttnMaskType::kCausalBottomRight},
    {"padding_causal_bottom_right", AttnMaskType::kPaddingCausalBottomRight},
    {"arbitrary", AttnMaskType::kArbitrary},
};

constexpr NamedValue<SoftmaxType> kSoftmaxTypes[] = {
    {"vanilla", SoftmaxType::kVanilla}, {"off-by-one", SoftmaxType::kOffByOne}, {"learnable", SoftmaxType::kLearnable}};

constexpr NamedValue<AttnBiasType> kBiasTypes[] = {{"no_bias", AttnBiasType::kNoBias},
                                                   {"pre_scale_bias", AttnBiasType::kPreScaleBias},
                                                   {"post_scale_bias", AttnBiasType::kPostScaleBias},
                                                   {"alibi", AttnBiasType::kAlibi}};

template <typename Enum, size_t N>
absl::string_view NameOf(const NamedValue<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

template <typename Enum, size_t N>
absl::StatusOr<Enum> Parse(const NamedValue<Enum> (&table)[N], absl::string_view text, absl::string_view field) {
  std::vector<std::string> names;
  for (const auto& entry : table) {
    if (entry.name == text) return entry.value;
    names.push_back(absl::StrCat("\"", entry.name, "\""));
  }
  return InvalidField(field, absl::StrCat("one of ", absl::StrJoin(names, ", ")), absl::StrCat("\"", text, "\""));
}

absl::Status CheckConfig(const AttentionConfig& config) {
  RETURN_IF_ERROR(CheckFinitePositive("config.softmax_scale", config.softmax_scale));
  if (!(config.dropout >= 0.0f && config.dropout < 1.0f)) {
    return InvalidField("config.dropout", "a probability in [0, 1)", config.dropout);
  }
  if (config.window_left < -1) return InvalidField("config.window_left", "-1 (unbounded) or >= 0", config.window_left);
  if (config.window_right < -1) {
    return InvalidField("config.window_right", "-1 (unbounded) or >= 0", config.window_right);
  }
  if (IsCausal(config.mask_type) && config.window_right != 0) {
    return InvalidField("config.window_right",
                        absl::StrCat("0 for mask type ", AttnMaskTypeName(config.mask_type),
                                     " (causal masks are windows with right = 0)"),
                        config.window_right);
  }
  if (config.qkv_format == QkvFormat::kThd) {
    if (!HasPadding(config.mask_type)) {
      return InvalidField("config.mask_type",
                          "padding, padding_causal or padding_causal_bottom_right with qkv_format thd",
                          AttnMaskTypeName(config.mask_type));
    }
    if (config.bias_type == AttnBiasType::kPreScaleBias || config.bias_type == AttnBiasType::kPostScaleBias) {
      return InvalidField("config.bias_type", "no_bias or alibi with qkv_format thd",
                          AttnBiasTypeName(config.bias_type));
    }
  }
  return absl::OkStatus();
}

// The sizes of one call, read from q, k and v.
struct Dims {
  int64_t batch = 0;  // sbhd/bshd; thd: from cu_seqlens
  int64_t s_q = 0;    // sbhd/bshd
  int64_t s_kv = 0;
  int64_t t_q = 0;  // token rows
  int64_t t_kv = 0;
  int64_t heads = 0;
  int64_t groups = 0;
  // Padding types and thd: the sequence lengths s_q(b), s_kv(b) (read by CheckSide).
  std::vector<int64_t> len_q, len_kv;
};

absl::Status CheckDim(absl::string_view name, const Shape& shape, int dim, int64_t expected, absl::string_view what) {
  if (shape[dim] == expected) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat("dimension ", dim, " = ", expected, " (", what, ")"),
                      ShapeToString(shape));
}

absl::StatusOr<Dims> CheckQkvShapes(const AttentionConfig& config, const Shape& q, const Shape& k, const Shape& v) {
  const bool thd = config.qkv_format == QkvFormat::kThd;
  const size_t rank = thd ? 3 : 4;
  for (const auto& [name, shape] : {std::pair<const char*, const Shape&>{"q", q}, {"k", k}, {"v", v}}) {
    if (shape.size() != rank) {
      return InvalidField(absl::StrCat(name, ".shape"),
                          absl::StrCat("rank ", rank, " (qkv_format ", QkvFormatName(config.qkv_format), ")"),
                          absl::StrCat(ShapeToString(shape), " (rank ", shape.size(), ")"));
    }
  }
  const int head_dim = static_cast<int>(rank) - 2;
  Dims dims;
  dims.heads = q[head_dim];
  dims.groups = k[head_dim];
  if (!thd) {
    const int batch_dim = config.qkv_format == QkvFormat::kSbhd ? 1 : 0;
    const int seq_dim = 1 - batch_dim;
    dims.batch = q[batch_dim];
    dims.s_q = q[seq_dim];
    dims.s_kv = k[seq_dim];
    RETURN_IF_ERROR(CheckDim("k", k, batch_dim, dims.batch, "the batch size of q"));
    dims.t_q = dims.s_q * dims.batch;
    dims.t_kv = dims.s_kv * dims.batch;
  } else {
    dims.t_q = q[0];
    dims.t_kv = k[0];
  }
  for (int d = 0; d <= head_dim; ++d) RETURN_IF_ERROR(CheckDim("v", v, d, k[d], "as in k"));
  RETURN_IF_ERROR(CheckDim("k", k, head_dim + 1, q[head_dim + 1], "the head size of q"));
  if (dims.groups < 1 || dims.heads % dims.groups != 0) {
    return InvalidField("k.shape",
                        absl::StrCat("a head count (dimension ", head_dim, ") >= 1 dividing the ", dims.heads,
                                     " heads of q"),
                        ShapeToString(k));
  }
  return dims;
}

// cu_seqlens: INT32 [batch + 1], starting at 0, non-decreasing. Returns the values; a
// tensor on a device is first copied to the host (ordered on ctx.stream, complete when
// CopyTo returns).
absl::StatusOr<std::vector<int64_t>> CheckCuSeqlens(const Context& ctx, absl::string_view name, const Tensor& t,
                                                    int64_t batch, bool starts_at_zero) {
  RETURN_IF_ERROR(CheckTensor(name, t, DType::kInt32, 1, ctx));
  if (batch >= 0 && t.dim(0) != batch + 1) {
    return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat("[", batch + 1, "] (batch size + 1)"),
                        ShapeToString(t.shape()));
  }
  if (t.dim(0) < 1) return InvalidField(absl::StrCat(name, ".shape"), "[batch size + 1]", ShapeToString(t.shape()));
  ASSIGN_OR_RETURN(const Tensor host, CopyTo(ctx, t, Device::Cpu()));
  const int32_t* data = host.data<int32_t>();
  std::vector<int64_t> values(data, data + host.numel());
  if (starts_at_zero ? values[0] != 0 : values[0] < 0) {
    return InvalidField(absl::StrCat(name, "[0]"), starts_at_zero ? "0" : ">= 0", values[0]);
  }
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] < values[i - 1]) {
      return InvalidField(absl::StrCat(name, "[", i, "]"), absl::StrCat(">= ", name, "[", i - 1, "] = ", values[i - 1]),
                          values[i]);
    }
  }
  return values;
}

// The sequences of one side (q or kv): lengths within `full` (sbhd/bshd) or placed
// within `rows` tokens (thd, with optional padded offsets). Returns the lengths.
absl::StatusOr<std::vector<int64_t>> CheckSequences(const Context& ctx, const AttentionConfig& config,
                                                    absl::string_view name, const Tensor& cu, const Tensor& cu_padded,
                                                    int64_t batch, int64_t full, int64_t rows) {
  const bool thd = config.qkv_format == QkvFormat::kThd;
  if (!cu.defined()) {
    return InvalidField(name, absl::StrCat("an INT32 [batch + 1] tensor (mask type ", AttnMaskTypeName(config.mask_type),
                                           ", qkv_format ", QkvFormatName(config.qkv_format), ")"),
                        "none");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> bounds, CheckCuSeqlens(ctx, name, cu, batch, /*starts_at_zero=*/true));
  std::vector<int64_t> lengths(bounds.size() - 1);
  for (size_t b = 0; b + 1 < bounds.size(); ++b) lengths[b] = bounds[b + 1] - bounds[b];
  if (!thd) {
    for (size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b] > full) {
        return InvalidField(name, absl::StrCat("sequence lengths <= ", full, " (the sequence dimension)"),
                            absl::StrCat(lengths[b], " for sequence ", b));
      }
    }
    return lengths;
  }
  const std::string padded_name = absl::StrCat(name, "_padded");
  if (!cu_padded.defined()) {
    if (bounds.back() > rows) {
      return InvalidField(absl::StrCat(name, "[", bounds.size() - 1, "]"),
                          absl::StrCat("<= ", rows, " (the token count of the tensor)"), bounds.back());
    }
    return lengths;
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> starts,
                   CheckCuSeqlens(ctx, padded_name, cu_padded, bounds.size() - 1, /*starts_at_zero=*/false));
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    const int64_t len = bounds[b + 1] - bounds[b];
    if (len > starts[b + 1] - starts[b]) {
      return InvalidField(padded_name, absl::StrCat("room for sequence ", b, " of length ", len),
                          absl::StrCat(starts[b + 1] - starts[b], " rows between ", padded_name, "[", b, "] and [",
                                       b + 1, "]"));
    }
  }
  if (starts.back() > rows) {
    return InvalidField(absl::StrCat(padded_name, "[", starts.size() - 1, "]"),
                        absl::StrCat("<= ", rows, " (the token count of the tensor)"), starts.back());
  }
  return lengths;
}

// A rank-4 tensor broadcastable to [B, H, S_q, S_kv]; with exact_seq the two sequence
// dimensions must match in full (bias), else any dimension may be 1 (mask).
absl::Status CheckBroadcast(const Context& ctx, absl::string_view name, const Tensor& t, DType dtype,
                            const Dims& dims, bool exact_seq) {
  RETURN_IF_ERROR(CheckTensor(name, t, dtype, 4, ctx));
  const int64_t full[4] = {dims.batch, dims.heads, dims.s_q, dims.s_kv};
  for (int d = 0; d < 4; ++d) {
    const bool may_be_one = !(exact_seq && d >= 2);
    if (t.dim(d) == full[d] || (may_be_one && t.dim(d) == 1)) continue;
    const std::string expected =
        exact_seq ? absl::StrCat("[1|", full[0], ", 1|", full[1], ", ", full[2], ", ", full[3], "]")
                  : absl::StrCat("[1|", full[0], ", 1|", full[1], ", 1|", full[2], ", 1|", full[3], "]");
    return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat(expected, " (broadcast to [B, H, S_q, S_kv])"),
                        ShapeToString(t.shape()));
  }
  return absl::OkStatus();
}

absl::Status CheckSide(const Context& ctx, const AttentionConfig& config, Dims& dims,
                       const AttentionSideTensors& side, const AttentionSideNames& names) {
  const bool thd = config.qkv_format == QkvFormat::kThd;
  int64_t batch = dims.batch;
  if (thd || HasPadding(config.mask_type)) {
    // thd reads the batch size from cu_seqlens_q, and the padded offsets.
    ASSIGN_OR_RETURN(dims.len_q, CheckSequences(ctx, config, names.cu_seqlens_q, side.cu_seqlens_q,
                                                thd ? side.cu_seqlens_q_padded : Tensor(), thd ? -1 : batch,
                                                dims.s_q, dims.t_q));
    if (thd) batch = side.cu_seqlens_q.dim(0) - 1;
    ASSIGN_OR_RETURN(dims.len_kv, CheckSequences(ctx, config, names.cu_seqlens_kv, side.cu_seqlens_kv,
                                                 thd ? side.cu_seqlens_kv_padded : Tensor(), batch, dims.s_kv,
                                                 dims.t_kv));
  }
  if (config.mask_type == AttnMaskType::kArbitrary) {
    if (!side.mask.defined()) {
      return InvalidField(names.mask, "a BOOL tensor broadcastable to [B, H, S_q, S_kv] (mask type arbitrary)", "none");
    }
    RETURN_IF_ERROR(CheckBroadcast(ctx, names.mask, side.mask, DType::kBool, dims, /*exact_seq=*/false));
  }
  if (config.bias_type == AttnBiasType::kPreScaleBias || config.bias_type == AttnBiasType::kPostScaleBias) {
    if (!side.bias.defined()) {
      return InvalidField(names.bias, absl::StrCat("an FP32 [1|B, 1|H, S_q, S_kv] tensor (bias type ",
                                               AttnBiasTypeName(config.bias_type), ")"),
                          "none");
    }
    RETURN_IF_ERROR(CheckBroadcast(ctx, names.bias, side.bias, DType::kFloat32, dims, /*exact_seq=*/true));
  }
  if (config.bias_type == AttnBiasType::kAlibi) {
    const Tensor& slopes = side.alibi_slopes;
    const std::string expected = absl::StrCat("FP32 [", dims.heads, "] or [", batch, ", ", dims.heads, "]");
    if (!slopes.defined()) return InvalidField(names.alibi_slopes, expected, "none");
    RETURN_IF_ERROR(CheckTensor(names.alibi_slopes, slopes, DType::kFloat32, kAnyRank, ctx));
    const bool ok = (slopes.rank() == 1 && slopes.dim(0) == dims.heads) ||
                    (slopes.rank() == 2 && slopes.dim(0) == batch && slopes.dim(1) == dims.heads);
    if (!ok) return InvalidField(absl::StrCat(names.alibi_slopes, ".shape"), expected, ShapeToString(slopes.shape()));
  }
  if (config.softmax_type == SoftmaxType::kLearnable) {
    RETURN_IF_ERROR(CheckTensorOfShape(names.softmax_offset, side.softmax_offset, DType::kFloat32, {dims.heads}, ctx));
  }
  return absl::OkStatus();
}

Shape WithLastDim(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

Shape WithoutLastDim(Shape shape) {
  shape.pop_back();
  return shape;
}

absl::StatusOr<Dims> CheckCall(const Context& ctx, const AttentionConfig& config, const Tensor& q, const Tensor& k,
                               const Tensor& v, const AttentionSideTensors& side) {
  RETURN_IF_ERROR(CheckConfig(config));
  if (q.defined() && q.dtype() != DType::kFloat32 && q.dtype() != DType::kBFloat16 && q.dtype() != DType::kFloat16) {
    return InvalidField("q.dtype", "FLOAT32, BFLOAT16 or FLOAT16", DTypeName(q.dtype()));
  }
  // k and v take q's dtype.
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"q", q}, {"k", k}, {"v", v}}) {
    RETURN_IF_ERROR(CheckTensor(name, t, q.defined() ? q.dtype() : DType::kFloat32, kAnyRank, ctx));
  }
  ASSIGN_OR_RETURN(Dims dims, CheckQkvShapes(config, q.shape(), k.shape(), v.shape()));
  RETURN_IF_ERROR(CheckSide(ctx, config, dims, side, AttentionSideNames()));
  return dims;
}

}  // namespace

absl::string_view QkvFormatName(QkvFormat format) { return NameOf(kQkvFormats, format); }
absl::string_view AttnMaskTypeName(AttnMaskType type) { return NameOf(kMaskTypes, type); }
absl::string_view SoftmaxTypeName(SoftmaxType type) { return NameOf(kSoftmaxTypes, type); }
absl::string_view AttnBiasTypeName(AttnBiasType type) { return NameOf(kBiasTypes, type); }

absl::StatusOr<QkvFormat> ParseQkvFormat(absl::string_view text, absl::string_view field) {
  return Parse(kQkvFormats, text, field);
}

absl::StatusOr<AttnMaskType> ParseAttnMaskType(absl::string_view text, absl::string_view field) {
  if (text == "padding,causal" || text == "causal,padding") return AttnMaskType::kPaddingCausal;
  return Parse(kMaskTypes, text, field);
}

absl::StatusOr<SoftmaxType> ParseSoftmaxType(absl::string_view text, absl::string_view field) {
  return Parse(kSoftmaxTypes, text, field);
}

absl::StatusOr<AttnBiasType> ParseAttnBiasType(absl::string_view text, absl::string_view field) {
  return Parse(kBiasTypes, text, field);
}

bool HasPadding(AttnMaskType type) {
  return type == AttnMaskType::kPadding || type == AttnMaskType::kPaddingCausal ||
         type == AttnMaskType::kPaddingCausalBottomRight;
}

bool IsCausal(AttnMaskType type) {
  return type == AttnMaskType::kCausal || type == AttnMaskType::kPaddingCausal ||
         type == AttnMaskType::kCausalBottomRight || type == AttnMaskType::kPaddingCausalBottomRight;
}

bool IsTopLeftAligned(AttnMaskType type) {
  return type == AttnMaskType::kCausal || type == AttnMaskType::kPaddingCausal;
}

std::vector<float> DefaultAlibiSlopes(int64_t heads) {
  std::vector<float> slopes;
  if (heads <= 0) return slopes;
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  for (int64_t k = 1; k <= n; ++k) slopes.push_back(static_cast<float>(std::exp2(-8.0 * k / n)));
  for (int64_t m = 1; static_cast<int64_t>(slopes.size()) < heads; ++m) {
    slopes.push_back(static_cast<float>(std::exp2(-4.0 * (2 * m - 1) / n)));
  }
  return slopes;
}

absl::Status CheckAttentionCall(const Context& ctx, const AttentionConfig& config, const Shape& q, const Shape& k,
                                const Shape& v, const AttentionSideTensors& side, const AttentionSideNames& names) {
  RETURN_IF_ERROR(CheckConfig(config));
  ASSIGN_OR_RETURN(Dims dims, CheckQkvShapes(config, q, k, v));
  return CheckSide(ctx, config, dims, side, names);
}

namespace {
std::atomic<bool> allow_nondeterministic_attention{false};
}  // namespace

void AllowNondeterministicAttention(bool allow) { allow_nondeterministic_attention.store(allow); }
bool NondeterministicAttentionAllowed() { return allow_nondeterministic_attention.load(); }

absl::Status FusedAttentionEligible(const Device& device, const AttentionConfig& config, DType dtype, int64_t d_qk,
                                    int64_t d_v) {
  if (device.is_cpu()) return absl::UnimplementedError("not fused: the CPU backend runs the reference");
#if TESERVE_WITH_CUDA
  RETURN_IF_ERROR(cuda::FusedAttentionEligible(config, dtype, d_qk, d_v));
  const absl::StatusOr<int64_t> version = cuda::CudnnRuntimeVersion();
  if (!version.ok()) return absl::UnimplementedError(absl::StrCat("not fused: ", version.status().message()));
  return absl::OkStatus();
#else
  return absl::UnimplementedError("not fused: built without the CUDA backend");
#endif
}

namespace {

bool Is16Bit(const Tensor& t) { return t.dtype() == DType::kBFloat16 || t.dtype() == DType::kFloat16; }

// The FP32 implementations (CPU reference or unfused CUDA kernels) on checked tensors.
absl::StatusOr<AttentionForwardOutputs> ForwardFp32(const Context& ctx, const AttentionConfig& config,
                                                    const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const AttentionSideTensors& side) {
  return Dispatch("AttentionForward", ctx, [&] { return cpu::AttentionForward(ctx, config, q, k, v, side); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::AttentionForward(ctx, config, q, k, v, side); }));
}

absl::StatusOr<AttentionBackwardOutputs> BackwardFp32(const Context& ctx, const AttentionConfig& config,
                                                      const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const AttentionSideTensors& side, const Tensor& out,
                                                      const Tensor& softmax_lse, const Tensor& dout) {
  return Dispatch("AttentionBackward", ctx,
                  [&] { return cpu::AttentionBackward(ctx, config, q, k, v, side, out, softmax_lse, dout); },
                  TESERVE_CUDA_KERNEL(
                      [&] { return cuda::AttentionBackward(ctx, config, q, k, v, side, out, softmax_lse, dout); }));
}

#if TESERVE_WITH_CUDA
// Why a call whose configuration the fused path takes cannot run there: a query row of
// some sequence has no key to attend (an empty key sequence, more queries than keys under
// bottom-right alignment, a window that leaves no key). The contract gives such a row
// out 0, lse -inf and no gradient; cuDNN's result for it is not that. Empty when every
// row has a key.
std::string RowWithoutKeys(const AttentionConfig& config, const Dims& dims) {
  const bool padded = !dims.len_q.empty();
  // Without padding every sequence has the same lengths: one stands for all.
  const int64_t sequences = padded ? static_cast<int64_t>(dims.len_q.size()) : std::min<int64_t>(dims.batch, 1);
  const int64_t right = IsCausal(config.mask_type) ? 0 : config.window_right;
  const int64_t left = config.window_left;
  for (int64_t b = 0; b < sequences; ++b) {
    const int64_t s_q = padded ? dims.len_q[b] : dims.s_q;
    const int64_t s_kv = padded ? dims.len_kv[b] : dims.s_kv;
    const int64_t o = IsTopLeftAligned(config.mask_type) ? 0 : s_kv - s_q;
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t lo = left < 0 ? 0 : std::max<int64_t>(0, i + o - left);
      const int64_t hi = right < 0 ? s_kv - 1 : std::min(s_kv - 1, i + o + right);
      if (lo > hi) {
        return absl::StrCat("not fused: query ", i, " of sequence ", b, " has no key to attend (s_q ", s_q,
                            ", s_kv ", s_kv, ")");
      }
    }
  }
  return "";
}

// The side tensors as the fused path takes them: a post_scale_bias rounded to q's dtype
// (cuDNN's bias is in the inputs' dtype). The conversion runs only for a configuration
// the fused path takes.
absl::StatusOr<AttentionSideTensors> FusedSide(const Context& ctx, const AttentionConfig& config, const Tensor& q,
                                               const Tensor& v, const AttentionSideTensors& side) {
  AttentionSideTensors fused = side;
  if (config.bias_type == AttnBiasType::kPostScaleBias &&
      cuda::FusedAttentionEligible(config, q.dtype(), q.dim(-1), v.dim(-1)).ok()) {
    ASSIGN_OR_RETURN(fused.bias, Convert(ctx, side.bias, q.dtype()));
  }
  return fused;
}

cuda::FusedSequences LongestSequences(const Dims& dims) {
  cuda::FusedSequences sequences;
  for (int64_t len : dims.len_q) sequences.longest_q = std::max(sequences.longest_q, len);
  for (int64_t len : dims.len_kv) sequences.longest_kv = std::max(sequences.longest_kv, len);
  return sequences;
}
#endif

absl::StatusOr<std::vector<Tensor>> Widen(const Context& ctx, std::initializer_list<const Tensor*> tensors) {
  std::vector<Tensor> out;
  for (const Tensor* t : tensors) {
    ASSIGN_OR_RETURN(Tensor wide, Convert(ctx, *t, DType::kFloat32));
    out.push_back(std::move(wide));
  }
  return out;
}

}  // namespace

absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side) {
  ASSIGN_OR_RETURN(const Dims dims, CheckCall(ctx, config, q, k, v, side));
  ScopedKernelTimer timer(ctx, KernelOp::kAttentionForward);
  const AttentionPath unfused = ctx.device.is_cpu() ? AttentionPath::kCpuReference : AttentionPath::kCudaUnfused;
  if (!Is16Bit(q)) {
    ASSIGN_OR_RETURN(AttentionForwardOutputs result, ForwardFp32(ctx, config, q, k, v, side));
    result.path = unfused;
    return result;
  }
  std::string why = "not fused: the CPU backend runs the reference";
#if TESERVE_WITH_CUDA
  if (!ctx.device.is_cpu()) {
    why = RowWithoutKeys(config, dims);
    absl::StatusOr<AttentionForwardOutputs> fused = absl::UnimplementedError(why);
    if (why.empty()) {
      ASSIGN_OR_RETURN(const AttentionSideTensors fused_side, FusedSide(ctx, config, q, v, side));
      fused = cuda::FusedAttentionForward(ctx, config, q, k, v, fused_side, LongestSequences(dims));
    }
    if (fused.ok()) {
      fused->path = AttentionPath::kCudnnFused;
      return fused;
    }
    if (!absl::IsUnimplemented(fused.status())) return fused.status();
    why = std::string(fused.status().message());
  }
#endif
  // 16-bit inputs the fused path does not take: FP32 computation, out rounded to q's dtype.
  ASSIGN_OR_RETURN(const std::vector<Tensor> wide, Widen(ctx, {&q, &k, &v}));
  ASSIGN_OR_RETURN(AttentionForwardOutputs result, ForwardFp32(ctx, config, wide[0], wide[1], wide[2], side));
  ASSIGN_OR_RETURN(result.out, Convert(ctx, result.out, q.dtype()));
  result.path = unfused;
  result.unfused_reason = std::move(why);
  return result;
}

absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout) {
  ASSIGN_OR_RETURN(const Dims dims, CheckCall(ctx, config, q, k, v, side));
  const Shape out_shape = WithLastDim(q.shape(), v.dim(-1));
  RETURN_IF_ERROR(CheckTensorOfShape("out", out, q.dtype(), out_shape, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("softmax_lse", softmax_lse, DType::kFloat32, WithoutLastDim(q.shape()), ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dout", dout, q.dtype(), out_shape, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kAttentionBackward);
  const AttentionPath unfused = ctx.device.is_cpu() ? AttentionPath::kCpuReference : AttentionPath::kCudaUnfused;
  if (!Is16Bit(q)) {
    ASSIGN_OR_RETURN(AttentionBackwardOutputs result, BackwardFp32(ctx, config, q, k, v, side, out, softmax_lse, dout));
    result.path = unfused;
    return result;
  }
  std::string why = "not fused: the CPU backend runs the reference";
#if TESERVE_WITH_CUDA
  if (!ctx.device.is_cpu()) why = RowWithoutKeys(config, dims);
  if (!ctx.device.is_cpu() && why.empty()) {
    AttentionConfig fused_config = config;
    if (NondeterministicAttentionAllowed()) fused_config.deterministic = false;
    ASSIGN_OR_RETURN(const AttentionSideTensors fused_side, FusedSide(ctx, config, q, v, side));
    absl::StatusOr<AttentionBackwardOutputs> fused =
        cuda::FusedAttentionBackward(ctx, fused_config, q, k, v, fused_side, LongestSequences(dims), out,
                                     softmax_lse, dout);
    if (fused.ok()) {
      if (fused->dbias.defined()) {
        ASSIGN_OR_RETURN(fused->dbias, Convert(ctx, fused->dbias, DType::kFloat32));
      }
      fused->path = AttentionPath::kCudnnFused;
      return fused;
    }
    if (!absl::IsUnimplemented(fused.status())) return fused.status();
    why = std::string(fused.status().message());
  }
#endif
  ASSIGN_OR_RETURN(const std::vector<Tensor> wide, Widen(ctx, {&q, &k, &v, &out, &dout}));
  ASSIGN_OR_RETURN(AttentionBackwardOutputs result,
                   BackwardFp32(ctx, config, wide[0], wide[1], wide[2], side, wide[3], softmax_lse, wide[4]));
  ASSIGN_OR_RETURN(result.dq, Convert(ctx, result.dq, q.dtype()));
  ASSIGN_OR_RETURN(result.dk, Convert(ctx, result.dk, k.dtype()));
  ASSIGN_OR_RETURN(result.dv, Convert(ctx, result.dv, v.dtype()));
  result.path = unfused;
  result.unfused_reason = std::move(why);
  return result;
}

}  // namespace kernels
}  // namespace teserve
