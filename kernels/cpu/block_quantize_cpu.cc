// CPU reference block quantization. Design choices:
// - Both copies go through one routine that reads x through a strided view
//   (CopyView): the rowwise copy is x, the columnwise copy is x^T. "Columnwise of x
//   equals rowwise of x^T" therefore holds by construction, and every copy is
//   quantized from the FP32 source, never from the other copy.
// - MXFP8 multiplies by the exact power of two 2^(127 - code), built from bits
//   (E8M0ToFloat(254 - code)), so codes 0 (factor 2^127) and 254 (factor 2^-127, an
//   FP32 subnormal) need no special case and no ldexp. The NaN code gives a NaN
//   factor, so a block holding a NaN encodes entirely as NaN.
// - 2D block scaling computes one scale per 128x128 tile of x and hands the same grid
//   to both copies (transposed for the columnwise one), so the two copies of a weight
//   dequantize to exactly transposed values.
// - Amax propagates NaN (kernels/cpu/block_math.h).
// - The fused dbias is the FP64 column sum of kernels/cpu/cast_cpu.h (ColumnSums), one
//   pass of its own: the copies read x through strided views, so no quantize loop
//   visits x in an order that would serve it.
// - Every product is one FP32 multiplication (what a GPU kernel does in registers),
//   encoded with core/float_codec.h; the per-block scale arithmetic lives in
//   kernels/quantize_math.h. The CUDA kernels compile both headers.
#include "kernels/cpu/block_quantize_cpu.h"

#include <algorithm>
#include <vector>

#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/status.h"
#include "kernels/cpu/block_math.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

using Encoder = uint8_t (*)(float);

Encoder EncoderFor(DType format) {
  return format == DType::kFloat8E4M3 ? FloatToE4M3 : FloatToE5M2;
}

float DecodeFp8(DType format, uint8_t code) {
  return format == DType::kFloat8E4M3 ? E4M3ToFloat(code) : E5M2ToFloat(code);
}

// One copy [rows, cols] of x read through strides.
struct CopyView {
  const float* base;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
  int64_t col_stride;
  float at(int64_t r, int64_t c) const { return base[r * row_stride + c * col_stride]; }
};

CopyView ViewOf(const Tensor& x, Copy copy) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  if (copy == Copy::kRowwise) return CopyView{x.data<float>(), rows, cols, cols, 1};
  return CopyView{x.data<float>(), cols, rows, 1, cols};
}

QuantizedTensor EmptyResult(const Tensor& x, DType format, ScalingMode mode) {
  QuantizedTensor q;
  q.shape = {x.dim(0), x.dim(1)};
  q.format = format;
  q.mode = mode;
  q.amax = AmaxOf(x.floats());
  return q;
}

void SetCopy(QuantizedTensor& q, Copy copy, Tensor data, Tensor scale_inv) {
  if (copy == Copy::kRowwise) {
    q.rowwise_data = std::move(data);
    q.rowwise_scale_inv = std::move(scale_inv);
  } else {
    q.columnwise_data = std::move(data);
    q.columnwise_scale_inv = std::move(scale_inv);
  }
}

// ---- MXFP8 ----

void QuantizeMxfp8Copy(const CopyView& v, DType format, uint8_t* data, uint8_t* codes) {
  const Encoder encode = EncoderFor(format);
  const float fp8_max = DTypeMaxFinite(format);
  const int64_t blocks = v.cols / kMxfp8BlockSize;
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kMxfp8BlockSize;
      const int64_t end = begin + kMxfp8BlockSize;
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = AbsMaxUpdate(amax, v.at(r, c));
      const uint8_t code = Mxfp8ScaleCode(amax, fp8_max);
      codes[r * blocks + b] = code;
      const float factor = Mxfp8EncodeFactor(code);
      for (int64_t c = begin; c < end; ++c) data[r * v.cols + c] = encode(v.at(r, c) * factor);
    }
  }
}

// ---- FP8 block scaling ----

struct BlockScalingParams {
  Encoder encode;
  float fp8_max;
  bool power_2_scale;
  float amax_epsilon;
};

BlockScalingParams ParamsOf(const BlockScalingQuantizeOptions& options) {
  return BlockScalingParams{EncoderFor(options.format), DTypeMaxFinite(options.format),
                            options.power_2_scale, options.amax_epsilon};
}

float ScaleOf(const BlockScalingParams& p, float amax) {
  return BlockScalingScale(amax, p.fp8_max, p.power_2_scale, p.amax_epsilon);
}

// 1x128 blocks along the copy's rows; the last block of a row may be partial.
void QuantizeBlock1DCopy(const CopyView& v, const BlockScalingParams& p, uint8_t* data,
                         float* scale_inv) {
  const int64_t blocks = CeilDiv(v.cols, kFp8BlockScalingSize);
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kFp8BlockScalingSize;
      const int64_t end = std::min(begin + kFp8BlockScalingSize, v.cols);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = AbsMaxUpdate(amax, v.at(r, c));
      const float scale = ScaleOf(p, amax);
      scale_inv[r * blocks + b] = 1.0f / scale;
      for (int64_t c = begin; c < end; ++c) data[r * v.cols + c] = p.encode(v.at(r, c) * scale);
    }
  }
}

// Scales of the 128x128 tiles of x (partial tiles at the edges), row-major
// [ceil(rows/128), ceil(cols/128)].
struct TileGrid {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> scale;
};

TileGrid ComputeTileScales(const CopyView& x, const BlockScalingParams& p) {
  TileGrid grid;
  grid.rows = CeilDiv(x.rows, kFp8BlockScalingSize);
  grid.cols = CeilDiv(x.cols, kFp8BlockScalingSize);
  std::vector<float> amax(grid.rows * grid.cols, 0.0f);
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) {
      float& tile = amax[(r / kFp8BlockScalingSize) * grid.cols + c / kFp8BlockScalingSize];
      tile = AbsMaxUpdate(tile, x.at(r, c));
    }
  }
  grid.scale.reserve(amax.size());
  for (float a : amax) grid.scale.push_back(ScaleOf(p, a));
  return grid;
}

// Writes one copy with the tile scales of x; `transposed` for the columnwise copy,
// whose tile (i, j) is x's tile (j, i).
void QuantizeBlock2DCopy(const CopyView& v, const TileGrid& grid, bool transposed,
                         const BlockScalingParams& p, uint8_t* data, float* scale_inv) {
  const int64_t tile_rows = transposed ? grid.cols : grid.rows;
  const int64_t tile_cols = transposed ? grid.rows : grid.cols;
  auto scale_at = [&](int64_t i, int64_t j) {
    return transposed ? grid.scale[j * grid.cols + i] : grid.scale[i * grid.cols + j];
  };
  for (int64_t i = 0; i < tile_rows; ++i) {
    for (int64_t j = 0; j < tile_cols; ++j) scale_inv[i * tile_cols + j] = 1.0f / scale_at(i, j);
  }
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t c = 0; c < v.cols; ++c) {
      const float scale = scale_at(r / kFp8BlockScalingSize, c / kFp8BlockScalingSize);
      data[r * v.cols + c] = p.encode(v.at(r, c) * scale);
    }
  }
}

}  // namespace

float BlockScalingScale(float block_amax, float fp8_max, bool power_2_scale, float amax_epsilon) {
  return BlockScalingScaleOf(block_amax, fp8_max, power_2_scale, amax_epsilon);
}

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context&, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options) {
  QuantizedTensor q = EmptyResult(x, options.format, ScalingMode::kMxfp8_1D);
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    if (!(copy == Copy::kRowwise ? options.rowwise : options.columnwise)) continue;
    const CopyView v = ViewOf(x, copy);
    ASSIGN_OR_RETURN(Tensor data, Tensor::Zeros(options.format, {v.rows, v.cols}));
    ASSIGN_OR_RETURN(Tensor codes,
                     Tensor::Zeros(DType::kFloat8E8M0, {v.rows, v.cols / kMxfp8BlockSize}));
    QuantizeMxfp8Copy(v, options.format, data.data<uint8_t>(), codes.data<uint8_t>());
    SetCopy(q, copy, std::move(data), std::move(codes));
  }
  if (options.dbias != nullptr) {
    ColumnSums(x.data<float>(), x.dim(0), x.dim(1), options.dbias->data<float>());
  }
  return q;
}

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context&, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options) {
  const ScalingMode mode = options.two_d ? ScalingMode::kBlock2D : ScalingMode::kBlock1D;
  QuantizedTensor q = EmptyResult(x, options.format, mode);
  const BlockScalingParams params = ParamsOf(options);
  TileGrid grid;
  if (options.two_d) grid = ComputeTileScales(ViewOf(x, Copy::kRowwise), params);
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    if (!(copy == Copy::kRowwise ? options.rowwise : options.columnwise)) continue;
    const CopyView v = ViewOf(x, copy);
    const bool transposed = copy == Copy::kColumnwise;
    const Shape scale_shape =
        options.two_d ? (transposed ? Shape{grid.cols, grid.rows} : Shape{grid.rows, grid.cols})
                      : Shape{v.rows, CeilDiv(v.cols, kFp8BlockScalingSize)};
    ASSIGN_OR_RETURN(Tensor data, Tensor::Zeros(options.format, {v.rows, v.cols}));
    ASSIGN_OR_RETURN(Tensor scale_inv, Tensor::Zeros(DType::kFloat32, scale_shape));
    if (options.two_d) {
      QuantizeBlock2DCopy(v, grid, transposed, params, data.data<uint8_t>(),
                          scale_inv.data<float>());
    } else {
      QuantizeBlock1DCopy(v, params, data.data<uint8_t>(), scale_inv.data<float>());
    }
    SetCopy(q, copy, std::move(data), std::move(scale_inv));
  }
  if (options.dbias != nullptr) {
    ColumnSums(x.data<float>(), x.dim(0), x.dim(1), options.dbias->data<float>());
  }
  return q;
}

absl::StatusOr<Tensor> DequantizeBlock(const Context&, const QuantizedTensor& q, Copy copy) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const bool mxfp8 = q.mode == ScalingMode::kMxfp8_1D;
  const int64_t block_rows = q.mode == ScalingMode::kBlock2D ? kFp8BlockScalingSize : 1;
  const int64_t block_cols = mxfp8 ? kMxfp8BlockSize : kFp8BlockScalingSize;
  const int64_t rows = data.dim(0);
  const int64_t cols = data.dim(1);
  const int64_t scale_cols = scale_inv.dim(1);
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, {rows, cols}));
  const uint8_t* codes = data.data<uint8_t>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t s = (r / block_rows) * scale_cols + c / block_cols;
      const float inv =
          mxfp8 ? E8M0ToFloat(scale_inv.data<uint8_t>()[s]) : scale_inv.data<float>()[s];
      dst[r * cols + c] = DecodeFp8(q.format, codes[r * cols + c]) * inv;
    }
  }
  return out;
}

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context&, const Tensor& scales) {
  const int64_t rows = scales.dim(0);
  const int64_t cols = scales.dim(1);
  const int64_t padded_cols = RoundUp(cols, kMxfp8SwizzleTileCols);
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat8E8M0,
                                             {RoundUp(rows, kMxfp8SwizzleTileRows), padded_cols}));
  const uint8_t* src = scales.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[Mxfp8SwizzledOffset(r, c, padded_cols)] = src[r * cols + c];
    }
  }
  return out;
}

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context&, const Tensor& swizzled, int64_t rows,
                                            int64_t cols) {
  const int64_t padded_cols = swizzled.dim(1);
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat8E8M0, {rows, cols}));
  const uint8_t* src = swizzled.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[r * cols + c] = src[Mxfp8SwizzledOffset(r, c, padded_cols)];
    }
  }
  return out;
}

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context&, const Tensor& scale_inv, bool two_d) {
  // 2D scales keep their layout; 1D scales [M, K/128] are transposed to [K/128, M].
  const bool transpose = !two_d;
  const int64_t rows = scale_inv.dim(0);
  const int64_t cols = scale_inv.dim(1);
  const int64_t out_rows = transpose ? cols : rows;
  const int64_t ld = RoundUp(transpose ? rows : cols, kBlockScalesGemmAlignment);
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, {out_rows, ld}));
  const float* src = scale_inv.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[transpose ? c * ld + r : r * ld + c] = src[r * cols + c];
    }
  }
  return out;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
