// Internal to the fused decode kernel (tq_decode.cu): its device building blocks — the m16n8k16 MMA, fast exp2 /
// reciprocal, a lane's code slices read from a stage, the code-byte and field offsets of the lookup tables, the
// replicated table fill and half-block barriers. Included by tq_decode.cu only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "exact_window.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

__device__ inline std::uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

__device__ inline void mma16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2, std::uint32_t a3,
                                std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^x on the MUFU unit without the IEEE wrapper of exp2f (whose range checks and subnormal scaling cost ≈ 5
// instructions per call): ≤ 2 ulp, results below 2^-126 flushed to +0 (a softmax weight that small is below
// every tolerance), ex2(−∞) = +0.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1/x to ≈ 1 ulp (subnormal results kept): the running value scale's reciprocal.
__device__ __forceinline__ float rcp_fast(float x) {
  float y;
  asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline std::uint32_t transpose8x8(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Tile loads use the Hopper bulk-copy engine (bulk_copy.cuh): one thread issues one copy per region and stage,
// completion is counted in bytes on the stage's mbarrier. Compared with per-thread 16-byte cp.async this removes
// ~300 address instructions per thread and tile.

// The bytes of one token row that one lane needs, read once per tile into registers. Rows are 8-byte aligned
// (every row size is a multiple of 8 and decode_attention requires a 16-byte aligned layer), so slices whose
// size is a multiple of 8 (4) bytes use 64-bit (32-bit) loads, 16-byte aligned ones 128-bit loads (A16 below);
// other sizes (3-bit values at d = 128: 6 bytes; some slices at d = 64) read the aligned words around the slice
// and shift it into place (up to 3 bytes past the slice: inside the region's slack).
template <unsigned NB>
struct Slice {
  std::uint32_t w[(NB + 3) / 4];
};
// The whole slice as vectors of V (uint4, uint2: 16- or 8-byte aligned), unpacked into its words.
template <typename V, unsigned NB>
__device__ __forceinline__ void load_words(const std::uint8_t* p, Slice<NB>& b) {
  constexpr unsigned per = sizeof(V) / 4;
  const V* s = reinterpret_cast<const V*>(p);
#pragma unroll
  for (unsigned i = 0; i < ((NB + 3) / 4) / per; ++i) {
    const V x = s[i];
    memcpy(&b.w[per * i], &x, sizeof(V));
  }
}
// A16: the caller guarantees 16-byte aligned slices (rows and slice offsets multiples of 16 bytes from a
// 16-byte aligned region), so NB % 16 == 0 slices use 128-bit loads: a quarter-warp's eight lanes then read 128
// contiguous bytes, one shared-memory wavefront, where two 64-bit loads of rows 64 bytes apart conflict 2-way.
template <unsigned NB, bool A16 = false>
__device__ __forceinline__ Slice<NB> load_slice(const std::uint8_t* row, std::uint32_t off) {
  constexpr unsigned nw = (NB + 3) / 4;
  Slice<NB> b;
  if constexpr (A16 && NB % 16 == 0) {
    load_words<uint4>(row + off, b);
  } else if constexpr (NB % 8 == 0) {
    load_words<uint2>(row + off, b);
  } else if constexpr (NB % 4 == 0) {
    const std::uint32_t* s = reinterpret_cast<const std::uint32_t*>(row + off);
#pragma unroll
    for (unsigned i = 0; i < nw; ++i) b.w[i] = s[i];
  } else {
    // Callers' offsets are multiples of NB from a 4-byte aligned row, so a slice starts a multiple of gcd(NB, 4)
    // bytes into its first word and spans kWords aligned words: 2 for 6-byte slices, where one more word was read
    // (and one more shared-memory wavefront spent, two with the value rows' 2-way conflicts) for no byte of the
    // slice. The top word's missing neighbour is zero: those bits lie past the slice.
    constexpr unsigned kMisalign = 4u - (NB % 2 == 0 ? 2u : 1u);  // the largest off % 4
    constexpr unsigned kWords = (NB + kMisalign + 3) / 4;
    const std::uint32_t* s = reinterpret_cast<const std::uint32_t*>(row + (off & ~3u));
    const std::uint32_t sh = 8u * (off & 3u);
    std::uint32_t raw[kWords];
#pragma unroll
    for (unsigned i = 0; i < kWords; ++i) raw[i] = s[i];
#pragma unroll
    for (unsigned i = 0; i < nw; ++i) b.w[i] = __funnelshift_r(raw[i], i + 1 < kWords ? raw[i + 1] : 0u, sh);
  }
  return b;
}
// Byte offset (into a table of 2^NB entries, entry e at byte e·2^SH + lane_bytes) of the NB-bit field at bit
// `pos` of a slice: one shift and one LOP3 (mask and OR of the lane's part), so a lookup is two integer
// instructions and one LDS whose address adds the table base as an immediate / uniform register.
template <unsigned NB, unsigned SH, unsigned NS>
__device__ __forceinline__ std::uint32_t field_offset(const Slice<NS>& b, unsigned pos, std::uint32_t lane_bytes) {
  constexpr unsigned nw = (NS + 3) / 4;
  constexpr std::uint32_t mask = ((1u << NB) - 1u) << SH;
  const unsigned i = pos / 32, s = pos % 32;
  std::uint32_t w;
  if (s + NB <= 32 || i + 1 >= nw) {
    w = s >= SH ? (b.w[i] >> (s - SH)) : (b.w[i] << (SH - s));
  } else {
    w = __funnelshift_r(b.w[i], b.w[i + 1], s) << SH;
  }
  // (w & mask) | lane_bytes as one LOP3 (the compiler otherwise splits it into an AND and an OR).
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(mask), "r"(lane_bytes));
  return r;
}
// Byte offset of the code-byte table entry of byte b of w for the lane's copy (entries `Stride` bytes apart):
// the byte by a permute, the scaling and the lane's copy by one multiply-add (FMA pipe; the integer ALU pipe
// is the kernel's busiest).
template <unsigned Stride>
__device__ __forceinline__ std::uint32_t byte_entry(std::uint32_t w, unsigned b, std::uint32_t lane_bytes) {
  const std::uint32_t x = __byte_perm(w, 0u, 0x4440u | b);
  std::uint32_t r;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "n"(Stride), "r"(lane_bytes));
  return r;
}
// The same for 256-byte entries, the lane's copy in the entry's low 128 bytes: one byte permute puts the code
// byte in bits 8..15 beside the lane's byte offset (lane_bytes < 128, in byte 0) and needs no multiply-add.
__device__ __forceinline__ std::uint32_t wide_byte_entry(std::uint32_t w, unsigned b, std::uint32_t lane_bytes) {
  return __byte_perm(w, lane_bytes, 0x7604u | (b << 4));
}
// Barrier of one half of the block (S::halves): ids 1 and 2 as immediates (a register id makes ptxas reserve all
// 16 of the block's barriers).
template <unsigned kThreads>
__device__ __forceinline__ void half_barrier(unsigned half) {
  if (half == 0) {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  } else {
    asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
  }
}
template <typename T>
__device__ __forceinline__ T lds_at(const void* base, std::uint32_t byte_offset) {
  return *reinterpret_cast<const T*>(reinterpret_cast<const std::uint8_t*>(base) + byte_offset);
}
// The two words of an 8-byte table entry as two 32-bit loads, for MMA operands that take them apart: an MMA
// wants its A fragment in four consecutive registers (x0.x, x1.x, x0.y, x1.y of two entries), which a 64-bit
// load's register pair never is, so ptxas adds two moves per 64-bit load. Used for the QJL sign entries (a
// 128-byte table: conflict-free either way): 27 fewer instructions in the seed kernel's loop, 1.5–3 % faster
// (docs/tq-decode-history.md, round 9). Not for the 2-bit keys' entries: their 16 copies put two lanes on each bank
// for a 32-bit load, and split there (by volatile loads, as ptxas merged plain ones again) it was 4–9 % slower.
__device__ __forceinline__ uint2 lds_pair_split(const void* base, std::uint32_t byte_offset) {
  const std::uint32_t a = static_cast<std::uint32_t>(__cvta_generic_to_shared(base)) + byte_offset;
  uint2 v;
  asm("ld.shared.u32 %0, [%2];\n\tld.shared.u32 %1, [%2+4];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

// Fills a lane-replicated lookup table of `entries` entries of kEntryBytes, kStrideBytes apart: entry e is the
// 16-byte pattern(e) repeated, one 16-byte store each (a quarter of the stores of a word at a time); the bytes
// between entries are left alone. Every thread of the block runs the same number of iterations, so pattern may
// shuffle within its warp.
template <unsigned kBlockSize, unsigned kEntryBytes = 128, unsigned kStrideBytes = kEntryBytes, typename Pattern>
__device__ __forceinline__ void fill_replicated(uint4* table, unsigned entries, Pattern pattern) {
  static_assert(kEntryBytes % 16 == 0 && kStrideBytes % 16 == 0 && kStrideBytes >= kEntryBytes,
                "entries of whole 16-byte stores");
  constexpr unsigned kPer = kEntryBytes / 16;
  for (unsigned j0 = 0; j0 < entries * kPer; j0 += kBlockSize) {
    const unsigned j = j0 + threadIdx.x;
    const uint4 v = pattern(min(j / kPer, entries - 1u));
    if (j < entries * kPer) table[kStrideBytes == kEntryBytes ? j : (j / kPer) * (kStrideBytes / 16) + j % kPer] = v;
  }
}

// The fp16 centroid byte tables of dequant2 (decode_coords.hpp): low bytes of the four centroids in one word,
// high bytes in another.
__device__ __forceinline__ void byte_tables(const float* centroids, float alpha, std::uint32_t& lo, std::uint32_t& hi) {
  lo = hi = 0;
  for (unsigned e = 0; e < 4; ++e) {
    const std::uint32_t h = __half_as_ushort(__float2half_rn(alpha * centroids[e]));
    lo |= (h & 0xFFu) << (8 * e);
    hi |= (h >> 8) << (8 * e);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
