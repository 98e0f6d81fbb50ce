// Device self-test of the wgmma helpers (wgmma.cuh): one warpgroup computes S = Q K^T (64 x 64, K = 128: both
// operands K-major) and O = P V (64 x 128, K = 64: P K-major in shared memory or in registers, V = the key tile
// viewed MN-major, transposed) from SW128 tiles, for given descriptor byte offsets, so a test can check the
// layout and descriptor conventions against a CPU product before a kernel relies on them. O is computed twice:
// as two m64n64k16 per k-step (one per 64 columns) and as one m64n128k16 (the DeepSeek-V4 attention's P V).
// Run by tests/cuda_dsv4/wgmma_test.cpp.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels_params.hpp"
#include "cuda/wgmma.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kRows = 64, kCols = 128;
constexpr unsigned kQBytes = kRows * kCols * 2, kKBytes = kRows * kCols * 2, kPBytes = kRows * kRows * 2;
constexpr unsigned kSmemBytes = kQBytes + kKBytes + kPBytes + 1024;  // + alignment slack

// Stores an m64n64 accumulator (wgmma.cuh's layout: rows 16 warp + lane / 4 and + 8) at columns col0 .. col0 + 63 of
// a row-major matrix with `ld` columns.
__device__ __forceinline__ void store_accumulator(float* dst, unsigned ld, unsigned col0, const float (&d)[32]) {
  const unsigned lane = threadIdx.x % 32, row = 16 * (threadIdx.x / 32) + lane / 4;
#pragma unroll
  for (unsigned i = 0; i < 8; ++i) {
    const unsigned col = col0 + 8 * i + 2 * (lane % 4);
    dst[row * ld + col] = d[4 * i];
    dst[row * ld + col + 1] = d[4 * i + 1];
    dst[(row + 8) * ld + col] = d[4 * i + 2];
    dst[(row + 8) * ld + col + 1] = d[4 * i + 3];
  }
}

// This thread's register A fragment of P (64 x 64, row-major fp16 in global memory) for k-step s: its warp's 16
// rows, as wgmma.cuh's *_rs forms take it (rows l / 4 and + 8, columns 2 (l % 4), + 1 and + 8, + 9).
__device__ __forceinline__ void p_fragment(const std::uint16_t* p, unsigned s, std::uint32_t (&af)[4]) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint16_t* p0 = p + (16 * warp + lane / 4) * kRows + 16 * s + 2 * (lane % 4);
  const std::uint16_t* p1 = p0 + 8 * kRows;
  af[0] = *reinterpret_cast<const std::uint32_t*>(p0);
  af[1] = *reinterpret_cast<const std::uint32_t*>(p1);
  af[2] = *reinterpret_cast<const std::uint32_t*>(p0 + 8);
  af[3] = *reinterpret_cast<const std::uint32_t*>(p1 + 8);
}

// acc = P V over the four k-steps (rows 16 s .. 16 s + 15 of V, 16 rows x 128 bytes apart from v), P from registers
// (from_registers, an *_rs form) or from shared memory at ps (from_shared, an *_ss form), as a.p_in_registers says.
template <typename Acc, typename FromRegisters, typename FromShared>
__device__ __forceinline__ void p_times_v(Acc& acc, const WgmmaSelftestArgs& a, const std::uint8_t* ps,
                                          const std::uint8_t* v, FromRegisters from_registers, FromShared from_shared) {
  wgmma_fence();
#pragma unroll
  for (unsigned s = 0; s < kRows / 16; ++s) {
    const GmmaDesc vb = sw128_descriptor(v + s * 16 * 128, a.mnmajor_leading, a.mnmajor_stride);
    if (a.p_in_registers) {
      std::uint32_t af[4];
      p_fragment(a.p, s, af);
      from_registers(acc, af, vb, s > 0);
    } else {
      from_shared(acc, sw128_descriptor(ps + s * 32, a.kmajor_leading, a.kmajor_stride), vb, s > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
}

__global__ void __launch_bounds__(128) wgmma_selftest_kernel(WgmmaSelftestArgs a) {
  extern __shared__ std::uint8_t smem_raw[];
  // SW128 tiles start 1024-byte aligned.
  std::uint8_t* smem = smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  std::uint8_t* qs = smem;
  std::uint8_t* ks = qs + kQBytes;
  std::uint8_t* ps = ks + kKBytes;
  const unsigned tid = threadIdx.x;
  for (unsigned i = tid; i < kRows * kCols; i += 128) {
    const unsigned r = i / kCols, c = i % kCols;
    *reinterpret_cast<std::uint16_t*>(qs + sw128_offset(r, c, kRows)) = a.q[i];
    *reinterpret_cast<std::uint16_t*>(ks + sw128_offset(r, c, kRows)) = a.k[i];
  }
  for (unsigned i = tid; i < kRows * kRows; i += 128) {
    *reinterpret_cast<std::uint16_t*>(ps + sw128_offset(i / kRows, i % kRows, kRows)) = a.p[i];
  }
  fence_shared_for_async();
  __syncthreads();

  // S = Q K^T: k-step s covers columns 16 s .. 16 s + 15: column block s / 4, 32 bytes per step inside it.
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (unsigned s = 0; s < kCols / 16; ++s) {
    const unsigned offset = (s / 4) * kRows * 128 + (s % 4) * 32;
    wgmma_m64n64k16_ss<0>(d, sw128_descriptor(qs + offset, a.kmajor_leading, a.kmajor_stride),
                          sw128_descriptor(ks + offset, a.kmajor_leading, a.kmajor_stride), s > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  store_accumulator(a.s, kRows, 0, d);

  // O = P V, V = the key tile read MN-major (rows = K = 64, columns = N = 128), 64 columns per instruction:
  // k-step s covers rows 16 s .. 16 s + 15, 16 rows x 128 bytes further on.
#pragma unroll
  for (unsigned nb = 0; nb < kCols / 64; ++nb) {
    float o[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    p_times_v(
        o, a, ps, ks + nb * kRows * 128,
        [](float(&d)[32], const std::uint32_t(&af)[4], GmmaDesc b, bool acc) {
          wgmma_m64n64k16_rs<1>(d, af, b, acc);
        },
        [](float(&d)[32], GmmaDesc p, GmmaDesc b, bool acc) { wgmma_m64n64k16_ss<1>(d, p, b, acc); });
    store_accumulator(a.o, kCols, nb * 64, o);
  }

  // O = P V again, all 128 columns per instruction: B's two 64-column blocks are the MN-major descriptor's leading
  // byte offset apart.
  float o2[2][32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o2[0][i] = o2[1][i] = 0.0f;
  p_times_v(
      o2, a, ps, ks,
      [](float(&d)[2][32], const std::uint32_t(&af)[4], GmmaDesc b, bool acc) {
        wgmma_m64n128k16_rs<1>(d, af, b, acc);
      },
      [](float(&d)[2][32], GmmaDesc p, GmmaDesc b, bool acc) { wgmma_m64n128k16_ss<1>(d, p, b, acc); });
  store_accumulator(a.o128, kCols, 0, o2[0]);
  store_accumulator(a.o128, kCols, 64, o2[1]);
}

}  // namespace

cudaError_t launch_wgmma_selftest(const WgmmaSelftestArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(wgmma_selftest_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  wgmma_selftest_kernel<<<1, 128, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
