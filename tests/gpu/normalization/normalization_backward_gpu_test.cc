// CUDA LayerNorm / RMSNorm backward against the CPU reference on the same inputs; sm_margin,
// the FP32 entry points and empty inputs (forward and backward).
//
// The contract tested (kernels/normalization.h):
// - dx, dgamma, dbeta agree with the CPU within tests/kernels/tolerances.h, the relative
//   part taken on the forward-error scale of each value.
// - Every output element is written (outputs poisoned before a direct launch).
// - sm_margin shrinks the grid to (SMs - margin) x resident CTAs and changes no result
//   (the backward's dgamma / dbeta summation order aside).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/normalization.h"
#include "tests/gpu/normalization/normalization_gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::NormBackwardOptions;
using kernels::NormForwardOptions;
using kernels::NormForwardResult;
using kernels::NormType;
using testing_kernels::AllClose;

const Device kGpu = Device::Cuda(0);

using testing::Bytes;
using testing::Floats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::Uniform;
using norm_gpu_test::AsDoubles;
using norm_gpu_test::BackwardScales;
using norm_gpu_test::Bits;
using norm_gpu_test::DeviceAlloc;
using norm_gpu_test::Encode;
using norm_gpu_test::ForwardScale;
using norm_gpu_test::Ordinal;
using norm_gpu_test::RandomInput;
using norm_gpu_test::RandomVector;
using norm_gpu_test::ShapeName;

// ---------------------------------------------------------------------------------------
// Backward.

struct BackwardCase {
  NormType type;
  DType dtype;
  int64_t n, h;
  bool zero_centered;
};

std::string BackwardName(const ::testing::TestParamInfo<BackwardCase>& info) {
  const BackwardCase& c = info.param;
  return absl::StrCat(c.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(c.dtype), "_", ShapeName(c.n, c.h),
                      c.zero_centered ? "_ZeroCentered" : "");
}

class NormBackwardGpuTest : public ::testing::TestWithParam<BackwardCase> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const BackwardCase& c = GetParam();
    const uint64_t seed = static_cast<uint64_t>(c.n * 733 + c.h);
    host_x_ = RandomInput(c.dtype, c.n, c.h, seed);
    host_dy_ = RandomInput(c.dtype, c.n, c.h, seed + 7);
    gamma_ = c.zero_centered ? RandomVector(c.h, -0.5f, 0.5f, seed + 1)
                             : RandomVector(c.h, 0.5f, 1.5f, seed + 1);
    // Statistics from the CPU forward, given to both backward passes.
    NormForwardOptions forward;
    forward.zero_centered_gamma = c.zero_centered;
    forward.y_dtype = DType::kFloat32;
    const Tensor beta = layer_norm() ? RandomVector(c.h, -1.0f, 1.0f, seed + 2) : Tensor();
    auto fwd = kernels::NormalizationForward(Context::Cpu(), c.type, host_x_, gamma_, beta, forward);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    mu_ = fwd->mu;
    rsigma_ = fwd->rsigma;
    options_.zero_centered_gamma = c.zero_centered;
  }

  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }

  absl::StatusOr<kernels::NormBackwardOutputs> Gpu(const NormBackwardOptions& options) const {
    return kernels::NormalizationBackward(GpuContext(), GetParam().type, OnDevice(host_dy_),
                                          OnDevice(host_x_), layer_norm() ? OnDevice(mu_) : Tensor(),
                                          OnDevice(rsigma_), OnDevice(gamma_), options);
  }

  Tensor host_x_, host_dy_, gamma_, mu_, rsigma_;
  NormBackwardOptions options_;
};

TEST_P(NormBackwardGpuTest, MatchesCpu) {
  const BackwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs gpu, Gpu(options_));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs cpu,
                       kernels::NormalizationBackward(Context::Cpu(), c.type, host_dy_, host_x_, mu_,
                                                      rsigma_, gamma_, options_));
  ASSERT_EQ(gpu.dx.dtype(), c.dtype);
  const std::vector<float> x = Floats(host_x_), dy = Floats(host_dy_);
  const std::vector<float> mu = layer_norm() ? Floats(mu_) : std::vector<float>(c.n, 0.0f);
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
  BackwardScales(x, dy, c.n, c.h, mu, Floats(rsigma_), gamma_.data<float>(), c.zero_centered,
                 &dx_scale, &dgamma_scale, &dbeta_scale);
  const std::vector<float> dx_cpu = Floats(cpu.dx);
  EXPECT_TRUE(AllClose(Floats(gpu.dx), AsDoubles(dx_cpu), c.dtype, dx_scale));
  const std::vector<float> dgamma_cpu = Floats(cpu.dgamma);
  EXPECT_TRUE(AllClose(Floats(gpu.dgamma), std::vector<double>(dgamma_cpu.begin(), dgamma_cpu.end()),
                       DType::kFloat32, dgamma_scale));
  ASSERT_EQ(gpu.dbeta.defined(), layer_norm());
  if (layer_norm()) {
    const std::vector<float> dbeta_cpu = Floats(cpu.dbeta);
    EXPECT_TRUE(AllClose(Floats(gpu.dbeta), std::vector<double>(dbeta_cpu.begin(), dbeta_cpu.end()),
                         DType::kFloat32, dbeta_scale));
  }
}

// A direct launch into a poisoned dx and workspace reproduces the op's outputs.
TEST_P(NormBackwardGpuTest, DirectLaunchWritesEveryOutputElement) {
  const BackwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs want, Gpu(options_));
  const Tensor dy = OnDevice(host_dy_), x = OnDevice(host_x_), rsigma = OnDevice(rsigma_);
  const Tensor gamma = OnDevice(gamma_);
  const Tensor mu = layer_norm() ? OnDevice(mu_) : Tensor();
  kernels::cuda::NormBackwardParams p;
  p.rms = !layer_norm();
  p.dy = dy.raw_data();
  p.x = x.raw_data();
  p.type = c.dtype == DType::kFloat32   ? kernels::cuda::NormDType::kFloat32
           : c.dtype == DType::kFloat16 ? kernels::cuda::NormDType::kFloat16
                                        : kernels::cuda::NormDType::kBFloat16;
  p.rows = c.n;
  p.cols = c.h;
  p.mu = layer_norm() ? mu.data<float>() : nullptr;
  p.rsigma = rsigma.data<float>();
  p.gamma = gamma.data<float>();
  p.zero_centered_gamma = c.zero_centered;
  int64_t workspace_floats = 0;
  ASSERT_EQ(kernels::cuda::NormBackwardWorkspaceFloats(p, &workspace_floats), cudaSuccess);
  const int64_t dx_bytes = want.dx.nbytes();
  void* dx = nullptr;
  float *dgamma = nullptr, *dbeta = nullptr, *workspace = nullptr;
  ASSERT_EQ(DeviceAlloc(&dx, dx_bytes), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&dgamma, c.h * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&dbeta, c.h * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&workspace, workspace_floats * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dx, 0xFF, dx_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dgamma, 0xFF, c.h * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dbeta, 0xFF, c.h * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(workspace, 0xFF, workspace_floats * 4), cudaSuccess);
  p.dx = dx;
  p.dgamma = dgamma;
  p.dbeta = layer_norm() ? dbeta : nullptr;
  p.workspace = workspace;
  ASSERT_EQ(kernels::cuda::LaunchNormBackward(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto bytes_of = [](const void* device, int64_t n) {
    std::vector<uint8_t> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  EXPECT_EQ(bytes_of(dx, dx_bytes), Bytes(want.dx));
  EXPECT_EQ(bytes_of(dgamma, c.h * 4), Bytes(want.dgamma));
  if (layer_norm()) {
    EXPECT_EQ(bytes_of(dbeta, c.h * 4), Bytes(want.dbeta));
  }
  for (void* ptr : {dx, static_cast<void*>(dgamma), static_cast<void*>(dbeta),
                    static_cast<void*>(workspace)}) {
    cudaFree(ptr);
  }
}

std::vector<BackwardCase> BackwardCases() {
  const NormType ln = NormType::kLayerNorm, rms = NormType::kRmsNorm;
  const DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  return {
      {ln, f32, 1, 259, false},        // one row, streaming (259 not a vector multiple)
      {rms, bf16, 257, 259, true},     // tails, streaming
      {ln, f16, 128, 129, false},
      {rms, f32, 128, 1024, false},    // registers, 1 vector per thread
      {ln, bf16, 300, 8192, true},     // registers, 4 vectors per thread
      {rms, f16, 5, 16384, false},     // registers, 8 vectors per thread
      {ln, f32, 3, 9000, false},       // too long for registers: streaming
      {ln, bf16, 16384, 8192, false},  // the benchmark shape
      {rms, bf16, 16384, 8192, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormBackwardGpuTest, ::testing::ValuesIn(BackwardCases()),
                         BackwardName);

// ---------------------------------------------------------------------------------------
// sm_margin, the FP32 entry points, empty inputs.

int SmCount() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return sms;
}

TEST(NormGpu, SmMarginShrinksTheGridAndChangesNoResult) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int sms = SmCount();
  const int64_t n = 4096, h = 2048;
  const Tensor host_x = RandomInput(DType::kBFloat16, n, h, 5);
  const Tensor host_dy = RandomInput(DType::kBFloat16, n, h, 6);
  const Tensor host_gamma = RandomVector(h, 0.5f, 1.5f, 7);
  const std::vector<float> x_values = Floats(host_x), dy_values = Floats(host_dy);
  const Tensor x = OnDevice(host_x), dy = OnDevice(host_dy);
  const Tensor gamma = OnDevice(host_gamma);
  const Tensor beta = OnDevice(RandomVector(h, -1.0f, 1.0f, 8));
  NormForwardOptions options;
  options.quantize = true;
  options.quantize_options.columnwise = true;
  options.quantize_options.scale = 64.0f;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult base,
                       kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma,
                                                     beta, options));
  kernels::cuda::NormForwardParams base_params;
  base_params.x = x.raw_data();
  base_params.x_type = kernels::cuda::NormDType::kBFloat16;
  base_params.rows = n;
  base_params.cols = h;
  base_params.gamma = gamma.data<float>();
  base_params.beta = beta.data<float>();
  base_params.columnwise = static_cast<uint8_t*>(const_cast<void*>(x.raw_data()));
  kernels::cuda::NormForwardPlan base_plan;
  ASSERT_EQ(kernels::cuda::PlanNormForward(base_params, &base_plan), cudaSuccess);
  EXPECT_TRUE(base_plan.register_tile);
  std::vector<double> mean_abs;
  const std::vector<double> y_scale = ForwardScale(x_values, n, h, Floats(base.rsigma),
                                                   host_gamma.data<float>(), Floats(beta).data(),
                                                   false, &mean_abs);
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs base_grad,
                       kernels::NormalizationBackward(GpuContext(), NormType::kLayerNorm, dy, x,
                                                      base.mu, base.rsigma, gamma, {}));
  for (const int margin : {1, sms / 2, sms - 1}) {
    SCOPED_TRACE(absl::StrCat("sm_margin ", margin));
    kernels::cuda::NormForwardParams p = base_params;
    p.sm_margin = margin;
    kernels::cuda::NormForwardPlan plan;
    ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
    EXPECT_EQ(plan.usable_sms, sms - margin);
    EXPECT_LE(plan.ctas, (sms - margin) * plan.ctas_per_sm);
    EXPECT_GE(plan.ctas, 1);
    kernels::cuda::NormBackwardParams bp;
    bp.dy = dy.raw_data();
    bp.x = x.raw_data();
    bp.dx = const_cast<void*>(dy.raw_data());  // planning only checks its alignment
    bp.gamma = gamma.data<float>();
    bp.type = kernels::cuda::NormDType::kBFloat16;
    bp.rows = n;
    bp.cols = h;
    bp.sm_margin = margin;
    kernels::cuda::NormBackwardPlan bplan;
    ASSERT_EQ(kernels::cuda::PlanNormBackward(bp, &bplan), cudaSuccess);
    EXPECT_LE(bplan.ctas, (sms - margin) * bplan.ctas_per_sm);

    options.sm_margin = margin;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult got,
                         kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma,
                                                       beta, options));
    if (plan.register_tile == base_plan.register_tile) {
      EXPECT_EQ(Bytes(got.y), Bytes(base.y));
      EXPECT_EQ(Bytes(got.fp8.rowwise_data), Bytes(base.fp8.rowwise_data));
      EXPECT_EQ(Bytes(got.fp8.columnwise_data), Bytes(base.fp8.columnwise_data));
      EXPECT_EQ(Bytes(got.mu), Bytes(base.mu));
      EXPECT_EQ(Bytes(got.rsigma), Bytes(base.rsigma));
    } else {
      // A cluster that no longer fits the usable SMs: the shared-memory tile kernel, whose
      // row sums round differently; y (BF16 here) within its tolerance, rsigma within FP32's.
      EXPECT_FALSE(plan.register_tile);
      EXPECT_TRUE(AllClose(Floats(got.y), AsDoubles(Floats(base.y)), DType::kBFloat16, y_scale));
      EXPECT_TRUE(AllClose(Floats(got.rsigma), AsDoubles(Floats(base.rsigma)), DType::kFloat32));
    }
    NormBackwardOptions grad_options;
    grad_options.sm_margin = margin;
    ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad,
                         kernels::NormalizationBackward(GpuContext(), NormType::kLayerNorm, dy, x,
                                                        base.mu, base.rsigma, gamma, grad_options));
    EXPECT_EQ(Bytes(grad.dx), Bytes(base_grad.dx));
    std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
    BackwardScales(x_values, dy_values, n, h, Floats(base.mu), Floats(base.rsigma), host_gamma.data<float>(),
                   false, &dx_scale, &dgamma_scale, &dbeta_scale);
    EXPECT_TRUE(AllClose(Floats(grad.dgamma), AsDoubles(Floats(base_grad.dgamma)), DType::kFloat32,
                         dgamma_scale));
    EXPECT_TRUE(AllClose(Floats(grad.dbeta), AsDoubles(Floats(base_grad.dbeta)), DType::kFloat32,
                         dbeta_scale));
  }
  options.sm_margin = sms;
  auto refused = kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma, beta, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                 "options.sm_margin: expected 0.."));
}

TEST(NormGpu, Fp32EntryPointsRunOnCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor host_x = RandomInput(DType::kFloat32, 37, 300, 9);
  const Tensor host_dy = RandomInput(DType::kFloat32, 37, 300, 10);
  const Tensor gamma = RandomVector(300, 0.5f, 1.5f, 11), beta = RandomVector(300, -1.0f, 1.0f, 12);
  ASSERT_OK_AND_ASSIGN(const kernels::NormForwardOutputs cpu,
                       kernels::LayerNormForward(Context::Cpu(), host_x, gamma, beta, 1e-5f, false));
  ASSERT_OK_AND_ASSIGN(const kernels::NormForwardOutputs gpu,
                       kernels::LayerNormForward(GpuContext(), OnDevice(host_x), OnDevice(gamma),
                                                 OnDevice(beta), 1e-5f, false));
  EXPECT_EQ(gpu.y.dtype(), DType::kFloat32);
  EXPECT_EQ(gpu.y.device(), kGpu);
  const std::vector<float> x = Floats(host_x), dy = Floats(host_dy), rsigma = Floats(cpu.rsigma);
  std::vector<double> mean_abs;
  const std::vector<double> y_scale = ForwardScale(x, 37, 300, rsigma, gamma.data<float>(),
                                                   beta.data<float>(), false, &mean_abs);
  EXPECT_TRUE(AllClose(Floats(gpu.y), AsDoubles(Floats(cpu.y)), DType::kFloat32, y_scale));
  EXPECT_TRUE(AllClose(Floats(gpu.mu), AsDoubles(Floats(cpu.mu)), DType::kFloat32, mean_abs));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad_cpu,
                       kernels::RmsNormBackward(Context::Cpu(), host_dy, host_x, cpu.rsigma, gamma, false));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad_gpu,
                       kernels::RmsNormBackward(GpuContext(), OnDevice(host_dy), OnDevice(host_x),
                                                OnDevice(cpu.rsigma), OnDevice(gamma), false));
  EXPECT_FALSE(grad_gpu.dbeta.defined());
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
  BackwardScales(x, dy, 37, 300, std::vector<float>(37, 0.0f), rsigma, gamma.data<float>(), false,
                 &dx_scale, &dgamma_scale, &dbeta_scale);
  EXPECT_TRUE(AllClose(Floats(grad_gpu.dx), AsDoubles(Floats(grad_cpu.dx)), DType::kFloat32, dx_scale));
  EXPECT_TRUE(AllClose(Floats(grad_gpu.dgamma), AsDoubles(Floats(grad_cpu.dgamma)), DType::kFloat32,
                       dgamma_scale));
}

TEST(NormGpu, EmptyInputWritesScaleInvAndZeroGradients) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor x = OnDevice(Tensor::Zeros(DType::kBFloat16, {0, 64}).value());
  const Tensor gamma = OnDevice(RandomVector(64, 0.5f, 1.5f, 13));
  NormForwardOptions options;
  options.write_y = false;
  options.quantize = true;
  options.quantize_options.scale = 4.0f;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult out,
                       kernels::NormalizationForward(GpuContext(), NormType::kRmsNorm, x, gamma,
                                                     Tensor(), options));
  EXPECT_EQ(out.fp8.amax, 0.0f);
  EXPECT_EQ(Floats(out.fp8.rowwise_scale_inv), std::vector<float>{0.25f});
  EXPECT_EQ(Floats(out.fp8.columnwise_scale_inv), std::vector<float>{0.25f});
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad,
                       kernels::NormalizationBackward(GpuContext(), NormType::kRmsNorm, x, x, Tensor(),
                                                      OnDevice(Tensor::Zeros(DType::kFloat32, {0}).value()),
                                                      gamma, {}));
  EXPECT_EQ(Floats(grad.dgamma), std::vector<float>(64, 0.0f));
}

#else

TEST(NormGpu, SkippedWithoutCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
