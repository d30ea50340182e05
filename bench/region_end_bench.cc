// The host cost of ending a session's delayed-scaling region on a GPU, per region, with
// N quantizers that each quantized once in it (a small tensor: the launch is what is
// timed, not the kernel): every quantizer reading its own amax (Quantizer::EndRegion:
// a copy and an event each) against all of them read together (recipes::RegionEnd: one
// gather, one copy, one event). Each timed round is what a session's step does for the
// region: N quantizations (each first resolving the previous round's read), then the
// region's end; the host wall time of the round is measured, not the GPU's.
//
//   region_end_bench [--iters=N]     prints one line per N and the two times in us
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/bench_status.h"
#include "bench/bench_util.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"

namespace teserve {
namespace bench {
namespace {

double RoundMicros(const Context& ctx, std::vector<std::unique_ptr<recipes::Quantizer>>& quantizers,
                   const Tensor& x, recipes::RegionEnd* together, int rounds) {
  std::vector<recipes::Quantizer*> all;
  for (auto& q : quantizers) all.push_back(q.get());
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (recipes::Quantizer* q : all) Check(q->Quantize(ctx, x, true, false).status(), "quantize");
    if (together != nullptr) {
      together->End(all);
    } else {
      for (recipes::Quantizer* q : all) q->EndRegion();
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (round >= 3) best = std::min(best, us);  // the first rounds allocate
  }
  return best;
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  const GpuStream gpu;
  const Context& ctx = gpu.context();
  const Tensor host = OrDie(Tensor::Zeros(DType::kFloat32, {16, 64}), "host");
  const Tensor x = OrDie(kernels::CopyTo(ctx, host, ctx.device), "to the GPU");
  recipes::Recipe recipe;
  recipe.config = recipes::DelayedScalingConfig();
  std::printf("| quantizers | per quantizer EndRegion (us/region) | RegionEnd (us/region) | ratio |\n|---|---|---|---|\n");
  for (int n : {16, 256, 4096}) {
    std::vector<std::unique_ptr<recipes::Quantizer>> own, shared;
    for (int i = 0; i < n; ++i) {
      own.push_back(OrDie(recipes::MakeQuantizer(recipe, recipes::TensorRole::kInput), "quantizer"));
      shared.push_back(OrDie(recipes::MakeQuantizer(recipe, recipes::TensorRole::kInput), "quantizer"));
    }
    recipes::RegionEnd together;
    const int rounds = std::max(flags.iters, 5);
    const double each = RoundMicros(ctx, own, x, nullptr, rounds);
    const double grouped = RoundMicros(ctx, shared, x, &together, rounds);
    std::printf("| %d | %.1f | %.1f | %.2fx |\n", n, each, grouped, each / grouped);
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) { return teserve::bench::Main(argc, argv); }
