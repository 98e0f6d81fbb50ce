// Hopper warpgroup MMA (wgmma, sm_90a) helpers for fp16 operands with f32 accumulation: the shared-memory
// layout both operands use (128-byte swizzle), matrix descriptors, and the m64n64k16 instruction with A from
// shared memory or from registers (m64n32k16 from shared memory, m64n128k16 from either). A
// warpgroup is 4 consecutive warps (128 threads); its m64nNk16 accumulator gives thread t (warp w = t / 32, lane
// l) rows 16 w + l / 4 and 16 w + l / 4 + 8 and, for each 8-column group i, columns 8 i + 2 (l % 4) and + 1:
// d[4 i] (row, col), d[4 i + 1] (row, col + 1), d[4 i + 2] (row + 8, col), d[4 i + 3] (row + 8, col + 1) — the
// mma.sync m16n8 layout per warp.
//
// Layout ("SW128"): a matrix of R rows x C fp16 columns (C a multiple of 64) is stored as C / 64 column blocks of
// R rows x 128 bytes each; in a block, row r's 16-byte chunk c (columns 8 c .. 8 c + 7) sits at
// r * 128 + ((c ^ (r % 8)) * 16). Blocks and the buffer start 1024-byte aligned. The same bytes serve as a K-major
// operand (rows = M or N, columns = K: Q and the key tile in QK^T) and as an MN-major one (rows = K, columns = N:
// the value tile in PV, with the transpose flag).
//
// Used by the DeepSeek-V4 sparse attention (src/cuda_dsv4/attention_wgmma.cu) and the TurboQuant prefill kernel
// (tq_prefill_wgmma.cu); in namespace kvcompact::cuda, which encloses both modules' namespaces.
// tests/cuda_dsv4/wgmma_test.cpp checks these conventions against a CPU product (on the H200: K-major descriptors
// with leading 16 / stride 1024 and MN-major ones with leading 8192 / stride 1024 match; swapped ones do not).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvcompact::cuda {

// Byte offset of element (row, col) in an SW128 matrix of `rows` rows.
__host__ __device__ constexpr std::uint32_t sw128_offset(std::uint32_t row, std::uint32_t col, std::uint32_t rows) {
  return (col / 64) * rows * 128 + row * 128 + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Matrix descriptor, as its two 32-bit halves: start address / 16 (bits 0-13) and leading byte offset / 16
// (bits 16-29) in lo; stride byte offset / 16 (bits 32-45) and the 128-byte swizzle (mode 1 in bits 62-63) in hi.
// An operand `bytes` further on is at(bytes): a 32-bit add to the address field, which cannot carry out of it
// (shared addresses are below 2^18). Kept as 32-bit halves so that per-MMA offsets cost one integer add instead
// of a 64-bit add with carries.
struct GmmaDesc {
  std::uint32_t lo, hi;
  __device__ __forceinline__ GmmaDesc at(std::uint32_t bytes) const { return GmmaDesc{lo + bytes / 16, hi}; }
};
__device__ __forceinline__ GmmaDesc sw128_descriptor(const void* start, std::uint32_t leading_bytes,
                                                     std::uint32_t stride_bytes) {
  const std::uint32_t addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(start));
  return GmmaDesc{((addr & 0x3FFFFu) >> 4) | (((leading_bytes >> 4) & 0x3FFFu) << 16),
                  ((stride_bytes >> 4) & 0x3FFFu) | (1u << 30)};
}

// Orders this thread's generic shared-memory writes before the async proxy's reads (wgmma operands).
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Multiplies an accumulator's rows by their factors: this thread's row 16 w + l / 4 by a, row + 8 by b, for NB
// m64n64 accumulators side by side (wgmma.cuh's layout above).
template <int NB>
__device__ __forceinline__ void scale_accumulator_rows(float (&d)[NB][32], float a, float b) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      d[nb][4 * i] *= a;
      d[nb][4 * i + 1] *= a;
      d[nb][4 * i + 2] *= b;
      d[nb][4 * i + 3] *= b;
    }
  }
}

// The accumulator operands %0..%31 of an m64n64 instruction (braced: KVC_WGMMA_D32), and %0..%63 of an m64n128 one.
#define KVC_WGMMA_REGS32                                                                                       \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KVC_WGMMA_D32 "{" KVC_WGMMA_REGS32 "}"
#define KVC_WGMMA_REGS64                                                                                      \
  KVC_WGMMA_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
                   "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KVC_WGMMA_D32_OPERANDS(d)                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (64 x 64, f32) = (accumulate ? d : 0) + A (64 x 16, descriptor) * B (16 x 64, descriptor); kTransB: B is
// MN-major (rows = K).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], GmmaDesc a, GmmaDesc b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%32, %33};\nmov.b64 db, {%34, %35};\n"
      "setp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVC_WGMMA_D32 ", da, db, p, 1, 1, 0, %37;\n}\n"
      : KVC_WGMMA_D32_OPERANDS(d)
      : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0), "n"(kTransB));
}

// d (64 x 64, f32) = (accumulate ? d : 0) + A (64 x 32 e4m3) * B (32 x 64 e4m3), both K-major (FP8 has no
// transposed form). A k-step of 32 e4m3 codes is 32 bytes of a row, as a k-step of 16 fp16 values, so FP8
// operands use the same SW128 layout and descriptor offsets as fp16 ones of half the width. Hopper's FP8 MMAs
// accumulate with fewer bits than f32 (DeepSeek-V3's report: ≈ 14), so d should hold only small terms.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_ss(float (&d)[32], GmmaDesc a, GmmaDesc b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%32, %33};\nmov.b64 db, {%34, %35};\n"
      "setp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " KVC_WGMMA_D32 ", da, db, p, 1, 1;\n}\n"
      : KVC_WGMMA_D32_OPERANDS(d)
      : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0));
}

// d (64 x 32, f32, 16 registers per thread) = (accumulate ? d : 0) + A (64 x 16) * B (16 x 32), both K-major.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], GmmaDesc a, GmmaDesc b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%16, %17};\nmov.b64 db, {%18, %19};\n"
      "setp.ne.b32 p, %20, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, da, db, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0));
}

// d (64 x 128, f32: d[0] columns 0-63, d[1] columns 64-127, each in the m64n64 layout) = (accumulate ? d : 0) +
// A (64 x 16, descriptor) * B (16 x 128, descriptor; B's two 64-column blocks the leading byte offset apart).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[2][32], GmmaDesc a, GmmaDesc b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nmov.b64 da, {%64, %65};\nmov.b64 db, {%66, %67};\n"
      "setp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" KVC_WGMMA_REGS64 "}, da, db, p, 1, 1, 0, %69;\n}\n"
      : KVC_WGMMA_D32_OPERANDS(d[0]), KVC_WGMMA_D32_OPERANDS(d[1])
      : "r"(a.lo), "r"(a.hi), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0), "n"(kTransB));
}

// As above with A from registers: this thread's mma.sync-style A fragment of its warp's 16 rows (a[0]: row
// l / 4, cols 2 (l % 4), + 1; a[1]: row + 8; a[2], a[3]: cols + 8).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const std::uint32_t (&a)[4], GmmaDesc b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nmov.b64 db, {%36, %37};\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVC_WGMMA_D32 ", {%32, %33, %34, %35}, db, p, 1, 1, "
      "%39;\n}\n"
      : KVC_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0), "n"(kTransB));
}

// d (64 x 128, f32) = (accumulate ? d : 0) + A (64 x 16, registers as above) * B (16 x 128, descriptor), as one
// instruction instead of two m64n64k16 (A read once); d[0] holds columns 0–63 and d[1] columns 64–127, each in the
// m64n64 layout. B's two 64-column blocks are the descriptor's leading byte offset apart.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[2][32], const std::uint32_t (&a)[4], GmmaDesc b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nmov.b64 db, {%68, %69};\nsetp.ne.b32 p, %70, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" KVC_WGMMA_REGS64 "}, {%64, %65, %66, %67}, db, p, 1, "
      "1, %71;\n}\n"
      : KVC_WGMMA_D32_OPERANDS(d[0]), KVC_WGMMA_D32_OPERANDS(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.lo), "r"(b.hi), "r"(accumulate ? 1 : 0), "n"(kTransB));
}

#undef KVC_WGMMA_D32
#undef KVC_WGMMA_REGS32
#undef KVC_WGMMA_REGS64
#undef KVC_WGMMA_D32_OPERANDS

}  // namespace kvcompact::cuda
