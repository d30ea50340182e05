// How a checked entry point of //kernels runs an op on the Context's device, and the
// one answer for "this op has no kernel for this device".
//
// After its metadata checks, an entry point ends in Dispatch:
//
//   return Dispatch("Amax", ctx,
//                   [&] { return cpu::Amax(ctx, x); },
//                   TESERVE_CUDA_KERNEL([&] { return cuda::Amax(ctx, x); }));
//
//   return Dispatch("Gemm", ctx, [&] { return cpu::Gemm(ctx, ...); }, kNoCudaKernel);
//
// CPU contexts run the first callable; every other context runs the second.
// TESERVE_CUDA_KERNEL(callable) is the callable in builds with the CUDA backend
// (TESERVE_WITH_CUDA from //tools/cuda:config) and kNoCudaBackend in CPU-only builds,
// where the cuda:: functions are not even declared: the preprocessor drops the call.
// kNoCudaKernel marks an op that has only the CPU reference in every build.
//
// Either marker answers NoKernel: UNIMPLEMENTED "<op> has no kernel for <device>
// (<reason>)", e.g. "Gemm has no kernel for cuda:0 (only the CPU reference exists)" or
// "Amax has no kernel for cuda:0 (teserve was built without CUDA)". Tests match these
// messages, so the wording is part of the contract.
#ifndef TESERVE_KERNELS_DISPATCH_H_
#define TESERVE_KERNELS_DISPATCH_H_

#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

// Why an op has no kernel on a non-CPU device; stands in for the CUDA callable.
struct NoKernelReason {
  const char* text;
};
// The op has no CUDA kernel (in any build).
inline constexpr NoKernelReason kNoCudaKernel{"only the CPU reference exists"};
// The op has a CUDA kernel, but this build has no CUDA backend (TESERVE_WITH_CUDA=0).
inline constexpr NoKernelReason kNoCudaBackend{"teserve was built without CUDA"};

// UNIMPLEMENTED "<op> has no kernel for <device> (<reason>)".
absl::Status NoKernel(absl::string_view op, const Device& device, NoKernelReason reason);

// Runs `cpu` for CPU contexts, else `cuda`: a callable, or a NoKernelReason answered by
// NoKernel(op, ctx.device, reason). Both callables take no arguments; the result type is
// the CPU callable's (absl::Status or absl::StatusOr<T>), and the CUDA callable's result
// must convert to it.
template <typename CpuFn, typename CudaFn>
std::invoke_result_t<CpuFn&> Dispatch(absl::string_view op, const Context& ctx, CpuFn&& cpu,
                                      CudaFn&& cuda) {
  if (ctx.device.is_cpu()) return cpu();
  if constexpr (std::is_same_v<std::decay_t<CudaFn>, NoKernelReason>) {
    return NoKernel(op, ctx.device, cuda);
  } else {
    return cuda();
  }
}

}  // namespace kernels
}  // namespace teserve

// The CUDA callable of a Dispatch, or kNoCudaBackend in CPU-only builds (the argument,
// which names cuda:: functions, is then not compiled). Variadic so that commas inside
// the lambda need no extra parentheses.
#if TESERVE_WITH_CUDA
#define TESERVE_CUDA_KERNEL(...) __VA_ARGS__
#else
#define TESERVE_CUDA_KERNEL(...) ::teserve::kernels::kNoCudaBackend
#endif

#endif  // TESERVE_KERNELS_DISPATCH_H_
