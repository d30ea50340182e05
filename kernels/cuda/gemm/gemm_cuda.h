// CUDA backend of kernels/gemm.h: the general GEMM through cuBLASLt (cublaslt_gemm.cc)
// and Linear's FP32 bias helpers (bias_cuda.cc, kernels in bias_kernels.cu).
//
// Block scaling: cuBLASLt's A_SCALE_MODE / B_SCALE_MODE are our b's / a's, with the scale
// pointers in the VEC128_32F / BLK128x128_32F layouts that kernels/block_quantize.h's
// BlockScalesGemmLayout produces: 1D [ceil(K/128), roundup(rows, 4)] with the operand's
// rows contiguous, 2D [ceil(rows/128), roundup(ceil(K/128), 4)] with the k blocks
// contiguous. FAST_ACCUM is left 0 (these kernels have no fast-accumulation variant).
//
// Row-major to cuBLASLt: a row-major [r, c] matrix is the column-major [c, r] one, so
// D = op(A) op(B) (row-major [m, n]) is computed as D^T = op(B)^T op(A)^T, i.e. cuBLASLt's
// "A" is our B and its "B" is our A, with M = n, N = m. Our FP8 layout rule (A not
// transposed, B transposed) is exactly cuBLASLt's TN, the only FP8 layout Hopper runs.
//
// What is cached and why:
// - one cuBLASLt handle per device (created on first use, lives for the process);
// - a 32 MiB workspace per (device, stream), so GEMMs of sessions on different streams
//   never share scratch memory; a session's stream releases its workspace when it is
//   destroyed (ReleaseGemmWorkspace), so the count follows the live streams;
// - the heuristic's algorithm per problem (shapes, dtypes, layout, epilogue, pointer
//   alignment), so steady-state calls skip the heuristic query.
// Descriptors are created per call (cheap) and owned by unique_ptr, so an error between
// create and destroy leaks nothing.
#ifndef TESERVE_KERNELS_CUDA_GEMM_GEMM_CUDA_H_
#define TESERVE_KERNELS_CUDA_GEMM_GEMM_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/gemm.h"

namespace teserve {
namespace kernels {
namespace cuda {

inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// Each assumes the checks of kernels/gemm.cc have passed (dtypes, shapes, devices,
// layout). None synchronizes: the work is enqueued on ctx.stream.

// k == 0 leaves beta * D (an epilogue, if any, is not applied: there is no product).
// Block-scaled operands (kernels/gemm.h) first ask BlockScaledGemmSupport; scales in
// kQuantizer layout are converted to cuBLASLt's into scratch on ctx.stream (one small
// kernel per operand), kGemm scales are read where they are (16-byte aligned).
absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options);

// kernels::BlockScaledGemmSupport for CUDA device `device`: the build's cuBLASLt header
// (CUBLAS_VERSION >= 12.9 defines the scale modes), the loaded library
// (cublasLtGetVersion) and the device's compute capability, each queried once.
absl::Status BlockScaledGemmSupport(int device);

// kernels::MicroScaledGemmSupport for CUDA device `device` (MXFP8's VEC32_UE8M0 and
// NVFP4's VEC16_UE4M3 modes: cuBLAS headers and library >= 12.8, compute capability 10.0+,
// not turned off by TESERVE_NATIVE_MICROSCALED_GEMM=0), each queried once.
absl::Status MicroScaledGemmSupport(int device);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

// Frees the cuBLASLt workspace of (device, stream), if one was made; the stream must be
// idle (kernels::DeviceStream calls this after its final synchronization).
void ReleaseGemmWorkspace(int device_index, void* stream);
// Workspaces alive (tests).
int64_t GemmWorkspaceCount();

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_GEMM_GEMM_CUDA_H_
