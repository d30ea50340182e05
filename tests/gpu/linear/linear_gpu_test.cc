// layers::Linear on cuda:0 with a 16-bit params_dtype:
//   - PlaceParameters builds the weight's compute copy on the device, equal bit for bit
//     to the CPU's kernels::Convert of the master; the forward reads it (a copy changed
//     behind the flag changes the output: there is no per-forward conversion on the
//     device) and gives the same bits as converting per forward;
//   - the multi-tensor optimizer step rewrites the copy in its pass, equal to Convert
//     of the updated master (device and CPU);
//   - wgrad written fresh (GEMM beta 0 onto a gradient marked zero) gives the same bits
//     as accumulating onto the zeros, and a second backward accumulates;
//   - the emulated recipes (MXFP8, NVFP4: the device multiplies the dequantized values as
//     BF16, NVFP4's per-tensor scales in the GEMM's alpha) give the CPU reference's y, dx
//     and dW within FP32 rounding: the quantized codes are equal on both (the quantize
//     kernels match bit for bit, stochastic rounding and the Hadamard transform
//     included), so only the GEMMs' summation order and the scaling's rounding differ.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "layers/init.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "recipes/recipe.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/recipe_specs.h"
#include "train/optimizer.h"

namespace teserve {
namespace layers {
namespace {

constexpr int64_t kTokens = 256, kIn = 128, kOut = 256;

Context Gpu() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  FillNormal(seed, std, t.mutable_floats());
  return t;
}

Tensor ToGpu(const Tensor& t) { return kernels::CopyTo(Gpu(), t, Device::Cuda(0)).value(); }
Tensor ToHost(const Tensor& t) { return kernels::CopyTo(Gpu(), t, Device::Cpu()).value(); }
Tensor CpuConvert(const Tensor& host, DType dtype) { return kernels::Convert(Context::Cpu(), host, dtype).value(); }

// A kIn -> kOut Linear's options (bias on, weights N(0, 0.05) from `seed`).
LinearOptions TestOptions(DType dtype, uint64_t seed) {
  LinearOptions o;
  o.in_features = kIn;
  o.out_features = kOut;
  o.params_dtype = dtype;
  o.init_std = 0.05f;
  o.seed = seed;
  return o;
}

std::unique_ptr<Linear> PlacedLinear(DType dtype, const std::string& recipe = "none") {
  const LinearOptions o = TestOptions(dtype, 3);
  auto linear = Linear::Create("fc", o, recipes::RecipeFromProto(testing_util::RecipeSpecNamed(recipe)).value());
  EXPECT_TRUE(linear.ok()) << linear.status();
  EXPECT_TRUE(PlaceParameters(Gpu(), (*linear)->Parameters()).ok());
  return std::move(linear).value();
}

class LinearGpuCopy : public ::testing::TestWithParam<DType> {};

TEST_P(LinearGpuCopy, TheForwardReadsTheCopyWhichEqualsConvert) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  auto linear = PlacedLinear(dtype);
  Parameter& w = *linear->Parameters()[0];
  ASSERT_TRUE(w.compute_copy_valid);
  ASSERT_EQ(w.compute_copy.device(), Device::Cuda(0));
  EXPECT_TRUE(BitwiseEqual(ToHost(w.compute_copy), CpuConvert(ToHost(w.value), dtype)));

  const Tensor x = ToGpu(Random({kTokens, kIn}, 1));
  auto with_copy = linear->Forward(Gpu(), {x}, ForwardOptions{false});
  ASSERT_TRUE(with_copy.ok()) << with_copy.status();
  InvalidateComputeCopy(w);
  auto converted = linear->Forward(Gpu(), {x}, ForwardOptions{false});
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_TRUE(BitwiseEqual(ToHost(with_copy->outputs[0]), ToHost(converted->outputs[0])));

  // A copy changed behind the flag: the device forward reads it as it is.
  ASSERT_TRUE(RefreshComputeCopy(Gpu(), w).ok());
  ASSERT_TRUE(kernels::FillZero(Gpu(), &w.compute_copy).ok());
  auto zeroed = linear->Forward(Gpu(), {x}, ForwardOptions{false});
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  EXPECT_FALSE(BitwiseEqual(ToHost(zeroed->outputs[0]), ToHost(converted->outputs[0])));
  ASSERT_TRUE(RefreshComputeCopy(Gpu(), w).ok());
  auto again = linear->Forward(Gpu(), {x}, ForwardOptions{false});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(BitwiseEqual(ToHost(again->outputs[0]), ToHost(converted->outputs[0])));
}

TEST_P(LinearGpuCopy, TheOptimizerStepRewritesTheCopy) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  auto linear = PlacedLinear(dtype);
  std::vector<Parameter*> params = linear->Parameters();
  Parameter& w = *params[0];
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  auto optimizer = train::OptimizerFromProto(spec).value();
  for (int64_t step = 1; step <= 2; ++step) {
    for (Parameter* p : params) {
      ASSERT_TRUE(kernels::CopyInto(Gpu(), Random(p->grad.shape(), 50 + step, 0.1f), &p->grad).ok());
    }
    ASSERT_TRUE(optimizer->Apply(Gpu(), params, step).ok());
    ASSERT_TRUE(w.compute_copy_valid);
    const Tensor copy = ToHost(w.compute_copy);
    EXPECT_TRUE(BitwiseEqual(copy, ToHost(kernels::Convert(Gpu(), w.value, dtype).value()))) << step;
    EXPECT_TRUE(BitwiseEqual(copy, CpuConvert(ToHost(w.value), dtype))) << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearGpuCopy, ::testing::Values(DType::kBFloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

class LinearGpuWgrad : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(LinearGpuWgrad, FreshEqualsAccumulatingOntoZeros) {
  TESERVE_SKIP_WITHOUT_GPU();
  const auto& [recipe, dtype] = GetParam();
  auto fresh = PlacedLinear(dtype, recipe);
  auto accumulated = PlacedLinear(dtype, recipe);
  ASSERT_TRUE(fresh->Parameters()[0]->grad_is_zero);
  accumulated->Parameters()[0]->grad_is_zero = false;
  Tensor first;
  for (int pass = 0; pass < 2; ++pass) {
    const Tensor x = ToGpu(Random({kTokens, kIn}, 60 + pass));
    const Tensor dy = ToGpu(Random({kTokens, kOut}, 70 + pass, 0.1f));
    for (Linear* l : {fresh.get(), accumulated.get()}) {
      auto out = l->Forward(Gpu(), {x}, ForwardOptions());
      ASSERT_TRUE(out.ok()) << out.status();
      for (const NamedQuantizer& q : l->Quantizers()) {
        if (recipes::IsForwardRole(q.quantizer->role())) q.quantizer->EndRegion();
      }
      ASSERT_TRUE(l->Backward(Gpu(), *out->saved, {dy}).ok());
      for (const NamedQuantizer& q : l->Quantizers()) {
        if (!recipes::IsForwardRole(q.quantizer->role())) q.quantizer->EndRegion();
      }
    }
    const Tensor got = ToHost(fresh->Parameters()[0]->grad);
    EXPECT_TRUE(BitwiseEqual(got, ToHost(accumulated->Parameters()[0]->grad))) << "pass " << pass;
    EXPECT_TRUE(BitwiseEqual(ToHost(fresh->Parameters()[1]->grad), ToHost(accumulated->Parameters()[1]->grad)))
        << "pass " << pass;
    if (pass == 0) first = got;
    if (pass == 1) {
      EXPECT_FALSE(BitwiseEqual(got, first));  // the second backward accumulated
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearGpuWgrad,
                         ::testing::Combine(::testing::Values("none", "delayed", "current"),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) + "_" + std::string(DTypeName(std::get<1>(info.param)));
                         });

double RelativeL2(const Tensor& got_any, const Tensor& want_any) {
  const Tensor got = CpuConvert(got_any, DType::kFloat32), want = CpuConvert(want_any, DType::kFloat32);
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.floats()[i], g = got.floats()[i];
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

class LinearGpuEmulated : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(LinearGpuEmulated, MatchesTheCpuLinearOnTheSameCodes) {
  TESERVE_SKIP_WITHOUT_GPU();
  const auto& [recipe, dtype] = GetParam();
  const LinearOptions o = TestOptions(dtype, 4);
  const recipes::Recipe r = recipes::RecipeFromProto(testing_util::RecipeSpecNamed(recipe)).value();
  auto cpu = Linear::Create("fc", o, r).value();
  auto gpu = Linear::Create("fc", o, r).value();
  ASSERT_TRUE(PlaceParameters(Gpu(), gpu->Parameters()).ok());
  Tensor x = Random({kTokens, kIn}, 80), dy = Random({kTokens, kOut}, 81, 0.1f);
  if (dtype != DType::kFloat32) {
    x = CpuConvert(x, dtype);
    dy = CpuConvert(dy, dtype);
  }
  auto step = [&](Linear& l, const Context& ctx, const Tensor& in, const Tensor& grad) {
    auto out = l.Forward(ctx, {in}, ForwardOptions());
    EXPECT_TRUE(out.ok()) << out.status();
    auto dx = l.Backward(ctx, *out->saved, {grad});
    EXPECT_TRUE(dx.ok()) << dx.status();
    return std::make_pair(out->outputs[0], (*dx)[0]);
  };
  const auto [y_cpu, dx_cpu] = step(*cpu, Context::Cpu(), x, dy);
  const auto [y_gpu, dx_gpu] = step(*gpu, Gpu(), ToGpu(x), ToGpu(dy));
  // FP32 params: only summation order and the final scaling differ (relative 1e-6 or
  // so; 1e-4 leaves room). 16-bit params: each output rounds once to BF16, and a sum on
  // the other side of a rounding boundary moves one element by one BF16 step (2^-8).
  const double bound = dtype == DType::kFloat32 ? 1e-4 : 1e-2;
  EXPECT_LE(RelativeL2(ToHost(y_gpu), y_cpu), bound) << "y";
  EXPECT_LE(RelativeL2(ToHost(dx_gpu), dx_cpu), bound) << "dx";
  EXPECT_LE(RelativeL2(ToHost(gpu->Parameters()[0]->grad), cpu->Parameters()[0]->grad), bound) << "dW";
  std::printf("%s %s: y %.3g dx %.3g dW %.3g\n", recipe.c_str(), std::string(DTypeName(dtype)).c_str(),
              RelativeL2(ToHost(y_gpu), y_cpu), RelativeL2(ToHost(dx_gpu), dx_cpu),
              RelativeL2(ToHost(gpu->Parameters()[0]->grad), cpu->Parameters()[0]->grad));
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearGpuEmulated,
                         ::testing::Combine(::testing::Values("mxfp8", "nvfp4"),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) + "_" + std::string(DTypeName(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace layers
}  // namespace teserve
