// Checkpoint write benchmark (CPU, no GPU needed): train::WriteCheckpoint of a deep
// model's state as a server's final checkpoint writes it, i.e. many small tensors in each
// group (parameters, gradients, optimizer, quantizer state). Run it under farm-bench to
// compare two builds:
//   checkpoint_write_bench DIR [TENSORS_PER_GROUP [FLOATS_PER_TENSOR]]
// (defaults 40000 and 256: ~41 MB in each of the three large groups, as a ~1300-layer
// narrow TransformerLayer stack). Writes checkpoint 'bench' into DIR (replaced each run)
// and prints the seconds the write took.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "train/checkpoint.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [TENSORS_PER_GROUP [FLOATS_PER_TENSOR]]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t count = argc > 2 ? std::atoll(argv[2]) : 40000;
  const int64_t floats = argc > 3 ? std::atoll(argv[3]) : 256;
  teserve::train::CheckpointContents contents;
  contents.state.step = 7;
  auto fill = [&](std::vector<teserve::train::NamedTensor>* group, const std::string& prefix, int64_t n,
                  int64_t size) {
    for (int64_t i = 0; i < n; ++i) {
      teserve::Tensor t = teserve::Tensor::Zeros(teserve::DType::kFloat32, {size}).value();
      for (int64_t k = 0; k < size; ++k) t.mutable_floats()[k] = static_cast<float>((i * 31 + k) % 97) * 0.01f;
      group->push_back({absl::StrCat(prefix, ".block", i, ".weight"), std::move(t)});
    }
  };
  fill(&contents.state.parameters, "model", count, floats);
  fill(&contents.state.gradients, "model", count, floats);
  fill(&contents.state.optimizer, "adamw", count, floats);
  fill(&contents.state.state, "quantizer", count / 2, 1);
  const absl::Time start = absl::Now();
  auto written = teserve::train::WriteCheckpoint(dir, "bench", contents, /*overwrite=*/true, "bench");
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    return 1;
  }
  std::printf("{\"bench\": \"checkpoint_write\", \"bytes\": %lld, \"seconds\": %.4f}\n",
              static_cast<long long>(written->bytes), seconds);
  return 0;
}
