// CPU reference casts. Design choices:
// - Every conversion goes through core/float_codec.h, the same integer-only codecs the
//   CUDA kernels compile, so "bit-exact given the same scale" is checkable.
// - The quantized value is encode(x * scale) with the product rounded to FP32 first
//   (what a GPU kernel computing in registers does), never a fused or double product.
// - Amax propagates NaN (kernels/cpu/block_math.h).
// - One pass over the source writes the rowwise copy and the transposed columnwise
//   copy; the transpose write is strided, which is fine for a reference.
// - The fused dbias (column sums) is accumulated in FP64 in that same pass and rounded
//   to FP32 once at the end.
#include "kernels/cpu/cast_cpu.h"

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "core/float_codec.h"
#include "core/status.h"
#include "kernels/cpu/block_math.h"
#include "kernels/scaling_math.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

constexpr char kCastTypes[] = "one of FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2";
constexpr char kFp8Formats[] = "FLOAT8_E4M3 or FLOAT8_E5M2";

template <typename Code, float (*kDecode)(Code)>
void DecodeAll(const void* in, int64_t n, float* out) {
  const Code* codes = static_cast<const Code*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = kDecode(codes[i]);
}

template <typename Code, Code (*kEncode)(float)>
void EncodeAll(const float* in, int64_t n, void* out) {
  Code* codes = static_cast<Code*>(out);
  for (int64_t i = 0; i < n; ++i) codes[i] = kEncode(in[i]);
}

// Writes encode(x * scale) into `rowwise` ([rows, cols]) and/or `columnwise`
// ([cols, rows]); either may be null. With `sums` ([cols], zeroed), adds every x[r, c]
// to sums[c] in FP64.
template <uint8_t (*kEncode)(float)>
void QuantizeScaled(const float* x, int64_t rows, int64_t cols, float scale, uint8_t* rowwise,
                    uint8_t* columnwise, double* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float value = x[r * cols + c];
      const uint8_t code = kEncode(value * scale);
      if (rowwise != nullptr) rowwise[r * cols + c] = code;
      if (columnwise != nullptr) columnwise[c * rows + r] = code;
      if (sums != nullptr) sums[c] += static_cast<double>(value);
    }
  }
}

void RoundSums(const std::vector<double>& sums, float* dbias) {
  for (size_t c = 0; c < sums.size(); ++c) dbias[c] = static_cast<float>(sums[c]);
}

absl::StatusOr<Tensor> ScalarTensor(float value) { return Tensor::FromFloats({value}, {1}); }

}  // namespace

void ColumnSums(const float* x, int64_t rows, int64_t cols, float* dbias) {
  std::vector<double> sums(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) sums[c] += static_cast<double>(x[r * cols + c]);
  }
  RoundSums(sums, dbias);
}

absl::StatusOr<float> Amax(const Context&, const Tensor& x) {
  if (x.dtype() != DType::kFloat32) return InvalidField("x.dtype", "FLOAT32", DTypeName(x.dtype()));
  return AmaxOf(x.floats());
}

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context&, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options) {
  const DType format = options.format;
  if (!IsFloat8(format)) return InvalidField("options.format", kFp8Formats, DTypeName(format));
  QuantizedTensor q;
  q.shape = {x.dim(0), x.dim(1)};
  q.format = format;
  q.mode = ScalingMode::kPerTensor;
  q.amax = AmaxOf(x.floats());
  const float scale =
      options.current.has_value()
          ? scaling_math::CurrentScale(q.amax, DTypeMaxFinite(format), options.current->amax_epsilon,
                                       options.current->power_2_scale)
          : options.scale;
  const float scale_inv = 1.0f / scale;
  uint8_t* rowwise = nullptr;
  uint8_t* columnwise = nullptr;
  if (options.rowwise) {
    ASSIGN_OR_RETURN(q.rowwise_data, Tensor::Zeros(format, {q.rows(), q.cols()}));
    ASSIGN_OR_RETURN(q.rowwise_scale_inv, ScalarTensor(scale_inv));
    rowwise = q.rowwise_data.data<uint8_t>();
  }
  if (options.columnwise) {
    ASSIGN_OR_RETURN(q.columnwise_data, Tensor::Zeros(format, {q.cols(), q.rows()}));
    ASSIGN_OR_RETURN(q.columnwise_scale_inv, ScalarTensor(scale_inv));
    columnwise = q.columnwise_data.data<uint8_t>();
  }
  std::vector<double> sums(options.dbias != nullptr ? q.cols() : 0, 0.0);
  double* sums_or_null = options.dbias != nullptr ? sums.data() : nullptr;
  const float* src = x.data<float>();
  if (format == DType::kFloat8E4M3) {
    QuantizeScaled<FloatToE4M3>(src, q.rows(), q.cols(), scale, rowwise, columnwise,
                                sums_or_null);
  } else {
    QuantizeScaled<FloatToE5M2>(src, q.rows(), q.cols(), scale, rowwise, columnwise,
                                sums_or_null);
  }
  if (options.dbias != nullptr) RoundSums(sums, options.dbias->data<float>());
  return q;
}

absl::StatusOr<Tensor> Dequantize(const Context&, const QuantizedTensor& q, Copy copy) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  if (!IsFloat8(data.dtype())) return InvalidField("q.data.dtype", kFp8Formats, DTypeName(data.dtype()));
  const float inv = scale_inv.data<float>()[0];
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, data.shape()));
  const uint8_t* codes = data.data<uint8_t>();
  float* dst = out.data<float>();
  const bool e4m3 = data.dtype() == DType::kFloat8E4M3;
  for (int64_t i = 0; i < data.numel(); ++i) {
    dst[i] = (e4m3 ? E4M3ToFloat(codes[i]) : E5M2ToFloat(codes[i])) * inv;
  }
  return out;
}

absl::StatusOr<Tensor> ToFloat32(const Context&, const Tensor& x) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, x.shape()));
  float* dst = out.data<float>();
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::kFloat32:
      if (n > 0) std::memcpy(dst, x.raw_data(), n * sizeof(float));
      return out;
    case DType::kFloat16: DecodeAll<uint16_t, Fp16ToFloat>(x.raw_data(), n, dst); return out;
    case DType::kBFloat16: DecodeAll<uint16_t, Bf16ToFloat>(x.raw_data(), n, dst); return out;
    case DType::kFloat8E4M3: DecodeAll<uint8_t, E4M3ToFloat>(x.raw_data(), n, dst); return out;
    case DType::kFloat8E5M2: DecodeAll<uint8_t, E5M2ToFloat>(x.raw_data(), n, dst); return out;
    default: return InvalidField("x.dtype", kCastTypes, DTypeName(x.dtype()));
  }
}

absl::StatusOr<Tensor> CastFromFloat32(const Context&, const Tensor& x, DType dtype) {
  if (x.dtype() != DType::kFloat32) return InvalidField("x.dtype", "FLOAT32", DTypeName(x.dtype()));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(dtype, x.shape()));
  const float* src = x.data<float>();
  const int64_t n = x.numel();
  switch (dtype) {
    case DType::kFloat32:
      if (n > 0) std::memcpy(out.raw_data(), src, n * sizeof(float));
      return out;
    case DType::kFloat16: EncodeAll<uint16_t, FloatToFp16>(src, n, out.raw_data()); return out;
    case DType::kBFloat16: EncodeAll<uint16_t, FloatToBf16>(src, n, out.raw_data()); return out;
    case DType::kFloat8E4M3: EncodeAll<uint8_t, FloatToE4M3>(src, n, out.raw_data()); return out;
    case DType::kFloat8E5M2: EncodeAll<uint8_t, FloatToE5M2>(src, n, out.raw_data()); return out;
    default: return InvalidField("dtype", kCastTypes, DTypeName(dtype));
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
