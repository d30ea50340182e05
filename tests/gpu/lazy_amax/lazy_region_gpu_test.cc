// Delayed scaling's lazy region end (recipes/quantizer.h) on a CUDA device.
//   - Bit-identical: a lazy GPU quantizer, an eager GPU one (set_lazy_region_end(false):
//     EndRegion reads the amaxes at once, as before) and a CPU one (amaxes in place) give
//     the same codes, snapshots and exported states across forward and backward regions,
//     with snapshots and exports right after EndRegion, EndRegions in a row and
//     ImportState while a region is pending.
//   - RegionEnd (a session's region end, one read for all of its quantizers' amaxes)
//     gives the same as each quantizer's own EndRegion.
//   - Non-blocking: EndRegion returns while the stream is still busy with earlier work,
//     and what resolves the region afterwards (the next Quantize, a Snapshot) waits for
//     that region only, not for the work enqueued after it.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "tests/gpu/lazy_amax/spin_kernel.h"
#endif

namespace teserve {
namespace recipes {
namespace {

#if TESERVE_WITH_CUDA
constexpr uint64_t kMillisecond = 1000 * 1000;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float x : v) out.push_back(Bits(x));
  return out;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Recipe Current(float amax_epsilon, bool power_2_scale) {
  CurrentScalingConfig c;
  c.amax_epsilon = amax_epsilon;
  c.power_2_scale = power_2_scale;
  Recipe r;
  r.config = c;
  return r;
}

Recipe Delayed(int history_len, AmaxComputeAlgo algo = AmaxComputeAlgo::kMax, float margin = 0.0f) {
  DelayedScalingConfig c;
  c.amax_history_len = history_len;
  c.amax_compute_algo = algo;
  c.margin = margin;
  Recipe r;
  r.config = c;
  return r;
}

// [rows, cols] FP32 host values of magnitude ~scale; `special` puts a NaN (1), an Inf (2)
// or nothing but zeros (3) in.
Tensor Values(int64_t rows, int64_t cols, uint32_t seed, float scale, int special = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = special == 3 ? 0.0f : normal(rng);
  if (special == 1) v[seed % v.size()] = NAN;
  if (special == 2) v[seed % v.size()] = INFINITY;
  return Tensor::FromFloats(v, {rows, cols}).value();
}

void ExpectSameSnapshot(const QuantizerSnapshot& a, const QuantizerSnapshot& b, const std::string& where) {
  EXPECT_EQ(Bits(a.amax), Bits(b.amax)) << where << ": amax " << a.amax << " vs " << b.amax;
  EXPECT_EQ(Bits(a.scale), Bits(b.scale)) << where << ": scale " << a.scale << " vs " << b.scale;
  EXPECT_EQ(Bits(a.scale_inv), Bits(b.scale_inv)) << where;
  EXPECT_EQ(Bits(a.amax_history), Bits(b.amax_history)) << where;
  EXPECT_EQ(a.quantize_calls, b.quantize_calls) << where;
}

void ExpectSameState(const QuantizerState& a, const QuantizerState& b, const std::string& where) {
  EXPECT_EQ(Bits(a.amax), Bits(b.amax)) << where;
  EXPECT_EQ(Bits(a.scale), Bits(b.scale)) << where;
  EXPECT_EQ(Bits(a.amax_history), Bits(b.amax_history)) << where;
  EXPECT_EQ(a.quantize_calls, b.quantize_calls) << where;
}

// A CPU quantizer (the reference), an eager and a lazy one on the GPU, same calls.
struct Trio {
  std::unique_ptr<Quantizer> cpu, eager, lazy;
  Context gpu;

  Trio(const Recipe& recipe, TensorRole role, const Context& gpu_ctx) : gpu(gpu_ctx) {
    cpu = MakeQuantizer(recipe, role).value();
    eager = MakeQuantizer(recipe, role).value();
    eager->set_lazy_region_end(false);
    lazy = MakeQuantizer(recipe, role).value();
  }

  Tensor Host(const Tensor& t) const { return kernels::CopyTo(gpu, t, Device::Cpu()).value(); }

  // All quantize x (a host tensor; the GPU ones a device copy). With `compare`, the codes
  // and scale_inv are read back and compared (a wait for the stream); without, the
  // region's amaxes stay in flight until EndRegion.
  void Quantize(const Tensor& x, const std::string& where, bool compare) {
    const Tensor x_dev = kernels::CopyTo(gpu, x, gpu.device).value();
    absl::StatusOr<QuantizedTensor> c = cpu->Quantize(Context::Cpu(), x, true, true);
    absl::StatusOr<QuantizedTensor> e = eager->Quantize(gpu, x_dev, true, true);
    absl::StatusOr<QuantizedTensor> l = lazy->Quantize(gpu, x_dev, true, true);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(l.ok()) << l.status();
    if (!compare) return;
    for (const QuantizedTensor* q : {&*e, &*l}) {
      EXPECT_TRUE(BitwiseEqual(c->rowwise_data, Host(q->rowwise_data))) << where;
      EXPECT_TRUE(BitwiseEqual(c->columnwise_data, Host(q->columnwise_data))) << where;
      EXPECT_TRUE(BitwiseEqual(c->rowwise_scale_inv, Host(q->rowwise_scale_inv))) << where;
    }
  }
  void EndRegion() {
    cpu->EndRegion();
    eager->EndRegion();
    lazy->EndRegion();
  }
  void ExpectSame(const std::string& where) {
    const QuantizerSnapshot c = cpu->Snapshot(), e = eager->Snapshot(), l = lazy->Snapshot();
    ExpectSameSnapshot(e, l, where + " (eager, lazy)");
    ExpectSameSnapshot(c, l, where + " (cpu, lazy)");
  }
  QuantizerState Export(const std::string& where) {
    const QuantizerState c = cpu->ExportState(), e = eager->ExportState(), l = lazy->ExportState();
    ExpectSameState(e, l, where + " (eager, lazy)");
    ExpectSameState(c, l, where + " (cpu, lazy)");
    return c;
  }
  void Import(const QuantizerState& s) {
    cpu->ImportState(s);
    eager->ImportState(s);
    lazy->ImportState(s);
  }
};
#endif

TEST(LazyRegionGpu, MatchesEagerAndTheCpuAcrossRegions) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = stream.context();
  const std::vector<std::pair<std::string, Recipe>> configs = {
      {"len1", Delayed(1)},
      {"len2", Delayed(2)},
      {"len16", Delayed(16)},
      {"most_recent", Delayed(5, AmaxComputeAlgo::kMostRecent)},
      {"margin1", Delayed(4, AmaxComputeAlgo::kMax, 1.0f)},
      // Current scaling: the scale computed on the device, reported once the amax is read.
      {"current", Current(0.0f, false)},
      {"current_eps_pow2", Current(1e-3f, true)},
  };
  for (const auto& [name, recipe] : configs) {
    SCOPED_TRACE(name);
    Trio input(recipe, TensorRole::kInput, gpu), weight(recipe, TensorRole::kWeight, gpu),
        grad(recipe, TensorRole::kGradOutput, gpu);
    QuantizerState mark;
    for (int step = 0; step < 16; ++step) {
      const std::string where = absl::StrCat("step ", step);
      const bool compare = step % 2 == 1;
      const float magnitude = std::ldexp(1.0f, (step * 5) % 11 - 5);
      const int special = step % 7 == 3 ? 1 + step % 3 : 0;
      if (step % 9 != 4) input.Quantize(Values(64, 48, 100 + step, magnitude, special), where, compare);
      if (step % 4 == 1) input.Quantize(Values(64, 48, 200 + step, 3.0f * magnitude), where, false);
      weight.Quantize(Values(32, 48, 300 + step, 0.05f), where, compare);
      input.EndRegion();
      weight.EndRegion();
      EXPECT_TRUE(weight.lazy->region_pending()) << where;
      if (step % 5 == 2) input.ExpectSame(where + " right after EndRegion");
      if (step % 5 == 3) input.Export(where + " right after EndRegion");
      if (step == 6) {
        weight.EndRegion();  // a second EndRegion before the first is resolved
        weight.EndRegion();
      }
      if (step % 6 != 5) grad.Quantize(Values(64, 32, 400 + step, 1e-3f * magnitude, special), where, compare);
      if (step == 8) mark = grad.Export("mark");
      grad.EndRegion();
      if (step == 10) {
        ASSERT_TRUE(grad.lazy->region_pending());
        grad.Import(mark);  // a rewind while the region is pending
      }
    }
    for (Trio* t : {&input, &weight, &grad}) {
      t->ExpectSame("end");
      t->Export("end");
    }
  }
#endif
}

// A session's region end on the GPU: the lazy quantizers of ten trios end together through
// one RegionEnd (their amaxes gathered on the device and read in one copy), the CPU and
// eager ones one by one. Trios sit regions out (holding the previous read) and quantize
// twice in others; all three of each trio agree bit for bit throughout.
TEST(LazyRegionGpu, RegionEndTogetherMatchesEagerAndTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = stream.context();
  std::vector<std::unique_ptr<Trio>> trios;
  for (int i = 0; i < 10; ++i) {
    const Recipe recipe = Delayed(1 + i % 5, i % 4 == 3 ? AmaxComputeAlgo::kMostRecent : AmaxComputeAlgo::kMax);
    trios.push_back(std::make_unique<Trio>(recipe, i % 3 == 2 ? TensorRole::kGradOutput : TensorRole::kInput, gpu));
  }
  RegionEnd together;
  for (int step = 0; step < 12; ++step) {
    std::vector<Quantizer*> lazy;
    for (size_t i = 0; i < trios.size(); ++i) {
      Trio& t = *trios[i];
      const std::string where = absl::StrCat("step ", step, " trio ", i);
      const float magnitude = std::ldexp(1.0f, static_cast<int>((step * 7 + i * 3) % 13) - 6);
      if ((step + i) % 5 != 4) t.Quantize(Values(16, 32, 1000 * step + i, magnitude), where, step % 3 == 0);
      if ((step + i) % 4 == 1) t.Quantize(Values(16, 32, 5000 + 1000 * step + i, 2 * magnitude), where, false);
      // Mid-region (before any of the three ends it): the open region's amaxes are read.
      if (step % 4 == 2 && i % 3 == 0) t.ExpectSame(where + ", before the region ends");
      t.cpu->EndRegion();
      t.eager->EndRegion();
      lazy.push_back(t.lazy.get());
    }
    together.End(lazy);
    if (step % 3 == 1) trios[step % trios.size()]->ExpectSame(absl::StrCat("step ", step, " right after End"));
  }
  for (size_t i = 0; i < trios.size(); ++i) {
    trios[i]->ExpectSame(absl::StrCat("end, trio ", i));
    trios[i]->Export(absl::StrCat("end, trio ", i));
  }
#endif
}

TEST(LazyRegionGpu, EndRegionReturnsWhileTheStreamRuns) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = stream.context();
  const Tensor x1 = kernels::CopyTo(gpu, Values(256, 256, 1, 2.0f), gpu.device).value();
  const Tensor x2 = kernels::CopyTo(gpu, Values(256, 256, 2, 5.0f), gpu.device).value();
  std::unique_ptr<Quantizer> lazy = MakeQuantizer(Delayed(8), TensorRole::kInput).value();
  std::unique_ptr<Quantizer> eager = MakeQuantizer(Delayed(8), TensorRole::kInput).value();
  eager->set_lazy_region_end(false);
  // A warm-up region on each (allocator, staging and event made).
  for (Quantizer* q : {lazy.get(), eager.get()}) {
    ASSERT_TRUE(q->Quantize(gpu, x1, true, true).ok());
    q->EndRegion();
    q->Snapshot();
  }

  // The region's quantization, then a long kernel still queued when the region ends.
  ASSERT_TRUE(lazy->Quantize(gpu, x1, true, true).ok());
  ASSERT_EQ(testing::LaunchSpin(500 * kMillisecond, stream.get()), cudaSuccess);
  auto t0 = std::chrono::steady_clock::now();
  lazy->EndRegion();
  EXPECT_LT(SecondsSince(t0), 0.25);
  EXPECT_TRUE(lazy->region_pending());
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);
  // The next region's work (a backward) is queued behind the read; the next
  // quantization waits for the ended region only, and that work still runs after it.
  ASSERT_EQ(testing::LaunchSpin(800 * kMillisecond, stream.get()), cudaSuccess);
  ASSERT_TRUE(lazy->Quantize(gpu, x2, true, true).ok());
  EXPECT_FALSE(lazy->region_pending());
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);
  lazy->EndRegion();
  // A Snapshot right after EndRegion also waits for that region only.
  ASSERT_EQ(testing::LaunchSpin(800 * kMillisecond, stream.get()), cudaSuccess);
  const QuantizerSnapshot lazy_snapshot = lazy->Snapshot();
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);

  // The eager end waits for the stream (what the test would catch).
  ASSERT_TRUE(eager->Quantize(gpu, x1, true, true).ok());
  ASSERT_EQ(testing::LaunchSpin(500 * kMillisecond, stream.get()), cudaSuccess);
  t0 = std::chrono::steady_clock::now();
  eager->EndRegion();
  EXPECT_GT(SecondsSince(t0), 0.3);
  ASSERT_TRUE(eager->Quantize(gpu, x2, true, true).ok());
  eager->EndRegion();
  ExpectSameSnapshot(eager->Snapshot(), lazy_snapshot, "eager vs lazy");
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
#endif
}

}  // namespace
}  // namespace recipes
}  // namespace teserve
