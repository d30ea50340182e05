// Checked entry points of kernels/activation.h: validate metadata (FP32 rank-2 x, even
// width for gated kinds, dy shaped like the output, clamped_swiglu params finite and
// > 0, devices; errors name the argument and say expected vs got), then run the CPU
// reference. There is no CUDA activation kernel yet, so CUDA contexts get
// UNIMPLEMENTED naming the op.
#include "kernels/activation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/cpu/activation_cpu.h"
#include "kernels/tensor_checks.h"

namespace teserve {
namespace kernels {
namespace {

struct NamedActivation {
  Activation kind;
  absl::string_view name;
  bool gated;
};

constexpr NamedActivation kActivations[] = {
    {Activation::kGelu, "gelu", false},     {Activation::kGeglu, "geglu", true},
    {Activation::kQgelu, "qgelu", false},   {Activation::kQgeglu, "qgeglu", true},
    {Activation::kRelu, "relu", false},     {Activation::kReglu, "reglu", true},
    {Activation::kSrelu, "srelu", false},   {Activation::kSreglu, "sreglu", true},
    {Activation::kSilu, "silu", false},     {Activation::kSwiglu, "swiglu", true},
    {Activation::kClampedSwiglu, "clamped_swiglu", true},
};

const NamedActivation& Find(Activation kind) {
  for (const NamedActivation& a : kActivations) {
    if (a.kind == kind) return a;
  }
  return kActivations[0];  // unreachable: every enumerator is listed
}

absl::Status CheckParams(Activation kind, const ActivationParams& params) {
  if (kind != Activation::kClampedSwiglu) return absl::OkStatus();
  RETURN_IF_ERROR(CheckFinitePositive("params.limit", params.limit));
  return CheckFinitePositive("params.alpha", params.alpha);
}

// x: FP32 [rows, cols] with cols even for gated kinds.
absl::Status CheckInput(Activation kind, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  if (IsGated(kind) && x.dim(1) % 2 != 0) {
    return InvalidField("x.shape",
                        absl::StrCat("[rows, 2k] (", ActivationName(kind), " splits the last dimension in halves)"),
                        ShapeToString(x.shape()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ActivationName(Activation kind) { return Find(kind).name; }

bool IsGated(Activation kind) { return Find(kind).gated; }

std::string ActivationNames() {
  return absl::StrJoin(kActivations, ", ",
                       [](std::string* out, const NamedActivation& a) { absl::StrAppend(out, a.name); });
}

absl::StatusOr<Activation> ParseActivation(absl::string_view name, absl::string_view field) {
  for (const NamedActivation& a : kActivations) {
    if (a.name == name) return a.kind;
  }
  return InvalidField(field, absl::StrCat("one of ", ActivationNames()), absl::StrCat("'", name, "'"));
}

absl::StatusOr<Tensor> ActivationForward(const Context& ctx, Activation kind, const ActivationParams& params,
                                         const Tensor& x) {
  RETURN_IF_ERROR(CheckInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  RETURN_IF_ERROR(CpuOnly("ActivationForward", ctx));
  return cpu::ActivationForward(ctx, kind, params, x);
}

absl::StatusOr<Tensor> ActivationBackward(const Context& ctx, Activation kind, const ActivationParams& params,
                                          const Tensor& dy, const Tensor& x) {
  RETURN_IF_ERROR(CheckInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dy", dy, DType::kFloat32,
                                     {x.dim(0), IsGated(kind) ? x.dim(1) / 2 : x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  RETURN_IF_ERROR(CpuOnly("ActivationBackward", ctx));
  return cpu::ActivationBackward(ctx, kind, params, dy, x);
}

}  // namespace kernels
}  // namespace teserve
