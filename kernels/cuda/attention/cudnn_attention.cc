// Host side of the cuDNN fused attention (cudnn_attention.h): graph building and caching,
// handles, the [B, H, S_q] <-> q-layout softmax_lse permutation, and execution on
// ctx.stream. The frontend is header-only and loads cuDNN with dlopen
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set in BUILD.bazel).
#include "kernels/cuda/attention/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kSeqQ, kSeqKv };

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

// [B, H, S, D] view of one of q, k, v, out (and their gradients) in sbhd / bshd.
struct View {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
};

View ViewOf(QkvFormat format, const Tensor& t) {
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

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& graph, const char* name, Uid uid,
                                                    const View& view) {
  return graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(view.dims).set_stride(view.strides));
}

void SetOutput(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const View& view) {
  t->set_output(true).set_uid(uid).set_dim(view.dims).set_stride(view.strides);
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

// Padding masks: cuDNN's per-sequence lengths (INT32 [B, 1, 1, 1] inputs kSeqQ, kSeqKv).
template <typename Attributes>
void SetPadding(const AttentionConfig& config, fe::graph::Graph& graph, int64_t batch, Attributes& attributes) {
  if (!Padding(config.mask_type)) return;
  auto lengths = [&](const char* name, Uid uid) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({batch, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  attributes.set_padding_mask(true)
      .set_seq_len_q(lengths("seq_len_q", kSeqQ))
      .set_seq_len_kv(lengths("seq_len_kv", kSeqKv));
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

std::string ProblemKey(const char* direction, int device, const AttentionConfig& config, const Tensor& q,
                       const Tensor& k, const Tensor& v) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &config.softmax_scale, sizeof(scale_bits));
  return absl::StrCat(direction, "|", device, "|", static_cast<int>(q.dtype()), "|",
                      static_cast<int>(config.qkv_format), "|", ShapeToString(q.shape()), ShapeToString(k.shape()),
                      ShapeToString(v.shape()), "|", static_cast<int>(config.mask_type), "|", config.window_left, "|",
                      config.window_right, "|", scale_bits, "|", config.deterministic ? 1 : 0);
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

// softmax_lse's strides in q's layout without the head size, as a [B, H, S_q] view.
LseLayout LseLayoutOf(QkvFormat format, const Tensor& q) {
  const View view = ViewOf(format, q);
  const int64_t b = view.dims[0], h = view.dims[1], s = view.dims[2];
  LseLayout layout;
  layout.batch = b;
  layout.heads = h;
  layout.seq = s;
  if (format == QkvFormat::kSbhd) {
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
// current device), the [B, H, S, D] views and, under a padding mask, the sequence lengths
// (INT32 [B] on the device, from cu_seqlens).
struct Problem {
  cudnnHandle_t handle = nullptr;
  View q, k, v;
  int64_t b = 0, h = 0, s_q = 0;
  Tensor seq_q, seq_kv;

  const int32_t* seq_q_data() const { return seq_q.defined() ? seq_q.data<int32_t>() : nullptr; }
  // The lengths' entries of an execution's variant pack.
  void AddLengths(std::unordered_map<int64_t, void*>& pack) const {
    if (!seq_q.defined()) return;
    pack[kSeqQ] = const_cast<void*>(seq_q.raw_data());
    pack[kSeqKv] = const_cast<void*>(seq_kv.raw_data());
  }
};

absl::StatusOr<Tensor> SequenceLengths(const Context& ctx, const Tensor& cu_seqlens, int64_t batch) {
  ASSIGN_OR_RETURN(Tensor lengths, Tensor::Empty(DType::kInt32, {batch}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchSeqLensFromCu(cu_seqlens.data<int32_t>(), lengths.data<int32_t>(), batch, StreamOf(ctx)));
  return lengths;
}

absl::StatusOr<Problem> PrepareProblem(const Context& ctx, const AttentionConfig& config, const Tensor& q,
                                       const Tensor& k, const Tensor& v, const AttentionSideTensors& side) {
  RETURN_IF_ERROR(FusedAttentionEligible(config, q.dtype(), q.dim(-1), v.dim(-1)));
  RETURN_IF_ERROR(CudnnLoaded());
  Problem p;
  ASSIGN_OR_RETURN(p.handle, CudnnState::Get().Handle(ctx.device.index, StreamOf(ctx)));
  p.q = ViewOf(config.qkv_format, q);
  p.k = ViewOf(config.qkv_format, k);
  p.v = ViewOf(config.qkv_format, v);
  p.b = p.q.dims[0];
  p.h = p.q.dims[1];
  p.s_q = p.q.dims[2];
  if (Padding(config.mask_type)) {
    ASSIGN_OR_RETURN(p.seq_q, SequenceLengths(ctx, side.cu_seqlens_q, p.b));
    ASSIGN_OR_RETURN(p.seq_kv, SequenceLengths(ctx, side.cu_seqlens_kv, p.b));
  }
  return p;
}

// A graph computing in FP32 on `dtype` inputs, with q, k and v as its first inputs.
std::tuple<std::shared_ptr<fe::graph::Graph>, std::shared_ptr<fe::graph::Tensor_attributes>,
           std::shared_ptr<fe::graph::Tensor_attributes>, std::shared_ptr<fe::graph::Tensor_attributes>>
NewGraph(DType dtype, const Problem& p) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(FrontendType(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tq = Input(*graph, "q", kQ, p.q);
  auto tk = Input(*graph, "k", kK, p.k);
  auto tv = Input(*graph, "v", kV, p.v);
  return {graph, tq, tk, tv};
}

}  // namespace

absl::Status FusedAttentionEligible(const AttentionConfig& config, DType dtype, int64_t d_qk, int64_t d_v) {
  auto no = [](absl::string_view why) { return absl::UnimplementedError(absl::StrCat("not fused: ", why)); };
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return no("q, k, v are not BF16 / FP16");
  if (config.qkv_format == QkvFormat::kThd) return no("thd (ragged offsets) is not wired to cuDNN yet");
  if (config.mask_type == AttnMaskType::kArbitrary) return no("cuDNN has no arbitrary boolean mask");
  if (config.bias_type != AttnBiasType::kNoBias) return no("bias and ALiBi are not wired to cuDNN yet");
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
                                                              const AttentionSideTensors& side) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const Problem p, PrepareProblem(ctx, config, q, k, v, side));
  const cudaStream_t stream = StreamOf(ctx);
  const cudnnHandle_t handle = p.handle;
  const View& qv = p.q;
  const int64_t b = p.b, h = p.h, s_q = p.s_q;
  const std::string key = ProblemKey("fwd", ctx.device.index, config, q, k, v);
  ASSIGN_OR_RETURN(std::shared_ptr<CachedGraph> cached, CudnnState::Get().GraphFor(key, [&]() {
    auto [graph, tq, tk, tv] = NewGraph(q.dtype(), p);
    fe::graph::SDPA_attributes attributes;
    attributes.set_name("sdpa_forward").set_generate_stats(true).set_attn_scale(config.softmax_scale);
    SetMask(config, attributes);
    SetPadding(config, *graph, b, attributes);
    auto [o, stats] = graph->sdpa(tq, tk, tv, attributes);
    SetOutput(o, kO, qv);
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
  p.AddLengths(pack);
  RETURN_IF_ERROR(Execute(*cached, handle, ctx, pack));
  Shape lse_shape = q.shape();
  lse_shape.pop_back();
  ASSIGN_OR_RETURN(result.softmax_lse, Tensor::Empty(DType::kFloat32, lse_shape, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchLsePermute(LseLayoutOf(config.qkv_format, q), stats.data<float>(),
                                                result.softmax_lse.data<float>(), /*to_layout=*/true,
                                                p.seq_q_data(), stream));
  if (p.seq_q.defined()) {
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(TokenRowsOf(config.qkv_format, result.out), p.seq_q_data(),
                                                      static_cast<uint16_t*>(result.out.raw_data()), stream));
  }
  return result;
}

absl::StatusOr<AttentionBackwardOutputs> FusedAttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                                const Tensor& q, const Tensor& k, const Tensor& v,
                                                                const AttentionSideTensors& side, const Tensor& out,
                                                                const Tensor& softmax_lse, const Tensor& dout) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(const Problem p, PrepareProblem(ctx, config, q, k, v, side));
  const cudaStream_t stream = StreamOf(ctx);
  const cudnnHandle_t handle = p.handle;
  const View &qv = p.q, &kv = p.k, &vv = p.v;
  const int64_t b = p.b, h = p.h, s_q = p.s_q;
  const std::string key = ProblemKey("bwd", ctx.device.index, config, q, k, v);
  ASSIGN_OR_RETURN(std::shared_ptr<CachedGraph> cached, CudnnState::Get().GraphFor(key, [&]() {
    auto [graph, tq, tk, tv] = NewGraph(q.dtype(), p);
    auto to = Input(*graph, "o", kO, qv);
    auto tdo = Input(*graph, "do", kDo, qv);
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
    auto [dq, dk, dv] = graph->sdpa_backward(tq, tk, tv, to, tdo, tstats, attributes);
    SetOutput(dq, kDq, qv);
    SetOutput(dk, kDk, kv);
    SetOutput(dv, kDv, vv);
    return Finish(graph, handle);
  }));

  ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty(DType::kFloat32, {b, h, s_q}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchLsePermute(LseLayoutOf(config.qkv_format, q), softmax_lse.data<float>(),
                                                stats.data<float>(), /*to_layout=*/false, p.seq_q_data(), stream));
  AttentionBackwardOutputs result;
  ASSIGN_OR_RETURN(result.dq, Tensor::Empty(q.dtype(), q.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(result.dk, Tensor::Empty(k.dtype(), k.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(result.dv, Tensor::Empty(v.dtype(), v.shape(), ctx.device, ctx.stream));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q.raw_data())},
                                             {kK, const_cast<void*>(k.raw_data())},
                                             {kV, const_cast<void*>(v.raw_data())},
                                             {kO, const_cast<void*>(out.raw_data())},
                                             {kDo, const_cast<void*>(dout.raw_data())},
                                             {kStats, stats.raw_data()},
                                             {kDq, result.dq.raw_data()},
                                             {kDk, result.dk.raw_data()},
                                             {kDv, result.dv.raw_data()}};
  p.AddLengths(pack);
  RETURN_IF_ERROR(Execute(*cached, handle, ctx, pack));
  if (p.seq_q.defined()) {
    for (auto [t, lengths] : {std::pair<Tensor*, const Tensor*>{&result.dq, &p.seq_q},
                              {&result.dk, &p.seq_kv},
                              {&result.dv, &p.seq_kv}}) {
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(TokenRowsOf(config.qkv_format, *t), lengths->data<int32_t>(),
                                                        static_cast<uint16_t*>(t->raw_data()), stream));
    }
  }
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
                                                              const AttentionSideTensors&) {
  return NotBuilt();
}
absl::StatusOr<AttentionBackwardOutputs> FusedAttentionBackward(const Context&, const AttentionConfig&, const Tensor&,
                                                                const Tensor&, const Tensor&,
                                                                const AttentionSideTensors&, const Tensor&,
                                                                const Tensor&, const Tensor&) {
  return NotBuilt();
}
void ReleaseCudnnHandle(int, void*) {}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_WITH_CUDNN_FRONTEND
