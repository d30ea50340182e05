// Linear layer benchmark: one forward and backward of layers::Linear on the GPU, as a
// session runs it (FP32 master weights and gradients, the op entry points, the
// session's stream, the quantizers' scaling state), for Linear's shape in the speed
// targets: --shapes=RxC means R tokens, C -> C features (16384x8192 by default).
//   linear_fp32_fwd_bwd        no recipe, FP32 activations (FP32 GEMMs)
//   linear_fp8_delayed_fwd_bwd FP8 delayed scaling, FP32 activations: x, W and dy
//                              quantized per tensor, the three GEMMs read the FP8 codes
//   linear_bf16_fwd_bwd        no recipe, params_dtype BF16 (BF16 x, dy, y, dx; BF16 GEMMs)
//   linear_fp8_delayed_bf16_fwd_bwd  FP8 delayed scaling with params_dtype BF16: what
//                              TE's te.Linear runs with BF16 parameters
//   linear_mxfp8_bf16_fwd_bwd  MXFP8 with params_dtype BF16; emulated on sm_90 (MXFP8
//                              quantize, dequantize, BF16 GEMMs)
//   linear_nvfp4_bf16_fwd_bwd  NVFP4 with params_dtype BF16, emulated the same way (the
//                              per-tensor scales in the GEMM's alpha)
//   layernorm_linear_fp8_delayed_bf16_fwd_bwd  LayerNormLinear (LayerNorm, C -> C, bias),
//                              BF16 params, FP8 delayed: te.LayerNormLinear's case (the
//                              norm kernel writes the GEMM's FP8 input)
//   layernorm_mlp_fp8_delayed_bf16_fwd_bwd  LayerNormMLP (LayerNorm, gelu, hidden C, ffn
//                              LAYER_BENCH_FFN or 4 C, bias), BF16 params, FP8 delayed:
//                              te.LayerNormMLP's case
//   layernorm_mlp_bf16_fwd_bwd  the same MLP with BF16 params and no recipe (fc1's GEMM
//                              applies the gelu in its epilogue)
//   linear_fp8_current_bf16_fwd_bwd, layernorm_linear_fp8_current_bf16_fwd_bwd,
//   layernorm_mlp_fp8_current_bf16_fwd_bwd  the same three under FP8 current scaling
//                              (te_layer_probe.py --recipe current)
// bench/te_layer_probe.py times the TE modules on the same shapes.
// Timed with CUDA events around ZeroGrad + Forward + Backward + the end of both scaling
// regions: what a training step's Linear costs in a session between two optimizer
// steps; once waiting for each step (the op's name) and once with steps back to back
// (<op>_pipelined, the host running ahead as te_linear_probe.py's loop of te.Linear).
// The gradients are marked zero as Session::Step(zero_grad) / ZeroGrad leave them (the
// fill deferred, so wgrad writes the weight gradient fresh, as te.Linear's with grads
// set to None), and a 16-bit weight's compute copy is valid, as after an optimizer step
// (PlaceParameters builds it; nothing in the loop writes the weight). flops = 3 GEMMs
// of 2 R C C. run_bench.py times torch.nn.Linear (BF16) forward + backward on the same
// shape beside it.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_status.h"
#include "bench/bench_util.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/tensor_checks.h"
#include "layers/init.h"
#include "layers/layernorm_linear.h"
#include "layers/layernorm_mlp.h"
#include "layers/linear.h"
#include "recipes/recipe.h"

namespace teserve {
namespace bench {
namespace {

// Where the time of one quantized forward + backward goes: the forward alone, the
// backward alone (repeated on one forward's saved operands, after a ZeroGrad as in the
// whole step), and each of the three GEMMs alone on the quantized operands Linear feeds
// them (fprop into params_dtype with the bias epilogue when 16-bit, dgrad into
// params_dtype, wgrad into the FP32 gradient written fresh (what Linear runs after a
// ZeroGrad) and accumulated (a second microbatch); also wgrad written fresh in
// params_dtype, what a 16-bit wgrad costs).
bool flags_breakdown = std::getenv("LINEAR_BENCH_BREAKDOWN") != nullptr;

void Breakdown(const std::string& op, const Context& ctx, layers::Linear& linear, const Tensor& x, const Tensor& dy,
               int64_t tokens, int64_t features, const Flags& flags, std::vector<Result>* results) {
  const int64_t gemm_flops = 2 * tokens * features * features;
  auto add = [&](const std::string& part, Timing t, int64_t flops) {
    Result r{op + "/" + part, tokens, features, std::string(DTypeName(x.dtype())), t, 0, "breakdown"};
    r.flops = flops;
    results->push_back(r);
  };
  const std::vector<layers::NamedQuantizer> quantizers = linear.Quantizers();
  add("forward", TimeLaunches([&]() -> cudaError_t {
        Check(linear.Forward(ctx, {x}, layers::ForwardOptions()).status(), "forward");
        return cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream));
      }, flags), gemm_flops);
  auto fwd = OrDie(linear.Forward(ctx, {x}, layers::ForwardOptions()), "forward");
  add("backward", TimeLaunches([&]() -> cudaError_t {
        Check(layers::ZeroGrads(ctx, linear.Parameters()), "zero grad");
        Check(linear.Backward(ctx, *fwd.saved, {dy}, nullptr).status(), "backward");
        return cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream));
      }, flags), 2 * gemm_flops);

  // The GEMMs alone, on operands quantized as Linear quantizes them.
  recipes::Quantizer* qx = quantizers[0].quantizer;
  recipes::Quantizer* qw = quantizers[1].quantizer;
  recipes::Quantizer* qdy = quantizers[2].quantizer;
  const Tensor w = OrDie(kernels::Convert(ctx, linear.Parameters()[0]->value, x.dtype()), "w");
  const QuantizedTensor xq = OrDie(qx->Quantize(ctx, x, true, true), "x");
  const QuantizedTensor wq = OrDie(qw->Quantize(ctx, w, true, true), "w");
  const QuantizedTensor dyq = OrDie(qdy->Quantize(ctx, dy, true, true), "dy");
  auto operand = [](const QuantizedTensor& q, kernels::Copy copy) {
    const kernels::QuantizedCopy c = kernels::SelectCopy(q, copy);
    return kernels::GemmOperand{c.data, true, c.scale_inv};
  };
  auto first = [](kernels::GemmOperand o) {
    o.transpose = false;
    return o;
  };
  Tensor y = OrDie(Tensor::Empty(x.dtype(), {tokens, features}, ctx.device, ctx.stream), "y");
  Tensor dw = OrDie(Tensor::Empty(x.dtype(), {features, features}, ctx.device, ctx.stream), "dw");
  Tensor bias = OrDie(kernels::Convert(ctx, linear.Parameters()[1]->value, x.dtype()), "bias");
  layers::Parameter* weight = linear.Parameters()[0];
  auto gemm = [&](const std::string& part, const kernels::GemmOperand& a, const kernels::GemmOperand& b, Tensor* d,
                  kernels::GemmOptions options) {
    add(part, TimeLaunches([&]() -> cudaError_t {
          Check(kernels::Gemm(ctx, a, b, d, options), part.c_str());
          return cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream));
        }, flags), gemm_flops);
  };
  kernels::GemmOptions fprop;
  fprop.accumulation = kernels::GemmAccumulation::kFast;
  if (x.dtype() != DType::kFloat32) {
    fprop.epilogue = kernels::GemmEpilogue::kBias;
    fprop.bias = &bias;
  }
  gemm("gemm_fprop", first(operand(xq, kernels::Copy::kRowwise)), operand(wq, kernels::Copy::kRowwise), &y, fprop);
  kernels::GemmOptions split;
  gemm("gemm_dgrad", first(operand(dyq, kernels::Copy::kRowwise)), operand(wq, kernels::Copy::kColumnwise), &y, split);
  gemm("gemm_wgrad_fp32_fresh", first(operand(dyq, kernels::Copy::kColumnwise)),
       operand(xq, kernels::Copy::kColumnwise), &weight->grad, split);
  kernels::GemmOptions accumulate;
  accumulate.beta = 1.0f;
  gemm("gemm_wgrad_fp32_acc", first(operand(dyq, kernels::Copy::kColumnwise)), operand(xq, kernels::Copy::kColumnwise),
       &weight->grad, accumulate);
  gemm("gemm_wgrad_fresh", first(operand(dyq, kernels::Copy::kColumnwise)), operand(xq, kernels::Copy::kColumnwise),
       &dw, split);
  for (const auto& q : quantizers) q.quantizer->EndRegion();
}

enum class Layer { kLinear, kLayerNormLinear, kLayerNormMLP };

int64_t MlpFfn(int64_t features) {
  const char* ffn = std::getenv("LAYER_BENCH_FFN");
  return ffn != nullptr ? std::atoll(ffn) : 4 * features;
}

std::unique_ptr<layers::Module> MakeLayer(Layer layer, const recipes::Recipe& recipe, DType dtype, int64_t features) {
  if (layer == Layer::kLayerNormLinear) {
    layers::LayerNormLinearOptions options;
    options.in_features = features;
    options.out_features = features;
    options.params_dtype = dtype;
    return OrDie(layers::LayerNormLinear::Create("ln_fc", options, recipe), "LayerNormLinear");
  }
  if (layer == Layer::kLayerNormMLP) {
    layers::LayerNormMLPOptions options;
    options.hidden_size = features;
    options.ffn_hidden_size = MlpFfn(features);
    options.params_dtype = dtype;
    return OrDie(layers::LayerNormMLP::Create("mlp", options, recipe), "LayerNormMLP");
  }
  layers::LinearOptions options;
  options.in_features = features;
  options.out_features = features;
  options.bias = true;
  options.params_dtype = dtype;
  return OrDie(layers::Linear::Create("fc", options, recipe), "Linear");
}

void RunOne(const std::string& op, const v1::RecipeSpec& spec, DType dtype, int64_t tokens, int64_t features,
            const Flags& flags, std::vector<Result>* results, Layer layer = Layer::kLinear) {
  const GpuStream gpu;
  const Context& ctx = gpu.context();
  const recipes::Recipe recipe = OrDie(recipes::RecipeFromProto(spec), "recipe");
  std::unique_ptr<layers::Module> linear = MakeLayer(layer, recipe, dtype, features);
  // As a session places its parameters: values and gradients on the GPU, a 16-bit
  // weight's compute copy built there.
  Check(layers::PlaceParameters(ctx, linear->Parameters()), "parameters to the GPU");
  const std::vector<layers::Parameter*> params = linear->Parameters();
  Tensor x_host = OrDie(Tensor::Zeros(DType::kFloat32, {tokens, features}), "x");
  layers::FillNormal(1, 1.0f, x_host.mutable_floats());
  Tensor dy_host = OrDie(Tensor::Zeros(DType::kFloat32, {tokens, features}), "dy");
  layers::FillNormal(2, 1e-3f, dy_host.mutable_floats());
  // Activations arrive in params_dtype, as from the previous layer of a 16-bit stack.
  const Tensor x = OrDie(kernels::Convert(ctx, OrDie(kernels::CopyTo(ctx, x_host, ctx.device), "x to the GPU"), dtype),
                         "x in params_dtype");
  const Tensor dy = OrDie(
      kernels::Convert(ctx, OrDie(kernels::CopyTo(ctx, dy_host, ctx.device), "dy to the GPU"), dtype),
      "dy in params_dtype");
  const std::vector<layers::NamedQuantizer> quantizers = linear->Quantizers();

  auto step = [&] {
    Check(layers::ZeroGrads(ctx, params), "zero grad");
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
  };
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(ctx.stream);
  // Each step waits for its work: what one call costs, seen from the host.
  const Timing t = TimeLaunches([&]() -> cudaError_t {
    step();
    return cudaStreamSynchronize(cuda_stream);
  }, flags, op);
  // Steps back to back with the host running ahead (only the lazy amax reads wait, each
  // for the previous step's region): what a loop of steps costs per step, as
  // te_linear_probe.py times te.Linear.
  const Timing pipelined = TimeLaunches([&]() -> cudaError_t {
    step();
    return cudaSuccess;
  }, flags, op + "_pipelined", cuda_stream);
  const int64_t act_bytes = dtype == DType::kFloat32 ? 4 : 2;
  if (flags_breakdown && !quantizers.empty() && layer == Layer::kLinear) {
    Breakdown(op, ctx, static_cast<layers::Linear&>(*linear), x, dy, tokens, features, flags, results);
  }
  // GEMM flops: 3 GEMMs of 2 R C C per C x C projection (the MLP: two of C x ffn).
  const int64_t projection = layer == Layer::kLayerNormMLP ? 2 * MlpFfn(features) * features : features * features;
  Result r{op,      tokens, features, dtype == DType::kFloat32 ? "fp32" : "bf16",
           t,       act_bytes * 3 * tokens * features + 4 * 2 * features * features,
           layer == Layer::kLinear ? "layers::Linear" : linear->kind()};
  r.flops = 3 * 2 * tokens * projection;
  results->push_back(r);
  Result rp = r;
  rp.op = op + "_pipelined";
  rp.timing = pipelined;
  results->push_back(rp);
}

// LINEAR_BENCH_ONLY=<op> runs that variant alone (for profilers that should see one).
void Run(int64_t rows, int64_t cols, const Flags& flags, std::vector<Result>* results) {
  const char* only = std::getenv("LINEAR_BENCH_ONLY");
  auto run = [only](const char* op, const v1::RecipeSpec& recipe, DType dtype, int64_t r, int64_t c,
                       const Flags& f, std::vector<Result>* out, Layer layer = Layer::kLinear) {
    if (only == nullptr || std::string(only) == op) RunOne(op, recipe, dtype, r, c, f, out, layer);
  };
  run("linear_fp32_fwd_bwd", v1::RecipeSpec(), DType::kFloat32, rows, cols, flags, results);
  v1::RecipeSpec delayed;
  delayed.mutable_delayed()->set_amax_history_len(1024);
  run("linear_fp8_delayed_fwd_bwd", delayed, DType::kFloat32, rows, cols, flags, results);
  run("linear_bf16_fwd_bwd", v1::RecipeSpec(), DType::kBFloat16, rows, cols, flags, results);
  run("linear_fp8_delayed_bf16_fwd_bwd", delayed, DType::kBFloat16, rows, cols, flags, results);
  v1::RecipeSpec current;
  current.mutable_current();
  run("linear_fp8_current_bf16_fwd_bwd", current, DType::kBFloat16, rows, cols, flags, results);
  v1::RecipeSpec mxfp8;
  mxfp8.mutable_mxfp8();
  run("linear_mxfp8_bf16_fwd_bwd", mxfp8, DType::kBFloat16, rows, cols, flags, results);
  v1::RecipeSpec nvfp4;
  nvfp4.mutable_nvfp4();
  run("linear_nvfp4_bf16_fwd_bwd", nvfp4, DType::kBFloat16, rows, cols, flags, results);
  run("layernorm_linear_fp8_delayed_bf16_fwd_bwd", delayed, DType::kBFloat16, rows, cols, flags, results,
      Layer::kLayerNormLinear);
  run("layernorm_mlp_fp8_delayed_bf16_fwd_bwd", delayed, DType::kBFloat16, rows, cols, flags, results,
      Layer::kLayerNormMLP);
  run("layernorm_mlp_bf16_fwd_bwd", v1::RecipeSpec(), DType::kBFloat16, rows, cols, flags, results,
      Layer::kLayerNormMLP);
  run("layernorm_linear_fp8_current_bf16_fwd_bwd", current, DType::kBFloat16, rows, cols, flags, results,
      Layer::kLayerNormLinear);
  run("layernorm_mlp_fp8_current_bf16_fwd_bwd", current, DType::kBFloat16, rows, cols, flags, results,
      Layer::kLayerNormMLP);
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) {
  return teserve::bench::RunPerShape(argc, argv, "linear_bench", teserve::bench::Run);
}
