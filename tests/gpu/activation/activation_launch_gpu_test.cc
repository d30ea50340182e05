// CUDA activations against the CPU reference, second file of activation_gpu_test (the
// contract tested: activation_gpu_test.cc): backward dx / dbias, and direct launches of
// the kernels (poisoned outputs fully written with either FP8 encoder; the 128 x 128 and
// 64 x 64 forward kernels agree bit for bit).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "tests/gpu/activation/activation_gpu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/activation/activation_kernels.h"
#endif

namespace teserve {
namespace activation_gpu_test {
namespace {

#if TESERVE_WITH_CUDA

// ---------------------------------------------------------------------------------------
// Backward.

void CheckBackward(const Case& c, bool specials) {
  const int64_t in_cols = InputWidth(c);
  const Tensor host_x = MakeInput(c.dtype, c.rows, in_cols, SeedOf(c), specials);
  const Tensor host_dy = MakeInput(c.dtype, c.rows, c.k, SeedOf(c) + 1, false);
  ActivationBackwardOptions options;
  options.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult gpu,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, OnDevice(host_dy),
                                                        OnDevice(host_x), options));
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult cpu,
                       kernels::FusedActivationBackward(Context::Cpu(), c.kind, kParams, host_dy, host_x, options));
  ASSERT_EQ(gpu.dx.dtype(), c.dtype);
  ASSERT_EQ(gpu.dx.shape(), (Shape{c.rows, in_cols}));
  ASSERT_EQ(gpu.dbias.shape(), (Shape{in_cols}));
  const std::vector<float> x = Floats(host_x);
  const std::vector<float> dy = Floats(host_dy);
  std::vector<double> y_scale, dx_scale;
  Scales(c.kind, x, &dy, c.rows, c.k, &y_scale, &dx_scale);
  const std::vector<float> cpu_dx = Floats(cpu.dx);
  ExpectClose(Floats(gpu.dx), cpu_dx, dx_scale, c.dtype, "dx");
  // dbias: a sum over rows of FP32 dx, judged on the sum of |dx|.
  std::vector<double> dbias_scale(in_cols, 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < in_cols; ++j) dbias_scale[j] += std::max(dx_scale[r * in_cols + j], std::fabs(double{cpu_dx[r * in_cols + j]}));
  }
  ExpectClose(Floats(gpu.dbias), Floats(cpu.dbias), dbias_scale, DType::kFloat32, "dbias");
}

class ActivationBackwardGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationBackwardGpuTest, DxAndDbiasMatchCpu) { CheckBackward(GetParam(), false); }

TEST_P(ActivationBackwardGpuTest, NanAndInfinityInputsMatchCpu) { CheckBackward(GetParam(), true); }

// Without dbias the same dx; the FP32 entry point on a CUDA device gives it too.
TEST_P(ActivationBackwardGpuTest, DxWithoutDbiasAndFp32EntryPointAgree) {
  const Case& c = GetParam();
  const Tensor x = OnDevice(MakeInput(c.dtype, c.rows, InputWidth(c), SeedOf(c), false));
  const Tensor dy = OnDevice(MakeInput(c.dtype, c.rows, c.k, SeedOf(c) + 1, false));
  ActivationBackwardOptions with_dbias;
  with_dbias.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult a,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, dy, x, with_dbias));
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult b,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, dy, x,
                                                        ActivationBackwardOptions()));
  EXPECT_FALSE(b.dbias.defined());
  EXPECT_EQ(Bytes(a.dx), Bytes(b.dx));
  if (c.dtype == DType::kFloat32) {
    ASSERT_OK_AND_ASSIGN(const Tensor dx, kernels::ActivationBackward(GpuContext(), c.kind, kParams, dy, x));
    EXPECT_EQ(Bytes(dx), Bytes(a.dx));
  }
}

INSTANTIATE_TEST_SUITE_P(Small, ActivationBackwardGpuTest, ::testing::ValuesIn(SmallCases()), CaseName);

class ActivationBackwardLargeGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationBackwardLargeGpuTest, DxAndDbiasMatchCpu) { CheckBackward(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Large, ActivationBackwardLargeGpuTest, ::testing::ValuesIn(LargeBackwardCases()),
                         CaseName);

// ---------------------------------------------------------------------------------------
// Direct launches: poisoned outputs, encoders.

template <typename T>
T* PoisonedBuffer(int64_t count, int byte) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, byte, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> Download(const T* p, int64_t count) {
  std::vector<T> out(count);
  EXPECT_EQ(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

kernels::cuda::ActivationFunctionParams FunctionParams(Activation kind) {
  kernels::cuda::ActivationFunctionParams f;
  f.gated = kernels::IsGated(kind);
  switch (kind) {
    case Activation::kGelu:
    case Activation::kGeglu: f.function = kernels::cuda::ActFunction::kGelu; break;
    case Activation::kSwiglu:
    case Activation::kSilu: f.function = kernels::cuda::ActFunction::kSigmoidLinear; f.alpha = 1.0f; break;
    case Activation::kClampedSwiglu:
      f.function = kernels::cuda::ActFunction::kSigmoidLinear;
      f.alpha = kParams.alpha;
      f.clamped = true;
      f.limit = kParams.limit;
      f.offset = 1.0f;
      break;
    default: ADD_FAILURE() << "not used here";
  }
  return f;
}

struct DirectCase {
  Activation kind;
  int64_t rows, k;
};

std::string DirectName(const ::testing::TestParamInfo<DirectCase>& info) {
  return absl::StrCat(kernels::ActivationName(info.param.kind), "_", info.param.rows, "x", info.param.k);
}

class ActivationDirectLaunchTest : public ::testing::TestWithParam<DirectCase> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

// Outputs poisoned with 0xFF bytes (NaN / 0xFF codes) are fully overwritten, with the
// values of the checked entry point; the codec encoder gives the hardware encoder's codes.
TEST_P(ActivationDirectLaunchTest, WritesEveryOutputElementWithEitherEncoder) {
  const DirectCase& d = GetParam();
  const int64_t in_cols = kernels::ActivationInputWidth(d.kind, d.k);
  const Tensor host_x = MakeInput(DType::kFloat32, d.rows, in_cols, 5, true);
  const Tensor x = OnDevice(host_x);
  ActivationForwardOptions options;
  options.quantize = true;
  options.quantize_options.scale = kScale;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult api,
                       kernels::FusedActivationForward(GpuContext(), d.kind, kParams, x, options));
  for (auto encoder : {kernels::cuda::ActFp8Encoder::kHardware, kernels::cuda::ActFp8Encoder::kCodec}) {
    kernels::cuda::ActivationForwardParams p;
    p.act = FunctionParams(d.kind);
    p.x = x.raw_data();
    p.rows = d.rows;
    p.cols = d.k;
    p.encoder = encoder;
    p.scale = kScale;
    p.scale_inv = 1.0f / kScale;
    float* y = PoisonedBuffer<float>(d.rows * d.k, 0xFF);
    uint8_t* row = PoisonedBuffer<uint8_t>(d.rows * d.k, 0xFF);
    uint8_t* col = PoisonedBuffer<uint8_t>(d.rows * d.k, 0xFF);
    uint32_t* amax = PoisonedBuffer<uint32_t>(1, 0xFF);
    p.y = y;
    p.rowwise = row;
    p.columnwise = col;
    p.amax_bits = amax;
    ASSERT_EQ(kernels::cuda::LaunchActivationForward(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got_y = Download(y, d.rows * d.k);
    const std::vector<float> want_y = Floats(api.y);
    int64_t y_differs = 0;
    for (size_t i = 0; i < want_y.size(); ++i) {
      const bool same = Bits(got_y[i]) == Bits(want_y[i]) || (std::isnan(got_y[i]) && std::isnan(want_y[i]));
      y_differs += same ? 0 : 1;
    }
    EXPECT_EQ(y_differs, 0) << "y";
    EXPECT_EQ(Download(row, d.rows * d.k), Bytes(api.fp8.rowwise_data));
    EXPECT_EQ(Download(col, d.rows * d.k), Bytes(api.fp8.columnwise_data));
    const uint32_t amax_bits = Download(amax, 1)[0];
    EXPECT_TRUE(amax_bits > 0x7F800000u ? std::isnan(api.fp8.amax) : amax_bits == Bits(api.fp8.amax));
    cudaFree(y);
    cudaFree(row);
    cudaFree(col);
    cudaFree(amax);
  }

  // Backward: dx poisoned, dbias poisoned.
  const Tensor dy = OnDevice(MakeInput(DType::kFloat32, d.rows, d.k, 6, false));
  ActivationBackwardOptions bwd;
  bwd.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult api_bwd,
                       kernels::FusedActivationBackward(GpuContext(), d.kind, kParams, dy, x, bwd));
  kernels::cuda::ActivationBackwardParams b;
  b.act = FunctionParams(d.kind);
  b.dy = dy.raw_data();
  b.x = x.raw_data();
  b.rows = d.rows;
  b.cols = d.k;
  float* dx = PoisonedBuffer<float>(d.rows * in_cols, 0xFF);
  float* dbias = PoisonedBuffer<float>(in_cols, 0xFF);
  b.dx = dx;
  b.dbias = dbias;
  const int64_t workspace_floats = kernels::cuda::ActivationBackwardWorkspaceFloats(b);
  float* workspace = PoisonedBuffer<float>(workspace_floats, 0xFF);
  b.workspace = workspace;
  ASSERT_EQ(kernels::cuda::LaunchActivationBackward(b, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_dx = Download(dx, d.rows * in_cols);
  const std::vector<float> want_dx = Floats(api_bwd.dx);
  int64_t dx_differs = 0;
  for (size_t i = 0; i < want_dx.size(); ++i) {
    const bool same = Bits(got_dx[i]) == Bits(want_dx[i]) || (std::isnan(got_dx[i]) && std::isnan(want_dx[i]));
    dx_differs += same ? 0 : 1;
  }
  EXPECT_EQ(dx_differs, 0) << "dx";
  const std::vector<float> got_dbias = Download(dbias, in_cols);
  const std::vector<float> want_dbias = Floats(api_bwd.dbias);
  for (int64_t j = 0; j < in_cols; ++j) {
    const bool same =
        Bits(got_dbias[j]) == Bits(want_dbias[j]) || (std::isnan(got_dbias[j]) && std::isnan(want_dbias[j]));
    ASSERT_TRUE(same) << "dbias[" << j << "] " << got_dbias[j] << " vs " << want_dbias[j];
  }
  cudaFree(dx);
  cudaFree(dbias);
  cudaFree(workspace);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationDirectLaunchTest,
                         ::testing::Values(DirectCase{Activation::kGelu, 257, 259}, DirectCase{Activation::kGelu, 1, 1024},
                                           DirectCase{Activation::kSwiglu, 128, 129},
                                           DirectCase{Activation::kSwiglu, 260, 192},
                                           DirectCase{Activation::kClampedSwiglu, 257, 259},
                                           DirectCase{Activation::kGelu, 136, 200},
                                           DirectCase{Activation::kSwiglu, 256, 256},
                                           DirectCase{Activation::kClampedSwiglu, 8, 8}),
                         DirectName);

// The 128 x 128 register-tile kernel (kAuto on these shapes) and the 64 x 64 one
// (kTiled64) give the same FP32 and BF16 y, codes and amax bit for bit, from FP32 and
// BF16 x with NaN and infinities, in both formats and with both encoders.
class ActivationForwardKernelsAgreeTest : public ::testing::TestWithParam<DirectCase> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationForwardKernelsAgreeTest, TileKernelMatchesTheFallbackKernel) {
  const DirectCase& d = GetParam();
  const int64_t in_cols = kernels::ActivationInputWidth(d.kind, d.k);
  const int64_t n = d.rows * d.k;
  for (DType x_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor x = OnDevice(MakeInput(x_dtype, d.rows, in_cols, 11, true));
    for (auto format : {kernels::cuda::Fp8Format::kE4M3, kernels::cuda::Fp8Format::kE5M2}) {
      for (auto encoder : {kernels::cuda::ActFp8Encoder::kHardware, kernels::cuda::ActFp8Encoder::kCodec}) {
        for (auto y_type : {kernels::cuda::ActDType::kFloat32, kernels::cuda::ActDType::kBFloat16}) {
          const std::string what = absl::StrCat(DTypeName(x_dtype), format == kernels::cuda::Fp8Format::kE4M3 ? " E4M3" : " E5M2",
                                                encoder == kernels::cuda::ActFp8Encoder::kCodec ? " codec" : " cvt",
                                                y_type == kernels::cuda::ActDType::kFloat32 ? " y FP32" : " y BF16");
          std::vector<uint8_t> y_bytes[2], row[2], col[2];
          uint32_t amax[2] = {0, 0};
          const size_t y_size = static_cast<size_t>(n) * (y_type == kernels::cuda::ActDType::kFloat32 ? 4 : 2);
          for (int which = 0; which < 2; ++which) {
            kernels::cuda::ActivationForwardParams p;
            p.act = FunctionParams(d.kind);
            p.kernel = which == 0 ? kernels::cuda::ActForwardKernel::kAuto : kernels::cuda::ActForwardKernel::kTiled64;
            p.x = x.raw_data();
            p.x_type = x_dtype == DType::kFloat32 ? kernels::cuda::ActDType::kFloat32
                                                  : kernels::cuda::ActDType::kBFloat16;
            p.rows = d.rows;
            p.cols = d.k;
            p.format = format;
            p.encoder = encoder;
            p.scale = kScale;
            p.scale_inv = 1.0f / kScale;
            uint8_t* y = PoisonedBuffer<uint8_t>(static_cast<int64_t>(y_size), 0xFF);
            uint8_t* r = PoisonedBuffer<uint8_t>(n, 0xFF);
            uint8_t* c = PoisonedBuffer<uint8_t>(n, 0xFF);
            uint32_t* a = PoisonedBuffer<uint32_t>(1, 0xFF);
            p.y = y;
            p.y_type = y_type;
            p.rowwise = r;
            p.columnwise = c;
            p.amax_bits = a;
            ASSERT_EQ(kernels::cuda::LaunchActivationForward(p, nullptr), cudaSuccess) << what;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
            y_bytes[which] = Download(y, static_cast<int64_t>(y_size));
            row[which] = Download(r, n);
            col[which] = Download(c, n);
            amax[which] = Download(a, 1)[0];
            cudaFree(y);
            cudaFree(r);
            cudaFree(c);
            cudaFree(a);
          }
          // NaN y may differ in payload only (FP32 y); compare the rest bitwise.
          int64_t y_differs = 0;
          if (y_type == kernels::cuda::ActDType::kFloat32) {
            for (int64_t i = 0; i < n; ++i) {
              float u, v;
              std::memcpy(&u, &y_bytes[0][4 * i], 4);
              std::memcpy(&v, &y_bytes[1][4 * i], 4);
              y_differs += (Bits(u) == Bits(v) || (std::isnan(u) && std::isnan(v))) ? 0 : 1;
            }
          } else {
            y_differs = y_bytes[0] == y_bytes[1] ? 0 : 1;
          }
          EXPECT_EQ(y_differs, 0) << what << ": y";
          EXPECT_EQ(row[0], row[1]) << what << ": rowwise codes";
          EXPECT_EQ(col[0], col[1]) << what << ": columnwise codes";
          if (amax[1] > 0x7F800000u) {
            EXPECT_GT(amax[0], 0x7F800000u) << what << ": amax NaN";
          } else {
            EXPECT_EQ(amax[0], amax[1]) << what << ": amax";
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationForwardKernelsAgreeTest,
                         ::testing::Values(DirectCase{Activation::kGelu, 256, 256},
                                           DirectCase{Activation::kGelu, 136, 200},
                                           DirectCase{Activation::kSwiglu, 136, 200},
                                           DirectCase{Activation::kClampedSwiglu, 256, 256},
                                           DirectCase{Activation::kSilu, 8, 8}),
                         DirectName);

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace activation_gpu_test
}  // namespace teserve
