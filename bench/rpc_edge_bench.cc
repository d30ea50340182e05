// The RPC edge of a GPU session: a request tensor from its wire bytes to the device
// (server/tensor_codec.h's decode, then the copy a session makes) and a result from the
// device back to host memory, with the host side in ordinary (pageable) memory against
// page-locked memory (Tensor::EmptyPinnedHost, what a GPU server uses). FP32 [R, C] from
// --shapes (16384x8192 = 512 MiB by default) and BF16 wire bytes of the same shape
// (widened while decoding). Median wall time of --iters rounds after --warmup; prints a
// table (ms and GB/s of the device copy's bytes).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/bench_status.h"
#include "bench/bench_util.h"
#include "client/client.h"
#include "core/context.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "server/tensor_codec.h"

namespace teserve {
namespace bench {
namespace {

template <typename Body>
double MedianMs(const Flags& flags, Body body) {
  std::vector<double> ms;
  for (int i = 0; i < flags.warmup + flags.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= flags.warmup) ms.push_back(took);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  const GpuStream gpu;
  const Context& ctx = gpu.context();
  std::printf("| tensor | step | pageable ms | pinned ms | pageable / pinned |\n|---|---|---|---|---|\n");
  for (const auto& [rows, cols] : flags.shapes) {
    const std::vector<float> values(static_cast<size_t>(rows * cols), 0.5f);
    for (const v1::DType wire_dtype : {v1::FLOAT32, v1::BFLOAT16}) {
      v1::Tensor wire = client::MakeFloatTensor(values, {rows, cols});
      if (wire_dtype == v1::BFLOAT16) {
        std::string bytes(values.size() * 2, '\0');
        for (size_t i = 0; i < values.size(); ++i) {
          const uint16_t code = FloatToBf16(values[i]);
          std::memcpy(&bytes[2 * i], &code, sizeof(code));
        }
        wire.set_dtype(v1::BFLOAT16);
        wire.set_data(std::move(bytes));
      }
      const char* name = wire_dtype == v1::FLOAT32 ? "FP32" : "BF16";
      auto in = [&](server::HostMemory memory) {
        const Tensor host = OrDie(server::DecodeFloatTensor(wire, "inputs[0]", memory), "decode");
        OrDie(kernels::CopyTo(ctx, host, ctx.device), "to the device");
      };
      const double in_pageable = MedianMs(flags, [&] { in(server::HostMemory::kPageable); });
      const double in_pinned = MedianMs(flags, [&] { in(server::HostMemory::kPinned); });
      std::printf("| %s [%lld, %lld] | decode + copy in | %.2f | %.2f | %.2fx |\n", name, static_cast<long long>(rows),
                  static_cast<long long>(cols), in_pageable, in_pinned, in_pageable / in_pinned);
    }
    const Tensor device =
        OrDie(kernels::CopyTo(ctx, OrDie(Tensor::FromFloats(values, {rows, cols}), "host"), ctx.device), "device");
    const double out_pageable = MedianMs(flags, [&] { OrDie(kernels::CopyTo(ctx, device, Device::Cpu()), "out"); });
    const double out_pinned = MedianMs(flags, [&] {
      Tensor host = OrDie(Tensor::EmptyPinnedHost(DType::kFloat32, device.shape()), "pinned");
      Check(kernels::CopyInto(ctx, device, &host), "out");
    });
    std::printf("| FP32 [%lld, %lld] | copy out | %.2f | %.2f | %.2fx |\n", static_cast<long long>(rows),
                static_cast<long long>(cols), out_pageable, out_pinned, out_pageable / out_pinned);
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace teserve

int main(int argc, char** argv) { return teserve::bench::Main(argc, argv); }
