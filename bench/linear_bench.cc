// Linear layer benchmark: one forward and backward of layers::Linear on the GPU, as a
// session runs it (FP32 activations and master weights, the op entry points, the
// session's stream, the quantizers' scaling state), for Linear's shape in the speed
// targets: --shapes=RxC means R tokens, C -> C features (16384x8192 by default).
//   linear_fp32_fwd_bwd        no recipe (FP32 GEMMs: the unquantized session path)
//   linear_fp8_delayed_fwd_bwd FP8 delayed scaling: x, W and dy quantized per tensor,
//                              the three GEMMs read the FP8 codes natively
// Timed with CUDA events around Forward + Backward + the end of both scaling regions
// (what a training step's Linear costs); flops = 3 GEMMs of 2 R C C. run_bench.py times
// torch.nn.Linear (BF16) forward + backward on the same shape beside it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "layers/init.h"
#include "layers/linear.h"
#include "recipes/recipe.h"

namespace teserve {
namespace bench {
namespace {

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

void RunOne(const std::string& op, const v1::RecipeSpec& spec, int64_t tokens, int64_t features, const Flags& flags,
            std::vector<Result>* results) {
  const std::unique_ptr<kernels::DeviceStream> stream = OrDie(kernels::DeviceStream::Create(0), "stream");
  Context ctx;
  ctx.device = Device::Cuda(0);
  ctx.stream = stream->get();
  const recipes::Recipe recipe = OrDie(recipes::RecipeFromProto(spec), "recipe");
  layers::LinearOptions options;
  options.in_features = features;
  options.out_features = features;
  options.bias = true;
  std::unique_ptr<layers::Linear> linear = OrDie(layers::Linear::Create("fc", options, recipe), "Linear");
  for (layers::Parameter* p : linear->Parameters()) {
    p->value = OrDie(kernels::CopyTo(ctx, p->value, ctx.device), "weights to the GPU");
    p->grad = OrDie(kernels::CopyTo(ctx, p->grad, ctx.device), "grads to the GPU");
  }
  Tensor x_host = OrDie(Tensor::Zeros(DType::kFloat32, {tokens, features}), "x");
  layers::FillNormal(1, 1.0f, x_host.mutable_floats());
  Tensor dy_host = OrDie(Tensor::Zeros(DType::kFloat32, {tokens, features}), "dy");
  layers::FillNormal(2, 1e-3f, dy_host.mutable_floats());
  const Tensor x = OrDie(kernels::CopyTo(ctx, x_host, ctx.device), "x to the GPU");
  const Tensor dy = OrDie(kernels::CopyTo(ctx, dy_host, ctx.device), "dy to the GPU");
  const std::vector<layers::NamedQuantizer> quantizers = linear->Quantizers();

  Timing t = TimeLaunches(
      [&]() -> cudaError_t {
        layers::ForwardOptions fwd;
        auto out = linear->Forward(ctx, {x}, fwd);
        Check(out.status(), op.c_str());
        for (const auto& q : quantizers) {
          if (recipes::IsForwardRole(q.quantizer->role())) q.quantizer->EndRegion();
        }
        Check(linear->Backward(ctx, *out->saved, {dy}, nullptr).status(), op.c_str());
        for (const auto& q : quantizers) {
          if (!recipes::IsForwardRole(q.quantizer->role())) q.quantizer->EndRegion();
        }
        return cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream));
      },
      flags);
  Result r{op, tokens, features, "fp32", t, 4 * (3 * tokens * features + 2 * features * features), "layers::Linear"};
  r.flops = 3 * 2 * tokens * features * features;
  results->push_back(r);
}

void Run(int64_t rows, int64_t cols, const Flags& flags, std::vector<Result>* results) {
  RunOne("linear_fp32_fwd_bwd", v1::RecipeSpec(), rows, cols, flags, results);
  v1::RecipeSpec delayed;
  delayed.mutable_delayed()->set_amax_history_len(1024);
  RunOne("linear_fp8_delayed_fwd_bwd", delayed, rows, cols, flags, results);
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "linear_bench", teserve::bench::Run);
}
