// CUDA attention (kernels/attention.h, kernels/cuda/attention) against the CPU
// reference on the same random inputs, forward and backward, for a table of
// configurations: every qkv format and mask type, windows, GQA/MQA, D_qk != D_v,
// S_q != S_kv, pre/post-scale bias with broadcast shapes, ALiBi slopes [H] and [B, H],
// off-by-one and learnable softmax, dropout, return_max_logit on and off, thd with and
// without padded offsets, rows and sequences with nothing to attend to, and the largest
// head size. The backward is given the CPU's out and softmax_lse on both sides, so it is
// compared on its own.
//
// Tolerances. The CPU sums in FP64 and rounds once; the kernels compute in FP32 (dot
// products over the head size, online-softmax sums over the keys, gradient sums over up
// to a few hundred queries or keys). Those FP32 sums carry errors of a few 1e-6 of the
// size of the terms summed, and the terms are at most about the size of the largest
// value of the tensor (gradients cancel, so the per-element value is no fair scale).
// So every element must satisfy
//   |got - want| <= kRtol * (max |want| over the tensor + |want|) + kAtol
// with kRtol = 1e-4, kAtol = 1e-7: an order of magnitude above the rounding, while any
// mask, index, dropout or scaling mistake moves values by a sizeable fraction of the
// tensor's scale. -inf entries (softmax_lse of rows that attend to nothing, max_logit of
// heads with nothing unmasked) must be -inf on both sides. Dropout masks are the same
// bits on both sides (kernels/stochastic_rounding.h), so dropout cases use the same
// tolerance. Each call is also run twice and must give the same bits (no atomics).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace {

using kernels::AttentionBackwardOutputs;
using kernels::AttentionForwardOutputs;
using kernels::AttentionSideTensors;
using kernels::AttnBiasType;
using kernels::AttnMaskType;
using kernels::QkvFormat;
using kernels::SoftmaxType;
using testing_kernels::AttentionProblem;
using testing_kernels::RandomTensor;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-7;

struct AttentionCase {
  std::string name;
  AttentionProblem problem;
  bool return_max_logit = true;
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

Tensor Int32Tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(values.size())}).value();
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// Host inputs of one problem (random values as in tests/kernels/attention_test.cc).
struct HostData {
  Tensor q, k, v, dout;
  AttentionSideTensors side;
};

HostData MakeData(const AttentionProblem& p, uint32_t seed) {
  HostData d;
  d.q = RandomTensor(p.q_shape(), -1.0f, 1.0f, seed);
  d.k = RandomTensor(p.k_shape(), -1.0f, 1.0f, seed + 1);
  d.v = RandomTensor(p.v_shape(), -1.0f, 1.0f, seed + 2);
  d.dout = RandomTensor(p.out_shape(), -1.0f, 1.0f, seed + 7);
  if (p.padded()) {
    d.side.cu_seqlens_q = Int32Tensor(p.cu_q);
    d.side.cu_seqlens_kv = Int32Tensor(p.cu_kv);
  }
  if (!p.cu_q_padded.empty()) d.side.cu_seqlens_q_padded = Int32Tensor(p.cu_q_padded);
  if (!p.cu_kv_padded.empty()) d.side.cu_seqlens_kv_padded = Int32Tensor(p.cu_kv_padded);
  if (p.mask == AttnMaskType::kArbitrary) {
    d.side.mask = Tensor::Zeros(DType::kBool, p.mask_shape).value();
    std::mt19937 rng(seed + 3);
    uint8_t* bits = d.side.mask.data<uint8_t>();
    for (int64_t i = 0; i < d.side.mask.numel(); ++i) bits[i] = (rng() % 10) < 3 ? 1 : 0;
    // A fully masked row of scores: the first query of every broadcast slice.
    for (int64_t j = 0; j < p.mask_shape[3]; ++j) bits[j] = 1;
  }
  if (p.bias == AttnBiasType::kPreScaleBias || p.bias == AttnBiasType::kPostScaleBias) {
    d.side.bias = RandomTensor(p.bias_shape, -1.0f, 1.0f, seed + 4);
  }
  if (p.bias == AttnBiasType::kAlibi) {
    d.side.alibi_slopes = p.batch_slopes ? RandomTensor({p.sequences(), p.heads}, 0.1f, 1.0f, seed + 5)
                                         : RandomTensor({p.heads}, 0.1f, 1.0f, seed + 5);
  }
  if (p.softmax == SoftmaxType::kLearnable) d.side.softmax_offset = RandomTensor({p.heads}, -1.0f, 1.0f, seed + 6);
  return d;
}

AttentionProblem Base(QkvFormat format, AttnMaskType mask) {
  AttentionProblem p;
  p.format = format;
  p.mask = mask;
  if (kernels::IsCausal(mask)) p.window_right = 0;
  return p;
}

AttentionProblem Thd(AttnMaskType mask, std::vector<int32_t> cu_q, std::vector<int32_t> cu_kv, int64_t t_q,
                     int64_t t_kv) {
  AttentionProblem p = Base(QkvFormat::kThd, mask);
  p.cu_q = std::move(cu_q);
  p.cu_kv = std::move(cu_kv);
  p.t_q = t_q;
  p.t_kv = t_kv;
  return p;
}

std::vector<AttentionCase> Cases() {
  using F = QkvFormat;
  using M = AttnMaskType;
  std::vector<AttentionCase> cases;
  auto add = [&](std::string name, AttentionProblem p, bool max_logit = true) {
    cases.push_back({std::move(name), std::move(p), max_logit});
  };
  AttentionProblem p;
  // Formats, S_q != S_kv, GQA / MQA, D_qk != D_v.
  p = Base(F::kSbhd, M::kNoMask), p.s_kv = 7;
  add("Sbhd_NoMask_Sq5_Skv7", p);
  p = Base(F::kBshd, M::kNoMask), p.s_q = 9, p.s_kv = 4, p.heads = 4, p.groups = 2, p.d_qk = 16, p.d_v = 8;
  add("Bshd_NoMask_GQA4x2_Dqk16_Dv8_Sq9_Skv4", p);
  p = Base(F::kBshd, M::kNoMask), p.heads = 3, p.groups = 1, p.d_qk = 40, p.d_v = 72;
  add("Bshd_NoMask_MQA_Dqk40_Dv72", p, /*max_logit=*/false);
  p = Base(F::kSbhd, M::kNoMask), p.batch = 3, p.s_q = 33, p.s_kv = 65, p.heads = 4, p.groups = 4;
  p.d_qk = 256, p.d_v = 256;
  add("Sbhd_NoMask_HeadSize256", p);
  // Mask types.
  for (M mask : {M::kCausal, M::kCausalBottomRight}) {
    for (auto [s_q, s_kv] : {std::pair<int64_t, int64_t>{4, 6}, {6, 4}}) {
      for (F format : {F::kSbhd, F::kBshd}) {
        p = Base(format, mask), p.s_q = s_q, p.s_kv = s_kv;
        add(absl::StrCat(format == F::kSbhd ? "Sbhd_" : "Bshd_", kernels::AttnMaskTypeName(mask), "_Sq", s_q, "_Skv",
                         s_kv),
            p);
      }
    }
  }
  p = Base(F::kBshd, M::kPadding), p.s_kv = 7, p.cu_q = {0, 3, 8}, p.cu_kv = {0, 6, 7};
  add("Bshd_Padding_Cross", p);
  p = Base(F::kSbhd, M::kPaddingCausal), p.cu_q = {0, 4, 6}, p.cu_kv = {0, 3, 8};
  add("Sbhd_PaddingCausal", p);
  p = Base(F::kBshd, M::kPaddingCausalBottomRight), p.s_kv = 6, p.cu_q = {0, 2, 7}, p.cu_kv = {0, 6, 9};
  add("Bshd_PaddingCausalBottomRight", p);
  p = Base(F::kSbhd, M::kPaddingCausalBottomRight), p.heads = 4, p.groups = 2, p.s_kv = 6;
  p.cu_q = {0, 5, 8}, p.cu_kv = {0, 6, 8};
  add("Sbhd_PaddingCausalBottomRight_GQA", p);
  p = Base(F::kBshd, M::kPadding), p.batch = 3, p.cu_q = {0, 0, 4, 7}, p.cu_kv = {0, 3, 5, 5};
  add("Bshd_Padding_EmptySequences", p);  // no queries; 2 keys; no keys (all-masked rows)
  p = Base(F::kBshd, M::kArbitrary), p.s_kv = 6, p.mask_shape = {2, 1, 5, 6};
  add("Bshd_Arbitrary_PerBatch_FullyMaskedRow", p);
  p = Base(F::kSbhd, M::kArbitrary), p.heads = 3, p.groups = 3, p.mask_shape = {1, 3, 1, 5};
  add("Sbhd_Arbitrary_BroadcastHeadsAndQueries", p);
  p = Base(F::kBshd, M::kArbitrary), p.heads = 4, p.groups = 1, p.mask_shape = {2, 4, 5, 1};
  add("Bshd_Arbitrary_MQA_BroadcastKeys", p);
  // Windows (left / right, with the diagonal offset).
  p = Base(F::kBshd, M::kNoMask), p.s_kv = 7, p.window_left = 2, p.window_right = 1;
  add("Bshd_NoMask_Window2x1_BottomRight", p);
  p = Base(F::kSbhd, M::kNoMask), p.s_q = 8, p.s_kv = 5, p.window_left = -1, p.window_right = 0;
  add("Sbhd_NoMask_WindowRight0_EmptyRows", p);
  p = Base(F::kSbhd, M::kCausal), p.s_q = 6, p.s_kv = 6, p.window_left = 2;
  add("Sbhd_Causal_Window2", p);
  p = Base(F::kBshd, M::kPaddingCausalBottomRight), p.s_kv = 6, p.cu_q = {0, 3, 8}, p.cu_kv = {0, 6, 10};
  p.window_left = 1;
  add("Bshd_PaddingCausalBottomRight_Window1", p);
  p = Base(F::kBshd, M::kPadding), p.cu_q = {0, 5, 8}, p.cu_kv = {0, 5, 10}, p.window_left = 0, p.window_right = 0;
  add("Bshd_Padding_Window0x0", p);
  p = Base(F::kBshd, M::kArbitrary), p.mask_shape = {2, 2, 5, 5}, p.window_left = 1, p.window_right = 1;
  add("Bshd_Arbitrary_Window1x1", p);
  // thd: ragged, with and without padded offsets, rows outside every sequence.
  p = Thd(M::kPadding, {0, 3, 3, 8}, {0, 2, 6, 9}, 10, 11), p.groups = 1;
  add("Thd_Padding_Ragged_MQA_TrailingRows", p);
  p = Thd(M::kPaddingCausal, {0, 3, 5, 9}, {0, 3, 5, 9}, 13, 13);
  p.cu_q_padded = {0, 4, 8, 13}, p.cu_kv_padded = {0, 4, 8, 13}, p.heads = 3, p.groups = 3;
  add("Thd_PaddingCausal_PaddedOffsets", p);
  p = Thd(M::kPaddingCausalBottomRight, {0, 2, 5}, {0, 4, 10}, 8, 12);
  p.cu_q_padded = {1, 3, 7}, p.cu_kv_padded = {0, 5, 11};
  add("Thd_PaddingCausalBottomRight_Cross_PaddedOffsets", p);
  p = Thd(M::kPadding, {0, 4, 7}, {0, 5, 9}, 7, 9), p.window_left = 1, p.window_right = 2;
  add("Thd_Padding_Window1x2", p);
  // Softmax types.
  p = Base(F::kBshd, M::kNoMask), p.softmax = SoftmaxType::kOffByOne;
  add("Bshd_NoMask_OffByOne", p);
  p = Base(F::kSbhd, M::kCausalBottomRight), p.softmax = SoftmaxType::kLearnable, p.s_q = 6;
  add("Sbhd_CausalBottomRight_Learnable_FullyMaskedRows", p);
  p = Thd(M::kPadding, {0, 3, 7}, {0, 0, 4}, 7, 4), p.softmax = SoftmaxType::kLearnable, p.heads = 4, p.groups = 2;
  add("Thd_Padding_Learnable_GQA_EmptyKeys", p);
  // Bias types and broadcast shapes.
  p = Base(F::kBshd, M::kNoMask), p.bias = AttnBiasType::kPreScaleBias, p.bias_shape = {1, 2, 5, 5}, p.scale = 0.3f;
  add("Bshd_NoMask_PreScaleBias_1hss", p);
  p = Base(F::kSbhd, M::kNoMask), p.heads = 4, p.groups = 2, p.s_kv = 7;
  p.bias = AttnBiasType::kPreScaleBias, p.bias_shape = {1, 1, 5, 7};
  add("Sbhd_NoMask_PreScaleBias_11ss_GQA", p);
  p = Base(F::kSbhd, M::kCausal), p.bias = AttnBiasType::kPostScaleBias, p.bias_shape = {2, 1, 5, 5};
  add("Sbhd_Causal_PostScaleBias_b1ss", p);
  p = Base(F::kBshd, M::kPadding), p.s_kv = 6, p.cu_q = {0, 4, 9}, p.cu_kv = {0, 6, 8};
  p.bias = AttnBiasType::kPostScaleBias, p.bias_shape = {2, 2, 5, 6};
  add("Bshd_Padding_PostScaleBias_bhss", p);
  p = Base(F::kBshd, M::kArbitrary), p.mask_shape = {1, 1, 5, 5};
  p.bias = AttnBiasType::kPostScaleBias, p.bias_shape = {2, 1, 5, 5}, p.softmax = SoftmaxType::kLearnable;
  add("Bshd_Arbitrary_PostScaleBias_Learnable", p);
  // ALiBi.
  p = Base(F::kBshd, M::kCausalBottomRight), p.s_q = 4, p.s_kv = 7, p.bias = AttnBiasType::kAlibi;
  add("Bshd_CausalBottomRight_Alibi", p);
  p = Base(F::kSbhd, M::kCausal), p.s_q = 4, p.s_kv = 7, p.bias = AttnBiasType::kAlibi;
  add("Sbhd_Causal_Alibi_TopLeft", p);
  p = Base(F::kBshd, M::kPadding), p.s_kv = 6, p.cu_q = {0, 2, 7}, p.cu_kv = {0, 6, 9};
  p.bias = AttnBiasType::kAlibi, p.batch_slopes = true;
  add("Bshd_Padding_AlibiPerBatchSlopes", p);
  p = Thd(M::kPaddingCausal, {0, 3, 8}, {0, 5, 9}, 8, 9), p.bias = AttnBiasType::kAlibi, p.batch_slopes = true;
  add("Thd_PaddingCausal_AlibiPerBatchSlopes", p);
  // Dropout.
  p = Base(F::kBshd, M::kCausal), p.dropout = 0.1f, p.dropout_seed = 17, p.dropout_stream = 5;
  add("Bshd_Causal_Dropout0p1", p);
  p = Thd(M::kPadding, {0, 3, 7}, {0, 4, 9}, 7, 9), p.dropout = 0.1f, p.dropout_seed = 3;
  p.softmax = SoftmaxType::kLearnable;
  add("Thd_Padding_Dropout0p1_Learnable", p);
  p = Base(F::kSbhd, M::kPadding), p.heads = 4, p.groups = 2, p.cu_q = {0, 5, 9}, p.cu_kv = {0, 4, 9};
  p.dropout = 0.1f, p.dropout_seed = 99, p.dropout_stream = 2;
  p.bias = AttnBiasType::kPreScaleBias, p.bias_shape = {2, 4, 5, 5};
  add("Sbhd_Padding_Dropout0p1_PreScaleBias_GQA", p);
  // Larger shapes: TE's "weird" shape, and a long GQA sequence with head size 128.
  p = Base(F::kSbhd, M::kCausal), p.batch = 3, p.s_q = 37, p.s_kv = 37, p.heads = 3, p.groups = 3;
  p.d_qk = 23, p.d_v = 23;
  add("Weird_Sbhd_Causal_3x37x3x23", p);
  p = Base(F::kBshd, M::kPaddingCausal), p.s_q = 160, p.s_kv = 160, p.heads = 8, p.groups = 2;
  p.d_qk = 128, p.d_v = 128, p.cu_q = {0, 160, 250}, p.cu_kv = {0, 160, 250}, p.dropout = 0.1f, p.dropout_seed = 5;
  add("Long_Bshd_PaddingCausal_GQA8x2_D128_Dropout", p);
  p = Thd(M::kPaddingCausalBottomRight, {0, 70, 70, 200}, {0, 90, 100, 300}, 210, 310);
  p.cu_q_padded = {0, 75, 75, 205}, p.cu_kv_padded = {0, 95, 105, 310}, p.heads = 4, p.groups = 4;
  p.d_qk = 64, p.d_v = 32, p.window_left = 40;
  add("Long_Thd_PaddingCausalBottomRight_Window40", p);
  return cases;
}

// The comparison of the file header, -inf entries matched exactly.
::testing::AssertionResult Close(const Tensor& got_host, const Tensor& want, const std::string& what) {
  if (!got_host.defined() || !want.defined()) {
    return ::testing::AssertionFailure() << what << ": defined " << got_host.defined() << " vs " << want.defined();
  }
  if (got_host.shape() != want.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << ShapeToString(got_host.shape()) << " vs "
                                         << ShapeToString(want.shape());
  }
  const absl::Span<const float> g = got_host.floats();
  const absl::Span<const float> w = want.floats();
  double scale = 0.0;
  for (float x : w) {
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  }
  int64_t failures = 0;
  std::string report;
  for (size_t i = 0; i < w.size(); ++i) {
    bool ok;
    double allowed = 0.0;
    if (!std::isfinite(w[i])) {
      ok = g[i] == w[i];
    } else {
      allowed = kRtol * (scale + std::fabs(static_cast<double>(w[i]))) + kAtol;
      ok = std::fabs(static_cast<double>(g[i]) - w[i]) <= allowed;  // NaN fails
    }
    if (ok) continue;
    if (++failures <= 5) absl::StrAppend(&report, "\n  [", i, "] got ", g[i], " want ", w[i], " (allowed ", allowed, ")");
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << failures << " of " << w.size() << " values differ"
                                       << report;
}

class AttentionGpuTest : public ::testing::TestWithParam<AttentionCase> {};

#if TESERVE_WITH_CUDA

// A CUDA context on its own non-blocking stream (outputs and scratch are ordered there).
class StreamContext {
 public:
  StreamContext() {
    ctx_.device = Device::Cuda(0);
    ok_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess;
    ctx_.stream = stream_;
  }
  ~StreamContext() {
    if (ok_) cudaStreamDestroy(stream_);
  }
  bool ok() const { return ok_; }
  const Context& ctx() const { return ctx_; }

 private:
  Context ctx_;
  cudaStream_t stream_ = nullptr;
  bool ok_ = false;
};

Tensor ToDevice(const Context& gpu, const Tensor& t) {
  if (!t.defined()) return Tensor();
  return kernels::CopyTo(gpu, t, gpu.device).value();
}

Tensor ToHost(const Context& gpu, const Tensor& t) {
  if (!t.defined()) return Tensor();
  return kernels::CopyTo(gpu, t, Device::Cpu()).value();
}

AttentionSideTensors SideToDevice(const Context& gpu, const AttentionSideTensors& s) {
  AttentionSideTensors d;
  d.cu_seqlens_q = ToDevice(gpu, s.cu_seqlens_q);
  d.cu_seqlens_kv = ToDevice(gpu, s.cu_seqlens_kv);
  d.cu_seqlens_q_padded = ToDevice(gpu, s.cu_seqlens_q_padded);
  d.cu_seqlens_kv_padded = ToDevice(gpu, s.cu_seqlens_kv_padded);
  d.mask = ToDevice(gpu, s.mask);
  d.bias = ToDevice(gpu, s.bias);
  d.alibi_slopes = ToDevice(gpu, s.alibi_slopes);
  d.softmax_offset = ToDevice(gpu, s.softmax_offset);
  return d;
}

// Both defined and bitwise equal, or both undefined.
bool SameBits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || BitwiseEqual(a, b);
}

TEST_P(AttentionGpuTest, ForwardAndBackwardMatchCpuReference) {
  TESERVE_SKIP_WITHOUT_GPU();
  const AttentionCase& c = GetParam();
  const AttentionProblem& p = c.problem;
  kernels::AttentionConfig config = p.config();
  config.return_max_logit = c.return_max_logit;
  const HostData h = MakeData(p, 41);
  StreamContext stream;
  ASSERT_TRUE(stream.ok());
  const Context& gpu = stream.ctx();
  const Tensor q = ToDevice(gpu, h.q), k = ToDevice(gpu, h.k), v = ToDevice(gpu, h.v);
  const Tensor dout = ToDevice(gpu, h.dout);
  const AttentionSideTensors side = SideToDevice(gpu, h.side);

  // Forward.
  ASSERT_OK_AND_ASSIGN(const AttentionForwardOutputs want,
                       kernels::AttentionForward(Context::Cpu(), config, h.q, h.k, h.v, h.side));
  ASSERT_OK_AND_ASSIGN(const AttentionForwardOutputs got, kernels::AttentionForward(gpu, config, q, k, v, side));
  EXPECT_EQ(got.out.device(), gpu.device);
  EXPECT_TRUE(Close(ToHost(gpu, got.out), want.out, "out"));
  EXPECT_TRUE(Close(ToHost(gpu, got.softmax_lse), want.softmax_lse, "softmax_lse"));
  if (c.return_max_logit) {
    EXPECT_TRUE(Close(ToHost(gpu, got.max_logit), want.max_logit, "max_logit"));
  } else {
    EXPECT_FALSE(got.max_logit.defined());
  }
  ASSERT_OK_AND_ASSIGN(const AttentionForwardOutputs again, kernels::AttentionForward(gpu, config, q, k, v, side));
  EXPECT_TRUE(SameBits(ToHost(gpu, again.out), ToHost(gpu, got.out))) << "out is not deterministic";
  EXPECT_TRUE(SameBits(ToHost(gpu, again.softmax_lse), ToHost(gpu, got.softmax_lse)));
  EXPECT_TRUE(SameBits(ToHost(gpu, again.max_logit), ToHost(gpu, got.max_logit)));

  // Backward from the CPU's forward outputs on both sides.
  ASSERT_OK_AND_ASSIGN(const AttentionBackwardOutputs want_grads,
                       kernels::AttentionBackward(Context::Cpu(), config, h.q, h.k, h.v, h.side, want.out,
                                                  want.softmax_lse, h.dout));
  const Tensor out = ToDevice(gpu, want.out), lse = ToDevice(gpu, want.softmax_lse);
  ASSERT_OK_AND_ASSIGN(const AttentionBackwardOutputs grads,
                       kernels::AttentionBackward(gpu, config, q, k, v, side, out, lse, dout));
  EXPECT_TRUE(Close(ToHost(gpu, grads.dq), want_grads.dq, "dq"));
  EXPECT_TRUE(Close(ToHost(gpu, grads.dk), want_grads.dk, "dk"));
  EXPECT_TRUE(Close(ToHost(gpu, grads.dv), want_grads.dv, "dv"));
  EXPECT_EQ(grads.dsoftmax_offset.defined(), want_grads.dsoftmax_offset.defined());
  if (want_grads.dsoftmax_offset.defined()) {
    EXPECT_TRUE(Close(ToHost(gpu, grads.dsoftmax_offset), want_grads.dsoftmax_offset, "dsoftmax_offset"));
  }
  EXPECT_EQ(grads.dbias.defined(), want_grads.dbias.defined());
  if (want_grads.dbias.defined()) {
    EXPECT_TRUE(Close(ToHost(gpu, grads.dbias), want_grads.dbias, "dbias"));
  }
  ASSERT_OK_AND_ASSIGN(const AttentionBackwardOutputs grads_again,
                       kernels::AttentionBackward(gpu, config, q, k, v, side, out, lse, dout));
  EXPECT_TRUE(SameBits(ToHost(gpu, grads_again.dq), ToHost(gpu, grads.dq))) << "dq is not deterministic";
  EXPECT_TRUE(SameBits(ToHost(gpu, grads_again.dk), ToHost(gpu, grads.dk))) << "dk is not deterministic";
  EXPECT_TRUE(SameBits(ToHost(gpu, grads_again.dv), ToHost(gpu, grads.dv))) << "dv is not deterministic";
  EXPECT_TRUE(SameBits(ToHost(gpu, grads_again.dbias), ToHost(gpu, grads.dbias))) << "dbias is not deterministic";
  EXPECT_TRUE(SameBits(ToHost(gpu, grads_again.dsoftmax_offset), ToHost(gpu, grads.dsoftmax_offset)));

  // The GPU's own forward outputs feed its backward as well (the training path).
  ASSERT_OK_AND_ASSIGN(const AttentionBackwardOutputs chained,
                       kernels::AttentionBackward(gpu, config, q, k, v, side, got.out, got.softmax_lse, dout));
  EXPECT_TRUE(Close(ToHost(gpu, chained.dq), want_grads.dq, "dq (GPU forward)"));
  EXPECT_TRUE(Close(ToHost(gpu, chained.dk), want_grads.dk, "dk (GPU forward)"));
  EXPECT_TRUE(Close(ToHost(gpu, chained.dv), want_grads.dv, "dv (GPU forward)"));
}

// Head sizes above the kernels' register rows are refused with a Status naming the field.
TEST(AttentionGpu, HeadSizeAbove256IsUnimplemented) {
  TESERVE_SKIP_WITHOUT_GPU();
  StreamContext stream;
  ASSERT_TRUE(stream.ok());
  const Context& gpu = stream.ctx();
  AttentionProblem p = Base(QkvFormat::kBshd, AttnMaskType::kNoMask);
  p.d_qk = 257;
  const HostData h = MakeData(p, 3);
  auto r = kernels::AttentionForward(gpu, p.config(), ToDevice(gpu, h.q), ToDevice(gpu, h.k), ToDevice(gpu, h.v),
                                     AttentionSideTensors());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("q.shape: the CUDA attention kernels take head sizes D_qk <= 256, got 257"),
            std::string::npos)
      << r.status();
  p.d_qk = 4;
  p.d_v = 300;
  const HostData h2 = MakeData(p, 3);
  auto r2 = kernels::AttentionForward(gpu, p.config(), ToDevice(gpu, h2.q), ToDevice(gpu, h2.k),
                                      ToDevice(gpu, h2.v), AttentionSideTensors());
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kUnimplemented) << r2.status();
  EXPECT_NE(r2.status().message().find("v.shape"), std::string::npos) << r2.status();
}

// cu_seqlens on the device are read back for the value checks: a bad value is the same
// INVALID_ARGUMENT as on the CPU.
TEST(AttentionGpu, DeviceCuSeqlensAreValidated) {
  TESERVE_SKIP_WITHOUT_GPU();
  StreamContext stream;
  ASSERT_TRUE(stream.ok());
  const Context& gpu = stream.ctx();
  AttentionProblem p = Base(QkvFormat::kBshd, AttnMaskType::kPadding);
  p.cu_q = {0, 4, 3};  // decreasing
  p.cu_kv = {0, 5, 10};
  const HostData h = MakeData(p, 5);
  auto cpu = kernels::AttentionForward(Context::Cpu(), p.config(), h.q, h.k, h.v, h.side);
  auto r = kernels::AttentionForward(gpu, p.config(), ToDevice(gpu, h.q), ToDevice(gpu, h.k), ToDevice(gpu, h.v),
                                     SideToDevice(gpu, h.side));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(r.status().message(), cpu.status().message());
  EXPECT_NE(r.status().message().find("cu_seqlens_q[2]"), std::string::npos) << r.status();
}

#endif  // TESERVE_WITH_CUDA

TEST_P(AttentionGpuTest, CudaContextWithoutCudaBuildIsAnError) {
#if TESERVE_WITH_CUDA
  GTEST_SKIP() << "built with CUDA: the GPU comparison covers this configuration";
#else
  const AttentionProblem& p = GetParam().problem;
  if (p.padded()) GTEST_SKIP() << "cu_seqlens values are read before dispatch";
  Context gpu;
  gpu.device = Device::Cuda(0);
  AttentionProblem plain = p;
  plain.bias = AttnBiasType::kNoBias;
  plain.softmax = SoftmaxType::kVanilla;
  if (plain.mask == AttnMaskType::kArbitrary) plain.mask = AttnMaskType::kNoMask;
  const Tensor q = Tensor::Borrow(nullptr, DType::kFloat32, plain.q_shape(), gpu.device);
  const Tensor k = Tensor::Borrow(nullptr, DType::kFloat32, plain.k_shape(), gpu.device);
  const Tensor v = Tensor::Borrow(nullptr, DType::kFloat32, plain.v_shape(), gpu.device);
  auto r = kernels::AttentionForward(gpu, plain.config(), q, k, v, AttentionSideTensors());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("AttentionForward has no kernel for cuda:0"), std::string::npos);
  const Tensor out = Tensor::Borrow(nullptr, DType::kFloat32, plain.out_shape(), gpu.device);
  Shape lse_shape = plain.q_shape();
  lse_shape.pop_back();
  const Tensor lse = Tensor::Borrow(nullptr, DType::kFloat32, lse_shape, gpu.device);
  auto g = kernels::AttentionBackward(gpu, plain.config(), q, k, v, AttentionSideTensors(), out, lse, out);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnimplemented) << g.status();
  EXPECT_NE(g.status().message().find("AttentionBackward has no kernel for cuda:0"), std::string::npos);
#endif
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; });

}  // namespace
}  // namespace teserve
