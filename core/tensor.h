// Tensor: shape, dtype, device and a reference-counted buffer (owned or borrowed).
// Row-major and contiguous. Copies share the buffer; Clone() copies the bytes.
#ifndef TESERVE_CORE_TENSOR_H_
#define TESERVE_CORE_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/dtype.h"

namespace teserve {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  std::string ToString() const;  // "cpu", "cuda:0"
  bool operator==(const Device& other) const {
    return type == other.type && index == other.index;
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

// Parses "cpu", "cuda" (= cuda:0) or "cuda:N".
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Memory for one device type. The CPU allocator is built in; the CUDA backend
// registers its own (kernels/cuda) so core stays free of CUDA.
//
// `stream` orders the allocation for device memory (a cudaStream_t; nullptr is the
// device's legacy default stream). The contract:
// - Allocate(..., stream, zero): memory usable by work enqueued on `stream` after the
//   call; zero-filled when `zero`, the fill ordered on `stream` as well. With a null
//   stream and `zero`, the call returns only once the zeros are written, so work on any
//   stream may use them (what Tensor::Zeros without a stream promises).
// - Deallocate(ptr, index, stream): the memory returns to the allocator once the work
//   enqueued on `stream` before the call has finished. A tensor is freed on the stream
//   it was allocated on, so a session that keeps all its work on its own stream never
//   waits on an allocation or a free.
// - Copy: `bytes` from src to dst on the same device, ordered on `stream`.
// Failures to allocate are RESOURCE_EXHAUSTED naming the bytes asked and the bytes free.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual absl::StatusOr<void*> Allocate(int64_t bytes, int device_index, void* stream, bool zero) = 0;
  virtual void Deallocate(void* ptr, int device_index, void* stream) = 0;
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes, int device_index, void* stream) = 0;
};
void RegisterAllocator(DeviceType type, Allocator* allocator);
// Page-locked host memory (the CUDA backend registers a caching one): host tensors a
// device copies from or into at full bus speed, without the driver's staging through
// its own pinned buffers. Its Allocate / Deallocate see device_index 0 and no stream;
// every host <-> device copy completes before it returns (kernels/elementwise.h), so a
// freed block may be handed out again at once.
void RegisterPinnedHostAllocator(Allocator* allocator);

using Shape = std::vector<int64_t>;

// Number of elements, failing on negative dims or int64 overflow. `field` names the
// shape in error messages ("forward.input.shape").
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape,
                                           absl::string_view field = "shape");
std::string ShapeToString(absl::Span<const int64_t> shape);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;

  // Zero-filled tensor; on a device, the zeros are written before this returns.
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape, Device device = Device::Cpu());
  // Stream-ordered (see Allocator): memory for work enqueued on `stream` (a
  // cudaStream_t on CUDA devices), returned to the allocator in that stream's order when
  // the last copy of the tensor goes. Empty leaves the contents undefined; ZerosOn fills
  // them on the stream without waiting. On the CPU both are plain allocations.
  static absl::StatusOr<Tensor> Empty(DType dtype, Shape shape, Device device, void* stream);
  static absl::StatusOr<Tensor> ZerosOn(DType dtype, Shape shape, Device device, void* stream);
  // A CPU tensor in page-locked memory when a pinned allocator is registered and has the
  // room, else in ordinary host memory (the contents are undefined either way).
  static absl::StatusOr<Tensor> EmptyPinnedHost(DType dtype, Shape shape);
  // Non-owning view of caller memory, which must outlive every copy of the tensor.
  static Tensor Borrow(void* data, DType dtype, Shape shape, Device device = Device::Cpu());
  // FP32 CPU tensor holding `values`; their count must match the shape.
  static absl::StatusOr<Tensor> FromFloats(absl::Span<const float> values, Shape shape);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }
  template <typename T>
  T* data() { return static_cast<T*>(data_); }
  template <typename T>
  const T* data() const { return static_cast<const T*>(data_); }
  // FP32 CPU contents as a span (empty for other dtypes). Host accessors: calling them
  // on a device tensor is a programming error that aborts with the tensor's device and
  // shape, never an empty span that makes a loop silently do nothing.
  absl::Span<const float> floats() const;
  absl::Span<float> mutable_floats();

  // Same buffer, new shape with the same element count.
  absl::StatusOr<Tensor> Reshape(Shape shape) const;
  // [rows, cols] view: all leading dims folded into rows.
  absl::StatusOr<Tensor> As2D() const;
  // Deep copy on the same device; a device copy is ordered on `stream` (see Allocator).
  absl::StatusOr<Tensor> Clone(void* stream = nullptr) const;

 private:
  static absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape, Device device, void* stream, bool zero);
  static absl::StatusOr<Tensor> AllocateWith(Allocator* allocator, DType dtype, Shape shape, Device device,
                                             void* stream, bool zero);
  void CheckOnHost(const char* accessor) const;

  std::shared_ptr<void> buffer_;  // keeps owned memory alive; null when borrowed
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  int64_t numel_ = 0;
  int64_t nbytes_ = 0;
  Device device_;
  bool defined_ = false;
};

// True when both tensors have the same dtype, shape and bytes.
bool BitwiseEqual(const Tensor& a, const Tensor& b);

}  // namespace teserve

#endif  // TESERVE_CORE_TENSOR_H_
