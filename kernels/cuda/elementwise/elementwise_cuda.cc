#include "kernels/cuda/elementwise/elementwise_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise/elementwise_kernels.h"
#include "kernels/cuda/device_entry.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status AddInto(const Context& ctx, const Tensor& x, Tensor* into) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAddInto(x.data<float>(), x.numel(), into->data<float>(), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status Scale(const Context& ctx, float factor, Tensor* x) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchScale(factor, x->numel(), x->data<float>(), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::StatusOr<double> SumOfSquares(const Context& ctx, absl::Span<const Tensor> tensors) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  if (tensors.empty()) return 0.0;
  const int64_t count = static_cast<int64_t>(tensors.size()) * kSumOfSquaresBlocks;
  // partials[count] then the total, in one stream-ordered scratch buffer.
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty(DType::kInt64, {count + 1}, ctx.device, ctx.stream));
  double* partials = static_cast<double*>(scratch.raw_data());
  for (size_t i = 0; i < tensors.size(); ++i) {
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchSumOfSquaresPartials(tensors[i].data<float>(), tensors[i].numel(),
                                                            partials + i * kSumOfSquaresBlocks, StreamOf(ctx)));
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchSumPartials(partials, count, partials + count, StreamOf(ctx)));
  double sum = 0.0;
  TESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum, partials + count, sizeof(sum), cudaMemcpyDeviceToHost, StreamOf(ctx)));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));
  return sum;
}

absl::Status FillZero(const Context& ctx, Tensor* x) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  if (x->nbytes() == 0) return absl::OkStatus();
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x->raw_data(), 0, static_cast<size_t>(x->nbytes()), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status CopyInto(const Context& ctx, const Tensor& src, Tensor* dst) {
  const Device device = src.device().is_cpu() ? dst->device() : src.device();
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  if (src.nbytes() == 0) return absl::OkStatus();
  // cudaMemcpyDefault: unified addressing tells the direction from the pointers.
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->raw_data(), src.raw_data(), static_cast<size_t>(src.nbytes()),
                                               cudaMemcpyDefault, StreamOf(ctx)));
  if (src.device().is_cpu() || dst->device().is_cpu()) {
    TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(ctx)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CopyTo(const Context& ctx, const Tensor& t, Device device) {
  // Entering the device registers the allocator the new tensor comes from.
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.is_cpu() ? t.device().index : device.index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t.dtype(), t.shape(), device, ctx.stream));
  RETURN_IF_ERROR(CopyInto(ctx, t, &out));
  return out;
}

namespace {

// Page-locked host memory for CopyManyInto's staging (cudaMemcpyAsync from or to
// pageable memory is staged by the driver and waits, one copy at a time).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(cudaStream_t stream) : stream_(stream) {}
  ~PinnedBuffer() {
    if (data_ == nullptr) return;
    // After an error copies into or out of it may still be queued: they finish first.
    cudaStreamSynchronize(stream_);
    cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // False when no page-locked memory could be had (then the destructor does nothing).
  bool Allocate(size_t bytes) {
    if (cudaMallocHost(&data_, bytes) == cudaSuccess) return true;
    data_ = nullptr;
    return false;
  }
  char* data() const { return static_cast<char*>(data_); }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
};

// One host <-> device copy of a batch.
struct HostCopy {
  char* dst;
  const char* src;
  size_t bytes;
};

// Moves `copies` (all device-to-host when to_host, else all host-to-device) through one
// pinned staging buffer: a chunk is up to chunk_bytes of consecutive copies
// (a copy larger than the room left is split across chunks), enqueued on `stream` as one
// cudaMemcpyAsync per piece and waited for once.
absl::Status StagedCopies(const std::vector<HostCopy>& copies, bool to_host, size_t chunk_bytes,
                          cudaStream_t stream) {
  size_t total = 0;
  for (const HostCopy& c : copies) total += c.bytes;
  if (total == 0) return absl::OkStatus();
  const size_t capacity = std::min(total, chunk_bytes);
  PinnedBuffer staging(stream);
  if (!staging.Allocate(capacity)) {
    // No page-locked memory to be had (a locked-memory limit): the copies still happen,
    // one synchronous copy each, as CopyInto makes them.
    cudaGetLastError();
    for (const HostCopy& c : copies) {
      TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c.dst, c.src, c.bytes, to_host ? cudaMemcpyDeviceToHost
                                                                                : cudaMemcpyHostToDevice,
                                                   stream));
      TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    }
    return absl::OkStatus();
  }
  struct Piece {
    char* host;      // the host side: dst (to_host) or src
    size_t offset;   // in staging
    size_t bytes;
  };
  std::vector<Piece> pieces;
  size_t next = 0;   // copies[next] is the first not fully staged
  size_t done = 0;   // bytes of copies[next] already staged
  while (next < copies.size()) {
    pieces.clear();
    size_t fill = 0;
    while (next < copies.size() && fill < capacity) {
      const HostCopy& c = copies[next];
      const size_t take = std::min(c.bytes - done, capacity - fill);
      if (take > 0) {
        if (to_host) {
          TESERVE_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(staging.data() + fill, c.src + done, take, cudaMemcpyDeviceToHost, stream));
          pieces.push_back(Piece{c.dst + done, fill, take});
        } else {
          std::memcpy(staging.data() + fill, c.src + done, take);
          TESERVE_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(c.dst + done, staging.data() + fill, take, cudaMemcpyHostToDevice, stream));
        }
      }
      fill += take;
      done += take;
      if (done == c.bytes) {
        ++next;
        done = 0;
      }
    }
    // The one wait of this chunk: its bytes have landed (to_host) or the staging buffer
    // may be refilled (to the device).
    TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    for (const Piece& p : pieces) std::memcpy(p.host, staging.data() + p.offset, p.bytes);
  }
  return absl::OkStatus();
}

// Device-to-host batches through a device staging buffer as well: per chunk, the pieces
// of at least kDirectPieceBytes are copied into it with cudaMemcpyAsync (device to
// device), the smaller ones by one gather launch (their table goes over first), then the
// whole chunk comes over in one device-to-host copy and is unpacked after the chunk's one
// wait. So a snapshot of a deep model's ~10^5 small tensors costs a few launches per chunk
// instead of a cudaMemcpyAsync each (microseconds of host time apiece). Pieces start at
// 16-byte offsets of the chunk, so a tensor split across chunks keeps its alignment.
// Returns false, having copied nothing, when the chunk is too small for that layout or a
// staging buffer cannot be had (then StagedCopies does the work).
constexpr size_t kDirectPieceBytes = size_t{256} << 10;
constexpr size_t kMaxGatherPieces = size_t{1} << 16;
constexpr size_t kGatherAlign = 16;
constexpr size_t kMinGatherChunk = size_t{1} << 16;

size_t AlignUp(size_t n) { return (n + kGatherAlign - 1) / kGatherAlign * kGatherAlign; }

absl::StatusOr<bool> GatheredCopiesToHost(const Context& ctx, Device device, const std::vector<HostCopy>& copies,
                                          size_t chunk_bytes) {
  if (chunk_bytes < kMinGatherChunk) return false;
  const cudaStream_t stream = StreamOf(ctx);
  size_t total = 0;
  for (const HostCopy& c : copies) total += AlignUp(c.bytes);
  if (total == 0) return true;
  const size_t capacity = std::min(total, chunk_bytes / kGatherAlign * kGatherAlign);
  PinnedBuffer staging(stream);
  PinnedBuffer table(stream);
  if (!staging.Allocate(capacity) || !table.Allocate(kMaxGatherPieces * sizeof(GatherPiece))) {
    cudaGetLastError();
    return false;
  }
  absl::StatusOr<Tensor> device_staging =
      Tensor::Empty(DType::kBool, {static_cast<int64_t>(capacity)}, device, ctx.stream);
  absl::StatusOr<Tensor> device_table = Tensor::Empty(
      DType::kInt64, {static_cast<int64_t>(kMaxGatherPieces * sizeof(GatherPiece) / sizeof(int64_t))}, device,
      ctx.stream);
  if (!device_staging.ok() || !device_table.ok()) {
    cudaGetLastError();
    return false;
  }
  char* dstage = static_cast<char*>(device_staging->raw_data());
  GatherPiece* host_table = reinterpret_cast<GatherPiece*>(table.data());
  struct Piece {
    char* host;
    size_t offset;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  size_t next = 0;  // copies[next] is the first not fully staged
  size_t done = 0;  // bytes of copies[next] already staged
  while (next < copies.size()) {
    pieces.clear();
    size_t fill = 0;
    size_t gathers = 0;
    while (next < copies.size() && fill < capacity && gathers < kMaxGatherPieces) {
      const HostCopy& c = copies[next];
      const size_t take = std::min(c.bytes - done, capacity - fill);
      if (take >= kDirectPieceBytes) {
        TESERVE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dstage + fill, c.src + done, take, cudaMemcpyDeviceToDevice, stream));
      } else if (take > 0) {
        host_table[gathers++] = GatherPiece{c.src + done, fill, take};
      }
      if (take > 0) pieces.push_back(Piece{c.dst + done, fill, take});
      fill = std::min(capacity, AlignUp(fill + take));
      done += take;
      if (done == c.bytes) {
        ++next;
        done = 0;
      }
    }
    if (gathers > 0) {
      GatherPiece* pieces_on_device = reinterpret_cast<GatherPiece*>(device_table->raw_data());
      TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pieces_on_device, host_table, gathers * sizeof(GatherPiece),
                                                   cudaMemcpyHostToDevice, stream));
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchGather(pieces_on_device, static_cast<int64_t>(gathers), dstage, stream));
    }
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging.data(), dstage, fill, cudaMemcpyDeviceToHost, stream));
    // The chunk's one wait: its bytes have landed and the table may be refilled.
    TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    for (const Piece& p : pieces) std::memcpy(p.host, staging.data() + p.offset, p.bytes);
  }
  return true;
}

}  // namespace

absl::Status CopyManyInto(const Context& ctx, Device device, absl::Span<const Tensor* const> srcs,
                          absl::Span<Tensor* const> dsts, int64_t chunk_bytes) {
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  const cudaStream_t stream = StreamOf(ctx);
  std::vector<HostCopy> to_host;
  std::vector<HostCopy> to_device;
  for (size_t i = 0; i < srcs.size(); ++i) {
    const Tensor& src = *srcs[i];
    Tensor& dst = *dsts[i];
    const size_t bytes = static_cast<size_t>(src.nbytes());
    if (bytes == 0 || src.raw_data() == dst.raw_data()) continue;
    const HostCopy copy{static_cast<char*>(dst.raw_data()), static_cast<const char*>(src.raw_data()), bytes};
    if (src.device().is_cpu() && dst.device().is_cpu()) {
      std::memcpy(copy.dst, copy.src, bytes);
    } else if (dst.device().is_cpu()) {
      to_host.push_back(copy);
    } else if (src.device().is_cpu()) {
      to_device.push_back(copy);
    } else {
      TESERVE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(copy.dst, copy.src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }
  ASSIGN_OR_RETURN(const bool gathered,
                   GatheredCopiesToHost(ctx, device, to_host, static_cast<size_t>(chunk_bytes)));
  if (!gathered) RETURN_IF_ERROR(StagedCopies(to_host, /*to_host=*/true, static_cast<size_t>(chunk_bytes), stream));
  RETURN_IF_ERROR(StagedCopies(to_device, /*to_host=*/false, static_cast<size_t>(chunk_bytes), stream));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> CopyManyTo(const Context& ctx, absl::Span<const Tensor* const> tensors,
                                               Device device, int64_t chunk_bytes) {
  // Entering the device registers the allocator the new tensors come from.
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor* t : tensors) {
    ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(t->dtype(), t->shape(), device, ctx.stream));
    out.push_back(std::move(copy));
  }
  std::vector<Tensor*> dsts;
  dsts.reserve(out.size());
  for (Tensor& t : out) dsts.push_back(&t);
  RETURN_IF_ERROR(CopyManyInto(ctx, device, tensors, dsts, chunk_bytes));
  return out;
}

absl::Status CopyColumns(const Context& ctx, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  // One strided 2-D copy: rows of `cols` elements between the two row pitches.
  const size_t bytes = static_cast<size_t>(DTypeBits(src.dtype()) / 8);
  const char* from = static_cast<const char*>(src.raw_data()) + src_col * bytes;
  char* to = static_cast<char*>(dst->raw_data()) + dst_col * bytes;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(to, dst->dim(1) * bytes, from, src.dim(1) * bytes, cols * bytes,
                                                 static_cast<size_t>(src.dim(0)), cudaMemcpyDeviceToDevice,
                                                 StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                            const ResidualDropout& dropout, Tensor* out) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchBiasDropoutAdd(h.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                                                    residual.data<float>(), h.numel(), h.shape().back(), dropout,
                                                    out->data<float>(), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status DropoutScale(const Context& ctx, const ResidualDropout& dropout, Tensor* x) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchDropoutScale(dropout, x->numel(), x->shape().back(), x->data<float>(), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context& ctx, const Tensor& x, float eps) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  L2NormForwardOutputs out;
  ASSIGN_OR_RETURN(out.y, Tensor::Empty(DType::kFloat32, x.shape(), ctx.device, ctx.stream));
  ASSIGN_OR_RETURN(out.rsigma, Tensor::Empty(DType::kFloat32, {x.dim(0)}, ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchL2NormForward(x.data<float>(), x.dim(0), x.dim(1), eps, out.y.data<float>(),
                                                   out.rsigma.data<float>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> L2NormalizationBackward(const Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(DType::kFloat32, x.shape(), ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchL2NormBackward(dy.data<float>(), x.data<float>(), rsigma.data<float>(), x.dim(0),
                                                    x.dim(1), dx.data<float>(), StreamOf(ctx)));
  return dx;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
