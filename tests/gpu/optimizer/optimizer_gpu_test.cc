// Multi-tensor AdamW / SGD (kernels/optimizer.h). The CPU op is checked against the
// update written out plainly in FP32 (the rules of train/optimizer.h), bitwise; the CUDA
// kernels are checked against the CPU op on the same inputs, bitwise too: master
// weights, both moments or the momentum buffer, and the BF16 / FP16 / FP8 model copies
// (16-bit ones equal to kernels::Convert of the master), over
// several steps, for a list of tensors with odd sizes (1 element, chunk tails, more than
// one chunk) and one tensor whose buffers are misaligned (the element-wise path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

using kernels::AdamWOptions;
using kernels::OptimizerTensor;
using kernels::SgdOptions;

Tensor RandomTensor(const Shape& shape, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  for (float& x : t.mutable_floats()) x = normal(rng);
  return t;
}

// One parameter's host buffers.
struct HostParam {
  Tensor p, g, m, v, copy;
  float copy_scale = 1.0f;
};

std::vector<HostParam> MakeParams(const std::vector<Shape>& shapes, const std::vector<DType>& copy_types,
                                  uint32_t seed) {
  std::vector<HostParam> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    HostParam hp;
    hp.p = RandomTensor(shapes[i], seed + 10 * i, 0.5f);
    hp.g = RandomTensor(shapes[i], seed + 10 * i + 1, 1e-2f);
    hp.m = Tensor::Zeros(DType::kFloat32, shapes[i]).value();
    hp.v = Tensor::Zeros(DType::kFloat32, shapes[i]).value();
    if (copy_types[i] != DType::kFloat32) {
      hp.copy = Tensor::Zeros(copy_types[i], shapes[i]).value();
      hp.copy_scale = IsFloat8(copy_types[i]) ? 300.0f : 1.0f;  // FP8: part of the range saturates
    }
    params.push_back(std::move(hp));
  }
  return params;
}

std::vector<OptimizerTensor> Views(std::vector<HostParam>* params, bool with_state) {
  std::vector<OptimizerTensor> views;
  for (HostParam& hp : *params) {
    OptimizerTensor t;
    t.param = &hp.p;
    t.grad = &hp.g;
    if (with_state) {
      t.exp_avg = &hp.m;
      t.exp_avg_sq = &hp.v;
    }
    if (hp.copy.defined()) {
      t.model_copy = &hp.copy;
      t.model_copy_scale = hp.copy_scale;
    }
    views.push_back(t);
  }
  return views;
}

::testing::AssertionResult SameBits(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << what << ": shape or dtype differs";
  }
  const uint8_t* a = got.data<uint8_t>();
  const uint8_t* b = want.data<uint8_t>();
  for (int64_t i = 0; i < want.nbytes(); ++i) {
    if (a[i] != b[i]) {
      return ::testing::AssertionFailure() << what << ": first difference at byte " << i << " of " << want.nbytes();
    }
  }
  return ::testing::AssertionSuccess();
}

// --- CPU op vs the update written out plainly -------------------------------------

TEST(OptimizerCpu, AdamWMatchesThePlainFp32Update) {
  AdamWOptions o;
  o.lr = 3e-3f;
  o.weight_decay = 0.05f;
  std::vector<HostParam> params = MakeParams({{7, 5}, {1}}, {DType::kFloat32, DType::kFloat32}, 1);
  std::vector<HostParam> plain = MakeParams({{7, 5}, {1}}, {DType::kFloat32, DType::kFloat32}, 1);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(kernels::AdamWStep(Context::Cpu(), Views(&params, true), o, step).ok());
    const float bc1 = 1.0f - std::pow(o.beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(o.beta2, static_cast<float>(step));
    const float step_size = o.lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    for (HostParam& hp : plain) {
      float* p = hp.p.data<float>();
      float* m = hp.m.data<float>();
      float* v = hp.v.data<float>();
      const float* g = hp.g.data<float>();
      for (int64_t j = 0; j < hp.p.numel(); ++j) {
        p[j] *= 1.0f - o.lr * o.weight_decay;
        m[j] = o.beta1 * m[j] + (1.0f - o.beta1) * g[j];
        v[j] = o.beta2 * v[j] + (1.0f - o.beta2) * g[j] * g[j];
        p[j] -= step_size * m[j] / (std::sqrt(v[j]) / bc2_sqrt + o.eps);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(SameBits(params[i].p, plain[i].p, absl::StrCat("param ", i, " step ", step)));
      EXPECT_TRUE(SameBits(params[i].v, plain[i].v, absl::StrCat("exp_avg_sq ", i, " step ", step)));
    }
  }
}

TEST(OptimizerCpu, SgdNesterovMatchesThePlainFp32Update) {
  SgdOptions o;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  o.nesterov = true;
  std::vector<HostParam> params = MakeParams({{33}}, {DType::kFloat32}, 2);
  std::vector<HostParam> plain = MakeParams({{33}}, {DType::kFloat32}, 2);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(kernels::SgdStep(Context::Cpu(), Views(&params, true), o, step).ok());
    float* p = plain[0].p.data<float>();
    float* buf = plain[0].m.data<float>();
    const float* g = plain[0].g.data<float>();
    for (int64_t j = 0; j < 33; ++j) {
      float d = g[j] + o.weight_decay * p[j];
      buf[j] = step == 1 ? d : o.momentum * buf[j] + (1.0f - o.dampening) * d;
      d = d + o.momentum * buf[j];
      p[j] -= o.lr * d;
    }
    EXPECT_TRUE(SameBits(params[0].p, plain[0].p, absl::StrCat("param step ", step)));
    EXPECT_TRUE(SameBits(params[0].m, plain[0].m, absl::StrCat("momentum step ", step)));
  }
}

TEST(OptimizerCpu, ModelCopiesEncodeTheUpdatedMaster) {
  std::vector<HostParam> params = MakeParams(
      {{9}, {9}, {9}, {9}}, {DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kFloat16}, 3);
  ASSERT_TRUE(kernels::AdamWStep(Context::Cpu(), Views(&params, true), AdamWOptions(), 1).ok());
  for (int64_t j = 0; j < 9; ++j) {
    EXPECT_EQ(params[0].copy.data<uint16_t>()[j], FloatToBf16(params[0].p.data<float>()[j]));
    EXPECT_EQ(params[1].copy.data<uint8_t>()[j], FloatToE4M3(params[1].p.data<float>()[j] * 300.0f));
    EXPECT_EQ(params[2].copy.data<uint8_t>()[j], FloatToE5M2(params[2].p.data<float>()[j] * 300.0f));
    EXPECT_EQ(params[3].copy.data<uint16_t>()[j], FloatToFp16(params[3].p.data<float>()[j]));
  }
}

// A 16-bit copy is what kernels::Convert makes of the updated master (round to nearest
// even, ties, overflow to Inf, NaN and subnormals included): layers read such a copy in
// place of converting the master per forward.
TEST(OptimizerCpu, SixteenBitCopiesEqualConvert) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<HostParam> params = MakeParams({{16}}, {dtype}, 5);
    // Ties and edge values, kept by a zero update (lr 0).
    const float special[] = {1.0f + 1.0f / 256,  1.0f + 3.0f / 256, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                             70000.0f,           -1e-6f,             6e-8f,              3.0e38f,
                             std::nanf(""),      -INFINITY,          0.0f,               -0.0f};
    float* p = params[0].p.data<float>();
    for (size_t j = 0; j < sizeof(special) / sizeof(special[0]); ++j) p[j] = special[j];
    SgdOptions o;
    o.lr = 0.0f;
    ASSERT_TRUE(kernels::SgdStep(Context::Cpu(), Views(&params, false), o, 1).ok());
    const Tensor converted = kernels::Convert(Context::Cpu(), params[0].p, dtype).value();
    EXPECT_TRUE(SameBits(params[0].copy, converted, std::string(DTypeName(dtype))));
  }
}

TEST(OptimizerCpu, ErrorsNameTheTensor) {
  std::vector<HostParam> params = MakeParams({{4, 8}, {4, 8}}, {DType::kFloat32, DType::kFloat32}, 4);
  params[1].v = Tensor::Zeros(DType::kFloat32, {8, 4}).value();
  const absl::Status s = kernels::AdamWStep(Context::Cpu(), Views(&params, true), AdamWOptions(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensors[1].exp_avg_sq"), std::string::npos) << s;
  const absl::Status no_state = kernels::AdamWStep(Context::Cpu(), Views(&params, false), AdamWOptions(), 1);
  EXPECT_NE(no_state.message().find("tensors[0].exp_avg"), std::string::npos) << no_state;
  const absl::Status step0 = kernels::SgdStep(Context::Cpu(), Views(&params, false), SgdOptions(), 0);
  EXPECT_NE(step0.message().find("step"), std::string::npos) << step0;
}

// --- CUDA vs CPU ---------------------------------------------------------------------

#if TESERVE_WITH_CUDA

using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

// Device copies of a host parameter list. With `misalign`, every buffer of parameter 0
// starts one element past an allocation (so it takes the element-wise path).
struct DeviceParams {
  std::vector<Tensor> storage;  // owners
  std::vector<HostParam> params;
};

Tensor ToDevice(const Tensor& host, bool misalign, std::vector<Tensor>* storage) {
  const Device gpu = Device::Cuda(0);
  kernels::cuda::RegisterCudaAllocator();  // Tensor::Zeros below may be the first device allocation
  if (!misalign) {
    storage->push_back(CopyToDevice(Context{}, host, gpu).value());
    return storage->back();
  }
  const int64_t esize = host.nbytes() / std::max<int64_t>(host.numel(), 1);
  Tensor raw = Tensor::Zeros(DType::kInt64, {(host.nbytes() + esize) / 8 + 1}, gpu).value();
  uint8_t* ptr = static_cast<uint8_t*>(raw.raw_data()) + esize;
  EXPECT_EQ(cudaMemcpy(ptr, host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  storage->push_back(raw);
  return Tensor::Borrow(ptr, host.dtype(), host.shape(), gpu);
}

DeviceParams ToDevice(const std::vector<HostParam>& host, bool misalign_first) {
  DeviceParams d;
  for (size_t i = 0; i < host.size(); ++i) {
    const bool mis = misalign_first && i == 0;
    HostParam hp;
    hp.p = ToDevice(host[i].p, mis, &d.storage);
    hp.g = ToDevice(host[i].g, mis, &d.storage);
    hp.m = ToDevice(host[i].m, mis, &d.storage);
    hp.v = ToDevice(host[i].v, mis, &d.storage);
    if (host[i].copy.defined()) hp.copy = ToDevice(host[i].copy, mis, &d.storage);
    hp.copy_scale = host[i].copy_scale;
    d.params.push_back(hp);
  }
  return d;
}

Tensor Host(const Tensor& device) { return CopyToHost(Context{}, device).value(); }

void ExpectSameState(std::vector<HostParam>& gpu, std::vector<HostParam>& cpu, bool with_v,
                     const std::string& where) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::string at = absl::StrCat(where, " tensor ", i, " ");
    EXPECT_TRUE(SameBits(Host(gpu[i].p), cpu[i].p, at + "param"));
    EXPECT_TRUE(SameBits(Host(gpu[i].m), cpu[i].m, at + "exp_avg"));
    if (with_v) {
      EXPECT_TRUE(SameBits(Host(gpu[i].v), cpu[i].v, at + "exp_avg_sq"));
    }
    if (cpu[i].copy.defined()) {
      EXPECT_TRUE(SameBits(Host(gpu[i].copy), cpu[i].copy, at + "model_copy"));
    }
  }
}

// 1 element, a chunk tail, two chunks plus 3, 257x259, and a misaligned first tensor.
const std::vector<Shape> kShapes = {{5, 7}, {1}, {65536 * 2 + 3}, {257, 259}, {128, 129}, {16, 1024}};
const std::vector<DType> kCopies = {DType::kBFloat16, DType::kFloat32,    DType::kFloat8E4M3,
                                    DType::kBFloat16, DType::kFloat8E5M2, DType::kFloat16};

struct AdamWCase {
  std::string name;
  AdamWOptions options;
  bool misalign;
};

class AdamWGpuTest : public ::testing::TestWithParam<AdamWCase> {};

TEST_P(AdamWGpuTest, BitIdenticalToCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  std::vector<HostParam> cpu = MakeParams(kShapes, kCopies, 7);
  DeviceParams gpu = ToDevice(cpu, GetParam().misalign);
  for (int64_t step = 1; step <= 4; ++step) {
    for (HostParam& hp : cpu) {  // fresh gradients each step, the same on both
      hp.g = RandomTensor(hp.g.shape(), 100 * step + hp.g.numel(), step == 3 ? 10.0f : 1e-3f);
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(cudaMemcpy(gpu.params[i].g.raw_data(), cpu[i].g.raw_data(), cpu[i].g.nbytes(),
                           cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_TRUE(kernels::AdamWStep(Context::Cpu(), Views(&cpu, true), GetParam().options, step).ok());
    Context ctx;
    ctx.device = Device::Cuda(0);
    const absl::Status s = kernels::AdamWStep(ctx, Views(&gpu.params, true), GetParam().options, step);
    ASSERT_TRUE(s.ok()) << s;
    ExpectSameState(gpu.params, cpu, true, absl::StrCat("step ", step));
  }
}

AdamWOptions Adam(float lr, float b1, float b2, float eps, float wd) {
  AdamWOptions o;
  o.lr = lr;
  o.beta1 = b1;
  o.beta2 = b2;
  o.eps = eps;
  o.weight_decay = wd;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Options, AdamWGpuTest,
    ::testing::Values(AdamWCase{"defaults", AdamWOptions(), false},
                      AdamWCase{"defaults_misaligned", AdamWOptions(), true},
                      AdamWCase{"lr1e_2_beta0_5_0_9_eps1e_3_wd0", Adam(1e-2f, 0.5f, 0.9f, 1e-3f, 0.0f), false},
                      AdamWCase{"lr0_1_wd0_5", Adam(0.1f, 0.9f, 0.999f, 1e-8f, 0.5f), false}),
    [](const ::testing::TestParamInfo<AdamWCase>& info) { return info.param.name; });

// The benchmark size: one 16384 x 8192 FP32 master (134M elements) with a BF16 model copy
// and a 1-element tensor after it, two steps.
TEST(AdamWGpuLarge, BitIdenticalToCpuOn16384x8192WithBf16Copy) {
  TESERVE_SKIP_WITHOUT_GPU();
  std::vector<HostParam> cpu = MakeParams({{16384, 8192}, {1}}, {DType::kBFloat16, DType::kFloat8E4M3}, 13);
  DeviceParams gpu = ToDevice(cpu, /*misalign_first=*/false);
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(kernels::AdamWStep(Context::Cpu(), Views(&cpu, true), AdamWOptions(), step).ok());
    Context ctx;
    ctx.device = Device::Cuda(0);
    const absl::Status s = kernels::AdamWStep(ctx, Views(&gpu.params, true), AdamWOptions(), step);
    ASSERT_TRUE(s.ok()) << s;
    ExpectSameState(gpu.params, cpu, true, absl::StrCat("step ", step));
  }
}

struct SgdCase {
  std::string name;
  SgdOptions options;
};

class SgdGpuTest : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdGpuTest, BitIdenticalToCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const bool momentum = GetParam().options.momentum != 0.0f;
  std::vector<HostParam> cpu = MakeParams(kShapes, kCopies, 9);
  DeviceParams gpu = ToDevice(cpu, /*misalign_first=*/true);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(kernels::SgdStep(Context::Cpu(), Views(&cpu, momentum), GetParam().options, step).ok());
    Context ctx;
    ctx.device = Device::Cuda(0);
    const absl::Status s = kernels::SgdStep(ctx, Views(&gpu.params, momentum), GetParam().options, step);
    ASSERT_TRUE(s.ok()) << s;
    ExpectSameState(gpu.params, cpu, false, absl::StrCat("step ", step));
  }
}

SgdOptions Sgd(float lr, float momentum, float dampening, float wd, bool nesterov) {
  SgdOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.weight_decay = wd;
  o.nesterov = nesterov;
  return o;
}

INSTANTIATE_TEST_SUITE_P(Options, SgdGpuTest,
                         ::testing::Values(SgdCase{"plain", Sgd(0.1f, 0.0f, 0.0f, 0.0f, false)},
                                           SgdCase{"weight_decay", Sgd(0.1f, 0.0f, 0.0f, 0.01f, false)},
                                           SgdCase{"momentum_dampening", Sgd(0.05f, 0.9f, 0.1f, 0.01f, false)},
                                           SgdCase{"nesterov", Sgd(0.05f, 0.9f, 0.0f, 0.0f, true)}),
                         [](const ::testing::TestParamInfo<SgdCase>& info) { return info.param.name; });

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
