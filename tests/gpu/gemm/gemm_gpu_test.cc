// The cuBLASLt GEMM (kernels/cuda/gemm) against the CPU reference on the same operands:
// every operand dtype pair, FP8 with per-tensor scales (both accumulations), FP8 output
// with d_scale and amax, the four epilogues, all transpose combinations of 16-bit and
// FP32 operands, and awkward shapes. Tolerances come from the shared table, keyed by
// the output dtype, with FP8 operands judged by the FP8 row (fast accumulation keeps
// partial sums in reduced precision), all relative to the sum of |a_ik b_kj|.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/gemm.h"
#if TESERVE_WITH_CUDA
#include "kernels/cuda/gemm/gemm_cuda.h"
#endif
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::RandomTensor;

Tensor Scalar(float value) { return Tensor::FromFloats({value}, {1}).value(); }
Tensor Cast(const Tensor& x, DType dtype) { return CastFromFloat32(Context::Cpu(), x, dtype).value(); }

// |op(A)| |op(B)| * |alpha| in FP32 on the CPU: the magnitude the tolerance scales with.
std::vector<double> TermMagnitude(const GemmOperand& a, const GemmOperand& b, const Tensor& d, float alpha) {
  auto abs_operand = [](const GemmOperand& x) {
    Tensor wide = ToFloat32(Context::Cpu(), x.data).value().Clone().value();
    const float s = x.scale_inv.defined() ? x.scale_inv.floats()[0] : 1.0f;
    for (float& v : wide.mutable_floats()) v = std::fabs(v) * s;
    return GemmOperand{wide, x.transpose};
  };
  Tensor out = Tensor::Zeros(DType::kFloat32, d.shape()).value();
  EXPECT_TRUE(Gemm(Context::Cpu(), abs_operand(a), abs_operand(b), &out).ok());
  std::vector<double> magnitude;
  for (float v : out.floats()) magnitude.push_back(std::fabs(alpha) * v + 1e-3);
  return magnitude;
}

struct Operands {
  GemmOperand a, b;                // host
  GemmOperand a_gpu, b_gpu;        // device copies
};

Operands MakeOperands(DType ta, DType tb, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                      uint32_t seed) {
  auto make = [&](DType dtype, int64_t rows, int64_t cols, bool fp8_scaled, uint32_t s) {
    const float range = IsFloat8(dtype) ? 6.0f : 1.0f;
    GemmOperand x{Cast(RandomTensor({rows, cols}, -range, range, s), dtype), false};
    if (fp8_scaled) x.scale_inv = Scalar(s % 2 ? 0.25f : 0.5f);
    return x;
  };
  Operands o;
  o.a = make(ta, trans_a ? k : m, trans_a ? m : k, IsFloat8(ta), seed);
  o.a.transpose = trans_a;
  o.b = make(tb, trans_b ? n : k, trans_b ? k : n, IsFloat8(tb), seed + 1);
  o.b.transpose = trans_b;
  o.a_gpu = testing::OnDevice(o.a);
  o.b_gpu = testing::OnDevice(o.b);
  return o;
}

DType ToleranceDType(DType operands, DType d) { return IsFloat8(operands) ? DType::kFloat8E4M3 : d; }

struct Case {
  DType a, b, d;
  int64_t m, n, k;
  bool trans_a, trans_b;
  GemmAccumulation accumulation;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(DTypeName(c.a), "_", DTypeName(c.b), "_to_", DTypeName(c.d), "_", c.m, "x", c.n, "x", c.k,
                      c.trans_a ? "_T" : "_N", c.trans_b ? "T" : "N",
                      c.accumulation == GemmAccumulation::kFast ? "_fast" : "");
}

class GemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(GemmGpu, MatchesTheCpuReference) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const Operands o = MakeOperands(c.a, c.b, c.m, c.n, c.k, c.trans_a, c.trans_b, 31);
  GemmOptions options;
  options.alpha = 0.75f;
  options.accumulation = c.accumulation;
  Tensor d_cpu = Tensor::Zeros(c.d, {c.m, c.n}).value();
  ASSERT_OK(Gemm(Context::Cpu(), o.a, o.b, &d_cpu, options));
  Tensor d_gpu = Tensor::Zeros(c.d, {c.m, c.n}, Device::Cuda(0)).value();
  ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &d_gpu, options));

  const std::vector<float> want = testing::Floats(d_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()),
                       ToleranceDType(c.a, c.d), TermMagnitude(o.a, o.b, d_cpu, options.alpha)));
}

constexpr DType kF32 = DType::kFloat32, kBF16 = DType::kBFloat16, kF16 = DType::kFloat16,
                kE4M3 = DType::kFloat8E4M3, kE5M2 = DType::kFloat8E5M2;
constexpr GemmAccumulation kSplit = GemmAccumulation::kSplit, kFast = GemmAccumulation::kFast;

INSTANTIATE_TEST_SUITE_P(
    HighPrecision, GemmGpu,
    ::testing::Values(Case{kF32, kF32, kF32, 257, 259, 131, false, false, kSplit},
                      Case{kF32, kF32, kF32, 64, 96, 33, true, false, kSplit},
                      Case{kF32, kF32, kF32, 65, 7, 128, false, true, kSplit},
                      Case{kF32, kF32, kF32, 3, 130, 17, true, true, kSplit},
                      Case{kBF16, kBF16, kBF16, 256, 512, 384, false, true, kSplit},
                      Case{kBF16, kBF16, kF32, 257, 136, 72, true, false, kSplit},
                      Case{kBF16, kBF16, kBF16, 1, 2048, 1024, false, true, kSplit},
                      Case{kF16, kF16, kF16, 128, 192, 64, true, true, kSplit},
                      Case{kF16, kF16, kF32, 96, 40, 264, false, false, kSplit}),
    CaseName);

INSTANTIATE_TEST_SUITE_P(
    Fp8PerTensor, GemmGpu,
    ::testing::Values(Case{kE4M3, kE4M3, kBF16, 256, 512, 384, false, true, kFast},
                      Case{kE4M3, kE4M3, kF32, 128, 64, 2048, false, true, kSplit},
                      Case{kE4M3, kE5M2, kBF16, 64, 256, 128, false, true, kSplit},
                      Case{kE5M2, kE4M3, kBF16, 192, 128, 256, false, true, kSplit},
                      Case{kE4M3, kE4M3, kF16, 48, 80, 64, false, true, kFast},
                      Case{kE4M3, kE4M3, kF32, 16, 16, 16, false, true, kFast}),
    CaseName);

TEST(GemmGpuFp8, OutputQuantizedWithDScaleAndAmaxOfTheUnscaledResult) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int64_t m = 128, n = 256, k = 192;
  // An E5M2 output takes an E5M2 operand (the dgrad's dy), as cuBLASLt's type table has it.
  const Operands e4 = MakeOperands(kE4M3, kE4M3, m, n, k, false, true, 41);
  const Operands e5 = MakeOperands(kE5M2, kE4M3, m, n, k, false, true, 42);
  const Tensor d_scale = Scalar(0.0625f);
  const Tensor d_scale_gpu = testing::OnDevice(d_scale);
  Tensor amax_cpu = Scalar(0.0f);
  Tensor amax_gpu = testing::OnDevice(Scalar(-1.0f));
  for (DType out : {kE4M3, kE5M2}) {
    SCOPED_TRACE(DTypeName(out));
    const Operands& o = out == kE4M3 ? e4 : e5;
    Tensor d_cpu = Tensor::Zeros(out, {m, n}).value();
    Tensor d_gpu = Tensor::Zeros(out, {m, n}, Device::Cuda(0)).value();
    GemmOptions cpu_options;
    cpu_options.d_scale = &d_scale;
    cpu_options.d_amax = &amax_cpu;
    GemmOptions gpu_options;
    gpu_options.d_scale = &d_scale_gpu;
    gpu_options.d_amax = &amax_gpu;
    ASSERT_OK(Gemm(Context::Cpu(), o.a, o.b, &d_cpu, cpu_options));
    ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &d_gpu, gpu_options));
    const float want_amax = amax_cpu.floats()[0];
    EXPECT_NEAR(testing::Floats(amax_gpu)[0], want_amax, 1e-4 * want_amax);
    // The FP32 results differ by the FP8 tensor cores' accumulation (the FP8 row of the
    // tolerance table against the terms' magnitude, scaled by d_scale, as for the
    // high-precision outputs); rounded to FP8 that may move a value to the neighbouring
    // code, one step (1/8 relative for E4M3, 1/4 for E5M2; below the normal range the
    // smallest subnormal).
    const std::vector<float> got = testing::Floats(d_gpu);
    const std::vector<float> want = testing::Floats(d_cpu);
    const std::vector<double> magnitude = TermMagnitude(o.a, o.b, d_cpu, d_scale.floats()[0]);
    const double accumulation = testing_kernels::ToleranceFor(kE4M3).rtol;
    const double step = out == kE4M3 ? 0.125 : 0.25;
    const double subnormal = out == kE4M3 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
    int64_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) ++differing;
      ASSERT_LE(std::fabs(got[i] - want[i]), step * std::fabs(want[i]) + subnormal + accumulation * magnitude[i])
          << "at " << i;
    }
    EXPECT_LT(differing, static_cast<int64_t>(got.size()) / 50);
  }
}

TEST(GemmGpuEpilogue, BiasAndGeluAuxBiasMatchTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int64_t m = 256, n = 384, k = 128;
  for (DType operands : {kBF16, kE4M3}) {
    SCOPED_TRACE(DTypeName(operands));
    const Operands o = MakeOperands(operands, operands, m, n, k, false, true, 51);
    const Tensor bias = Cast(RandomTensor({n}, -1.0f, 1.0f, 52), kBF16);
    const Tensor bias_gpu = testing::OnDevice(bias);
    for (GemmEpilogue epilogue : {GemmEpilogue::kBias, GemmEpilogue::kGeluAuxBias}) {
      Tensor d_cpu = Tensor::Zeros(kBF16, {m, n}).value();
      Tensor aux_cpu = Tensor::Zeros(kBF16, {m, n}).value();
      Tensor d_gpu = Tensor::Zeros(kBF16, {m, n}, Device::Cuda(0)).value();
      Tensor aux_gpu = Tensor::Zeros(kBF16, {m, n}, Device::Cuda(0)).value();
      GemmOptions cpu_options, gpu_options;
      cpu_options.epilogue = gpu_options.epilogue = epilogue;
      cpu_options.bias = &bias;
      gpu_options.bias = &bias_gpu;
      if (epilogue == GemmEpilogue::kGeluAuxBias) {
        cpu_options.aux = &aux_cpu;
        gpu_options.aux = &aux_gpu;
      }
      ASSERT_OK(Gemm(Context::Cpu(), o.a, o.b, &d_cpu, cpu_options));
      ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &d_gpu, gpu_options));
      const std::vector<double> magnitude = TermMagnitude(o.a, o.b, d_cpu, 1.0f);
      std::vector<double> scaled = magnitude;
      for (size_t i = 0; i < scaled.size(); ++i) scaled[i] += 1.0;  // |bias| <= 1
      const std::vector<float> want = testing::Floats(d_cpu);
      EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()),
                           ToleranceDType(operands, kBF16), scaled));
      if (epilogue == GemmEpilogue::kGeluAuxBias) {
        const std::vector<float> want_aux = testing::Floats(aux_cpu);
        EXPECT_TRUE(AllClose(testing::Floats(aux_gpu), std::vector<double>(want_aux.begin(), want_aux.end()),
                             ToleranceDType(operands, kBF16), scaled));
      }
    }
  }
}

class GemmGpuGradEpilogue : public ::testing::TestWithParam<DType> {};

// The backward epilogues with 16-bit operands, D and bias gradient in one dtype (what
// cuBLASLt's kernels take) and with FP32 throughout.
TEST_P(GemmGpuGradEpilogue, DGeluBGradAndBGradBMatchTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const int64_t m = 256, n = 192, k = 128;
  // dgrad of fc2: D = (dy W) * gelu'(aux), bias_grad = column sums of D.
  const Operands o = MakeOperands(t, t, m, n, k, false, false, 61);
  Tensor aux_cpu_in = Cast(RandomTensor({m, n}, -2.0f, 2.0f, 62), t);
  Tensor aux_gpu_in = testing::OnDevice(aux_cpu_in);
  Tensor d_cpu = Tensor::Zeros(t, {m, n}).value();
  Tensor d_gpu = Tensor::Zeros(t, {m, n}, Device::Cuda(0)).value();
  Tensor bgrad_cpu = Tensor::Zeros(t, {n}).value();
  Tensor bgrad_gpu = Tensor::Zeros(t, {n}, Device::Cuda(0)).value();
  GemmOptions cpu_options, gpu_options;
  cpu_options.epilogue = gpu_options.epilogue = GemmEpilogue::kDGeluBGrad;
  cpu_options.aux = &aux_cpu_in;
  gpu_options.aux = &aux_gpu_in;
  cpu_options.bias_grad = &bgrad_cpu;
  gpu_options.bias_grad = &bgrad_gpu;
  ASSERT_OK(Gemm(Context::Cpu(), o.a, o.b, &d_cpu, cpu_options));
  ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &d_gpu, gpu_options));
  const std::vector<double> magnitude = TermMagnitude(o.a, o.b, d_cpu, 1.2f);  // |gelu'| < 1.2
  const DType tol = t == kF32 ? kBF16 : t;  // tanh-GELU' differs in its last bits on the GPU
  const std::vector<float> want = testing::Floats(d_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()), tol, magnitude));
  std::vector<double> bgrad_magnitude(n, 0.0);
  for (int64_t i = 0; i < m * n; ++i) bgrad_magnitude[i % n] += magnitude[i];
  const std::vector<float> want_bgrad = testing::Floats(bgrad_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(bgrad_gpu), std::vector<double>(want_bgrad.begin(), want_bgrad.end()),
                       tol, bgrad_magnitude));

  // wgrad with dbias: dW [m, n] = dy^T x, dy stored [k, m]; bias_grad [m] = sums of dy.
  const Operands w = MakeOperands(t, t, m, n, k, true, false, 63);
  Tensor dw_cpu = Tensor::Zeros(t, {m, n}).value();
  Tensor dw_gpu = Tensor::Zeros(t, {m, n}, Device::Cuda(0)).value();
  Tensor db_cpu = Tensor::Zeros(t, {m}).value();
  Tensor db_gpu = Tensor::Zeros(t, {m}, Device::Cuda(0)).value();
  GemmOptions wc, wg;
  wc.epilogue = wg.epilogue = GemmEpilogue::kBGradB;
  wc.bias_grad = &db_cpu;
  wg.bias_grad = &db_gpu;
  ASSERT_OK(Gemm(Context::Cpu(), w.a, w.b, &dw_cpu, wc));
  ASSERT_OK(Gemm(testing::GpuContext(), w.a_gpu, w.b_gpu, &dw_gpu, wg));
  const std::vector<float> want_dw = testing::Floats(dw_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(dw_gpu), std::vector<double>(want_dw.begin(), want_dw.end()), tol,
                       TermMagnitude(w.a, w.b, dw_cpu, 1.0f)));
  std::vector<double> db_magnitude(m, static_cast<double>(k));  // |dy| <= 1
  const std::vector<float> want_db = testing::Floats(db_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(db_gpu), std::vector<double>(want_db.begin(), want_db.end()), tol,
                       db_magnitude));

  // Linear's wgrad of 16-bit operands: FP32 dW (the gradient) and an FP32 bias gradient.
  if (t == kF32) return;
  Tensor dw32_cpu = Tensor::Zeros(kF32, {m, n}).value();
  Tensor dw32_gpu = Tensor::Zeros(kF32, {m, n}, Device::Cuda(0)).value();
  Tensor db32_cpu = Tensor::Zeros(kF32, {m}).value();
  Tensor db32_gpu = Tensor::Zeros(kF32, {m}, Device::Cuda(0)).value();
  wc.bias_grad = &db32_cpu;
  wg.bias_grad = &db32_gpu;
  ASSERT_OK(Gemm(Context::Cpu(), w.a, w.b, &dw32_cpu, wc));
  ASSERT_OK(Gemm(testing::GpuContext(), w.a_gpu, w.b_gpu, &dw32_gpu, wg));
  const std::vector<float> want_dw32 = testing::Floats(dw32_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(dw32_gpu), std::vector<double>(want_dw32.begin(), want_dw32.end()), kF32,
                       TermMagnitude(w.a, w.b, dw32_cpu, 1.0f)));
  const std::vector<float> want_db32 = testing::Floats(db32_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(db32_gpu), std::vector<double>(want_db32.begin(), want_db32.end()), kF32,
                       db_magnitude));

  // Accumulating (beta 1, a gradient that already holds a sum): dW doubles, the bias
  // gradient is the same sums, bit for bit.
  const Tensor db32_first = testing::OnHost(db32_gpu);
  wc.beta = wg.beta = 1.0f;
  ASSERT_OK(Gemm(Context::Cpu(), w.a, w.b, &dw32_cpu, wc));
  ASSERT_OK(Gemm(testing::GpuContext(), w.a_gpu, w.b_gpu, &dw32_gpu, wg));
  std::vector<double> twice = TermMagnitude(w.a, w.b, dw32_cpu, 1.0f);
  for (double& v : twice) v *= 2.0;
  const std::vector<float> want_dw2 = testing::Floats(dw32_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(dw32_gpu), std::vector<double>(want_dw2.begin(), want_dw2.end()), kF32, twice));
  EXPECT_TRUE(BitwiseEqual(testing::OnHost(db32_gpu), db32_first)) << "the bias gradient depends on beta";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmGpuGradEpilogue, ::testing::Values(kBF16, kF16, kF32),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(DTypeName(info.param)); });

#if TESERVE_WITH_CUDA
// A session's stream gets a cuBLASLt workspace with its first GEMM and gives it back
// when it is destroyed, so workspaces follow the live sessions.
TEST(GemmGpu, ASessionStreamReleasesItsWorkspace) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Operands o = MakeOperands(kBF16, kBF16, 64, 64, 64, false, true, 91);
  const int64_t before = cuda::GemmWorkspaceCount();
  {
    std::unique_ptr<DeviceStream> stream = DeviceStream::Create(0).value();
    Context ctx = testing::GpuContext();
    ctx.stream = stream->get();
    Tensor d = Tensor::Zeros(kBF16, {64, 64}, Device::Cuda(0)).value();
    ASSERT_OK(Gemm(ctx, o.a_gpu, o.b_gpu, &d));
    EXPECT_EQ(cuda::GemmWorkspaceCount(), before + 1);
    ASSERT_OK(stream->Synchronize());
  }
  EXPECT_EQ(cuda::GemmWorkspaceCount(), before);
}
#endif

TEST(GemmGpu, RepeatedCallsReuseTheCachedAlgorithmAndAgree) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Operands o = MakeOperands(kBF16, kBF16, 128, 128, 128, false, true, 71);
  Tensor first = Tensor::Zeros(kBF16, {128, 128}, Device::Cuda(0)).value();
  Tensor second = Tensor::Zeros(kBF16, {128, 128}, Device::Cuda(0)).value();
  ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &first));
  ASSERT_OK(Gemm(testing::GpuContext(), o.a_gpu, o.b_gpu, &second));
  EXPECT_EQ(testing::Bytes(first), testing::Bytes(second));
}

// Linear's FP32 helpers (the CPU layers' Gemm, AddBias, ColumnSum) on the device.
TEST(GemmGpuFp32Helpers, GemmWithBetaAddBiasAndColumnSumMatchTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int64_t m = 300, n = 77, k = 45;
  const Tensor a = RandomTensor({k, m}, -1.0f, 1.0f, 81);
  const Tensor b = RandomTensor({n, k}, -1.0f, 1.0f, 82);
  const Tensor c0 = RandomTensor({m, n}, -1.0f, 1.0f, 83);
  Tensor c_cpu = c0.Clone().value();
  Tensor c_gpu = testing::OnDevice(c0);
  ASSERT_OK(Gemm(Context::Cpu(), a, true, b, true, 0.5f, 1.0f, &c_cpu));
  ASSERT_OK(Gemm(testing::GpuContext(), testing::OnDevice(a), true, testing::OnDevice(b), true, 0.5f, 1.0f, &c_gpu));
  std::vector<double> magnitude = TermMagnitude(GemmOperand{a, true}, GemmOperand{b, true}, c_cpu, 0.5f);
  for (size_t i = 0; i < magnitude.size(); ++i) magnitude[i] += std::fabs(c0.floats()[i]);
  EXPECT_TRUE(AllClose(testing::Floats(c_gpu), std::vector<double>(c_cpu.floats().begin(), c_cpu.floats().end()),
                       kF32, magnitude));

  const Tensor bias = RandomTensor({n}, -1.0f, 1.0f, 84);
  ASSERT_OK(AddBias(Context::Cpu(), bias, &c_cpu));
  ASSERT_OK(AddBias(testing::GpuContext(), testing::OnDevice(bias), &c_gpu));
  for (size_t i = 0; i < magnitude.size(); ++i) magnitude[i] += 1.0;
  EXPECT_TRUE(AllClose(testing::Floats(c_gpu), std::vector<double>(c_cpu.floats().begin(), c_cpu.floats().end()),
                       kF32, magnitude));

  // Column sums of the same matrix (on each side its own copy), then accumulated once more.
  Tensor sums_cpu = RandomTensor({n}, -1.0f, 1.0f, 85);
  Tensor sums_gpu = testing::OnDevice(sums_cpu);
  for (bool accumulate : {false, true}) {
    ASSERT_OK(ColumnSum(Context::Cpu(), c_cpu, accumulate, &sums_cpu));
    ASSERT_OK(ColumnSum(testing::GpuContext(), testing::OnDevice(c_cpu), accumulate, &sums_gpu));
    std::vector<double> sum_magnitude(n, 0.0);
    for (int64_t i = 0; i < m * n; ++i) sum_magnitude[i % n] += std::fabs(c_cpu.floats()[i]);
    for (double& v : sum_magnitude) v *= 2.0;
    EXPECT_TRUE(AllClose(testing::Floats(sums_gpu),
                         std::vector<double>(sums_cpu.floats().begin(), sums_cpu.floats().end()), kF32,
                         sum_magnitude));
  }

  // k = 0: beta = 0 clears D.
  Tensor empty_k = Tensor::Zeros(kF32, {m, 0}, Device::Cuda(0)).value();
  Tensor empty_b = Tensor::Zeros(kF32, {0, n}, Device::Cuda(0)).value();
  ASSERT_OK(Gemm(testing::GpuContext(), empty_k, false, empty_b, false, 1.0f, 0.0f, &c_gpu));
  for (float v : testing::Floats(c_gpu)) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
