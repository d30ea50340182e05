#include "kernels/cuda/gemm/gemm_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"

// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F appeared in cuBLAS 12.9.
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
#define TESERVE_CUBLASLT_BLOCK_SCALING 1
#else
#define TESERVE_CUBLASLT_BLOCK_SCALING 0
#endif
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 (MXFP8), VEC16_UE4M3 and CUDA_R_4F_E2M1 (NVFP4)
// appeared in cuBLAS 12.8.
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
#define TESERVE_CUBLASLT_MXFP8 1
#else
#define TESERVE_CUBLASLT_MXFP8 0
#endif

// Turns a failed cuBLASLt call into a Status naming the statement, file and line.
#define TESERVE_CUBLAS_RETURN_IF_ERROR(statement)                                          \
  do {                                                                                     \
    const cublasStatus_t teserve_cublas_status_ = (statement);                             \
    if (teserve_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      return ::teserve::kernels::cuda::CublasErrorToStatus(teserve_cublas_status_,         \
                                                           #statement, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status CublasErrorToStatus(cublasStatus_t status, const char* statement, const char* file,
                                 int line) {
  const std::string message = absl::StrCat("cuBLASLt error ", cublasLtGetStatusName(status), " (",
                                           cublasLtGetStatusString(status), ") in `", statement,
                                           "` at ", file, ":", line);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

struct HandleDeleter {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using Preference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

absl::StatusOr<cudaDataType_t> CudaType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kFloat8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2:
      return CUDA_R_8F_E5M2;
#if TESERVE_CUBLASLT_MXFP8
    case DType::kFloat4E2M1:
      return CUDA_R_4F_E2M1;
#endif
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Gemm: no cuBLASLt type for ", DTypeName(dtype)));
  }
}

cublasLtEpilogue_t LtEpilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGeluBGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kBGradB:
      return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by the
// alignment its preference is told, so it is part of the cache key.
uint32_t AlignmentOf(const void* ptr) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  uint32_t alignment = 256;
  while (alignment > 1 && (p % alignment) != 0) alignment /= 2;
  return alignment;
}

// What the heuristic's choice depends on.
struct ProblemKey {
  int device;
  int64_t m, n, k;
  int a_type, b_type, d_type, bias_type;
  bool transpose_a, transpose_b, fast_accumulation, has_beta, has_amax;
  int epilogue;
  uint32_t align_a, align_b, align_d;
  int a_scale_mode, b_scale_mode;

  auto Tie() const {
    return std::tie(device, m, n, k, a_type, b_type, d_type, bias_type, transpose_a, transpose_b,
                    fast_accumulation, has_beta, has_amax, epilogue, align_a, align_b, align_d, a_scale_mode,
                    b_scale_mode);
  }
  bool operator<(const ProblemKey& other) const { return Tie() < other.Tie(); }
};

// Process-wide cuBLASLt state: handles, workspaces and chosen algorithms. Everything
// here is created once and kept for the life of the process.
class LtState {
 public:
  static LtState& Get() {
    static LtState* state = new LtState();
    return *state;
  }

  absl::StatusOr<cublasLtHandle_t> Handle(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second.get();
    cublasLtHandle_t handle = nullptr;
    TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
    handles_[device].reset(handle);
    return handle;
  }

  absl::StatusOr<void*> Workspace(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_pair(device, stream);
    auto it = workspaces_.find(key);
    if (it != workspaces_.end()) return it->second;
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, kGemmWorkspaceBytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "Gemm: cannot allocate the ", kGemmWorkspaceBytes, "-byte cuBLASLt workspace on cuda:",
          device));
    }
    TESERVE_CUDA_RETURN_IF_ERROR(status);
    workspaces_[key] = ptr;
    return ptr;
  }

  void ReleaseWorkspace(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workspaces_.find(std::make_pair(device, stream));
    if (it == workspaces_.end()) return;
    ScopedDevice scoped(device);
    cudaFree(it->second);
    workspaces_.erase(it);
  }

  int64_t WorkspaceCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(workspaces_.size());
  }

  bool FindAlgo(const ProblemKey& key, cublasLtMatmulAlgo_t* algo) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = algos_.find(key);
    if (it == algos_.end()) return false;
    *algo = it->second;
    return true;
  }

  void StoreAlgo(const ProblemKey& key, const cublasLtMatmulAlgo_t& algo) {
    std::lock_guard<std::mutex> lock(mu_);
    algos_[key] = algo;
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, HandleDeleter>> handles_;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces_;
  std::map<ProblemKey, cublasLtMatmulAlgo_t> algos_;
};

// Candidates the heuristic is asked for; the fastest of them is kept per problem.
constexpr int kGemmAlgoCandidates = 8;
// Timed launches per candidate (after one untimed warm-up launch).
constexpr int kGemmAutotuneRuns = 3;

// TESERVE_GEMM_AUTOTUNE=1 times the heuristic's candidates (FastestAlgo); by default the
// first is kept. Off by default because a timed choice can differ between processes
// (timing noise), and with it the summation order: a restarted server would no longer
// reproduce a run bit for bit (checkpoint resume relies on that), for a gain measured at
// about 1% on Linear's FP8 GEMMs (bench/NOTES.md).
bool GemmAutotuneEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TESERVE_GEMM_AUTOTUNE");
    return v != nullptr && std::string(v) == "1";
  }();
  return enabled;
}

// TESERVE_GEMM_LOG=1 prints, once per problem, the heuristic's candidates and the
// algorithm kept (stderr): which kernel configuration a shape runs.
bool GemmLogEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TESERVE_GEMM_LOG");
    return v != nullptr && std::string(v) == "1";
  }();
  return enabled;
}

std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  // The attributes are 16- or 32-bit; cuBLASLt wants the exact size, which a first call
  // with no buffer reports.
  auto get = [&algo](cublasLtMatmulAlgoConfigAttributes_t attribute) -> int64_t {
    size_t size = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &size);
    uint64_t value = 0;
    size_t written = 0;
    if (size == 0 || size > sizeof(value) ||
        cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, size, &written) != CUBLAS_STATUS_SUCCESS) {
      return -1;
    }
    return written == 2 ? static_cast<int64_t>(value & 0xffff) : static_cast<int64_t>(value & 0xffffffff);
  };
  return absl::StrCat("id=", get(CUBLASLT_ALGO_CONFIG_ID), " tile=", get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                      " stages=", get(CUBLASLT_ALGO_CONFIG_STAGES_ID),
                      " splitk=", get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                      " swizzle=", get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                      " custom=", get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                      " cluster=", get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                      " inner=", get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID));
}

// Everything of one cublasLtMatmul call but C, D and the algorithm.
struct LtCall {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lt_a;
  const void* a;  // cuBLASLt's A (our b)
  cublasLtMatrixLayout_t lt_b;
  const void* b;  // cuBLASLt's B (our a)
  cublasLtMatrixLayout_t lt_c;
  cublasLtMatrixLayout_t lt_d;
  void* workspace;
  cudaStream_t stream;
};

// The candidate that runs this problem fastest, timed on the stream with scratch C / D
// (so the caller's D is untouched whatever beta is; the operands, bias and aux are the
// caller's, read or rewritten in full by the real call that follows). cuBLASLt's
// heuristic ranks by a model, and for large FP8 problems its first choice is not always
// the fastest kernel. Runs once per problem key; it waits for the stream, so the first
// call of each shape pays a synchronization and (1 + kGemmAutotuneRuns) launches per
// candidate. Any failure (no scratch memory, a candidate that does not launch) falls
// back to the heuristic's order.
cublasLtMatmulAlgo_t FastestAlgo(const Context& ctx, const LtCall& call, const cublasLtMatmulHeuristicResult_t* results,
                                 int found, const Tensor& d_like, void* c_fp8) {
  cublasLtMatmulAlgo_t best = results[0].algo;
  auto scratch = Tensor::Empty(d_like.dtype(), d_like.shape(), d_like.device(), ctx.stream);
  if (!scratch.ok()) return best;
  void* d = scratch->raw_data();
  void* c = c_fp8 != nullptr ? c_fp8 : d;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    cudaGetLastError();
    if (start != nullptr) cudaEventDestroy(start);
    return best;
  }
  const float alpha = 1.0f, beta = 0.0f;
  float best_ms = -1.0f;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto launch = [&] {
      return cublasLtMatmul(call.handle, call.desc, &alpha, call.a, call.lt_a, call.b, call.lt_b, &beta, c,
                            call.lt_c, d, call.lt_d, &results[i].algo, call.workspace, kGemmWorkspaceBytes,
                            call.stream);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    bool ok = cudaEventRecord(start, call.stream) == cudaSuccess;
    for (int r = 0; ok && r < kGemmAutotuneRuns; ++r) ok = launch() == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop, call.stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0.0f;
    ok = ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      continue;
    }
    if (best_ms < 0.0f || ms < best_ms) {
      best_ms = ms;
      best = results[i].algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

template <typename T>
absl::Status SetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                          const T& value) {
  TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  return absl::OkStatus();
}

// Column-major layout of a row-major [rows, cols] tensor: [cols, rows], ld = cols.
absl::StatusOr<Layout> RowMajorLayout(DType dtype, int64_t rows, int64_t cols) {
  ASSIGN_OR_RETURN(cudaDataType_t type, CudaType(dtype));
  cublasLtMatrixLayout_t layout = nullptr;
  TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&layout, type, cols, rows, cols));
  return Layout(layout);
}

absl::Status QueryBlockScaledGemmSupport(int device) {
#if TESERVE_CUBLASLT_BLOCK_SCALING
  int major = 0;
  int minor = 0;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return BlockScaledGemmSupportFor(major, minor, static_cast<int64_t>(cublasLtGetVersion()));
#else
  return absl::UnimplementedError(absl::StrCat(
      "FP8 block-scaled GEMMs need cuBLASLt >= 12.9; teserve was built against cuBLAS headers ",
#if defined(CUBLAS_VERSION)
      CUBLAS_VERSION,
#else
      "of unknown version",
#endif
      ", which lack the VEC128_32F / BLK128x128_32F scale modes"));
#endif
}

absl::Status QueryMicroScaledGemmSupport(int device) {
  const char* native = std::getenv("TESERVE_NATIVE_MICROSCALED_GEMM");
  if (native != nullptr && std::string(native) == "0") {
    return absl::UnimplementedError(
        "native MXFP8 / NVFP4 GEMMs are turned off (TESERVE_NATIVE_MICROSCALED_GEMM=0)");
  }
#if TESERVE_CUBLASLT_MXFP8
  int major = 0;
  int minor = 0;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return MicroScaledGemmSupportFor(major, minor, static_cast<int64_t>(cublasLtGetVersion()));
#else
  return absl::UnimplementedError(
      "MXFP8 / NVFP4 GEMMs need cuBLASLt >= 12.8; teserve was built against cuBLAS headers without the "
      "VEC32_UE8M0 / VEC16_UE4M3 scale modes");
#endif
}

// cuBLASLt's name for a block scale mode (int32_t, as the descriptor attribute takes it).
int32_t LtScaleMode(GemmScaleMode mode) {
  switch (mode) {
#if TESERVE_CUBLASLT_BLOCK_SCALING
    case GemmScaleMode::kBlock1D: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case GemmScaleMode::kBlock2D: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
#endif
#if TESERVE_CUBLASLT_MXFP8
    case GemmScaleMode::kMxfp8: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    case GemmScaleMode::kNvfp4_1D:
    case GemmScaleMode::kNvfp4_2D: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
#endif
    default: break;
  }
  return 0;  // CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
}

// A block-scaled operand's scales in cuBLASLt's layout: the tensor itself (kGemm) or a
// stream-ordered scratch conversion of the quantizer's layout, which `keep` holds until
// the matmul has been enqueued (the pool frees it in stream order after).
absl::StatusOr<const void*> GemmLayoutScales(const Context& ctx, const GemmOperand& operand, const char* name,
                                             Tensor* keep) {
  if (operand.scale_layout == GemmScaleLayout::kGemm) {
    if (AlignmentOf(operand.scale_inv.raw_data()) < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gemm: ", name, ".scale_inv: expected a 16-byte aligned address for kGemm block scales, got one aligned to ",
          AlignmentOf(operand.scale_inv.raw_data()), " bytes"));
    }
    return operand.scale_inv.raw_data();
  }
  if (operand.scale_mode == GemmScaleMode::kMxfp8 || operand.scale_mode == GemmScaleMode::kNvfp4_1D ||
      operand.scale_mode == GemmScaleMode::kNvfp4_2D) {
    // One-byte scales (E8M0 [R, C / 32], E4M3 [R, C / 16], or E4M3 [R / 16, C / 16] with
    // each row repeated for the 16 rows it covers) into the 128x4-tiled order of the
    // VEC32 / VEC16 modes (the kernel writes every byte, padding included).
    const int64_t rows = operand.scale_inv.dim(0);
    const int64_t cols = operand.scale_inv.dim(1);
    const int64_t repeat = operand.scale_mode == GemmScaleMode::kNvfp4_2D ? kGemmNvfp4BlockSize : 1;
    const Shape swizzled = {(rows * repeat + 127) / 128 * 128, (cols + 3) / 4 * 4};
    ASSIGN_OR_RETURN(*keep,
                     Tensor::Empty(operand.scale_inv.dtype(), swizzled, operand.scale_inv.device(), ctx.stream));
    TESERVE_CUDA_RETURN_IF_ERROR(LaunchSwizzleBlockScales(operand.scale_inv.data<uint8_t>(), rows, cols, repeat,
                                                          keep->data<uint8_t>(), StreamOf(ctx)));
    return static_cast<const void*>(keep->raw_data());
  }
  const bool two_d = operand.scale_mode == GemmScaleMode::kBlock2D;
  const int64_t rows = operand.scale_inv.dim(0);
  const int64_t cols = operand.scale_inv.dim(1);
  const int64_t out_rows = two_d ? rows : cols;
  const int64_t ld = ((two_d ? cols : rows) + 3) / 4 * 4;  // kernels/block_quantize.h's padding to 4
  // The kernel writes every entry, padding included: no fill needed.
  ASSIGN_OR_RETURN(*keep, Tensor::Empty(DType::kFloat32, {out_rows, ld}, operand.scale_inv.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchBlockScalesGemmLayout(operand.scale_inv.data<float>(), rows, cols,
                                                           /*transpose=*/!two_d, keep->data<float>(), StreamOf(ctx)));
  return static_cast<const void*>(keep->raw_data());
}

// query(device), asked once per (query, device). A failed CUDA query (not a "no") is not
// kept: it may be transient.
absl::Status CachedSupport(absl::Status (*query)(int), int device) {
  static std::mutex mu;
  static auto* answers = new std::map<std::pair<absl::Status (*)(int), int>, absl::Status>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(query, device);
  auto it = answers->find(key);
  if (it != answers->end()) return it->second;
  absl::Status status = query(device);
  if (status.ok() || absl::IsUnimplemented(status)) (*answers)[key] = status;
  return status;
}

std::string Describe(const ProblemKey& key) {
  return absl::StrCat("m=", key.m, " n=", key.n, " k=", key.k, " a=", DTypeName(static_cast<DType>(key.a_type)),
                      " b=", DTypeName(static_cast<DType>(key.b_type)),
                      " d=", DTypeName(static_cast<DType>(key.d_type)), " epilogue=", key.epilogue,
                      " scale_modes=", key.a_scale_mode, "/", key.b_scale_mode);
}

}  // namespace

absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options) {
  const int64_t m = d->dim(0);
  const int64_t n = d->dim(1);
  const int64_t k = a.transpose ? a.data.dim(0) : a.data.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  const int device = d->device().index;
  const bool block = a.scale_mode != GemmScaleMode::kPerTensor;
  if (a.scale_mode == GemmScaleMode::kMxfp8 || a.scale_mode == GemmScaleMode::kNvfp4_1D ||
      a.scale_mode == GemmScaleMode::kNvfp4_2D) {
    RETURN_IF_ERROR(MicroScaledGemmSupport(device));
  } else if (block) {
    RETURN_IF_ERROR(BlockScaledGemmSupport(device));
  }
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device));
  const cudaStream_t stream = StreamOf(ctx);
  // Codes with scales: FP8, or NVFP4's packed FP4 (the scale pointers, fast accumulation).
  const bool fp8 = IsFloat8(a.data.dtype()) || a.data.dtype() == DType::kFloat4E2M1;
  if (k == 0) {
    // cuBLASLt wants k >= 1. D = beta * D: zeros, D itself, or a scaling we do not need.
    if (options.beta == 0.0f) {
      TESERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d->raw_data(), 0, d->nbytes(), stream));
      return absl::OkStatus();
    }
    if (options.beta == 1.0f) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: k = 0 with beta = ", options.beta, " (only 0 or 1 are supported on CUDA)"));
  }

  LtState& state = LtState::Get();
  ASSIGN_OR_RETURN(cublasLtHandle_t handle, state.Handle(device));
  ASSIGN_OR_RETURN(void* workspace, state.Workspace(device, stream));

  // cuBLASLt's A is our B and its B is our A (see the header).
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MatmulDesc desc(raw_desc);
  const cublasOperation_t op_lt_a = b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a));
  RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b));
  // Block-scaled operands always run split (the checks refused kFast for them).
  const bool fast = fp8 && !block && options.accumulation == GemmAccumulation::kFast;
  Tensor a_scales_scratch, b_scales_scratch;  // converted block scales, alive until enqueued
  if (fp8) {
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(fast)));
    const void* lt_a_scale = b.scale_inv.raw_data();
    const void* lt_b_scale = a.scale_inv.raw_data();
    if (block) {
      ASSIGN_OR_RETURN(lt_a_scale, GemmLayoutScales(ctx, b, "b", &b_scales_scratch));
      ASSIGN_OR_RETURN(lt_b_scale, GemmLayoutScales(ctx, a, "a", &a_scales_scratch));
      const int32_t lt_a_mode = LtScaleMode(b.scale_mode);
      const int32_t lt_b_mode = LtScaleMode(a.scale_mode);
      RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_a_mode));
      RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_b_mode));
    }
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a_scale));
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b_scale));
    if (IsFloat8(d->dtype())) {
      const void* d_scale = options.d_scale->raw_data();
      RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale));
    }
    if (options.d_amax != nullptr) {
      void* amax = options.d_amax->raw_data();
      RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax));
    }
  }

  DType bias_dtype = d->dtype();
  RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, LtEpilogue(options.epilogue)));
  const Tensor* bias_vector = options.bias != nullptr ? options.bias : options.bias_grad;
  if (bias_vector != nullptr) {
    bias_dtype = bias_vector->dtype();
    ASSIGN_OR_RETURN(cudaDataType_t bias_type, CudaType(bias_dtype));
    const void* bias_ptr = bias_vector->raw_data();
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr));
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type));
  }
  if (options.aux != nullptr) {
    void* aux = options.aux->raw_data();
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux));
    RETURN_IF_ERROR(SetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, n));
  }

  ASSIGN_OR_RETURN(Layout lt_a, RowMajorLayout(b.data.dtype(), b.data.dim(0), b.data.dim(1)));
  ASSIGN_OR_RETURN(Layout lt_b, RowMajorLayout(a.data.dtype(), a.data.dim(0), a.data.dim(1)));
  ASSIGN_OR_RETURN(Layout lt_d, RowMajorLayout(d->dtype(), m, n));
  // An FP8 D takes a BF16 C (cuBLASLt has no FP8 C). beta is 0 then, so C is never
  // read, but C may alias D only with D's own layout: C gets a scratch matrix from the
  // stream's pool.
  ASSIGN_OR_RETURN(Layout lt_c, RowMajorLayout(IsFloat8(d->dtype()) ? DType::kBFloat16 : d->dtype(), m, n));
  Tensor c_scratch;
  void* c_ptr = d->raw_data();
  if (IsFloat8(d->dtype())) {
    ASSIGN_OR_RETURN(c_scratch, Tensor::Empty(DType::kBFloat16, {m, n}, d->device(), ctx.stream));
    c_ptr = c_scratch.raw_data();
  }

  const ProblemKey key{device,
                       m,
                       n,
                       k,
                       static_cast<int>(a.data.dtype()),
                       static_cast<int>(b.data.dtype()),
                       static_cast<int>(d->dtype()),
                       static_cast<int>(bias_dtype),
                       a.transpose,
                       b.transpose,
                       fast,
                       options.beta != 0.0f,
                       options.d_amax != nullptr,
                       static_cast<int>(options.epilogue),
                       AlignmentOf(a.data.raw_data()),
                       AlignmentOf(b.data.raw_data()),
                       AlignmentOf(d->raw_data()),
                       static_cast<int>(a.scale_mode),
                       static_cast<int>(b.scale_mode)};
  cublasLtMatmulAlgo_t algo;
  if (!state.FindAlgo(key, &algo)) {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
    Preference pref(raw_pref);
    const uint64_t workspace_bytes = kGemmWorkspaceBytes;
    TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attribute, value] : alignments) {
      TESERVE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulPreferenceSetAttribute(pref.get(), attribute, &value, sizeof(value)));
    }
    cublasLtMatmulHeuristicResult_t results[kGemmAlgoCandidates] = {};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), lt_a.get(), lt_b.get(), lt_c.get(), lt_d.get(),
                                       pref.get(), kGemmAlgoCandidates, results, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gemm: cuBLASLt has no algorithm for ", Describe(key), " (", cublasLtGetStatusString(status), ")"));
    }
    algo = results[0].algo;
    if (GemmLogEnabled()) {
      for (int i = 0; i < found; ++i) {
        std::fprintf(stderr, "teserve gemm: %s candidate %d: %s waves=%.2f\n", Describe(key).c_str(), i,
                     DescribeAlgo(results[i].algo).c_str(), results[i].wavesCount);
      }
    }
    // An FP8 D's amax is written by every run (the timing runs included); those keep
    // the heuristic's first choice.
    if (found > 1 && options.d_amax == nullptr && GemmAutotuneEnabled()) {
      const LtCall call{handle, desc.get(), lt_a.get(), b.data.raw_data(), lt_b.get(), a.data.raw_data(),
                        lt_c.get(), lt_d.get(), workspace, stream};
      algo = FastestAlgo(ctx, call, results, found, *d, IsFloat8(d->dtype()) ? c_ptr : nullptr);
    }
    if (GemmLogEnabled()) {
      std::fprintf(stderr, "teserve gemm: %s fast_accum=%d chosen: %s\n", Describe(key).c_str(), fast ? 1 : 0,
                   DescribeAlgo(algo).c_str());
    }
    state.StoreAlgo(key, algo);
  }

  const float alpha = options.alpha;
  const float beta = options.beta;
  TESERVE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle, desc.get(), &alpha, b.data.raw_data(), lt_a.get(),
                                                a.data.raw_data(), lt_b.get(), &beta, c_ptr, lt_c.get(),
                                                d->raw_data(), lt_d.get(), &algo, workspace,
                                                kGemmWorkspaceBytes, stream));
  return absl::OkStatus();
}

absl::Status BlockScaledGemmSupport(int device) { return CachedSupport(QueryBlockScaledGemmSupport, device); }

absl::Status MicroScaledGemmSupport(int device) { return CachedSupport(QueryMicroScaledGemmSupport, device); }

void ReleaseGemmWorkspace(int device_index, void* stream) {
  LtState::Get().ReleaseWorkspace(device_index, static_cast<cudaStream_t>(stream));
}

int64_t GemmWorkspaceCount() { return LtState::Get().WorkspaceCount(); }

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
