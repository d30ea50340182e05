// cuDNN's fused attention (kernels/cuda/attention/cudnn_attention.h) through
// kernels::AttentionForward / Backward with BF16 and FP16 q, k, v, against the CPU
// reference run on the same 16-bit values widened to FP32 (exact), forward and backward:
// sbhd / bshd, no_mask, causal, causal_bottom_right, a sliding window, the three padding
// types (ragged lengths, an empty query sequence; padding rows must come out as the
// contract's zeros and -inf even with unfilled allocations poisoned), thd (packed and
// with padded offsets, rows outside every sequence), GQA and MQA, head
// sizes 64 and 128, odd sequence lengths, a post_scale_bias of each broadcast shape (with
// dbias) and ALiBi with the default slopes. Also: which path ran (fused for these, unfused
// with the reason for a query row with no key), the dtypes of every output, and that a
// repeated backward gives the same bits (cuDNN's deterministic algorithm).
//
// Tolerances. The inputs are exact on both sides; the fused kernels round the
// probabilities P to the input dtype before P V and dP, and round out and the gradients
// to it. So every element must satisfy
//   |got - want| <= rtol * (max |want| over the tensor + |want|)
// with rtol 2e-2 for BF16 (8 significant bits) and 4e-3 for FP16 (11): a few units of the
// 16-bit rounding of the tensor's scale, while a mask, offset, head-mapping or scale
// mistake moves values by a sizeable fraction of it. softmax_lse (FP32, natural-log
// logsumexp of the scaled scores) is compared with 1e-3 absolute. Equal values (the
// padding rows' 0 and -inf) always agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention/cudnn_attention.h"
#endif

namespace teserve {
namespace {

using kernels::AttentionPath;
using kernels::AttnMaskType;
using kernels::QkvFormat;
using testing_kernels::AttentionProblem;
using testing_kernels::RandomTensor;

struct FusedCase {
  std::string name;
  AttentionProblem problem;
  DType dtype;
};

void PrintTo(const FusedCase& c, std::ostream* os) { *os << c.name; }

std::vector<FusedCase> Cases() {
  using F = QkvFormat;
  using M = AttnMaskType;
  std::vector<FusedCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const std::string t = dtype == DType::kBFloat16 ? "Bf16" : "Fp16";
    auto add = [&](std::string name, AttentionProblem p) { cases.push_back({t + "_" + name, std::move(p), dtype}); };
    AttentionProblem p;
    p.format = F::kBshd, p.mask = M::kNoMask, p.batch = 2, p.s_q = 128, p.s_kv = 128, p.heads = 4, p.groups = 4;
    p.d_qk = 64, p.d_v = 64;
    add("Bshd_NoMask_D64", p);
    p.format = F::kSbhd, p.mask = M::kCausal, p.window_right = 0, p.s_q = 200, p.s_kv = 200, p.d_qk = 128;
    p.d_v = 128, p.groups = 2;
    add("Sbhd_Causal_GQA4x2_D128_S200", p);
    p.format = F::kBshd, p.mask = M::kCausalBottomRight, p.s_q = 96, p.s_kv = 160, p.groups = 1;
    add("Bshd_CausalBottomRight_MQA_Sq96_Skv160", p);
    p.format = F::kBshd, p.mask = M::kCausal, p.s_q = 192, p.s_kv = 192, p.groups = 4, p.window_left = 31;
    p.d_qk = 64, p.d_v = 64;
    add("Bshd_Causal_Window31", p);
    p = AttentionProblem();
    p.format = F::kBshd, p.mask = M::kPadding, p.batch = 3, p.s_q = 128, p.s_kv = 128, p.heads = 4, p.groups = 2;
    p.d_qk = 64, p.d_v = 64, p.cu_q = {0, 100, 228, 265}, p.cu_kv = {0, 128, 218, 219};
    add("Bshd_Padding_GQA_Lengths100_128_37", p);
    p.format = F::kSbhd, p.mask = M::kPaddingCausal, p.window_right = 0, p.s_q = 128, p.s_kv = 128, p.groups = 4;
    p.d_qk = 128, p.d_v = 128, p.cu_q = {0, 70, 198, 199}, p.cu_kv = {0, 128, 228, 292};
    add("Sbhd_PaddingCausal_D128", p);
    p.format = F::kBshd, p.mask = M::kPaddingCausalBottomRight, p.s_q = 96, p.s_kv = 160, p.groups = 1;
    p.d_qk = 64, p.d_v = 64, p.cu_q = {0, 50, 146, 146}, p.cu_kv = {0, 80, 240, 250};
    add("Bshd_PaddingCausalBottomRight_MQA_EmptyQuery", p);
    p = AttentionProblem();
    p.format = F::kThd, p.mask = M::kPaddingCausal, p.window_right = 0, p.heads = 4, p.groups = 2;
    p.d_qk = 64, p.d_v = 64, p.cu_q = {0, 100, 228, 265}, p.cu_kv = {0, 100, 228, 265}, p.t_q = 280, p.t_kv = 270;
    add("Thd_PaddingCausal_GQA_TailRows", p);
    p.mask = M::kPadding, p.window_right = -1, p.groups = 4, p.d_qk = 128, p.d_v = 128;
    p.cu_q = {0, 60, 150, 151}, p.cu_q_padded = {0, 64, 160, 176}, p.t_q = 180;
    p.cu_kv = {0, 90, 150, 190}, p.cu_kv_padded = {0, 96, 160, 208}, p.t_kv = 210;
    add("Thd_Padding_PaddedOffsets_D128", p);
    p.mask = M::kPaddingCausalBottomRight, p.window_right = 0, p.groups = 1, p.d_qk = 64, p.d_v = 64;
    p.cu_q = {0, 40, 40, 140}, p.cu_kv = {0, 64, 70, 270}, p.cu_q_padded.clear(), p.cu_kv_padded.clear();
    p.t_q = 140, p.t_kv = 270;
    add("Thd_PaddingCausalBottomRight_MQA_EmptyQuery", p);
    // Score modifiers: post_scale_bias of every broadcast shape (cuDNN may refuse some
    // dbias shapes; that backward then runs unfused and must still match), ALiBi with the
    // default slopes on the top-left causal masks.
    using B = kernels::AttnBiasType;
    p = AttentionProblem();
    p.format = F::kBshd, p.mask = M::kNoMask, p.batch = 2, p.s_q = 128, p.s_kv = 128, p.heads = 4, p.groups = 4;
    p.d_qk = 64, p.d_v = 64, p.bias = B::kPostScaleBias, p.bias_shape = {1, 4, 128, 128};
    add("Bshd_NoMask_PostScaleBias1H", p);
    p.format = F::kSbhd, p.mask = M::kCausal, p.window_right = 0, p.bias_shape = {2, 4, 128, 128}, p.groups = 2;
    add("Sbhd_Causal_GQA_PostScaleBiasBH", p);
    p.format = F::kBshd, p.groups = 4, p.s_q = 64, p.s_kv = 192, p.bias_shape = {2, 1, 64, 192};
    add("Bshd_Causal_Sq64_Skv192_PostScaleBiasB1", p);
    p.mask = M::kPadding, p.window_right = -1, p.batch = 3, p.s_q = 128, p.s_kv = 128, p.bias_shape = {1, 1, 128, 128};
    p.cu_q = {0, 100, 228, 265}, p.cu_kv = {0, 128, 218, 219};
    add("Bshd_Padding_PostScaleBias11", p);
    p = AttentionProblem();
    p.format = F::kBshd, p.mask = M::kCausal, p.window_right = 0, p.batch = 2, p.s_q = 160, p.s_kv = 160;
    p.heads = 8, p.groups = 2, p.d_qk = 64, p.d_v = 64, p.bias = B::kAlibi;
    add("Bshd_Causal_GQA_Alibi", p);
    p.format = F::kSbhd, p.mask = M::kPaddingCausal, p.heads = 6, p.groups = 6, p.batch = 3, p.s_q = 128, p.s_kv = 128;
    p.d_qk = 128, p.d_v = 128, p.cu_q = {0, 70, 198, 199}, p.cu_kv = {0, 128, 228, 292};
    add("Sbhd_PaddingCausal_Heads6_Alibi", p);
    p = AttentionProblem();
    p.format = F::kThd, p.mask = M::kPaddingCausal, p.window_right = 0, p.heads = 4, p.groups = 2, p.d_qk = 64;
    p.d_v = 64, p.cu_q = {0, 100, 228, 265}, p.cu_kv = {0, 100, 228, 265}, p.t_q = 280, p.t_kv = 270;
    p.bias = B::kAlibi;
    add("Thd_PaddingCausal_Alibi", p);
  }
  return cases;
}

::testing::AssertionResult Close(const Tensor& got, const Tensor& want, double rtol, double atol,
                                 const std::string& what) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << ShapeToString(got.shape()) << " vs "
                                         << ShapeToString(want.shape());
  }
  const absl::Span<const float> g = got.floats();
  const absl::Span<const float> w = want.floats();
  double scale = 0.0;
  for (float x : w) {
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  }
  int64_t failures = 0;
  std::string report;
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i]) continue;  // the padding rows' exact 0 and -inf
    const double allowed = rtol * (scale + std::fabs(static_cast<double>(w[i]))) + atol;
    if (std::fabs(static_cast<double>(g[i]) - w[i]) <= allowed) continue;  // NaN fails
    if (++failures <= 5) absl::StrAppend(&report, "\n  [", i, "] got ", g[i], " want ", w[i], " (allowed ", allowed, ")");
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << failures << " of " << w.size() << " values differ" << report;
}

class FusedAttentionGpuTest : public ::testing::TestWithParam<FusedCase> {};

#if TESERVE_WITH_CUDA

kernels::AttentionConfig ConfigOf(const AttentionProblem& p) {
  kernels::AttentionConfig config;
  config.qkv_format = p.format;
  config.mask_type = p.mask;
  config.window_left = p.window_left;
  config.window_right = p.window_right;
  config.softmax_scale = p.softmax_scale();
  config.bias_type = p.bias;
  config.alibi_default_slopes = p.bias == kernels::AttnBiasType::kAlibi;
  return config;
}

// cu_seqlens of the padding cases, on the host (the CPU reference) and on the GPU.
Tensor Int32Tensor(const std::vector<int32_t>& values) {
  if (values.empty()) return Tensor();
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(values.size())}).value();
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// cu_seqlens (and thd's padded offsets) of the padding and thd cases, on the host (the
// CPU reference) and on the GPU.
kernels::AttentionSideTensors SideOf(const AttentionProblem& p) {
  kernels::AttentionSideTensors side;
  side.cu_seqlens_q = Int32Tensor(p.cu_q);
  side.cu_seqlens_kv = Int32Tensor(p.cu_kv);
  side.cu_seqlens_q_padded = Int32Tensor(p.cu_q_padded);
  side.cu_seqlens_kv_padded = Int32Tensor(p.cu_kv_padded);
  if (p.bias == kernels::AttnBiasType::kPostScaleBias) side.bias = RandomTensor(p.bias_shape, -2.0f, 2.0f, 15);
  if (p.bias == kernels::AttnBiasType::kAlibi) {
    side.alibi_slopes = Tensor::FromFloats(kernels::DefaultAlibiSlopes(p.heads), {p.heads}).value();
  }
  return side;
}

kernels::AttentionSideTensors OnDevice(const Context& gpu, const kernels::AttentionSideTensors& host) {
  auto copy = [&](const Tensor& t) { return t.defined() ? kernels::CopyTo(gpu, t, gpu.device).value() : Tensor(); };
  kernels::AttentionSideTensors side;
  side.cu_seqlens_q = copy(host.cu_seqlens_q);
  side.cu_seqlens_kv = copy(host.cu_seqlens_kv);
  side.cu_seqlens_q_padded = copy(host.cu_seqlens_q_padded);
  side.cu_seqlens_kv_padded = copy(host.cu_seqlens_kv_padded);
  side.bias = copy(host.bias);
  side.alibi_slopes = copy(host.alibi_slopes);
  return side;
}

// A host tensor rounded to `dtype` and widened back: the values both sides compute on.
Tensor Rounded(const Context& cpu, const Tensor& x, DType dtype) {
  return kernels::Convert(cpu, kernels::Convert(cpu, x, dtype).value(), DType::kFloat32).value();
}

Tensor WideHost(const Context& gpu, const Tensor& device_tensor) {
  const Tensor host = kernels::CopyTo(gpu, device_tensor, Device::Cpu()).value();
  Context cpu;
  return host.dtype() == DType::kFloat32 ? host : kernels::Convert(cpu, host, DType::kFloat32).value();
}

TEST_P(FusedAttentionGpuTest, MatchesTheReferenceOnTheSame16BitValues) {
  TESERVE_SKIP_WITHOUT_GPU();
  if (const auto version = kernels::cuda::CudnnRuntimeVersion(); !version.ok()) {
    GTEST_SKIP() << version.status().message();
  }
  const FusedCase& c = GetParam();
  const AttentionProblem& p = c.problem;
  const kernels::AttentionConfig config = ConfigOf(p);
  const double rtol = c.dtype == DType::kBFloat16 ? 2e-2 : 4e-3;
  Context cpu;
  const Tensor q = Rounded(cpu, RandomTensor(p.q_shape(), -1.0f, 1.0f, 11), c.dtype);
  const Tensor k = Rounded(cpu, RandomTensor(p.k_shape(), -1.0f, 1.0f, 12), c.dtype);
  const Tensor v = Rounded(cpu, RandomTensor(p.v_shape(), -1.0f, 1.0f, 13), c.dtype);
  const Tensor dout = Rounded(cpu, RandomTensor(p.out_shape(), -1.0f, 1.0f, 14), c.dtype);
  kernels::AttentionSideTensors side = SideOf(p);
  // The fused path rounds the bias to the inputs' dtype: the reference takes the same.
  if (side.bias.defined()) side.bias = Rounded(cpu, side.bias, c.dtype);
  ASSERT_OK_AND_ASSIGN(const kernels::AttentionForwardOutputs want,
                       kernels::AttentionForward(cpu, config, q, k, v, side));
  ASSERT_OK_AND_ASSIGN(const kernels::AttentionBackwardOutputs want_grads,
                       kernels::AttentionBackward(cpu, config, q, k, v, side, want.out, want.softmax_lse, dout));

  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = stream.context();
  auto narrow = [&](const Tensor& x) {
    return kernels::CopyTo(gpu, kernels::Convert(cpu, x, c.dtype).value(), gpu.device).value();
  };
  const Tensor dq16 = narrow(q), dk16 = narrow(k), dv16 = narrow(v), ddout16 = narrow(dout);
  const kernels::AttentionSideTensors gpu_side = OnDevice(gpu, side);
  ASSERT_OK_AND_ASSIGN(const kernels::AttentionForwardOutputs got,
                       kernels::AttentionForward(gpu, config, dq16, dk16, dv16, gpu_side));
  EXPECT_EQ(got.path, AttentionPath::kCudnnFused) << got.unfused_reason;
  EXPECT_EQ(got.out.dtype(), c.dtype);
  EXPECT_EQ(got.softmax_lse.dtype(), DType::kFloat32);
  EXPECT_TRUE(Close(WideHost(gpu, got.out), want.out, rtol, 0.0, "out"));
  EXPECT_TRUE(Close(WideHost(gpu, got.softmax_lse), want.softmax_lse, 0.0, 1e-3, "softmax_lse"));

  ASSERT_OK_AND_ASSIGN(const kernels::AttentionBackwardOutputs grads,
                       kernels::AttentionBackward(gpu, config, dq16, dk16, dv16, gpu_side, got.out,
                                                  got.softmax_lse, ddout16));
  EXPECT_EQ(grads.dq.dtype(), c.dtype);
  // Every backward here runs fused, except that cuDNN may refuse a dbias shape (then the
  // unfused kernels answer, from the fused forward's outputs, and must still match).
  if (p.bias != kernels::AttnBiasType::kPostScaleBias || (p.bias_shape[0] == 1 && p.bias_shape[1] != 1)) {
    EXPECT_EQ(grads.path, AttentionPath::kCudnnFused) << grads.unfused_reason;
  }
  std::printf("%s backward: %s %s\n", c.name.c_str(),
              grads.path == AttentionPath::kCudnnFused ? "cudnn_fused" : "unfused", grads.unfused_reason.c_str());
  // dq, dk, dv sum over keys / queries with P and dP rounded to 16 bits: twice the
  // forward's tolerance.
  EXPECT_TRUE(Close(WideHost(gpu, grads.dq), want_grads.dq, 2 * rtol, 0.0, "dq"));
  EXPECT_TRUE(Close(WideHost(gpu, grads.dk), want_grads.dk, 2 * rtol, 0.0, "dk"));
  EXPECT_TRUE(Close(WideHost(gpu, grads.dv), want_grads.dv, 2 * rtol, 0.0, "dv"));
  if (p.bias == kernels::AttnBiasType::kPostScaleBias) {
    ASSERT_TRUE(grads.dbias.defined());
    EXPECT_EQ(grads.dbias.dtype(), DType::kFloat32);
    EXPECT_TRUE(Close(WideHost(gpu, grads.dbias), want_grads.dbias, 2 * rtol, 0.0, "dbias"));
  }

  ASSERT_OK_AND_ASSIGN(const kernels::AttentionBackwardOutputs again,
                       kernels::AttentionBackward(gpu, config, dq16, dk16, dv16, gpu_side, got.out,
                                                  got.softmax_lse, ddout16));
  const Tensor a = WideHost(gpu, grads.dq), b = WideHost(gpu, again.dq);
  EXPECT_TRUE(std::equal(a.floats().begin(), a.floats().end(), b.floats().begin())) << "dq differs between runs";
  const Tensor ak = WideHost(gpu, grads.dk), bk = WideHost(gpu, again.dk);
  EXPECT_TRUE(std::equal(ak.floats().begin(), ak.floats().end(), bk.floats().begin())) << "dk differs between runs";
}

INSTANTIATE_TEST_SUITE_P(Fused, FusedAttentionGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<FusedCase>& info) { return info.param.name; });

// A call whose configuration is in the fused set but in which a query row has no key to
// attend (sequence 1: 8 queries, 6 keys, bottom-right causal) runs unfused in FP32 and
// says why; the outputs still have the input dtype and match the reference.
TEST(FusedAttentionFallback, AQueryRowWithNoKeyRunsUnfusedAndSaysWhy) {
  TESERVE_SKIP_WITHOUT_GPU();
  AttentionProblem p;
  p.format = QkvFormat::kBshd, p.mask = AttnMaskType::kPaddingCausalBottomRight, p.window_right = 0;
  p.s_q = 8, p.s_kv = 8, p.d_qk = 16, p.d_v = 16;
  p.cu_q = {0, 5, 13}, p.cu_kv = {0, 6, 12};
  kernels::AttentionConfig config = ConfigOf(p);
  Context cpu;
  const Tensor q = Rounded(cpu, RandomTensor(p.q_shape(), -1.0f, 1.0f, 21), DType::kBFloat16);
  const Tensor k = Rounded(cpu, RandomTensor(p.k_shape(), -1.0f, 1.0f, 22), DType::kBFloat16);
  const Tensor v = Rounded(cpu, RandomTensor(p.v_shape(), -1.0f, 1.0f, 23), DType::kBFloat16);
  const kernels::AttentionSideTensors side = SideOf(p);
  ASSERT_OK_AND_ASSIGN(const kernels::AttentionForwardOutputs want, kernels::AttentionForward(cpu, config, q, k, v, side));

  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = stream.context();
  auto narrow = [&](const Tensor& x) {
    return kernels::CopyTo(gpu, kernels::Convert(cpu, x, DType::kBFloat16).value(), gpu.device).value();
  };
  ASSERT_OK_AND_ASSIGN(const kernels::AttentionForwardOutputs got,
                       kernels::AttentionForward(gpu, config, narrow(q), narrow(k), narrow(v), OnDevice(gpu, side)));
  EXPECT_EQ(got.path, AttentionPath::kCudaUnfused);
  EXPECT_NE(got.unfused_reason.find("query 0 of sequence 1 has no key"), std::string::npos) << got.unfused_reason;
  EXPECT_EQ(got.out.dtype(), DType::kBFloat16);
  // The unfused path computes in FP32 and rounds out once: within BF16's half ulp.
  EXPECT_TRUE(Close(WideHost(gpu, got.out), want.out, 4e-3, 0.0, "out"));
  // The configuration itself is in the fused set (only this call's lengths are not).
  const absl::Status eligible =
      kernels::FusedAttentionEligible(gpu.device, config, DType::kBFloat16, p.d_qk, p.d_v);
  EXPECT_TRUE(eligible.ok()) << eligible;
}

// An arbitrary boolean mask is outside the fused set whatever the lengths.
TEST(FusedAttentionFallback, ArbitraryMaskIsNotEligible) {
  TESERVE_SKIP_WITHOUT_GPU();
  kernels::AttentionConfig config;
  config.qkv_format = QkvFormat::kBshd;
  config.mask_type = AttnMaskType::kArbitrary;
  const absl::Status eligible = kernels::FusedAttentionEligible(Device::Cuda(0), config, DType::kBFloat16, 64, 64);
  EXPECT_TRUE(absl::IsUnimplemented(eligible)) << eligible;
  EXPECT_NE(eligible.message().find("arbitrary"), std::string::npos) << eligible;
}

// Score modifiers cuDNN does not compute as the contract defines them stay unfused, each
// with its reason: a pre-scale bias, ALiBi with given slopes, ALiBi off the top-left
// causal masks. The same configurations with a post-scale bias / the default slopes on a
// causal mask are in the fused set.
TEST(FusedAttentionFallback, ScoreModifiersCuDnnComputesOtherwiseAreNotEligible) {
  TESERVE_SKIP_WITHOUT_GPU();
  if (const auto version = kernels::cuda::CudnnRuntimeVersion(); !version.ok()) {
    GTEST_SKIP() << version.status().message();
  }
  kernels::AttentionConfig config;
  config.qkv_format = QkvFormat::kBshd;
  config.mask_type = AttnMaskType::kCausal;
  config.window_right = 0;
  auto why = [&]() {
    const absl::Status s = kernels::FusedAttentionEligible(Device::Cuda(0), config, DType::kBFloat16, 64, 64);
    return s.ok() ? std::string("eligible") : std::string(s.message());
  };
  config.bias_type = kernels::AttnBiasType::kPreScaleBias;
  EXPECT_NE(why().find("pre_scale_bias"), std::string::npos) << why();
  config.bias_type = kernels::AttnBiasType::kPostScaleBias;
  EXPECT_EQ(why(), "eligible");
  config.bias_type = kernels::AttnBiasType::kAlibi;
  config.alibi_default_slopes = false;
  EXPECT_NE(why().find("given slopes"), std::string::npos) << why();
  config.alibi_default_slopes = true;
  EXPECT_EQ(why(), "eligible");
  config.mask_type = AttnMaskType::kCausalBottomRight;
  EXPECT_NE(why().find("ALiBi under a mask"), std::string::npos) << why();
  config.mask_type = AttnMaskType::kNoMask;
  config.window_right = -1;
  EXPECT_NE(why().find("ALiBi under a mask"), std::string::npos) << why();
}

#else

TEST_P(FusedAttentionGpuTest, MatchesTheReferenceOnTheSame16BitValues) { TESERVE_SKIP_WITHOUT_GPU(); }
INSTANTIATE_TEST_SUITE_P(Fused, FusedAttentionGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<FusedCase>& info) { return info.param.name; });

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
