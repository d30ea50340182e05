// Host side of the cuDNN fused attention (cudnn_attention.h): graph building and caching,
// handles, the [B, H, S_q] <-> q-layout softmax_lse permutation, and execution on
// ctx.stream. The frontend is header-only and loads cuDNN with dlopen
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set in BUILD.bazel).
#include "kernels/cuda/attention/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/scoped_device.h"

#if TESERVE_WITH_CUDNN_FRONTEND
#include "cudnn_frontend.h"

namespace cudnn_frontend {
// The handle the frontend's dynamic-loading shim resolves every cuDNN symbol from.
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graphs' inputs and outputs.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kSeqQ, kSeqKv, kOffsetQ, kOffsetKv, kBias, kDbias
};

// dlopen of cuDNN, once per process. The status says why it failed.
const absl::Status& CudnnLoaded() {
  static const absl::Status* status = [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      void* handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (handle != nullptr) {
        fe::cudnn_dlhandle = handle;
        return new absl::Status();
      }
    }
    const char* error = dlerror();
    return new absl::Status(absl::UnimplementedError(
        absl::StrCat("cuDNN could not be loaded (dlopen libcudnn.so.9: ", error != nullptr ? error : "unknown", ")")));
  }();
  return *status;
}

absl::Status FrontendError(absl::string_view step, fe::error_object error) {
  // cuDNN refusing a graph is "not supported here", so the caller runs the unfused path.
  return absl::UnimplementedError(absl::StrCat("cuDNN SDPA ", step, ": ", error.get_message()));
}

// [B, H, S, D] view of one of q, k, v, out (and their gradients): strides of the sbhd /
// bshd tensor; for thd, batch sequences of at most max_seq tokens at ragged offsets (the
// batch stride is then unused).
struct View {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
};

View ViewOf(QkvFormat format, const Tensor& t, int64_t batch = 0, int64_t max_seq = 0) {
  if (format == QkvFormat::kThd) {
    const int64_t h = t.dim(1);
    const int64_t d = t.dim(2);
    return View{{batch, h, max_seq, d}, {max_seq * h * d, d, h * d, 1}};
  }
  const bool sbhd = format == QkvFormat::kSbhd;
  const int64_t s = sbhd ? t.dim(0) : t.dim(1);
  const int64_t b = sbhd ? t.dim(1) : t.dim(0);
  const int64_t h = t.dim(2);
  const int64_t d = t.dim(3);
  if (sbhd) return View{{b, h, s, d}, {h * d, d, b * h * d, 1}};
  return View{{b, h, s, d}, {s * h * d, d, h * d, 1}};
}

// The token rows of one of q, k, v, out (and their gradients) in sbhd / bshd.
TokenRows TokenRowsOf(QkvFormat format, const Tensor& t) {
  const View view = ViewOf(format, t);
  TokenRows rows;
  rows.batch = view.dims[0];
  rows.seq = view.dims[2];
  rows.stride_b = view.strides[0];
  rows.stride_s = view.strides[2];
  rows.row_elems = view.dims[1] * view.dims[3];
  return rows;
}

fe::DataType_t FrontendType(DType dtype) {
  return dtype == DType::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// ragged: thd's offsets tensor for this side (null otherwise).
TensorPtr Input(fe::graph::Graph& graph, const char* name, Uid uid, const View& view, const TensorPtr& ragged) {
  TensorPtr t = graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(view.dims).set_stride(view.strides));
  if (ragged != nullptr) t->set_ragged_offset(ragged);
  return t;
}

void SetOutput(const TensorPtr& t, Uid uid, const View& view, const TensorPtr& ragged) {
  t->set_output(true).set_uid(uid).set_dim(view.dims).set_stride(view.strides);
  if (ragged != nullptr) t->set_ragged_offset(ragged);
}

// An INT32 [n, 1, 1, 1] graph input (sequence lengths, ragged offsets).
TensorPtr IndexInput(fe::graph::Graph& graph, const char* name, Uid uid, int64_t n) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({n, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT32));
}

// kernels/attention.h's mask predicates, spelled here: this library sits below the
// dispatcher that defines them.
bool Causal(AttnMaskType t) {
  return t == AttnMaskType::kCausal || t == AttnMaskType::kPaddingCausal || t == AttnMaskType::kCausalBottomRight ||
         t == AttnMaskType::kPaddingCausalBottomRight;
}
bool TopLeft(AttnMaskType t) { return t == AttnMaskType::kCausal || t == AttnMaskType::kPaddingCausal; }
bool Padding(AttnMaskType t) {
  return t == AttnMaskType::kPadding || t == AttnMaskType::kPaddingCausal ||
         t == AttnMaskType::kPaddingCausalBottomRight;
}

// The mask as cuDNN's diagonal band (kernels/attention.h: windows, causal = right 0, the
// offset o top-left for causal / padding_causal and bottom-right otherwise).
template <typename Attributes>
void SetMask(const AttentionConfig& config, Attributes& attributes) {
  const bool causal = Causal(config.mask_type);
  const int64_t right = causal ? 0 : config.window_right;
  const int64_t left = config.window_left;
  if (right < 0 && left < 0) return;
  attributes.set_diagonal_alignment(TopLeft(config.mask_type) ? fe::DiagonalAlignment_t::TOP_LEFT
                                                                        : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  if (left >= 0) attributes.set_diagonal_band_left_bound(static_cast<int>(left + 1));
  if (right >= 0) attributes.set_diagonal_band_right_bound(static_cast<int>(right));
}

// Padding masks (thd has one too): cuDNN's per-sequence lengths (INT32 [B, 1, 1, 1]
// inputs kSeqQ, kSeqKv).
template <typename Attributes>
void SetPadding(const AttentionConfig& config, fe::graph::Graph& graph, int64_t batch, Attributes& attributes) {
  if (!Padding(config.mask_type)) return;
  attributes.set_padding_mask(true)
      .set_seq_len_q(IndexInput(graph, "seq_len_q", kSeqQ, batch))
      .set_seq_len_kv(IndexInput(graph, "seq_len_kv", kSeqKv, batch));
}

// A contiguous [1|B, 1|H, S_q, S_kv] tensor in the inputs' dtype: the post_scale_bias
// (kBias) or its gradient (kDbias).
TensorPtr BiasTensor(fe::graph::Graph& graph, const char* name, Uid uid, const Shape& shape) {
  const int64_t s_q = shape[2], s_kv = shape[3];
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({shape[0], shape[1], s_q, s_kv})
                          .set_stride({shape[1] * s_q * s_kv, s_q * s_kv, s_kv, 1}));
}

// The score modifiers: cuDNN adds a bias after the scale (post_scale_bias); its ALiBi adds
// slope_h * (j - i) with the default slopes (FusedAttentionEligible admits it only where
// that is the contract's ALiBi). Returns the bias graph input, or null.
template <typename Attributes>
TensorPtr SetScoreModifiers(const AttentionConfig& config, const Tensor* bias, fe::graph::Graph& graph,
                            Attributes& attributes) {
  if (config.bias_type == AttnBiasType::kAlibi) attributes.set_alibi_mask(true);
  if (config.bias_type != AttnBiasType::kPostScaleBias) return nullptr;
  TensorPtr t = BiasTensor(graph, "bias", kBias, bias->shape());
  attributes.set_bias(t);
  return t;
}

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
  std::mutex mu;  // one execution at a time (the frontend's plan state is shared)
};

class CudnnState {
 public:
  static CudnnState& Get() {
    static CudnnState* state = new CudnnState();
    return *state;
  }

  // The handle bound to (device, stream); created on first use.
  absl::StatusOr<cudnnHandle_t> Handle(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find({device, stream});
    if (it != handles_.end()) return it->second;
    cudnnHandle_t handle = nullptr;
    try {
      if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) {
        return absl::UnimplementedError("cuDNN SDPA: cudnnCreate failed");
      }
      fe::detail::set_stream(handle, stream);
    } catch (const std::exception& e) {
      return absl::UnimplementedError(absl::StrCat("cuDNN SDPA: ", e.what()));
    }
    handles_[{device, stream}] = handle;
    return handle;
  }

  void ReleaseHandle(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find({device, stream});
    if (it == handles_.end()) return;
    try {
      fe::detail::destroy_handle(it->second);
    } catch (const std::exception&) {
      // Nothing to do: the process keeps going without that handle either way.
    }
    handles_.erase(it);
  }

  // The cached graph for `key`, or the result of `build` (cached when it succeeds, and
  // when cuDNN refuses the problem, so a refusal is not rebuilt on every call).
  template <typename Build>
  absl::StatusOr<std::shared_ptr<CachedGraph>> GraphFor(const std::string& key, Build build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = graphs_.find(key);
      if (it != graphs_.end()) return it->second;
      auto refused = refused_.find(key);
      if (refused != refused_.end()) return refused->second;
    }
    absl::StatusOr<std::shared_ptr<CachedGraph>> built = build();
    std::lock_guard<std::mutex> lock(mu_);
    if (built.ok()) {
      graphs_.emplace(key, *built);
    } else if (absl::IsUnimplemented(built.status())) {
      refused_.emplace(key, built.status());
    }
    return built;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, cudaStream_t>, cudnnHandle_t> handles_;
  std::map<std::string, std::shared_ptr<CachedGraph>> graphs_;
  std::map<std::string, absl::Status> refused_;
};

absl::StatusOr<std::shared_ptr<CachedGraph>> Finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle) {
  auto cached = std::make_shared<CachedGraph>();
  try {
    fe::error_object status = graph->validate();
    if (!status.is_good()) return FrontendError("validate", status);
    status = graph->build_operation_graph(handle);
    if (!status.is_good()) return FrontendError("build_operation_graph", status);
    status = graph->create_execution_plans({fe::HeurMode_t::A});
    if (!status.is_good()) return FrontendError("create_execution_plans", status);
    status = graph->check_support(handle);
    if (!status.is_good()) return FrontendError("check_support", status);
    status = graph->build_plans(handle);
    if (!status.is_good()) return FrontendError("build_plans", status);
    int64_t workspace = 0;
    status = graph->get_workspace_size(workspace);
    if (!status.is_good()) return FrontendError("get_workspace_size", status);
    cached->workspace_bytes = workspace;
  } catch (const std::exception& e) {
    return absl::UnimplementedError(absl::StrCat("cuDNN SDPA: ", e.what()));
  }
  cached->graph = std::move(graph);
  return cached;
}

// The graph's identity: the [B, H, S, D] views (for thd the bucketed longest sequences, not
// the token counts, which only move the ragged offsets), dtype, layout, mask and scale.
std::string ProblemKey(const char* direction, int device, const AttentionConfig& config, DType dtype,
                       const View& q, const View& k, const View& v, const Tensor* bias) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &config.softmax_scale, sizeof(scale_bits));
  return absl::StrCat(direction, "|", device, "|", static_cast<int>(dtype), "|", static_cast<int>(config.qkv_format),
                      "|", absl::StrJoin(q.dims, ","), ";", absl::StrJoin(k.dims, ","), ";", absl::StrJoin(v.dims, ","),
                      "|", static_cast<int>(config.mask_type), "|", config.window_left, "|", config.window_right, "|",
                      scale_bits, "|", config.deterministic ? 1 : 0, "|", static_cast<int>(config.bias_type), "|",
                      bias != nullptr ? ShapeToString(bias->shape()) : "");
}

absl::Status Execute(CachedGraph& cached, cudnnHandle_t handle, const Context& ctx,
                     std::unordered_map<int64_t, void*>& pack) {
  Tensor workspace;  // stream-ordered pool memory, as INT32 words
  if (cached.workspace_bytes > 0) {
    ASSIGN_OR_RETURN(workspace,
                     Tensor::Empty(DType::kInt32, {(cached.workspace_bytes + 3) / 4}, ctx.device, ctx.stream));
  }
  std::lock_guard<std::mutex> lock(cached.mu);
  try {
    fe::error_object status =
        cached.graph->execute(handle, pack, cached.workspace_bytes > 0 ? workspace.raw_data() : nullptr);
    if (!status.is_good()) return absl::InternalError(absl::StrCat("cuDNN SDPA execute: ", status.get_message()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cuDNN SDPA execute: ", e.what()));
  }
  return absl::OkStatus();
}

// softmax_lse's strides in q's layout without the head size, as a [B, H, S_q] view (q
// is q's view; thd: row_start locates the sequences).
LseLayout LseLayoutOf(QkvFormat format, const View& view, const int32_t* row_start) {
  const int64_t b = view.dims[0], h = view.dims[1], s = view.dims[2];
  LseLayout layout;
  layout.batch = b;
  layout.heads = h;
  layout.seq = s;
  if (format == QkvFormat::kThd) {
    layout.stride_h = 1;
    layout.stride_s = h;
    layout.row_start = row_start;
  } else if (format == QkvFormat::kSbhd) {
    layout.stride_b = h;
    layout.stride_h = 1;
    layout.stride_s = b * h;
  } else {
    layout.stride_b = s * h;
    layout.stride_h = 1;
    layout.stride_s = h;
  }
  return layout;
}

// What both directions start from: the checks, the cuDNN handle of ctx's stream (on the
// current device), the [B, H, S, D] views and, under a padding mask or thd, the sequence
// lengths (INT32 [B] on the device, from cu_seqlens); for thd also where each sequence
// starts (cu_seqlens*_padded, else cu_seqlens) and cuDNN's ragged offsets (INT32 [B + 1],
// in elements; q's serve out, dout and dq, k's serve v, dk and dv, as D_qk == D_v).
struct Problem {
  cudnnHandle_t handle = nullptr;
  View q, k, v;
  int64_t b = 0, h = 0, s_q = 0;
  Tensor seq_q, seq_kv;
  const Tensor* start_q = nullptr;
  const Tensor* start_kv = nullptr;
  Tensor offset_q, offset_kv;
  const Tensor* bias = nullptr;  // post_scale_bias, in q's dtype

  bool ragged() const { return offset_q.defined(); }
  const int32_t* seq_q_data() const { return seq_q.defined() ? seq_q.data<int32_t>() : nullptr; }
  const int32_t* start_q_data() const { return start_q != nullptr ? start_q->data<int32_t>() : nullptr; }
  // The lengths' and offsets' entries of an execution's variant pack.
  void AddSequenceInputs(std::unordered_map<int64_t, void*>& pack) const {
    if (seq_q.defined()) {
      pack[kSeqQ] = const_cast<void*>(seq_q.raw_data());
      pack[kSeqKv] = const_cast<void*>(seq_kv.raw_data());
    }
    if (ragged()) {
      pack[kOffsetQ] = const_cast<void*>(offset_q.raw_data());
      pack[kOffsetKv] = const_cast<void*>(offset_kv.raw_data());
    }
    if (bias != nullptr) pack[kBias] = const_cast<void*>(bias->raw_data());
  }
  // Zeroes the rows of `t` (one of q's or k's side) that hold no token of a sequence:
  // padding rows (sbhd / bshd) or rows outside every sequence (thd; lse, when given, gets
  // -inf there).
  absl::Status ClearRowsWithoutTokens(QkvFormat format, bool q_side, Tensor& t, float* lse,
                                      cudaStream_t stream) const {
    const Tensor& lengths = q_side ? seq_q : seq_kv;
    uint16_t* data = static_cast<uint16_t*>(t.raw_data());
    if (ragged()) {
      RaggedRows rows;
      rows.tokens = t.dim(0);
      rows.batch = b;
      rows.row_elems = t.dim(1) * t.dim(2);
      rows.heads = t.dim(1);
      const Tensor& start = *(q_side ? start_q : start_kv);
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchClearRowsOutsideSequences(rows, start.data<int32_t>(),
                                                                   lengths.data<int32_t>(), data, lse, stream));
    } else if (lengths.defined()) {
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(TokenRowsOf(format, t), lengths.data<int32_t>(), data, stream));
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<Tensor> SequenceLengths(const Context& ctx, const Tensor& cu_seqlens, int64_t batch) {
  ASSIGN_OR_RETURN(Tensor lengths, Tensor::Empty(DType::kInt32, {batch}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchSeqLensFromCu(cu_seqlens.data<int32_t>(), lengths.data<int32_t>(), batch, StreamOf(ctx)));
  return lengths;
}

// thd: cuDNN sees each sequence in a [max_seq] extent; the longest sequence is rounded up
// to a power of two (at least 128) so that batches of varying lengths share few graphs.
int64_t BucketedLength(int64_t longest) {
  int64_t bucket = 128;
  while (bucket < longest) bucket *= 2;
  return bucket;
}

absl::StatusOr<Tensor> RaggedOffsets(const Context& ctx, const Tensor& start, int64_t batch, int64_t row_elems) {
  ASSIGN_OR_RETURN(Tensor offsets, Tensor::Empty(DType::kInt32, {batch + 1}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchRaggedOffsets(start.data<int32_t>(), offsets.data<int32_t>(), batch, row_elems, StreamOf(ctx)));
  return offsets;
}

absl::StatusOr<Problem> PrepareProblem(const Context& ctx, const AttentionConfig& config, const Tensor& q,
                                       const Tensor& k, const Tensor& v, const AttentionSideTensors& side,
                                       const FusedSequences& sequences) {
  RETURN_IF_ERROR(FusedAttentionEligible(config, q.dtype(), q.dim(-1), v.dim(-1)));
  RETURN_IF_ERROR(CudnnLoaded());
  Problem p;
  ASSIGN_OR_RETURN(p.handle, CudnnState::Get().Handle(ctx.device.index, StreamOf(ctx)));
  const bool thd = config.qkv_format == QkvFormat::kThd;
  if (thd && std::max(q.numel(), k.numel()) > std::numeric_limits<int32_t>::max()) {
    return absl::UnimplementedError("not fused: thd tensors past 2^31 elements (cuDNN's INT32 ragged offsets)");
  }
  if (config.bias_type == AttnBiasType::kPostScaleBias) {
    if (!side.bias.defined() || side.bias.dtype() != q.dtype() || side.bias.rank() != 4) {
      return absl::InternalError("cuDNN SDPA: the post_scale_bias must come as a 4-D tensor in q's dtype");
    }
    p.bias = &side.bias;
  }
  const int64_t batch = thd ? side.cu_seqlens_q.dim(0) - 1 : 0;
  p.q = ViewOf(config.qkv_format, q, batch, BucketedLength(sequences.longest_q));
  p.k = ViewOf(config.qkv_format, k, batch, BucketedLength(sequences.longest_kv));
  p.v = ViewOf(config.qkv_format, v, batch, BucketedLength(sequences.longest_kv));
  p.b = p.q.dims[0];
  p.h = p.q.dims[1];
  p.s_q = p.q.dims[2];
  if (Padding(config.mask_type)) {
    ASSIGN_OR_RETURN(p.seq_q, SequenceLengths(ctx, side.cu_seqlens_q, p.b));
    ASSIGN_OR_RETURN(p.seq_kv, SequenceLengths(ctx, side.cu_seqlens_kv, p.b));
  }
  if (thd) {
    p.start_q = side.cu_seqlens_q_padded.defined() ? &side.cu_seqlens_q_padded : &side.cu_seqlens_q;
    p.start_kv = side.cu_seqlens_kv_padded.defined() ? &side.cu_seqlens_kv_padded : &side.cu_seqlens_kv;
    ASSIGN_OR_RETURN(p.offset_q, RaggedOffsets(ctx, *p.start_q, p.b, q.dim(1) * q.dim(2)));
    ASSIGN_OR_RETURN(p.offset_kv, RaggedOffsets(ctx, *p.start_kv, p.b, k.dim(1) * k.dim(2)));
  }
  return p;
}

// A graph computing in FP32 on `dtype` inputs, with q, k and v as its first inputs and,
// for thd, the ragged offsets of q's and k's side.
struct NewGraph {
  NewGraph(DType dtype, const Problem& p) : graph(std::make_shared<fe::graph::Graph>()) {
    graph->set_io_data_type(FrontendType(dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    if (p.ragged()) {
      ragged_q = IndexInput(*graph, "offset_q", kOffsetQ, p.b + 1);
      ragged_kv = IndexInput(*graph, "offset_kv", kOffsetKv, p.b + 1);
    }
    q = Input(*graph, "q", kQ, p.q, ragged_q);
    k = Input(*graph, "k", kK, p.k, ragged_kv);
    v = Input(*graph, "v", kV, p.v, ragged_kv);
  }

  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr ragged_q, ragged_kv;  // thd only
  TensorPtr q, k, v;
};

}  // namespace

absl::Status FusedAttentionEligible(const AttentionConfig& config, DType dtype, int64_t d_qk, int64_t d_v) {
  auto no = [](absl::string_view why) { return absl::UnimplementedError(absl::StrCat("not fused: ", why)); };
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return no("q, k, v are not BF16 / FP16");
  if (config.mask_type == AttnMaskType::kArbitrary) return no("cuDNN has no arbitrary boolean mask");
  if (config.bias_type == AttnBiasType::kPreScaleBias) {
    return no("cuDNN adds its bias after the scale (pre_scale_bias runs unfused)");
  }
  if (config.bias_type == AttnBiasType::kAlibi) {
    if (!config.alibi_default_slopes) return no("ALiBi with given slopes (cuDNN's ALiBi computes the default ones)");
    if (!TopLeft(config.mask_type)) {
      return no("ALiBi under a mask other than causal / padding_causal (cuDNN's ALiBi, slope * (j - i), is "
                "-slope * |i + o - j| only left of a top-left diagonal)");
    }
  }
  if (config.softmax_type != SoftmaxType::kVanilla) return no("softmax sinks (off-by-one, learnable) run unfused");
  if (config.dropout > 0.0f) return no("dropout masks must equal the CPU's bit for bit (counter-based RNG)");
  if (config.return_max_logit) return no("max_logit is computed by the unfused kernels");
  if (d_qk != d_v) return no("D_qk != D_v");
  if (d_qk % 8 != 0 || d_qk > 256) return no("cuDNN takes head sizes that are multiples of 8 up to 256");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudnnRuntimeVersion() {
  RETURN_IF_ERROR(CudnnLoaded());
  try {
    return static_cast<int64_t>(fe::detail::get_backend_version());
  } catch (const std::exception& e) {
    return absl::UnimplementedError(absl::StrCat("cuDNN: ", e.what()));
  }
}

absl::StatusOr<AttentionForwardOutputs> FusedAttentionForward(const Context& ctx, const AttentionConfig& config,
                                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                                              const AttentionSideTensors& side,
                                                              const FusedSequences& sequences) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const Problem p, PrepareProblem(ctx, config, q, k, v, side, sequences));
  const cudaStream_t stream = StreamOf(ctx);
  const cudnnHandle_t handle = p.handle;
  const View& qv = p.q;
  const int64_t b = p.b, h = p.h, s_q = p.s_q;
  const std::string key = ProblemKey("fwd", ctx.device.index, config, q.dtype(), p.q, p.k, p.v, p.bias);
  ASSIGN_OR_RETURN(std::shared_ptr<CachedGraph> cached, CudnnState::Get().GraphFor(key, [&]() {
    NewGraph g(q.dtype(), p);
    auto& graph = g.graph;
    fe::graph::SDPA_attributes attributes;
    attributes.set_name("sdpa_forward").set_generate_stats(true).set_attn_scale(config.softmax_scale);
    SetMask(config, attributes);
    SetPadding(config, *graph, b, attributes);
    SetScoreModifiers(config, p.bias, *graph, attributes);
    auto [o, stats] = graph->sdpa(g.q, g.k, g.v, attributes);
    SetOutput(o, kO, qv, g.ragged_q);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({b, h, s_q, 1}).set_stride(
        {h * s_q, s_q, 1, 1});
    return Finish(graph, handle);
  }));

  AttentionForwardOutputs result;
  ASSIGN_OR_RETURN(result.out, Tensor::Empty(q.dtype(), q.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty(DType::kFloat32, {b, h, s_q}, ctx.device, ctx.stream));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q.raw_data())},
                                             {kK, const_cast<void*>(k.raw_data())},
                                             {kV, const_cast<void*>(v.raw_data())},
                                             {kO, result.out.raw_data()},
                                             {kStats, stats.raw_data()}};
  p.AddSequenceInputs(pack);
  RETURN_IF_ERROR(Execute(*cached, handle, ctx, pack));
  Shape lse_shape = q.shape();
  lse_shape.pop_back();
  ASSIGN_OR_RETURN(result.softmax_lse, Tensor::Empty(DType::kFloat32, lse_shape, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchLsePermute(LseLayoutOf(config.qkv_format, p.q, p.start_q_data()),
                                                stats.data<float>(), result.softmax_lse.data<float>(),
                                                /*to_layout=*/true, p.seq_q_data(), stream));
  RETURN_IF_ERROR(p.ClearRowsWithoutTokens(config.qkv_format, /*q_side=*/true, result.out,
                                           result.softmax_lse.data<float>(), stream));
  return result;
}

absl::StatusOr<AttentionBackwardOutputs> FusedAttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                                const Tensor& q, const Tensor& k, const Tensor& v,
                                                                const AttentionSideTensors& side,
                                                                const FusedSequences& sequences, const Tensor& out,
                                                                const Tensor& softmax_lse, const Tensor& dout) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const Problem p, PrepareProblem(ctx, config, q, k, v, side, sequences));
  const cudaStream_t stream = StreamOf(ctx);
  const cudnnHandle_t handle = p.handle;
  const View &qv = p.q, &kv = p.k, &vv = p.v;
  const int64_t b = p.b, h = p.h, s_q = p.s_q;
  const std::string key = ProblemKey("bwd", ctx.device.index, config, q.dtype(), p.q, p.k, p.v, p.bias);
  ASSIGN_OR_RETURN(std::shared_ptr<CachedGraph> cached, CudnnState::Get().GraphFor(key, [&]() {
    NewGraph g(q.dtype(), p);
    auto& graph = g.graph;
    auto to = Input(*graph, "o", kO, qv, g.ragged_q);
    auto tdo = Input(*graph, "do", kDo, qv, g.ragged_q);
    auto tstats = graph->tensor(fe::graph::Tensor_attributes()
                                    .set_name("stats")
                                    .set_uid(kStats)
                                    .set_data_type(fe::DataType_t::FLOAT)
                                    .set_dim({b, h, s_q, 1})
                                    .set_stride({h * s_q, s_q, 1, 1}));
    fe::graph::SDPA_backward_attributes attributes;
    attributes.set_name("sdpa_backward").set_attn_scale(config.softmax_scale).set_deterministic_algorithm(config.deterministic);
    SetMask(config, attributes);
    SetPadding(config, *graph, b, attributes);
    if (SetScoreModifiers(config, p.bias, *graph, attributes) != nullptr) {
      attributes.set_dbias(BiasTensor(*graph, "dbias", kDbias, p.bias->shape()));
    }
    auto [dq, dk, dv] = graph->sdpa_backward(g.q, g.k, g.v, to, tdo, tstats, attributes);
    SetOutput(dq, kDq, qv, g.ragged_q);
    SetOutput(dk, kDk, kv, g.ragged_kv);
    SetOutput(dv, kDv, vv, g.ragged_kv);
    return Finish(graph, handle);
  }));

  ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty(DType::kFloat32, {b, h, s_q}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchLsePermute(LseLayoutOf(config.qkv_format, p.q, p.start_q_data()),
                                                softmax_lse.data<float>(), stats.data<float>(), /*to_layout=*/false,
                                                p.seq_q_data(), stream));
  AttentionBackwardOutputs result;
  ASSIGN_OR_RETURN(result.dq, Tensor::Empty(q.dtype(), q.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(result.dk, Tensor::Empty(k.dtype(), k.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(result.dv, Tensor::Empty(v.dtype(), v.shape(), ctx.device, ctx.stream));
  if (p.bias != nullptr) {
    // Zero-filled: cuDNN sums the broadcast dimensions into it and leaves positions no
    // unmasked score reaches (padding) as they were.
    ASSIGN_OR_RETURN(result.dbias, Tensor::ZerosOn(q.dtype(), p.bias->shape(), ctx.device, ctx.stream));
  }
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q.raw_data())},
                                             {kK, const_cast<void*>(k.raw_data())},
                                             {kV, const_cast<void*>(v.raw_data())},
                                             {kO, const_cast<void*>(out.raw_data())},
                                             {kDo, const_cast<void*>(dout.raw_data())},
                                             {kStats, stats.raw_data()},
                                             {kDq, result.dq.raw_data()},
                                             {kDk, result.dk.raw_data()},
                                             {kDv, result.dv.raw_data()}};
  p.AddSequenceInputs(pack);
  if (p.bias != nullptr) pack[kDbias] = result.dbias.raw_data();
  RETURN_IF_ERROR(Execute(*cached, handle, ctx, pack));
  RETURN_IF_ERROR(p.ClearRowsWithoutTokens(config.qkv_format, /*q_side=*/true, result.dq, nullptr, stream));
  RETURN_IF_ERROR(p.ClearRowsWithoutTokens(config.qkv_format, /*q_side=*/false, result.dk, nullptr, stream));
  RETURN_IF_ERROR(p.ClearRowsWithoutTokens(config.qkv_format, /*q_side=*/false, result.dv, nullptr, stream));
  return result;
}

void ReleaseCudnnHandle(int device_index, void* stream) {
  if (!CudnnLoaded().ok()) return;
  CudnnState::Get().ReleaseHandle(device_index, static_cast<cudaStream_t>(stream));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#else  // !TESERVE_WITH_CUDNN_FRONTEND

namespace teserve {
namespace kernels {
namespace cuda {
namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "not fused: teserve was built without the cuDNN frontend headers (pip package nvidia-cudnn-frontend)");
}
}  // namespace

absl::Status FusedAttentionEligible(const AttentionConfig&, DType, int64_t, int64_t) { return NotBuilt(); }
absl::StatusOr<int64_t> CudnnRuntimeVersion() { return NotBuilt(); }
absl::StatusOr<AttentionForwardOutputs> FusedAttentionForward(const Context&, const AttentionConfig&, const Tensor&,
                                                              const Tensor&, const Tensor&,
                                                              const AttentionSideTensors&, const FusedSequences&) {
  return NotBuilt();
}
absl::StatusOr<AttentionBackwardOutputs> FusedAttentionBackward(const Context&, const AttentionConfig&, const Tensor&,
                                                                const Tensor&, const Tensor&,
                                                                const AttentionSideTensors&, const FusedSequences&,
                                                                const Tensor&, const Tensor&, const Tensor&) {
  return NotBuilt();
}
void ReleaseCudnnHandle(int, void*) {}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_WITH_CUDNN_FRONTEND
