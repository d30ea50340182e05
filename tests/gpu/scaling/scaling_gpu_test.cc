// Delayed-scaling update of N quantizers (kernels/delayed_scaling.h). The oracle is
// recipes::ScalingState, one per quantizer, fed the same amax sequence: after every
// region the CPU op's history, scale and scale_inv must equal the states' bitwise, and
// the CUDA op (one launch for all quantizers) must equal the CPU op bitwise. The amax
// sequences hit every rule: skipped regions (slot 0 == 0), NaN and Inf amaxes (scale
// kept), amaxes so small the scale overflows (FLT_MAX), E4M3 and E5M2 maxima, margins.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/delayed_scaling.h"
#include "kernels/scaling_math.h"
#include "recipes/recipe.h"
#include "recipes/scaling.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

using kernels::DelayedScalingTensors;
using kernels::DelayedScalingUpdateOptions;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

struct Case {
  std::string name;
  int64_t quantizers;
  int64_t history_len;
  recipes::AmaxComputeAlgo algo;
  float margin;
};

// The amax quantizer q records in region `region` (0 = it did not run).
float AmaxFor(int64_t q, int region, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const float pick = u(*rng);
  if (pick < 0.1f) return 0.0f;
  if (pick < 0.13f) return NAN;
  if (pick < 0.16f) return INFINITY;
  if (pick < 0.2f) return 1e-42f;  // fp8_max / amax overflows: FLT_MAX
  return std::ldexp(u(*rng) + 0.01f, static_cast<int>(q % 7) - 3 + region % 3);
}

// Host tensors of the op and the oracle states.
struct Fixture {
  Tensor history, scale, scale_inv, fp8_max, enabled;
  std::vector<recipes::ScalingState> states;
  DelayedScalingUpdateOptions options;

  explicit Fixture(const Case& c) {
    history = Tensor::Zeros(DType::kFloat32, {c.quantizers, c.history_len}).value();
    scale = Tensor::Zeros(DType::kFloat32, {c.quantizers}).value();
    scale_inv = Tensor::Zeros(DType::kFloat32, {c.quantizers}).value();
    fp8_max = Tensor::Zeros(DType::kFloat32, {c.quantizers}).value();
    enabled = Tensor::Zeros(DType::kInt32, {1}).value();
    enabled.data<int32_t>()[0] = 1;
    recipes::DelayedScalingConfig config;
    config.amax_history_len = static_cast<int>(c.history_len);
    config.amax_compute_algo = c.algo;
    config.margin = c.margin;
    for (int64_t q = 0; q < c.quantizers; ++q) {
      const float max = q % 3 == 2 ? 57344.0f : 448.0f;  // gradients in E5M2 (HYBRID)
      fp8_max.data<float>()[q] = max;
      scale.data<float>()[q] = 1.0f;
      scale_inv.data<float>()[q] = 1.0f;
      states.emplace_back(config, max);
    }
    options.use_max = c.algo == recipes::AmaxComputeAlgo::kMax;
    options.margin = c.margin;
  }

  // Records one region's amaxes in both (slot 0 keeps the NaN-propagating max).
  void Record(int region, std::mt19937* rng) {
    const int64_t h = history.dim(1);
    for (int64_t q = 0; q < history.dim(0); ++q) {
      const int times = 1 + static_cast<int>(q % 2);  // some quantize twice per region
      for (int k = 0; k < times; ++k) {
        const float amax = AmaxFor(q, region, rng);
        states[q].RecordAmax(amax);
        float& slot0 = history.data<float>()[q * h];
        slot0 = kernels::scaling_math::NanMax(slot0, amax);
      }
    }
  }

  DelayedScalingTensors Tensors() {
    return DelayedScalingTensors{&history, &scale, &scale_inv, &fp8_max, &enabled};
  }
};

// The op's tensors equal the oracle states bitwise.
void ExpectMatchesStates(const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                         const std::vector<recipes::ScalingState>& states, const std::string& where) {
  const int64_t h = history.dim(1);
  for (size_t q = 0; q < states.size(); ++q) {
    ASSERT_EQ(Bits(scale.data<float>()[q]), Bits(states[q].scale())) << where << " quantizer " << q;
    ASSERT_EQ(Bits(scale_inv.data<float>()[q]), Bits(states[q].scale_inv())) << where << " quantizer " << q;
    for (int64_t i = 0; i < h; ++i) {
      ASSERT_EQ(Bits(history.data<float>()[q * h + i]), Bits(states[q].history()[i]))
          << where << " quantizer " << q << " slot " << i;
    }
  }
}

class DelayedScalingTest : public ::testing::TestWithParam<Case> {};

TEST_P(DelayedScalingTest, CpuOpMatchesScalingState) {
  Fixture f(GetParam());
  std::mt19937 rng(5);
  bool saw_flt_max = false;
  for (int region = 0; region < 12; ++region) {
    f.Record(region, &rng);
    for (recipes::ScalingState& s : f.states) s.Update();
    ASSERT_TRUE(kernels::DelayedScalingUpdate(Context::Cpu(), f.Tensors(), f.options).ok());
    ExpectMatchesStates(f.history, f.scale, f.scale_inv, f.states, absl::StrCat("region ", region));
    for (const recipes::ScalingState& s : f.states) saw_flt_max |= s.scale() == FLT_MAX;
  }
  if (GetParam().quantizers >= 8 && GetParam().algo == recipes::AmaxComputeAlgo::kMostRecent) {
    EXPECT_TRUE(saw_flt_max) << "the sequence never reached the FLT_MAX clamp";
  }
}

TEST_P(DelayedScalingTest, DisabledFlagLeavesEverything) {
  Fixture f(GetParam());
  std::mt19937 rng(6);
  f.Record(0, &rng);
  const Tensor history = f.history.Clone().value();
  f.enabled.data<int32_t>()[0] = 0;
  ASSERT_TRUE(kernels::DelayedScalingUpdate(Context::Cpu(), f.Tensors(), f.options).ok());
  EXPECT_TRUE(BitwiseEqual(f.history, history));
  for (int64_t q = 0; q < GetParam().quantizers; ++q) EXPECT_EQ(f.scale.data<float>()[q], 1.0f);
}

#if TESERVE_WITH_CUDA
using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

TEST_P(DelayedScalingTest, CudaOpMatchesCpuOpBitwise) {
  TESERVE_SKIP_WITHOUT_GPU();
  Fixture f(GetParam());
  Context gpu;
  gpu.device = Device::Cuda(0);
  Tensor d_history, d_scale, d_scale_inv;
  const Tensor d_fp8_max = CopyToDevice(gpu, f.fp8_max, gpu.device).value();
  Tensor d_enabled = CopyToDevice(gpu, f.enabled, gpu.device).value();
  std::mt19937 rng(7);
  for (int region = 0; region < 12; ++region) {
    f.Record(region, &rng);
    // The device starts each region from the CPU's recorded history and its own scales.
    d_history = CopyToDevice(gpu, f.history, gpu.device).value();
    if (region == 0) {
      d_scale = CopyToDevice(gpu, f.scale, gpu.device).value();
      d_scale_inv = CopyToDevice(gpu, f.scale_inv, gpu.device).value();
    }
    for (recipes::ScalingState& s : f.states) s.Update();
    ASSERT_TRUE(kernels::DelayedScalingUpdate(Context::Cpu(), f.Tensors(), f.options).ok());
    const absl::Status s = kernels::DelayedScalingUpdate(
        gpu, DelayedScalingTensors{&d_history, &d_scale, &d_scale_inv, &d_fp8_max, &d_enabled}, f.options);
    ASSERT_TRUE(s.ok()) << s;
    ExpectMatchesStates(CopyToHost(gpu, d_history).value(), CopyToHost(gpu, d_scale).value(),
                        CopyToHost(gpu, d_scale_inv).value(), f.states, absl::StrCat("cuda region ", region));
  }
  // The device flag: 0 skips the whole launch.
  const Tensor before = CopyToHost(gpu, d_history).value();
  const Tensor zero = Tensor::Zeros(DType::kInt32, {1}).value();
  d_enabled = CopyToDevice(gpu, zero, gpu.device).value();
  ASSERT_TRUE(kernels::DelayedScalingUpdate(
                  gpu, DelayedScalingTensors{&d_history, &d_scale, &d_scale_inv, &d_fp8_max, &d_enabled}, f.options)
                  .ok());
  EXPECT_TRUE(BitwiseEqual(CopyToHost(gpu, d_history).value(), before));
}
#endif  // TESERVE_WITH_CUDA

INSTANTIATE_TEST_SUITE_P(
    Configs, DelayedScalingTest,
    ::testing::Values(Case{"one_quantizer_len1_max", 1, 1, recipes::AmaxComputeAlgo::kMax, 0.0f},
                      Case{"n9_len2_most_recent", 9, 2, recipes::AmaxComputeAlgo::kMostRecent, 0.0f},
                      Case{"n17_len5_max_margin1", 17, 5, recipes::AmaxComputeAlgo::kMax, 1.0f},
                      Case{"n40_len33_max_margin0_5", 40, 33, recipes::AmaxComputeAlgo::kMax, 0.5f},
                      Case{"n300_len16_most_recent", 300, 16, recipes::AmaxComputeAlgo::kMostRecent, 0.0f},
                      Case{"n12_len1024_max", 12, 1024, recipes::AmaxComputeAlgo::kMax, 2.0f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(DelayedScaling, ErrorsNameTheTensor) {
  Case c{"x", 3, 4, recipes::AmaxComputeAlgo::kMax, 0.0f};
  Fixture f(c);
  f.scale = Tensor::Zeros(DType::kFloat32, {4}).value();
  const absl::Status s = kernels::DelayedScalingUpdate(Context::Cpu(), f.Tensors(), f.options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("scale.shape: expected [3], got [4]"), std::string::npos) << s;
}

}  // namespace
}  // namespace teserve
