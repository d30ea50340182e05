// CUDA cast family (kernels/cuda/cast/cast_cuda.h) against the CPU reference
// (kernels/cpu/cast_cpu.h) on the same inputs and scale. Quantization with the same
// scale must be bit-exact (TE_FACTS.md: "quantize kernels with the same scale are
// expected to be bit-exact"), so data, scale_inv, amax and dequantized values are all
// compared bitwise, never with a tolerance.
//
// Inputs span many binades (so the FP8 subnormal range, rounding ties and saturation are
// all hit): scale = 2 * fp8_max / amax, so the top half of the range saturates.
// Shapes cover both CUDA paths: rows and cols multiples of 8 take the 128 x 128 tile
// kernel (partial tiles: 8x8, 136x200; with BF16 x and rows % 32 != 0 its halo variant:
// 136x200, 264x200, 376x136, 400x264, 16336x8192), every other shape the scalar 64 x 64 tile kernel
// (1x1, 1x259, 257x259, 128x129). BF16 inputs are compared with the CPU op on their exact
// FP32 widening.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/quantized_tensor.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cast/cast_kernels.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::Copy;
using kernels::PerTensorQuantizeOptions;
using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Values spread over 2^-24 .. 2^8 in magnitude, both signs, with -0.0 and 0.0 mixed in.
std::vector<float> WideRangeValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-24, 8);
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = std::ldexp(normal(rng), binade(rng));
  if (n > 0) values[0] = -0.0f;
  if (n > 2) values[n / 2] = 0.0f;
  return values;
}

// Host copy of a device tensor, or the CPU tensor itself.
Tensor OnHost(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  auto host = CopyToHost(Context{}, t);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *host : Tensor();
}

void ExpectBitwiseEqual(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  const Tensor gpu_host = OnHost(gpu);
  ASSERT_EQ(gpu_host.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  ASSERT_EQ(gpu_host.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu_host.dtype(), cpu.dtype()) << what;
  if (BitwiseEqual(gpu_host, cpu)) return;
  const uint8_t* a = gpu_host.data<uint8_t>();
  const uint8_t* b = cpu.data<uint8_t>();
  for (int64_t i = 0; i < cpu.nbytes(); ++i) {
    if (a[i] != b[i]) {
      FAIL() << what << ": first difference at byte " << i << " (gpu 0x" << std::hex << int{a[i]}
             << ", cpu 0x" << int{b[i]} << ")";
    }
  }
}

struct CastCase {
  DType format;
  int64_t rows;
  int64_t cols;
  DType source = DType::kFloat32;  // dtype of the device x
};

std::string CaseName(const ::testing::TestParamInfo<CastCase>& info) {
  const char* format = info.param.format == DType::kFloat8E4M3 ? "Float8E4M3" : "Float8E5M2";
  const char* source = info.param.source == DType::kBFloat16 ? "FromBFloat16_" : "";
  return absl::StrCat(source, format, "_", info.param.rows, "x", info.param.cols);
}

// Device copy of `values` [rows, cols] in `source` (FP32 or BF16) and the FP32 host tensor
// holding exactly the device values (the BF16 ones widened), the CPU op's input.
struct DeviceInput {
  Tensor host_fp32;
  Tensor device;
};

absl::StatusOr<DeviceInput> MakeDeviceInput(const std::vector<float>& values, int64_t rows,
                                            int64_t cols, DType source) {
  DeviceInput in;
  ASSIGN_OR_RETURN(in.host_fp32, Tensor::FromFloats(values, {rows, cols}));
  Tensor host_source = in.host_fp32;
  if (source == DType::kBFloat16) {
    ASSIGN_OR_RETURN(host_source,
                     kernels::cpu::CastFromFloat32(Context::Cpu(), in.host_fp32, source));
    ASSIGN_OR_RETURN(in.host_fp32, kernels::cpu::ToFloat32(Context::Cpu(), host_source));
  }
  ASSIGN_OR_RETURN(in.device, CopyToDevice(Context{}, host_source, Device::Cuda(0)));
  return in;
}

class CastGpuTest : public ::testing::TestWithParam<CastCase> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const CastCase& c = GetParam();
    auto input = MakeDeviceInput(
        WideRangeValues(c.rows * c.cols, static_cast<uint32_t>(c.rows * 7919 + c.cols)), c.rows,
        c.cols, c.source);
    ASSERT_TRUE(input.ok()) << input.status();
    host_x_ = input->host_fp32;
    device_x_ = input->device;
    ASSERT_OK_AND_ASSIGN(const float amax, kernels::cpu::Amax(Context::Cpu(), host_x_));
    options_.format = c.format;
    options_.scale = amax > 0.0f ? 2.0f * DTypeMaxFinite(c.format) / amax : 1.0f;
    options_.rowwise = true;
    options_.columnwise = true;
  }

  Context GpuContext() const {
    Context ctx;
    ctx.device = gpu_;
    return ctx;
  }

  const Device gpu_ = Device::Cuda(0);
  Tensor host_x_;
  Tensor device_x_;
  PerTensorQuantizeOptions options_;
};

TEST_P(CastGpuTest, AmaxMatchesCpu) {
  ASSERT_OK_AND_ASSIGN(const float cpu, kernels::cpu::Amax(Context::Cpu(), host_x_));
  ASSERT_OK_AND_ASSIGN(const float gpu, kernels::cuda::Amax(GpuContext(), device_x_));
  EXPECT_EQ(Bits(gpu), Bits(cpu)) << "gpu " << gpu << " cpu " << cpu;
}

TEST_P(CastGpuTest, QuantizeMatchesCpuBitExact) {
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host_x_, options_));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, options_));
  EXPECT_EQ(gpu.shape, cpu.shape);
  EXPECT_EQ(gpu.format, cpu.format);
  EXPECT_EQ(gpu.mode, ScalingMode::kPerTensor);
  EXPECT_EQ(Bits(gpu.amax), Bits(cpu.amax)) << "amax gpu " << gpu.amax << " cpu " << cpu.amax;
  ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data");
  ExpectBitwiseEqual(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, "rowwise_scale_inv");
  ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data");
  ExpectBitwiseEqual(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, "columnwise_scale_inv");
}

TEST_P(CastGpuTest, SingleCopyRequestsMatchTheFusedOutput) {
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host_x_, options_));
  PerTensorQuantizeOptions rowwise_only = options_;
  rowwise_only.columnwise = false;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor rows,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, rowwise_only));
  EXPECT_FALSE(rows.has_columnwise());
  ExpectBitwiseEqual(rows.rowwise_data, cpu.rowwise_data, "rowwise-only rowwise_data");
  EXPECT_EQ(Bits(rows.amax), Bits(cpu.amax));

  PerTensorQuantizeOptions columnwise_only = options_;
  columnwise_only.rowwise = false;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cols,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, columnwise_only));
  EXPECT_FALSE(cols.has_rowwise());
  ExpectBitwiseEqual(cols.columnwise_data, cpu.columnwise_data, "columnwise-only columnwise_data");
  EXPECT_EQ(Bits(cols.amax), Bits(cpu.amax));
}

TEST_P(CastGpuTest, DequantizeMatchesCpuBitExact) {
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu_q,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host_x_, options_));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu_q,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, options_));
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    const std::string name = copy == Copy::kRowwise ? "rowwise" : "columnwise";
    ASSERT_OK_AND_ASSIGN(const Tensor cpu, kernels::cpu::Dequantize(Context::Cpu(), cpu_q, copy));
    ASSERT_OK_AND_ASSIGN(const Tensor gpu, kernels::cuda::Dequantize(GpuContext(), gpu_q, copy));
    EXPECT_EQ(gpu.device(), gpu_);
    ExpectBitwiseEqual(gpu, cpu, "dequantized " + name);
  }
}

// Column sums of x [rows, cols] in FP64: sum |x| per column, the magnitude the FP32
// reduction tolerance scales with (tests/kernels/tolerances.h).
std::vector<double> ColumnAbsSums(const Tensor& x) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  const float* v = x.data<float>();
  std::vector<double> sums(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) sums[c] += std::fabs(static_cast<double>(v[r * cols + c]));
  }
  return sums;
}

// The fused dbias against the CPU op's FP64 column sums, within the FP32 reduction
// tolerance; the codes, scale_inv and amax of the same call stay bit-exact, and a second
// call gives bitwise the same dbias (every summation order is fixed).
TEST_P(CastGpuTest, DbiasMatchesCpuWithinFp32ReductionTolerance) {
  const int64_t cols = host_x_.dim(1);
  ASSERT_OK_AND_ASSIGN(Tensor cpu_dbias, Tensor::Zeros(DType::kFloat32, {cols}));
  PerTensorQuantizeOptions cpu_options = options_;
  cpu_options.dbias = &cpu_dbias;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host_x_, cpu_options));
  ASSERT_OK_AND_ASSIGN(Tensor gpu_dbias, Tensor::Zeros(DType::kFloat32, {cols}, gpu_));
  PerTensorQuantizeOptions gpu_options = options_;
  gpu_options.dbias = &gpu_dbias;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, gpu_options));
  EXPECT_EQ(Bits(gpu.amax), Bits(cpu.amax));
  ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data with dbias");
  ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data with dbias");
  ExpectBitwiseEqual(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, "rowwise_scale_inv with dbias");
  const Tensor got = OnHost(gpu_dbias);
  const absl::Span<const float> want = cpu_dbias.floats();
  EXPECT_TRUE(testing_kernels::AllClose(got.floats(), std::vector<double>(want.begin(), want.end()),
                                        DType::kFloat32, ColumnAbsSums(host_x_)));

  ASSERT_OK_AND_ASSIGN(Tensor again, Tensor::Zeros(DType::kFloat32, {cols}, gpu_));
  gpu_options.dbias = &again;
  ASSERT_TRUE(kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, gpu_options).ok());
  ExpectBitwiseEqual(again, got, "dbias of a second call");
}

// Current scaling's rule on the device (an amax pass, the scale computed there, the cast
// reading it): codes, scale_inv and amax equal the CPU's bit for bit, whichever cast
// kernel the shape takes, with the amax left on the device and with a fused dbias.
TEST_P(CastGpuTest, CurrentRuleMatchesCpuBitExact) {
  for (const kernels::CurrentScaleRule rule :
       {kernels::CurrentScaleRule{0.0f, false}, kernels::CurrentScaleRule{0.0f, true},
        kernels::CurrentScaleRule{1e-2f, false}}) {
    const std::string where = absl::StrCat("epsilon ", rule.amax_epsilon, " power_2 ", rule.power_2_scale);
    PerTensorQuantizeOptions options = options_;
    options.scale = 1.0f;
    options.current = rule;
    ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu, kernels::cpu::QuantizePerTensor(Context::Cpu(), host_x_, options));
    ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu, kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, options));
    EXPECT_EQ(Bits(gpu.amax), Bits(cpu.amax)) << where;
    ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, where + " rowwise_data");
    ExpectBitwiseEqual(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, where + " rowwise_scale_inv");
    ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data, where + " columnwise_data");
    ExpectBitwiseEqual(gpu.columnwise_scale_inv, cpu.columnwise_scale_inv, where + " columnwise_scale_inv");

    // Deferred amax and a fused dbias: the same codes; the amax bits on the device.
    PerTensorQuantizeOptions deferred = options;
    deferred.defer_amax = true;
    ASSERT_OK_AND_ASSIGN(Tensor dbias, Tensor::Empty(DType::kFloat32, {host_x_.dim(1)}, gpu_, nullptr));
    deferred.dbias = &dbias;
    ASSERT_OK_AND_ASSIGN(const QuantizedTensor lazy, kernels::cuda::QuantizePerTensor(GpuContext(), device_x_, deferred));
    ASSERT_TRUE(lazy.amax_bits.defined()) << where;
    const Tensor bits = OnHost(lazy.amax_bits);
    float amax;
    std::memcpy(&amax, bits.raw_data(), sizeof(amax));
    if (!std::isnan(cpu.amax)) {
      EXPECT_EQ(Bits(amax), Bits(cpu.amax)) << where;
    }
    ExpectBitwiseEqual(lazy.rowwise_data, cpu.rowwise_data, where + " deferred rowwise_data");
    ExpectBitwiseEqual(lazy.columnwise_scale_inv, cpu.columnwise_scale_inv, where + " deferred scale_inv");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CastGpuTest,
    ::testing::Values(CastCase{DType::kFloat8E4M3, 1, 1}, CastCase{DType::kFloat8E4M3, 1, 259},
                      CastCase{DType::kFloat8E4M3, 257, 259}, CastCase{DType::kFloat8E4M3, 128, 129},
                      CastCase{DType::kFloat8E4M3, 2048, 4096}, CastCase{DType::kFloat8E5M2, 1, 1},
                      CastCase{DType::kFloat8E5M2, 1, 259}, CastCase{DType::kFloat8E5M2, 257, 259},
                      CastCase{DType::kFloat8E5M2, 128, 129},
                      CastCase{DType::kFloat8E5M2, 2048, 4096}, CastCase{DType::kFloat8E4M3, 8, 8},
                      CastCase{DType::kFloat8E4M3, 136, 200}, CastCase{DType::kFloat8E5M2, 136, 200},
                      // BF16 x (the benchmarked input): both paths, up to the bench shape.
                      CastCase{DType::kFloat8E4M3, 1, 259, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 257, 259, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 128, 129, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 8, 8, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 136, 200, DType::kBFloat16},
                      CastCase{DType::kFloat8E5M2, 136, 200, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 2048, 4096, DType::kBFloat16},
                      CastCase{DType::kFloat8E5M2, 2048, 4096, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 16384, 8192, DType::kBFloat16},
                      // rows % 32 != 0 (BF16: the halo kernel, sector-aligned columnwise runs;
                      // FP32: the aligned kernel) with rows % 32 = 16, 24 and 8, several tile
                      // rows, partial tile columns; 376 rows end in a 120-row tile, whose
                      // windows take 18 units.
                      CastCase{DType::kFloat8E4M3, 400, 264}, CastCase{DType::kFloat8E5M2, 376, 136},
                      CastCase{DType::kFloat8E4M3, 264, 200, DType::kBFloat16},
                      CastCase{DType::kFloat8E5M2, 400, 264, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 376, 136, DType::kBFloat16},
                      CastCase{DType::kFloat8E4M3, 16336, 8192, DType::kBFloat16}),
    CaseName);

Context GpuContext() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

TEST(CastGpu, NanPropagatesToAmaxAndEncodesLikeCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  std::vector<float> values = WideRangeValues(257 * 259, 11u);
  values[1234] = std::numeric_limits<float>::quiet_NaN();
  values[4321] = std::numeric_limits<float>::infinity();
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {257, 259}));
  ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(Context{}, host, Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(const float amax, kernels::cuda::Amax(GpuContext(), device));
  EXPECT_TRUE(std::isnan(amax));
  PerTensorQuantizeOptions options;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host, options));
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device, options));
  EXPECT_TRUE(std::isnan(gpu.amax));
  ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data with NaN and Inf");
  ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data, "columnwise_data with NaN and Inf");
}

// The tile kernel encodes with the hardware conversion and patches NaN products only in
// fragments holding Inf or NaN: NaN, Inf and -Inf scattered over a 136x200 tensor (some
// fragments with them, most without) must still give the CPU's codes, for FP32 and BF16 x.
// With BF16 x, 136 rows (rows % 32 = 8) take the halo kernel: rows 100 and 120 lie in the 32
// rows above the second tile, which that tile encodes again for its columnwise runs.
TEST(CastGpu, NanAndInfOnTheTileKernelMatchCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (const DType source : {DType::kFloat32, DType::kBFloat16}) {
    for (const DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(source), " -> ", DTypeName(format)));
      std::vector<float> values = WideRangeValues(136 * 200, 17u);
      values[5] = std::numeric_limits<float>::quiet_NaN();
      values[200 * 9 + 130] = -std::numeric_limits<float>::quiet_NaN();
      values[200 * 40 + 64] = std::numeric_limits<float>::infinity();
      values[200 * 135 + 199] = -std::numeric_limits<float>::infinity();
      values[200 * 100 + 17] = std::numeric_limits<float>::quiet_NaN();
      values[200 * 120 + 151] = std::numeric_limits<float>::infinity();
      ASSERT_OK_AND_ASSIGN(const DeviceInput in, MakeDeviceInput(values, 136, 200, source));
      PerTensorQuantizeOptions options;
      options.format = format;
      options.scale = 3.0f;
      options.columnwise = true;
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                           kernels::cpu::QuantizePerTensor(Context::Cpu(), in.host_fp32, options));
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu,
                           kernels::cuda::QuantizePerTensor(GpuContext(), in.device, options));
      EXPECT_TRUE(std::isnan(gpu.amax));
      ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, "rowwise_data with NaN and Inf");
      ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data,
                         "columnwise_data with NaN and Inf");

      // Inf without NaN: the amax is exactly +Inf.
      values[5] = 1.0f;
      values[200 * 9 + 130] = 1.0f;
      values[200 * 100 + 17] = 1.0f;
      ASSERT_OK_AND_ASSIGN(const DeviceInput inf_in, MakeDeviceInput(values, 136, 200, source));
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor inf_cpu, kernels::cpu::QuantizePerTensor(
                                                              Context::Cpu(), inf_in.host_fp32, options));
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor inf_gpu,
                           kernels::cuda::QuantizePerTensor(GpuContext(), inf_in.device, options));
      EXPECT_EQ(Bits(inf_gpu.amax), Bits(std::numeric_limits<float>::infinity()));
      ExpectBitwiseEqual(inf_gpu.rowwise_data, inf_cpu.rowwise_data, "rowwise_data with Inf");
      ExpectBitwiseEqual(inf_gpu.columnwise_data, inf_cpu.columnwise_data, "columnwise_data with Inf");
    }
  }
}

// NaN, Inf and +-Inf columns through both kernels (136x200: 128 x 128 tiles; 257x259: the
// 64 x 64 fallback), FP32 and BF16 x: dbias follows IEEE sums like the CPU's FP64 ones.
TEST(CastGpu, DbiasPropagatesNanAndInfPerColumn) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (const DType source : {DType::kFloat32, DType::kBFloat16}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{136, 200}, {400, 264}, {257, 259}}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(source), " ", rows, "x", cols));
      std::vector<float> values = WideRangeValues(rows * cols, 23u);
      values[(rows - 1) * cols + 0] = std::numeric_limits<float>::quiet_NaN();
      values[5 * cols + 1] = std::numeric_limits<float>::infinity();
      values[(rows - 2) * cols + 1] = -std::numeric_limits<float>::infinity();
      values[70 * cols + 130] = -std::numeric_limits<float>::infinity();
      ASSERT_OK_AND_ASSIGN(const DeviceInput in, MakeDeviceInput(values, rows, cols, source));
      ASSERT_OK_AND_ASSIGN(Tensor dbias, Tensor::Zeros(DType::kFloat32, {cols}, Device::Cuda(0)));
      ASSERT_OK_AND_ASSIGN(Tensor cpu_dbias, Tensor::Zeros(DType::kFloat32, {cols}));
      PerTensorQuantizeOptions options;
      options.columnwise = true;
      options.dbias = &cpu_dbias;
      ASSERT_TRUE(kernels::cpu::QuantizePerTensor(Context::Cpu(), in.host_fp32, options).ok());
      options.dbias = &dbias;
      ASSERT_TRUE(kernels::cuda::QuantizePerTensor(GpuContext(), in.device, options).ok());
      const Tensor got = OnHost(dbias);
      const float* d = got.data<float>();
      EXPECT_TRUE(std::isnan(d[0])) << d[0];
      EXPECT_TRUE(std::isnan(d[1])) << "Inf + -Inf: " << d[1];
      EXPECT_EQ(d[130], -std::numeric_limits<float>::infinity());
      const std::vector<double> magnitude = ColumnAbsSums(in.host_fp32);
      for (int64_t c = 2; c < cols; ++c) {
        if (c == 130) continue;
        const double want = cpu_dbias.data<float>()[c];
        EXPECT_NEAR(d[c], want, 1e-6 + 5e-6 * magnitude[c]) << "column " << c;
      }
    }
  }
}

TEST(CastGpu, DbiasOfNoRowsIsZero) {
  TESERVE_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::Zeros(DType::kFloat32, {0, 5}));
  ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(Context{}, host, Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(const Tensor ones, Tensor::FromFloats({1, 1, 1, 1, 1}, {5}));
  ASSERT_OK_AND_ASSIGN(Tensor dbias, CopyToDevice(Context{}, ones, Device::Cuda(0)));
  PerTensorQuantizeOptions options;
  options.dbias = &dbias;
  ASSERT_TRUE(kernels::cuda::QuantizePerTensor(GpuContext(), device, options).ok());
  const Tensor got = OnHost(dbias);
  for (int c = 0; c < 5; ++c) EXPECT_EQ(got.data<float>()[c], 0.0f) << c;
}

TEST(CastGpu, AmaxOfBFloat16MatchesHostLoop) {
  TESERVE_SKIP_WITHOUT_GPU();
  const std::vector<float> values = WideRangeValues(1000 * 37 + 3, 5u);
  std::vector<uint16_t> codes(values.size());
  float expected = 0.0f;
  for (size_t i = 0; i < values.size(); ++i) {
    codes[i] = FloatToBf16(values[i]);
    expected = std::max(expected, std::fabs(Bf16ToFloat(codes[i])));
  }
  const Tensor host = Tensor::Borrow(codes.data(), DType::kBFloat16,
                                     {static_cast<int64_t>(codes.size())});
  ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(Context{}, host, Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(const float amax, kernels::cuda::Amax(GpuContext(), device));
  EXPECT_EQ(Bits(amax), Bits(expected));
}

TEST(CastGpu, RunsOnANonDefaultStream) {
  TESERVE_SKIP_WITHOUT_GPU();
  const testing::ScopedStream owned;  // declared first: outlives the tensors below
  ASSERT_TRUE(owned.ok());
  const cudaStream_t stream = owned.get();
  Context ctx = GpuContext();
  ctx.stream = stream;
  const std::vector<float> values = WideRangeValues(300 * 64, 3u);
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {300, 64}));
  ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(ctx, host, Device::Cuda(0)));
  PerTensorQuantizeOptions options;
  options.format = DType::kFloat8E5M2;
  options.scale = 1024.0f;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu,
                       kernels::cpu::QuantizePerTensor(Context::Cpu(), host, options));
  auto gpu = kernels::cuda::QuantizePerTensor(ctx, device, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto dequantized = kernels::cuda::Dequantize(ctx, *gpu, Copy::kColumnwise);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  auto back = CopyToHost(ctx, *dequantized);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_OK_AND_ASSIGN(const Tensor expected,
                       kernels::cpu::Dequantize(Context::Cpu(), cpu, Copy::kColumnwise));
  EXPECT_TRUE(BitwiseEqual(*back, expected));
  ExpectBitwiseEqual(gpu->rowwise_data, cpu.rowwise_data, "rowwise_data on a stream");
}

// Launches back to back on one stream into the same amax word, each followed by a
// device-side copy of it, must each see their own maximum only: a large input, a smaller
// one, zeros (no block adds anything there, so only the reset can give 0), the large one
// again. BF16 x on the aligned tile kernel (256 rows) and the halo kernel (272 rows), FP32 x
// on the aligned one. (A reset by a programmatic dependent launch instead of the memset, as
// the norm kernels do, passed this test but ran 2-3 us slower on small shapes.)
TEST(CastGpu, EveryLaunchOnAStreamResetsTheAmax) {
  TESERVE_SKIP_WITHOUT_GPU();
  constexpr int64_t kCols = 384;
  for (const DType source : {DType::kBFloat16, DType::kFloat32}) {
    for (const int64_t rows : {256, 272}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(source), " ", rows, "x", kCols));
      std::vector<float> large = WideRangeValues(rows * kCols, 41u);
      std::vector<float> small = WideRangeValues(rows * kCols, 43u);
      for (float& v : large) v *= 1024.0f;
      for (float& v : small) v *= 0.125f;
      const std::vector<float> zeros(rows * kCols, 0.0f);
      std::vector<DeviceInput> inputs;
      for (const std::vector<float>* values : std::vector<const std::vector<float>*>{&large, &small, &zeros, &large}) {
        ASSERT_OK_AND_ASSIGN(DeviceInput in, MakeDeviceInput(*values, rows, kCols, source));
        inputs.push_back(std::move(in));
      }
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      uint8_t* codes = nullptr;
      uint32_t* words = nullptr;  // [0]: the amax word, [1 + i]: its copy after launch i
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&codes), 2 * rows * kCols), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&words), (1 + inputs.size()) * sizeof(uint32_t)), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(words, 0xFF, (1 + inputs.size()) * sizeof(uint32_t), stream), cudaSuccess);
      for (size_t i = 0; i < inputs.size(); ++i) {
        kernels::cuda::QuantizeLaunchParams params;
        params.x = inputs[i].device.raw_data();
        params.type = source == DType::kBFloat16 ? kernels::cuda::SourceType::kBFloat16
                                                 : kernels::cuda::SourceType::kFloat32;
        params.rows = rows;
        params.cols = kCols;
        params.rowwise = codes;
        params.columnwise = codes + rows * kCols;
        params.amax_bits = words;
        ASSERT_EQ(kernels::cuda::LaunchQuantizePerTensor(params, stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(words + 1 + i, words, sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream),
                  cudaSuccess);
      }
      std::vector<uint32_t> got(1 + inputs.size());
      ASSERT_EQ(cudaMemcpyAsync(got.data(), words, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (size_t i = 0; i < inputs.size(); ++i) {
        ASSERT_OK_AND_ASSIGN(const float want, kernels::cpu::Amax(Context::Cpu(), inputs[i].host_fp32));
        EXPECT_EQ(got[1 + i], Bits(want)) << "launch " << i;
      }
      EXPECT_EQ(cudaFree(codes), cudaSuccess);
      EXPECT_EQ(cudaFree(words), cudaSuccess);
      EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    }
  }
}

// The rule's special amaxes on the device: zero, NaN and Inf give scale 1, a tiny amax a
// scale of FLT_MAX, an epsilon floors the amax; empty tensors take the host's scale.
TEST(CastGpu, CurrentRuleSpecialAmaxesMatchCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> inputs = {
      {0.0f, -0.0f, 0.0f, 0.0f}, {1.0f, nan, 2.0f, 3.0f}, {1.0f, -inf, 2.0f, 3.0f},
      {1e-44f, 0.0f, -1e-45f, 0.0f}, {1e-6f, -2e-6f, 0.0f, 1e-7f}};
  for (const std::vector<float>& values : inputs) {
    for (const float epsilon : {0.0f, 1e-3f}) {
      const std::string where = absl::StrCat(values[0], ", ", values[1], " epsilon ", epsilon);
      ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats(values, {2, 2}));
      ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(Context{}, host, Device::Cuda(0)));
      PerTensorQuantizeOptions options;
      options.current = kernels::CurrentScaleRule{epsilon, false};
      options.columnwise = true;
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor cpu, kernels::cpu::QuantizePerTensor(Context::Cpu(), host, options));
      ASSERT_OK_AND_ASSIGN(const QuantizedTensor gpu, kernels::cuda::QuantizePerTensor(GpuContext(), device, options));
      ExpectBitwiseEqual(gpu.rowwise_data, cpu.rowwise_data, where + " rowwise_data");
      ExpectBitwiseEqual(gpu.rowwise_scale_inv, cpu.rowwise_scale_inv, where + " rowwise_scale_inv");
      ExpectBitwiseEqual(gpu.columnwise_data, cpu.columnwise_data, where + " columnwise_data");
    }
  }
  ASSERT_OK_AND_ASSIGN(const Tensor empty, Tensor::Empty(DType::kFloat32, {0, 8}, Device::Cuda(0), nullptr));
  PerTensorQuantizeOptions options;
  options.current = kernels::CurrentScaleRule{};
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor q, kernels::cuda::QuantizePerTensor(GpuContext(), empty, options));
  EXPECT_EQ(OnHost(q.rowwise_scale_inv).floats()[0], 1.0f);
}

TEST(CastGpu, EmptyTensorGivesZeroAmaxAndEmptyCopies) {
  TESERVE_SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::Zeros(DType::kFloat32, {0, 5}));
  ASSERT_OK_AND_ASSIGN(const Tensor device, CopyToDevice(Context{}, host, Device::Cuda(0)));
  ASSERT_OK_AND_ASSIGN(const float amax, kernels::cuda::Amax(GpuContext(), device));
  EXPECT_EQ(amax, 0.0f);
  PerTensorQuantizeOptions options;
  options.scale = 4.0f;
  options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const QuantizedTensor q,
                       kernels::cuda::QuantizePerTensor(GpuContext(), device, options));
  EXPECT_EQ(q.columnwise_data.shape(), (Shape{5, 0}));
  const Tensor scale_inv = OnHost(q.rowwise_scale_inv);
  EXPECT_EQ(scale_inv.floats()[0], 0.25f);
}

// Metadata errors come before any CUDA call, so these run on machines without a GPU.
TEST(CastGpu, RejectsHostTensorsAndOtherDtypes) {
  ASSERT_OK_AND_ASSIGN(const Tensor host, Tensor::FromFloats({1, 2, 3, 4}, {2, 2}));
  const auto amax = kernels::cuda::Amax(GpuContext(), host);
  EXPECT_THAT(amax, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                              "x.device: expected a CUDA device, got cpu"));
  std::vector<int32_t> ints(4);
  const Tensor int_view = Tensor::Borrow(ints.data(), DType::kInt32, {2, 2}, Device::Cuda(0));
  const auto q = kernels::cuda::QuantizePerTensor(GpuContext(), int_view, {});
  EXPECT_THAT(q, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                           "x.dtype: expected FLOAT32 or BFLOAT16, got INT32"));

  float storage[4] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {2, 2}, Device::Cuda(0));
  Tensor host_dbias = Tensor::Zeros(DType::kFloat32, {2}).value();
  PerTensorQuantizeOptions options;
  options.dbias = &host_dbias;
  const auto on_host = kernels::cuda::QuantizePerTensor(GpuContext(), x, options);
  EXPECT_NE(on_host.status().message().find("options.dbias.device: expected a CUDA device, got cpu"),
            absl::string_view::npos)
      << on_host.status();
  float sums[3] = {};
  Tensor wrong_shape = Tensor::Borrow(sums, DType::kFloat32, {3}, Device::Cuda(0));
  options.dbias = &wrong_shape;
  const auto shape = kernels::cuda::QuantizePerTensor(GpuContext(), x, options);
  EXPECT_NE(shape.status().message().find("options.dbias: expected FLOAT32 [2], got FLOAT32 [3]"),
            absl::string_view::npos)
      << shape.status();
}

#else  // !TESERVE_WITH_CUDA

TEST(CastGpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
