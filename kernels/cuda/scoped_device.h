// ScopedDevice: makes a CUDA device current for a scope and restores the previous one,
// so ops on "cuda:N" tensors never leave the caller's thread pointed elsewhere.
#ifndef TESERVE_KERNELS_CUDA_SCOPED_DEVICE_H_
#define TESERVE_KERNELS_CUDA_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

namespace teserve {
namespace kernels {
namespace cuda {

class ScopedDevice {
 public:
  explicit ScopedDevice(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == index ? cudaSuccess : cudaSetDevice(index);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  // Movable so EnterDevice (device_entry.h) can hand the guard to its caller; the
  // moved-from guard restores nothing.
  ScopedDevice(ScopedDevice&& other) noexcept : previous_(other.previous_), status_(other.status_) {
    other.previous_ = -1;
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ScopedDevice& operator=(ScopedDevice&&) = delete;

  // cudaSuccess, or why the device could not be made current.
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SCOPED_DEVICE_H_
