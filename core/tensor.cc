#include "core/tensor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/status.h"

namespace teserve {
namespace {

class CpuAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes, int, void*, bool zero) override {
    const size_t size = static_cast<size_t>(bytes > 0 ? bytes : 1);
    void* ptr = zero ? std::calloc(size, 1) : std::malloc(size);
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    return ptr;
  }
  void Deallocate(void* ptr, int, void*) override { std::free(ptr); }
  absl::Status Copy(void* dst, const void* src, int64_t bytes, int, void*) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
};

Allocator*& AllocatorSlot(DeviceType type) {
  static Allocator* cpu = new CpuAllocator();
  static Allocator* cuda = nullptr;
  return type == DeviceType::kCpu ? cpu : cuda;
}

std::atomic<Allocator*>& PinnedHostSlot() {
  static std::atomic<Allocator*> pinned{nullptr};
  return pinned;
}

}  // namespace

std::string Device::ToString() const {
  return type == DeviceType::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  int index = 0;
  if (absl::ConsumePrefix(&text, "cuda:") && absl::SimpleAtoi(text, &index) && index >= 0) {
    return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: expected cpu, cuda or cuda:N, got '", text, "'"));
}

void RegisterAllocator(DeviceType type, Allocator* allocator) { AllocatorSlot(type) = allocator; }

void RegisterPinnedHostAllocator(Allocator* allocator) { PinnedHostSlot().store(allocator); }

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape, absl::string_view field) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: expected a non-negative dimension, got ", d));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": expected an element count that fits in int64, got ", ShapeToString(shape),
          " (overflows at dimension ", i, ")"));
    }
    n *= d;
  }
  return n;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Tensor> Tensor::Allocate(DType dtype, Shape shape, Device device, void* stream, bool zero) {
  Allocator* allocator = AllocatorSlot(device.type);
  if (allocator == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no allocator for device ", device.ToString(), " (built without CUDA?)"));
  }
  return AllocateWith(allocator, dtype, std::move(shape), device, stream, zero);
}

absl::StatusOr<Tensor> Tensor::EmptyPinnedHost(DType dtype, Shape shape) {
  Allocator* pinned = PinnedHostSlot().load();
  if (pinned != nullptr) {
    absl::StatusOr<Tensor> t = AllocateWith(pinned, dtype, shape, Device::Cpu(), nullptr, /*zero=*/false);
    if (t.ok() || !absl::IsResourceExhausted(t.status())) return t;
  }
  return Empty(dtype, std::move(shape), Device::Cpu(), nullptr);
}

absl::StatusOr<Tensor> Tensor::AllocateWith(Allocator* allocator, DType dtype, Shape shape, Device device,
                                            void* stream, bool zero) {
  ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
  ASSIGN_OR_RETURN(int64_t nbytes, DTypeStorageBytes(dtype, numel));
  ASSIGN_OR_RETURN(void* ptr, allocator->Allocate(nbytes, device.index, stream, zero));
  Tensor t;
  const int index = device.index;
  t.buffer_ = std::shared_ptr<void>(
      ptr, [allocator, index, stream](void* p) { allocator->Deallocate(p, index, stream); });
  t.data_ = ptr;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = numel;
  t.nbytes_ = nbytes;
  t.device_ = device;
  t.defined_ = true;
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape, Device device) {
  return Allocate(dtype, std::move(shape), device, /*stream=*/nullptr, /*zero=*/true);
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, Shape shape, Device device, void* stream) {
  return Allocate(dtype, std::move(shape), device, stream, /*zero=*/false);
}

absl::StatusOr<Tensor> Tensor::ZerosOn(DType dtype, Shape shape, Device device, void* stream) {
  return Allocate(dtype, std::move(shape), device, stream, /*zero=*/true);
}

Tensor Tensor::Borrow(void* data, DType dtype, Shape shape, Device device) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.numel_ = 1;
  for (int64_t d : shape) t.numel_ *= d;
  t.nbytes_ = (t.numel_ * DTypeBits(dtype) + 7) / 8;
  t.shape_ = std::move(shape);
  t.device_ = device;
  t.defined_ = true;
  return t;
}

absl::StatusOr<Tensor> Tensor::FromFloats(absl::Span<const float> values, Shape shape) {
  ASSIGN_OR_RETURN(Tensor t, Zeros(DType::kFloat32, std::move(shape)));
  if (t.numel() != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("FromFloats: shape ", ShapeToString(t.shape()),
                                                   " holds ", t.numel(), " elements, got ",
                                                   values.size(), " values"));
  }
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

void Tensor::CheckOnHost(const char* accessor) const {
  if (device_.is_cpu()) return;
  std::fprintf(stderr, "teserve: Tensor::%s() on a %s tensor %s: host accessors need a CPU tensor\n", accessor,
               device_.ToString().c_str(), ShapeToString(shape_).c_str());
  std::abort();
}

absl::Span<const float> Tensor::floats() const {
  CheckOnHost("floats");
  if (dtype_ != DType::kFloat32 || data_ == nullptr) return {};
  return absl::Span<const float>(data<float>(), numel_);
}

absl::Span<float> Tensor::mutable_floats() {
  CheckOnHost("mutable_floats");
  if (dtype_ != DType::kFloat32 || data_ == nullptr) return {};
  return absl::Span<float>(data<float>(), numel_);
}

absl::StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
  if (numel != numel_) {
    return absl::InvalidArgumentError(absl::StrCat("reshape: expected ", numel_, " elements (",
                                                   ShapeToString(shape_), "), got ", numel, " (",
                                                   ShapeToString(shape), ")"));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

absl::StatusOr<Tensor> Tensor::As2D() const {
  if (rank() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("expected a tensor of rank >= 1, got shape ",
                                                   ShapeToString(shape_)));
  }
  int64_t rows = 1;
  for (int i = 0; i + 1 < rank(); ++i) rows *= shape_[i];  // keeps rows when cols is 0
  return Reshape({rows, shape_.back()});
}

absl::StatusOr<Tensor> Tensor::Clone(void* stream) const {
  ASSIGN_OR_RETURN(Tensor t, Allocate(dtype_, shape_, device_, stream, /*zero=*/false));
  if (nbytes_ > 0) {
    RETURN_IF_ERROR(AllocatorSlot(device_.type)->Copy(t.raw_data(), data_, nbytes_, device_.index, stream));
  }
  return t;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

}  // namespace teserve
