// Small host-side helpers shared by the CUDA wrappers of the block-scaled recipes
// (block_quantize_cuda.cc, nvfp4_cuda.cc): device and dtype checks that name the field
// and say expected vs got, the stream of a Context, and reading a device amax.
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
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cuda/cast_kernels.h"
#include "kernels/cuda/cuda_check.h"

namespace teserve {
namespace kernels {
namespace cuda {

inline cudaStream_t StreamOf(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

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
