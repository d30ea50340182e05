// Probe (not part of the build): does the size of the L2 write requests decide what a
// rowwise + columnwise FP8 output costs on the H200? The cast-transpose and LayerNorm + FP8
// kernels write their codes with 8-byte stores per lane: a rowwise store instruction makes 4
// requests of 64 bytes, a columnwise one 8 requests of 32 bytes (one sector each), while a
// BF16 output goes out as whole 128-byte lines. Both FP8 kernels spend ~16 us more than
// their BF16-output twins on the same bytes (bench/NOTES.md).
//
// A 128 x 128 tile per 256-thread block, 8 rows x 8 columns per thread (16-byte loads of BF16
// x, the cast-transpose kernel's lane layout), the "code" of a value its high byte (one byte
// permute: the memory pattern without the encoder). Modes:
//   0 direct   rowwise 8-byte stores (64-byte runs), columnwise 8-byte stores (32-byte runs):
//              the kernels' pattern
//   1 col-line rowwise direct, columnwise staged in shared memory and stored as whole lines
//   2 lines    both staged, both stored as whole lines (16 bytes per lane, 8 lanes a line)
//   3 rowwise  rowwise direct only (half the writes)
//   4 copy     BF16 x to a BF16 y, 16-byte stores (the same bytes as modes 0-2)
// Each mode runs at the occupancy the kernel gets and at 2 blocks per SM (16 warps, the
// LayerNorm kernel's compute warps), set by padding the dynamic shared memory.
// Build: nvcc -O3 -arch=sm_90a -o write_granularity_probe bench/probes/write_granularity_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

constexpr int kThreads = 256;
constexpr int kTile = 128;

// 4 x 4 byte transpose: out[i] byte k = in[k] byte i.
__device__ __forceinline__ void Transpose4x4(const uint32_t in[4], uint32_t out[4]) {
  const uint32_t a0 = __byte_perm(in[0], in[1], 0x5140), a1 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t b0 = __byte_perm(in[2], in[3], 0x5140), b1 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(a0, b0, 0x5410);
  out[1] = __byte_perm(a0, b0, 0x7632);
  out[2] = __byte_perm(a1, b1, 0x5410);
  out[3] = __byte_perm(a1, b1, 0x7632);
}

// Shared tiles are 128 lines of 16 8-byte units; unit u of line l sits at u ^ swz, where swz
// spreads the staging writes of one warp instruction over all banks (2 wavefronts for 256
// bytes) and keeps unit pairs (16-byte chunks) together for the line reads.
__device__ __forceinline__ int RowSwizzle(int row) { return ((row / 8) % 4) * 4; }
__device__ __forceinline__ int ColSwizzle(int col) { return ((col / 8) % 4) * 4; }

template <int kMode>
__global__ void __launch_bounds__(kThreads) Probe(const uint16_t* __restrict__ x, uint8_t* __restrict__ rowwise,
                                                  uint8_t* __restrict__ columnwise, uint16_t* __restrict__ y,
                                                  int64_t rows, int64_t cols) {
  extern __shared__ uint2 smem[];  // [0, 2048): rowwise tile, [2048, 4096): columnwise tile
  const int tiles_across = static_cast<int>(cols / kTile);
  const int64_t tile_r = static_cast<int64_t>(blockIdx.x / tiles_across) * kTile;
  const int64_t tile_c = static_cast<int64_t>(blockIdx.x % tiles_across) * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int down = lane / 8, across = lane % 8;
  const int lr = (warp % 4) * 32 + down * 8;  // first of this thread's 8 rows in the tile
  const int lc = (warp / 4) * 64 + across * 8;  // first of its 8 columns
  const uint4* src = reinterpret_cast<const uint4*>(x + (tile_r + lr) * cols + tile_c + lc);
  uint4 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = src[k * cols / 8];

  if constexpr (kMode == 4) {
    uint4* dst = reinterpret_cast<uint4*>(y + (tile_r + lr) * cols + tile_c + lc);
#pragma unroll
    for (int k = 0; k < 8; ++k) dst[k * cols / 8] = v[k];
    return;
  }
  uint32_t lo[8], hi[8];  // codes of columns 0-3 / 4-7 of row k
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    lo[k] = __byte_perm(v[k].x, v[k].y, 0x7531);
    hi[k] = __byte_perm(v[k].z, v[k].w, 0x7531);
  }
  // Rowwise.
  if constexpr (kMode == 2) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int row = lr + k;
      smem[row * 16 + ((lc / 8) ^ RowSwizzle(row))] = make_uint2(lo[k], hi[k]);
    }
  } else {
    uint8_t* out = rowwise + (tile_r + lr) * cols + tile_c + lc;
#pragma unroll
    for (int k = 0; k < 8; ++k) *reinterpret_cast<uint2*>(out + k * cols) = make_uint2(lo[k], hi[k]);
  }
  if constexpr (kMode == 3) return;
  // Columnwise: column lc + e, rows lr .. lr + 7.
  uint32_t top[8], bottom[8];
  Transpose4x4(lo, top);
  Transpose4x4(hi, top + 4);
  Transpose4x4(lo + 4, bottom);
  Transpose4x4(hi + 4, bottom + 4);
  if constexpr (kMode == 0) {
    uint8_t* out = columnwise + (tile_c + lc) * rows + tile_r + lr;
#pragma unroll
    for (int e = 0; e < 8; ++e) *reinterpret_cast<uint2*>(out + e * rows) = make_uint2(top[e], bottom[e]);
    return;
  }
  uint2* ctile = smem + 2048;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int col = lc + e;
    ctile[col * 16 + ((lr / 8) ^ ColSwizzle(col))] = make_uint2(top[e], bottom[e]);
  }
  __syncthreads();
  // Whole lines: 8 lanes per 128-byte line, 4 lines per warp instruction, 32 lines per pass.
  const int chunk = lane % 8;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int line = pass * 32 + warp * 4 + lane / 8;
    const uint2* cl = ctile + line * 16;
    const int cu = (2 * chunk) ^ ColSwizzle(line);
    const uint4 c = make_uint4(cl[cu].x, cl[cu].y, cl[cu + 1].x, cl[cu + 1].y);
    *reinterpret_cast<uint4*>(columnwise + (tile_c + line) * rows + tile_r + 16 * chunk) = c;
    if constexpr (kMode == 2) {
      const uint2* rl = smem + line * 16;
      const int ru = (2 * chunk) ^ RowSwizzle(line);
      const uint4 r = make_uint4(rl[ru].x, rl[ru].y, rl[ru + 1].x, rl[ru + 1].y);
      *reinterpret_cast<uint4*>(rowwise + (tile_r + line) * cols + tile_c + 16 * chunk) = r;
    }
  }
}

using ProbeFn = void (*)(const uint16_t*, uint8_t*, uint8_t*, uint16_t*, int64_t, int64_t);

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 50;
  const int64_t n = rows * cols;
  uint16_t *x, *y;
  uint8_t *rowwise, *columnwise;
  CHECK(cudaMalloc(&x, n * 2));
  CHECK(cudaMalloc(&y, n * 2));
  CHECK(cudaMalloc(&rowwise, n));
  CHECK(cudaMalloc(&columnwise, n));
  {
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = static_cast<uint16_t>((i * 2654435761u) >> 7);
    CHECK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const ProbeFn fns[5] = {Probe<0>, Probe<1>, Probe<2>, Probe<3>, Probe<4>};
  const char* names[5] = {"direct", "col-line", "lines", "rowwise", "copy"};
  const int64_t bytes[5] = {4 * n, 4 * n, 4 * n, 3 * n, 4 * n};
  const int blocks = static_cast<int>((rows / kTile) * (cols / kTile));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::printf("mode,blocks_per_sm,median_us,min_us,TBps\n");
  for (int limit : {0, 2}) {
    for (int m = 0; m < 5; ++m) {
      // Dynamic shared memory: the tiles (32 KiB), or enough to leave `limit` blocks per SM.
      int smem = 32 * 1024;
      if (limit > 0) smem = 100 * 1024;
      CHECK(cudaFuncSetAttribute(fns[m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      int per_sm = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fns[m], kThreads, smem));
      CHECK(cudaMemset(rowwise, 0, n));
      CHECK(cudaMemset(columnwise, 0, n));
      std::vector<float> t;
      for (int r = 0; r < reps + 3; ++r) {
        CHECK(cudaEventRecord(a));
        fns[m]<<<blocks, kThreads, smem>>>(x, rowwise, columnwise, y, rows, cols);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 3) t.push_back(ms * 1000.0f);
      }
      CHECK(cudaGetLastError());
      std::sort(t.begin(), t.end());
      const float med = t[t.size() / 2];
      std::printf("%s,%d,%.1f,%.1f,%.3f\n", names[m], per_sm, med, t[0], bytes[m] / (med * 1e-6) / 1e12);
      // The modes must agree on the bytes they write (checked against mode 0's output).
      if (m <= 2) {
        static std::vector<uint8_t> ref_r, ref_c;
        std::vector<uint8_t> hr(n), hc(n);
        CHECK(cudaMemcpy(hr.data(), rowwise, n, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hc.data(), columnwise, n, cudaMemcpyDeviceToHost));
        if (m == 0 && ref_r.empty()) {
          // mode 0 against the host: code = high byte of x, rowwise and transposed.
          std::vector<uint16_t> hx(n);
          CHECK(cudaMemcpy(hx.data(), x, n * 2, cudaMemcpyDeviceToHost));
          for (int64_t i = 0; i < n; i += 977) {
            const int64_t r = i / cols, c = i % cols;
            const uint8_t code = static_cast<uint8_t>(hx[i] >> 8);
            if (hr[i] != code || hc[c * rows + r] != code) {
              std::fprintf(stderr, "direct: wrong code at row %lld col %lld\n", (long long)r, (long long)c);
              return 1;
            }
          }
          ref_r = hr;
          ref_c = hc;
        } else if (hr != ref_r || hc != ref_c) {
          std::fprintf(stderr, "mode %s writes different bytes than direct\n", names[m]);
          return 1;
        }
      }
    }
  }
  (void)sms;
  return 0;
}
