// Small host-side helpers shared by the CUDA op wrappers (cast, block quantize, NVFP4,
// activation, normalization): device and dtype checks that name the field and say
// expected vs got, the stream of a Context, the per-tensor FP8 outputs of a fused cast,
// and reading a device amax.
#ifndef TESERVE_KERNELS_CUDA_CUDA_TENSOR_CHECKS_H_
#define TESERVE_KERNELS_CUDA_CUDA_TENSOR_CHECKS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/cuda/cast/cast_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"  // StreamOf

namespace teserve {
namespace kernels {
namespace cuda {


// Defined and on a CUDA device.
inline absl::Status CheckOnCudaDevice(absl::string_view name, const Tensor& t) {
  if (!t.defined()) return InvalidField(name, "a tensor", "an undefined tensor");
  if (t.device().type != DeviceType::kCuda) {
    return InvalidField(absl::StrCat(name, ".device"), "a CUDA device", t.device().ToString());
  }
  return absl::OkStatus();
}

// FP32 or BF16 rank-2 source on a CUDA device.
inline absl::StatusOr<SourceType> CheckSource(const Tensor& x) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  if (x.rank() != 2) return InvalidField("x.shape", "rank 2", ShapeToString(x.shape()));
  switch (x.dtype()) {
    case DType::kFloat32: return SourceType::kFloat32;
    case DType::kBFloat16: return SourceType::kBFloat16;
    default: return InvalidField("x.dtype", "FLOAT32 or BFLOAT16", DTypeName(x.dtype()));
  }
}

inline absl::StatusOr<Fp8Format> Fp8FormatOf(absl::string_view field, DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3: return Fp8Format::kE4M3;
    case DType::kFloat8E5M2: return Fp8Format::kE5M2;
    default: return InvalidField(field, "FLOAT8_E4M3 or FLOAT8_E5M2", DTypeName(dtype));
  }
}

// The per-tensor FP8 outputs of a fused cast of an [rows, cols] result on `device`: the
// copies `q` asks for (codes, rowwise [rows, cols] / columnwise [cols, rows], and a
// one-element scale_inv each) in *fp8 with its shape, format and mode, a zeroed amax word
// in *amax_bits, and in *p (a launch-parameter struct with these fields) their pointers,
// scale and scale_inv = 1 / scale. The caller sets p->format.
// Allocated on `stream` (the launch's, so no wait) and not filled: the kernels write
// every code and both scale_inv words (the launchers write them for an empty tensor too),
// and the launchers zero the amax word before the kernels take their maximum into it.
template <typename Params>
absl::Status AllocatePerTensorFp8(int64_t rows, int64_t cols, const PerTensorQuantizeOptions& q,
                                  Device device, void* stream, QuantizedTensor* fp8, Tensor* amax_bits,
                                  Params* p) {
  fp8->shape = {rows, cols};
  fp8->format = q.format;
  fp8->mode = ScalingMode::kPerTensor;
  p->scale = q.scale;
  p->scale_inv = 1.0f / q.scale;
  if (q.rowwise) {
    ASSIGN_OR_RETURN(fp8->rowwise_data, Tensor::Empty(q.format, {rows, cols}, device, stream));
    ASSIGN_OR_RETURN(fp8->rowwise_scale_inv, Tensor::Empty(DType::kFloat32, {1}, device, stream));
    p->rowwise = fp8->rowwise_data.template data<uint8_t>();
    p->rowwise_scale_inv = fp8->rowwise_scale_inv.template data<float>();
  }
  if (q.columnwise) {
    ASSIGN_OR_RETURN(fp8->columnwise_data, Tensor::Empty(q.format, {cols, rows}, device, stream));
    ASSIGN_OR_RETURN(fp8->columnwise_scale_inv, Tensor::Empty(DType::kFloat32, {1}, device, stream));
    p->columnwise = fp8->columnwise_data.template data<uint8_t>();
    p->columnwise_scale_inv = fp8->columnwise_scale_inv.template data<float>();
  }
  ASSIGN_OR_RETURN(*amax_bits, Tensor::Empty(DType::kInt32, {1}, device, stream));
  p->amax_bits = amax_bits->template data<uint32_t>();
  return absl::OkStatus();
}

// The FP32 amax held as magnitude bits in device memory, after the stream's work. Any
// NaN comes back as the canonical quiet NaN the CPU reference produces.
inline absl::StatusOr<float> ReadAmaxBits(const uint32_t* device_bits, cudaStream_t stream) {
  uint32_t bits = 0;
  TESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&bits, device_bits, sizeof(bits), cudaMemcpyDeviceToHost, stream));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (bits > 0x7F800000u) bits = 0x7FC00000u;
  float amax;
  std::memcpy(&amax, &bits, sizeof(amax));
  return amax;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CUDA_TENSOR_CHECKS_H_
