#include "kernels/dispatch.h"

#include "absl/strings/str_cat.h"

namespace teserve {
namespace kernels {

absl::Status NoKernel(absl::string_view op, const Device& device, NoKernelReason reason) {
  return absl::UnimplementedError(
      absl::StrCat(op, " has no kernel for ", device.ToString(), " (", reason.text, ")"));
}

}  // namespace kernels
}  // namespace teserve
