// CPU reference NVFP4. Design choices:
// - Every step is the FP32 operation sequence written in kernels/nvfp4.h, through the
//   integer codecs of core/float_codec.h, the block-scale arithmetic of
//   kernels/quantize_math.h and the stateless draws of kernels/stochastic_rounding.h,
//   which the CUDA kernels compile too. Nothing here uses double or fused operations,
//   so a GPU can match it bit for bit.
// - The columnwise copy is quantized from a materialized transpose of x (optionally
//   Hadamard-transformed). That costs a copy of x, which is fine for a reference and
//   keeps one 1D routine for both copies: blocks always run along the copy's last dim.
// - 2D blocks compute one encode factor per 16x16 block and write each element's code
//   to both copies, so the copies are transposes by construction.
// - Packed FP4 buffers come zeroed from Tensor::Zeros; codes are OR-ed into nibbles.
#include "kernels/cpu/nvfp4_cpu.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/float_codec.h"
#include "core/status.h"
#include "kernels/cpu/block_math.h"
#include "kernels/hadamard.h"
#include "kernels/quantize_math.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

constexpr int64_t kBlock = kNvfp4BlockSize;

// The first n floats at v.
absl::Span<const float> Floats(const float* v, int64_t n) {
  return absl::MakeConstSpan(v, static_cast<size_t>(n));
}

struct GlobalScale {
  float s;
  float inv_s;
};

using BlockScale = Nvfp4BlockScale;

BlockScale ComputeBlockScale(float block_amax, const GlobalScale& g) {
  return Nvfp4BlockScaleOf(block_amax, g.s, g.inv_s);
}

struct Rounding {
  bool stochastic = false;
  uint64_t key = 0;
};

uint8_t EncodeElement(float x, float e, const Rounding& rounding, uint64_t index) {
  const float y = x * e;
  if (!rounding.stochastic) return FloatToE2M1(y);
  return StochasticRoundToE2M1(y, RandomBits24(rounding.key, index));
}

void PutNibble(uint8_t* data, int64_t i, uint8_t code) {
  data[i >> 1] |= (i & 1) ? static_cast<uint8_t>(code << 4) : static_cast<uint8_t>(code & 0xF);
}

uint8_t GetNibble(const uint8_t* data, int64_t i) {
  return (i & 1) ? (data[i >> 1] >> 4) : (data[i >> 1] & 0xF);
}

// 1D blocks along the rows of src [rows, cols] (cols % 16 == 0): data [rows, cols]
// packed, scales [rows, cols / 16].
void Quantize1D(const float* src, int64_t rows, int64_t cols, const GlobalScale& g,
                const Rounding& rounding, uint8_t* data, uint8_t* scales) {
  const int64_t blocks_per_row = cols / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const int64_t first = r * cols + b * kBlock;
      const BlockScale scale = ComputeBlockScale(AmaxOf(Floats(src + first, kBlock)), g);
      scales[r * blocks_per_row + b] = scale.byte;
      for (int64_t i = first; i < first + kBlock; ++i) {
        PutNibble(data, i, EncodeElement(src[i], scale.e, rounding, static_cast<uint64_t>(i)));
      }
    }
  }
}

struct CopyOut {
  uint8_t* data = nullptr;    // null when the copy is not requested
  uint8_t* scales = nullptr;
};

float TileAmax(const float* x, int64_t cols, int64_t r0, int64_t c0) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r0 + kBlock; ++r) amax = AbsMaxUpdate(amax, AmaxOf(Floats(x + r * cols + c0, kBlock)));
  return amax;
}

// 16x16 blocks of x [rows, cols]; rowwise scales [rows/16, cols/16], columnwise scales
// the transpose. Draws are keyed by the rowwise index for both copies.
void Quantize2D(const float* x, int64_t rows, int64_t cols, const GlobalScale& g,
                const Rounding& rounding, CopyOut row, CopyOut col) {
  const int64_t block_rows = rows / kBlock;
  const int64_t block_cols = cols / kBlock;
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const BlockScale scale = ComputeBlockScale(TileAmax(x, cols, br * kBlock, bc * kBlock), g);
      if (row.scales != nullptr) row.scales[br * block_cols + bc] = scale.byte;
      if (col.scales != nullptr) col.scales[bc * block_rows + br] = scale.byte;
      for (int64_t r = br * kBlock; r < (br + 1) * kBlock; ++r) {
        for (int64_t c = bc * kBlock; c < (bc + 1) * kBlock; ++c) {
          const int64_t i = r * cols + c;
          const uint8_t code = EncodeElement(x[i], scale.e, rounding, static_cast<uint64_t>(i));
          if (row.data != nullptr) PutNibble(row.data, i, code);
          if (col.data != nullptr) PutNibble(col.data, c * rows + r, code);
        }
      }
    }
  }
}

absl::StatusOr<Tensor> Transpose(const Tensor& x) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kFloat32, {cols, rows}));
  const float* src = x.data<float>();
  float* dst = t.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
  return t;
}

// Allocates one copy's data [rows, cols] and scales [scale_rows, scale_cols].
absl::StatusOr<CopyOut> AllocateCopy(int64_t rows, int64_t cols, int64_t scale_rows,
                                     int64_t scale_cols, Tensor* data, Tensor* scales) {
  ASSIGN_OR_RETURN(*data, Tensor::Zeros(DType::kFloat4E2M1, {rows, cols}));
  ASSIGN_OR_RETURN(*scales, Tensor::Zeros(DType::kFloat8E4M3, {scale_rows, scale_cols}));
  return CopyOut{data->data<uint8_t>(), scales->data<uint8_t>()};
}

Rounding RoundingFor(const Context& ctx, const Nvfp4QuantizeOptions& options, uint32_t copy_id) {
  Rounding rounding;
  rounding.stochastic = options.stochastic_rounding;
  rounding.key = RandomKey(ctx.seed, options.rng_stream, copy_id);
  return rounding;
}

GlobalScale GlobalScaleFor(float scaling_amax) {
  const float s = Nvfp4GlobalEncodeScale(scaling_amax);
  return GlobalScale{s, 1.0f / s};
}

absl::StatusOr<QuantizedTensor> Quantize2DCopies(const Context& ctx, const Tensor& x,
                                                 const Nvfp4QuantizeOptions& options,
                                                 QuantizedTensor q) {
  const int64_t rows = q.rows();
  const int64_t cols = q.cols();
  const GlobalScale g = GlobalScaleFor(q.amax);
  q.global_encode_scale = g.s;
  CopyOut row;
  CopyOut col;
  if (options.rowwise) {
    ASSIGN_OR_RETURN(row, AllocateCopy(rows, cols, rows / kBlock, cols / kBlock,
                                       &q.rowwise_data, &q.rowwise_scale_inv));
  }
  if (options.columnwise) {
    ASSIGN_OR_RETURN(col, AllocateCopy(cols, rows, cols / kBlock, rows / kBlock,
                                       &q.columnwise_data, &q.columnwise_scale_inv));
  }
  Quantize2D(x.data<float>(), rows, cols, g, RoundingFor(ctx, options, kRowwiseCopyId), row, col);
  return q;
}

absl::StatusOr<QuantizedTensor> Quantize1DCopies(const Context& ctx, const Tensor& x,
                                                 const Nvfp4QuantizeOptions& options,
                                                 QuantizedTensor q) {
  const int64_t rows = q.rows();
  const int64_t cols = q.cols();
  float scaling_amax = q.amax;
  Tensor col_source;
  if (options.columnwise) {
    ASSIGN_OR_RETURN(col_source, Transpose(x));
    if (options.random_hadamard) {
      ASSIGN_OR_RETURN(col_source, ApplyHadamard16(ctx, col_source));
      scaling_amax = AbsMaxUpdate(scaling_amax, AmaxOf(col_source.floats()));
    }
  }
  const GlobalScale g = GlobalScaleFor(scaling_amax);
  q.global_encode_scale = g.s;
  if (options.rowwise) {
    ASSIGN_OR_RETURN(CopyOut row, AllocateCopy(rows, cols, rows, cols / kBlock, &q.rowwise_data,
                                               &q.rowwise_scale_inv));
    Quantize1D(x.data<float>(), rows, cols, g, RoundingFor(ctx, options, kRowwiseCopyId), row.data,
               row.scales);
  }
  if (options.columnwise) {
    ASSIGN_OR_RETURN(CopyOut col, AllocateCopy(cols, rows, cols, rows / kBlock,
                                               &q.columnwise_data, &q.columnwise_scale_inv));
    Quantize1D(col_source.data<float>(), cols, rows, g,
               RoundingFor(ctx, options, kColumnwiseCopyId), col.data, col.scales);
  }
  return q;
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options) {
  QuantizedTensor q;
  q.shape = {x.dim(0), x.dim(1)};
  q.format = DType::kFloat4E2M1;
  q.mode = options.two_d ? ScalingMode::kNvfp4_2D : ScalingMode::kNvfp4_1D;
  q.amax = AmaxOf(x.floats());
  if (options.two_d) return Quantize2DCopies(ctx, x, options, std::move(q));
  return Quantize1DCopies(ctx, x, options, std::move(q));
}

absl::StatusOr<Tensor> DequantizeNvfp4(const Context&, const QuantizedTensor& q, Copy copy) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const int64_t rows = data.dim(0);
  const int64_t cols = data.dim(1);
  const int64_t block_rows = q.mode == ScalingMode::kNvfp4_2D ? kBlock : 1;
  const int64_t scale_cols = cols / kBlock;
  const float inv_s = 1.0f / q.global_encode_scale;
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, {rows, cols}));
  const uint8_t* codes = data.data<uint8_t>();
  const uint8_t* scale_bytes = scales.data<uint8_t>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float sd = E4M3ToFloat(scale_bytes[(r / block_rows) * scale_cols + c / kBlock]);
      dst[i] = (E2M1ToFloat(GetNibble(codes, i)) * sd) * inv_s;
    }
  }
  return out;
}

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context&, const Tensor& x) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat4E2M1, x.shape()));
  const float* src = x.data<float>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) PutNibble(dst, i, FloatToE2M1(src[i]));
  return out;
}

absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context&, const Tensor& packed) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, packed.shape()));
  const uint8_t* src = packed.data<uint8_t>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < packed.numel(); ++i) dst[i] = E2M1ToFloat(GetNibble(src, i));
  return out;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
