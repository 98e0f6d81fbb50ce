// DeepSeek-V4 sparse attention, split kernel on warpgroup MMAs (wgmma, sm_90a) for blocks of 64 heads: the same
// contract as attention_split_kernel (attention.cu: one token, one split of its row list, partial O / m / l for
// the merge kernel), with the query and each decoded row tile held once in shared memory in the SW128 layout
// (wgmma.cuh) and read by the tensor cores directly. Per 64-row tile:
//   decode rows to fp16 (all threads) -> S = Q K^T: warpgroup x < 2 (kSWarpgroups) takes rows [32 x, 32 x + 32)
//   of the tile, all 64 heads, K = 512 (32 m64n32k16) -> online softmax in registers (per-head maxima and sums
//   exchanged between the two through shared memory) -> P (fp16, 64 heads x 64 rows) to shared memory ->
//   O += P V: warpgroup x of W takes dims [512 x / W, 512 (x + 1) / W) (m64n128k16, V = the tile read MN-major).
// W = 2 warpgroups for BF16 rows, 4 for FP8 rows (WgShape): with four, a thread holds half of O (64 registers
// instead of 128), so 16 warps fit at 128 registers, and each warp decodes half as many FP8 pieces (cuda-dsv4-
// kernels.md, round 20: FP8 attention 1.5-2 % faster; BF16 rows, whose tiles come by cp.async, 2.5 % slower).
// BF16 rows are copied by cp.async straight into their SW128 places of one of two tile buffers and widened to
// fp16 in place (bf16 and fp16 are both 2 bytes); FP8 rows (584 bytes) are loaded into registers and decoded
// into one of the two buffers, in both cases after P V of the previous tile is issued. (A warpgroup MMA's issue
// waits until the tensor cores take it, so that decode mostly follows P V rather than overlapping it: phase
// timing, round 27 in docs/cuda-dsv4-kernels-history.md.)
// Shared memory is what bounds the MMAs: with both operands there they run at its bandwidth, 128 bytes per cycle
// (scripts/gpu/wgmma_rate.cu on the H200: m64n16k16 to m64n64k16 alike). Reads per tile: Q twice (S on two
// warpgroups: 128 KB), the tile twice (S and P V: 128 KB), P once per warpgroup and 128 dims of O (FP8 rows
// 4 x 8 KB, BF16 rows 2 x 16 KB; m64n64k16 read it twice as often), against ~800 KB for the mma.sync kernel, whose
// fragments are reloaded per warp. tests/cuda_dsv4/wgmma_test.cpp checks the wgmma conventions this relies on;
// the attention tests check this kernel (attention.cu launches it for 64-head blocks).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_rows.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/wgmma.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kRows = kAttnTileRows;              // 64
constexpr unsigned kTileBytes = kRows * kHeadDim * 2;  // an SW128 matrix of 64 x 512 fp16: 64 KB
constexpr unsigned kPBytes = kAttnBlockHeads * kRows * 2;
constexpr unsigned kFp8RowBytes = 584;  // 56 pieces of 8 e4m3 codes, 16 pieces of 4 bf16, 8 scale bytes
static_assert(kRows * kFp8RowBytes <= kTileBytes, "a raw FP8 tile fits in a tile buffer");

// The block's split of the work by row format (above): warpgroups, threads, a warpgroup's rows of S and dims of
// P V, and its m64n64 accumulators of O.
template <bool kBf16Rows>
struct WgShape {
  static constexpr unsigned warpgroups = kBf16Rows ? 2 : 4;
  static constexpr unsigned threads = 128 * warpgroups;
  static constexpr unsigned pv_dims = kHeadDim / warpgroups;
  static constexpr unsigned pv_blocks = pv_dims / 64;
};
// The warpgroups that compute S = Q K^T (and the softmax's P), each for kRows / kSWarpgroups rows of every tile:
// two, also when the block has four (FP8 rows). Every S instruction reads all of Q from shared memory, so two
// warpgroups' m64n32k16 read it half as often as four warpgroups' m64n16k16; the other two only meet them at
// the softmax's two barriers. Measured (docs/cuda-dsv4-kernels-history.md, round 25): FP8 rows' attention 4.5 % faster
// at batch 8 x 1M and 10 % faster in a prefill chunk — once the S warpgroups' loop spilled nothing: with eight P
// addresses and the row-pointer lookups kept in registers, 36 bytes spilled, and the decode step's attention ran
// 10 % slower instead (local memory beside ~204 KB of shared memory leaves the reloads little L1).
constexpr unsigned kSWarpgroups = 2;
constexpr unsigned kMaxWarpgroups = 4;
constexpr unsigned kBf16Threads = WgShape<true>::threads;  // 256
constexpr unsigned kFp8Threads = WgShape<false>::threads;  // 512

struct WgSmem {
  std::uint8_t q[kTileBytes];     // SW128, 1024-byte aligned (the struct is placed so)
  std::uint8_t k[2][kTileBytes];  // two fp16 tiles (alternating)
  std::uint8_t p[kPBytes];
  float part_max[kMaxWarpgroups][kAttnBlockHeads];  // per warpgroup, over its rows of the tile
  float part_sum[kMaxWarpgroups][kAttnBlockHeads];
  const std::uint8_t* rows[2][kRows];
  std::uint32_t present[2][kRows / 32];  // bit r % 32 of word r / 32: rows[.][r] is not null (the softmax's test)
};
constexpr unsigned kSmemBytes = sizeof(WgSmem) + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "one block per multiprocessor");

// BF16 rows (256 threads): thread t copies the 16-byte piece t % 64 (dims 8 (t % 64) ...) of rows 4 j + t / 64
// (j < 16) straight to its SW128 place in `tile`; a missing row is zero-filled, so the widening needs no test and
// the missing rows' values are zeros (their p is 0, and 0 times a stale inf would be NaN in P V). Each thread later
// widens exactly the pieces it copied.
__device__ __forceinline__ void stage_bf16_rows(std::uint8_t* tile, const std::uint8_t* const* rows,
                                                const void* any_global) {
  const unsigned pc = threadIdx.x % 64, r0 = threadIdx.x / 64;
#pragma unroll
  for (unsigned j = 0; j < kRows * 64 / kBf16Threads; ++j) {
    const std::uint8_t* src = rows[4 * j + r0];
    cp_async16_or_zero(tile + sw128_offset(4 * j + r0, pc * 8, kRows), src != nullptr ? src + pc * 16 : any_global,
                       src != nullptr ? 16u : 0u);
  }
  cp_async_commit();
}

// Widens this thread's pieces of a BF16 tile (stage_bf16_rows) to fp16 in place: fixed offsets from two bases,
// since row 4 j + r0 has r % 8 = r0 + 4 (j % 2) in the SW128 XOR.
__device__ __forceinline__ void widen_bf16_tile(std::uint8_t* tile) {
  const unsigned pc = threadIdx.x % 64, r0 = threadIdx.x / 64;
  std::uint8_t* even = tile + sw128_offset(r0, pc * 8, kRows);
  std::uint8_t* odd = tile + sw128_offset(r0 + 4, pc * 8, kRows) - 4 * 128;
#pragma unroll
  for (unsigned j = 0; j < kRows * 64 / kBf16Threads; ++j) {
    uint4* piece = reinterpret_cast<uint4*>((j % 2 == 0 ? even : odd) + 4 * j * 128);
    const uint4 v = *piece;
    *piece = make_uint4(bf16x2_to_half2(v.x), bf16x2_to_half2(v.y), bf16x2_to_half2(v.z),
                        bf16x2_to_half2(v.w));
  }
}

// FP8 rows (512 threads) go through registers: thread t holds row t / 8 of a tile, its 8-byte pieces t % 8 + 8 j
// (j < 9: 72 pieces, 56 of e4m3 codes then 16 of bf16 pairs) and the row's 8 block scales. The loads of tile t + 1
// are issued before S of tile t and decoded into the other fp16 tile buffer while P V of tile t runs on the tensor
// cores, as the BF16 rows are widened (a raw tile in shared memory does not fit beside two fp16 tiles and the
// query, so it used to be decoded between the tiles' tensor-core work, with every thread waiting). A warp's load j
// reads 4 rows x 64 contiguous bytes; its stores of piece j hit the 8 SW128 chunk positions of 4 rows evenly (ideal
// wavefronts).
constexpr unsigned kFp8Lanes = kFp8Threads / kRows;                     // threads per row (8)
constexpr unsigned kFp8RegPieces = (kFp8RowBytes / 8 - 1) / kFp8Lanes;  // 9
constexpr unsigned kFp8CodePieces = 56;
struct Fp8RowRegs {
  uint2 piece[kFp8RegPieces];
  uint2 scales;  // block b's exponent byte (e + 127) in byte b; 127 for a missing row (zeros decode to zeros)
};

// From global memory (kRaw false: rows[r]) or from a raw tile in shared memory that stage_fp8_rows filled (kRaw
// true: raw + r kFp8RowBytes); a missing row (rows[r] null) gives zeros either way.
template <bool kRaw>
__device__ __forceinline__ void load_fp8_row_regs(Fp8RowRegs& regs, const std::uint8_t* const* rows,
                                                  const std::uint8_t* raw = nullptr) {
  const unsigned r = threadIdx.x / kFp8Lanes, q = threadIdx.x % kFp8Lanes;
  if (rows[r] != nullptr) {
    const uint2* src = reinterpret_cast<const uint2*>(kRaw ? raw + r * kFp8RowBytes : rows[r]);
#pragma unroll
    for (unsigned j = 0; j < kFp8RegPieces; ++j) {
      regs.piece[j] = kRaw ? src[q + kFp8Lanes * j] : __ldg(src + q + kFp8Lanes * j);
    }
    regs.scales = kRaw ? src[kFp8CodePieces + 16] : __ldg(src + kFp8CodePieces + 16);
  } else {
#pragma unroll
    for (unsigned j = 0; j < kFp8RegPieces; ++j) regs.piece[j] = make_uint2(0u, 0u);
    regs.scales = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
  }
}

// The first tile of FP8 rows: the present rows' bytes by cp.async into a raw tile in shared memory (the second
// tile buffer, which is free until the second tile), in flight while the query is converted; registers could
// not hold them beside the query's.
__device__ __forceinline__ void stage_fp8_rows(std::uint8_t* raw, const std::uint8_t* const* rows) {
  constexpr unsigned kPieces = kFp8RowBytes / 8;
  for (unsigned c = threadIdx.x; c < kRows * kPieces; c += kFp8Threads) {
    const unsigned r = c / kPieces, pc = c % kPieces;
    if (rows[r] != nullptr) cp_async8(raw + r * kFp8RowBytes + pc * 8, rows[r] + pc * 8);
  }
  cp_async_commit();
}

// Decodes this thread's pieces (load_fp8_row_regs) into the SW128 fp16 tile. Code piece q + 8 j lies in block
// (q + 8 j) / 8 = j (q < 8), so its scale byte is known at compile time.
__device__ __forceinline__ void decode_fp8_row_regs(std::uint8_t* tile, const Fp8RowRegs& regs) {
  static_assert(kFp8Lanes == 8, "code piece j's block is j");
  const unsigned r = threadIdx.x / kFp8Lanes, q = threadIdx.x % kFp8Lanes;
#pragma unroll
  for (unsigned j = 0; j < kFp8RegPieces; ++j) {
    const unsigned pc = q + kFp8Lanes * j;
    if (j < kFp8CodePieces / kFp8Lanes) {
      const std::uint32_t word = j < 4 ? regs.scales.x : regs.scales.y;
      const int e = static_cast<int>((word >> (8 * (j % 4))) & 0xFFu) - 127;
      *reinterpret_cast<uint4*>(tile + sw128_offset(r, pc * 8, kRows)) = e4m3x8_scaled_to_half8<true>(regs.piece[j], e);
    } else {
      *reinterpret_cast<uint2*>(tile + sw128_offset(r, 448 + (pc - kFp8CodePieces) * 4, kRows)) =
          make_uint2(bf16x2_to_half2(regs.piece[j].x), bf16x2_to_half2(regs.piece[j].y));
    }
  }
}

// 2^x by the multi-function unit alone (ex2.approx.ftz): exp2f adds a range test and two multiplications for
// results below 2^-126, which the softmax does not need (such a p or rescale factor is 0 to the sums' precision).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Floats per staged row of the epilogue (a warpgroup's kPvDims dims of one head, padded: attention_rows.cuh).
template <unsigned kPvDims>
constexpr unsigned kStageStride = kPvDims + kStagedRowPad;

// Barrier over warpgroup x's 128 threads (named barriers 1 .. 4; 0 is the block's). The id is a register, so ptxas
// reserves all 16 named barriers ("Block Limit Barriers 4" in Nsight Compute): the block is alone on its
// multiprocessor anyway.
__device__ __forceinline__ void warpgroup_barrier(unsigned x) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(x + 1) : "memory");
}

// v, hidden from the optimiser: values computed from it cannot be hoisted out of the loop that computes them.
__device__ __forceinline__ unsigned opaque(unsigned v) {
  asm volatile("" : "+r"(v));
  return v;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// Thread t: warpgroup x = t / 128, warp w = (t / 32) % 4, lane l (g = l / 4, tig = l % 4). Its heads (the
// accumulators' rows) are 16 w + g and 16 w + g + 8 in every warpgroup, so all hold the same softmax state.
// kDirect: the launch's p.direct_output (one split per token): the block writes the token's output itself. A
// template parameter, so that the decode instances carry none of that epilogue's code (with it behind a runtime
// branch, the decode step's attention ran 1-3 % slower).
template <bool kBf16Rows, bool kDirect>
__global__ void __launch_bounds__(WgShape<kBf16Rows>::threads, 1) attention_split_wgmma_kernel(AttentionParams p) {
  wait_for_previous_grid();
  using Shape = WgShape<kBf16Rows>;
  constexpr unsigned kThreads = Shape::threads, kWg = Shape::warpgroups, kSWg = kSWarpgroups;
  constexpr unsigned kSRows = kRows / kSWg;
  static_assert(kSRows == 32, "S as m64n32k16");
  constexpr unsigned kPvDims = Shape::pv_dims, kPvBlocks = Shape::pv_blocks;
  extern __shared__ std::uint8_t smem_raw[];
  WgSmem& sm = *reinterpret_cast<WgSmem*>(
      smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  const std::uint32_t split = blockIdx.x, token = blockIdx.y, h0 = blockIdx.z * kAttnBlockHeads;
  const unsigned tid = threadIdx.x, x = tid / 128, w = (tid / 32) % 4, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const unsigned ha = 16 * w + g, hb = ha + 8;  // this thread's two heads (block-relative)
  const bool s_group = kSWg == kWg || x < kSWg;  // this warpgroup computes S (and P) for kSRows rows
  const TokenRowsDev d = p.tokens[token];
  if (token_beyond_bound(p, d)) {  // nothing is read; the merge (or here, the direct output) writes NaN
    if constexpr (kDirect) {
      float* out = p.out + (static_cast<std::uint64_t>(token) * p.heads + h0) * kHeadDim;
      for (unsigned i = tid; i < kAttnBlockHeads * kHeadDim; i += kThreads) out[i] = quiet_nan();
    }
    return;
  }
  const SplitRows range = split_rows(p, d, split);
  if (range.empty()) return write_empty_split<kDirect>(p, token, h0, kAttnBlockHeads, split);
  const std::uint32_t nw = range.nw, r_begin = range.begin, r_end = range.end();
  auto part_of = [&](std::uint32_t h) { return partial_index(p, token, h0, h, split); };
  // The last kRows threads look up a tile's row pointers (and publish which are not null, the softmax's validity
  // test, as one ballot word per 32 rows): with S on fewer warpgroups than W they are outside the S warpgroups,
  // whose registers are the scarcer (round 25).
  static_assert(kThreads - kRows >= 128 * kSWg || kSWg == kWg, "the row pointers' threads are outside S");
  bool bad_index = false;  // this thread met an index outside [-1, visible rows): the token's output becomes NaN
  auto tile_rows = [&](unsigned slot, std::uint32_t t0) {
    const unsigned r = tid - (kThreads - kRows);
    if (tid >= kThreads - kRows) {  // (two whole warps)
      const std::uint8_t* row = t0 + r < r_end ? attention_row_pointer(p, d, token, t0 + r, nw, bad_index) : nullptr;
      sm.rows[slot][r] = row;
      const std::uint32_t present = __ballot_sync(0xFFFFFFFFu, row != nullptr);
      if (lane == 0) sm.present[slot][r / 32] = present;
    }
  };
  // The query, 64 heads x 512 floats, becomes SW128 fp16 (8-byte stores of 4 values): float4 j of this thread is
  // dims c .. c + 3 (c = 4 (tid % 128)) of head W j + x = W (j % (8 / W)) + x + 8 (j / (8 / W)), whose SW128 XOR
  // term depends on j % (8 / W) only. All loads are issued first, so they are in flight with the first tile's row
  // pointers (whose index loads they would otherwise wait behind).
  constexpr unsigned kQPer = kAttnBlockHeads * kHeadDim / 4 / kThreads;  // 32 (W = 2) or 16 float4 per thread
  constexpr unsigned kHeadPeriod = 8 / kWg;
  float4 qv[kQPer];
  {
    const float4* qsrc =
        reinterpret_cast<const float4*>(p.q + (static_cast<std::uint64_t>(token) * p.heads + h0) * kHeadDim);
#pragma unroll
    for (unsigned j = 0; j < kQPer; ++j) qv[j] = __ldg(qsrc + j * kThreads + tid);
  }
  tile_rows(0, r_begin);
  __syncthreads();
  if constexpr (kBf16Rows) {
    stage_bf16_rows(sm.k[0], sm.rows[0], p.q);
  } else {
    stage_fp8_rows(sm.k[1], sm.rows[0]);
  }
  {
    const unsigned c = 4 * (tid % 128);
#pragma unroll
    for (unsigned j = 0; j < kQPer; ++j) {
      *reinterpret_cast<uint2*>(sm.q + sw128_offset(kWg * (j % kHeadPeriod) + x, c, kAttnBlockHeads) +
                                (j / kHeadPeriod) * 8 * 128) =
          make_uint2(pack_half2(qv[j].x, qv[j].y), pack_half2(qv[j].z, qv[j].w));
    }
  }
  // Matrix descriptors: Q, this warpgroup's rows of the tile (S), P, and its dims of the tile (P V).
  const GmmaDesc desc_q = sw128_descriptor(sm.q, 16, 1024);
  // (Buffer k[1] is kTileBytes after k[0]: its descriptors are at(kTileBytes + ...) of these.)
  const GmmaDesc desc_k = sw128_descriptor(sm.k[0] + (s_group ? kSRows * x : 0) * 128, 16, 1024);
  const GmmaDesc desc_p = sw128_descriptor(sm.p, 16, 1024);
  const GmmaDesc desc_v = sw128_descriptor(sm.k[0] + kPvBlocks * x * (kRows * 128), 8192, 1024);
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // running max (log2 units) and sum
  float o[kPvBlocks][32];  // dims kPvDims x + 64 nb + ..., the m64n64 accumulator layout
#pragma unroll
  for (unsigned nb = 0; nb < kPvBlocks; ++nb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[nb][i] = 0.0f;
  }

  // Tile t uses rows[t % 2] and tile buffer t % 2. While P V of tile t runs on the tensor cores, each thread
  // widens its own pieces of tile t + 1 (BF16: no barrier needed for those, it copied them) or decodes its FP8
  // registers into the other buffer.
  Fp8RowRegs fp8;  // (FP8 rows only)
  cp_async_wait<0>();
  if constexpr (kBf16Rows) {
    widen_bf16_tile(sm.k[0]);
  } else {
    __syncthreads();  // the first raw tile is in (each thread decodes pieces that others copied)
    load_fp8_row_regs<true>(fp8, sm.rows[0], sm.k[1]);
    decode_fp8_row_regs(sm.k[0], fp8);
  }
  // The tile loop, as two copies: one for the warpgroups that compute S (kS) and one for the others. (With
  // S behind a runtime branch inside one loop, ptxas serialised every wgmma: C7520.)
  auto run_tiles = [&](auto s_group_tag) {
    constexpr bool kS = decltype(s_group_tag)::value;
    for (std::uint32_t t0 = r_begin, cur = 0; t0 < r_end; t0 += kRows, cur ^= 1u) {
      const bool has_next = t0 + kRows < r_end;
      const unsigned kb = cur;  // this tile's buffer
      // (With S on fewer warpgroups, the loop of the S warpgroups carries no code for the row pointers.)
      if constexpr (kSWg == kWg || !kS) {
        if (has_next) tile_rows(cur ^ 1u, t0 + kRows);
      }
      fence_shared_for_async();
      __syncthreads();  // the tile is fp16 (and the query); the next tile's row pointers are visible; the previous
                        // tile's P V is done (waited below), so its buffer and P are free

      // The next tile's loads go out while S runs, not before it: issued first, their register operands held the
      // S instructions back behind the load queue (round 22: the most-sampled stall of the FP8 kernel was the
      // instruction after the nine row loads, waiting for them to leave the queue).
      auto load_next = [&] {
        if (has_next) {
          if constexpr (kBf16Rows) {
            stage_bf16_rows(sm.k[kb ^ 1u], sm.rows[cur ^ 1u], p.q);
          } else {
            load_fp8_row_regs<false>(fp8, sm.rows[cur ^ 1u]);
          }
        }
      };
      float s[kSRows / 2];  // (warpgroups x < kSWg)
      if constexpr (kS) {
        // ---- S = Q K^T for rows [kSRows x, kSRows (x + 1)): k-step s = columns 16 s .. 16 s + 15.
        wgmma_fence();
#pragma unroll
        for (unsigned ks = 0; ks < kHeadDim / 16; ++ks) {
          const unsigned col = (ks / 4) * (kRows * 128) + (ks % 4) * 32;
          wgmma_m64n32k16_ss(s, desc_q.at(col), desc_k.at(kb * kTileBytes + col), ks > 0);
        }
        wgmma_commit();
        load_next();
        wgmma_wait<0>();
        // ---- online softmax. Columns 8 i + 2 tig (+1) of this warpgroup's rows: tile rows kSRows x + ...
        float mx_a = -INFINITY, mx_b = -INFINITY;
        // Row r of the tile is valid when its pointer is not null (bit r of the tile's present words; rows past
        // the list are null): this warpgroup's kSRows rows are word x (kSRows = 32), shifted to the thread's first.
        static_assert(kSRows == 32, "one present word per S warpgroup");
        const std::uint32_t present = sm.present[cur][x] >> (2 * tig);
#pragma unroll
        for (unsigned i = 0; i < kSRows / 8; ++i) {
#pragma unroll
          for (unsigned j = 0; j < 2; ++j) {
            const bool valid = (present >> (8 * i + j)) & 1u;
            s[4 * i + j] = valid ? s[4 * i + j] * p.scale_log2 : -INFINITY;
            s[4 * i + 2 + j] = valid ? s[4 * i + 2 + j] * p.scale_log2 : -INFINITY;
            mx_a = fmaxf(mx_a, s[4 * i + j]);
            mx_b = fmaxf(mx_b, s[4 * i + 2 + j]);
          }
        }
        mx_a = quad_max(mx_a);
        mx_b = quad_max(mx_b);
        if (tig == 0) {
          sm.part_max[x][ha] = mx_a;
          sm.part_max[x][hb] = mx_b;
        }
      } else {
        load_next();
      }
      __syncthreads();
      float mn_a = m_a, mn_b = m_b;
#pragma unroll
      for (unsigned y = 0; y < kSWg; ++y) {
        mn_a = fmaxf(mn_a, sm.part_max[y][ha]);
        mn_b = fmaxf(mn_b, sm.part_max[y][hb]);
      }
      const float al_a = mn_a == -INFINITY ? 1.0f : exp2_ftz(m_a - mn_a);
      const float al_b = mn_b == -INFINITY ? 1.0f : exp2_ftz(m_b - mn_b);
      if constexpr (kS) {
        float sum_a = 0.0f, sum_b = 0.0f;
        // P's store addresses, from the thread index made opaque here: otherwise ptxas keeps all eight
        // (loop-invariant) in registers for the whole loop, and with S on two warpgroups they spilled to local
        // memory, whose reloads sat on every tile's softmax (round 25).
        const unsigned ptid = opaque(tid), pg = (ptid % 32) / 4, pa = 16 * ((ptid / 32) % 4) + pg;
        std::uint8_t* const prow = sm.p + pa * 128 + 4 * (ptid % 4);
#pragma unroll
        for (unsigned i = 0; i < kSRows / 8; ++i) {
          const float p0 = mn_a == -INFINITY ? 0.0f : exp2_ftz(s[4 * i] - mn_a);
          const float p1 = mn_a == -INFINITY ? 0.0f : exp2_ftz(s[4 * i + 1] - mn_a);
          const float p2 = mn_b == -INFINITY ? 0.0f : exp2_ftz(s[4 * i + 2] - mn_b);
          const float p3 = mn_b == -INFINITY ? 0.0f : exp2_ftz(s[4 * i + 3] - mn_b);
          const __half2 xa = __floats2half2_rn(p0, p1), xb = __floats2half2_rn(p2, p3);
          // sw128_offset(ha, r, 64) and (hb, r, 64) for r = kSRows x + 8 i + 2 tig: rows ha and hb = ha + 8 share
          // the XOR term pg = ha % 8.
          std::uint8_t* const pc = prow + ((((kSRows * (ptid / 128)) / 8 + i) ^ pg) << 4);
          *reinterpret_cast<__half2*>(pc) = xa;
          *reinterpret_cast<__half2*>(pc + 8 * 128) = xb;
          const float2 fa = __half22float2(xa), fb = __half22float2(xb);
          sum_a += fa.x + fa.y;
          sum_b += fb.x + fb.y;
        }
        sum_a = quad_sum(sum_a);
        sum_b = quad_sum(sum_b);
        if (tig == 0) {
          sm.part_sum[x][ha] = sum_a;
          sm.part_sum[x][hb] = sum_b;
        }
      }
      // O *= alpha (register accumulators; the fence below orders these writes before the next wgmma), skipped
      // by a warp whose maxima all stayed (alpha = 1 exactly: the product would not change a bit).
      if (__any_sync(0xFFFFFFFFu, al_a != 1.0f || al_b != 1.0f)) scale_accumulator_rows(o, al_a, al_b);
      fence_shared_for_async();
      __syncthreads();  // P and every warpgroup's sums are in; every read of part_max is done
      l_a *= al_a;
      l_b *= al_b;
#pragma unroll
      for (unsigned y = 0; y < kSWg; ++y) {
        l_a += sm.part_sum[y][ha];
        l_b += sm.part_sum[y][hb];
      }
      m_a = mn_a;
      m_b = mn_b;
      // ---- O += P V for dims [kPvDims x, kPvDims (x + 1)): V = the tile as rows = K, k-step s = tile rows 16 s ...
      // As m64n128k16, two 64-dim blocks of O per instruction: A (P, 2 KB) is read from shared memory once per
      // 128 dims instead of per 64 (round 27: the FP8 batch-8 step's attention part -3 %).
      static_assert(kPvBlocks % 2 == 0, "P V as m64n128k16");
      wgmma_fence();
#pragma unroll
      for (unsigned nb = 0; nb < kPvBlocks; nb += 2) {
#pragma unroll
        for (unsigned ks = 0; ks < kRows / 16; ++ks) {
          wgmma_m64n128k16_ss<1>(*reinterpret_cast<float(*)[2][32]>(&o[nb][0]), desc_p.at(ks * 32),
                                 desc_v.at(kb * kTileBytes + nb * (kRows * 128) + ks * 16 * 128), true);
        }
      }
      wgmma_commit();
      if (has_next) {
        if constexpr (kBf16Rows) {
          cp_async_wait<0>();
          widen_bf16_tile(sm.k[kb ^ 1u]);
        } else {
          decode_fp8_row_regs(sm.k[kb ^ 1u], fp8);
        }
      }
      wgmma_wait<0>();
      // (The next iteration's barrier orders these reads of P and the tile before they are rewritten; the partial
      // maxima / sums are rewritten only after it.)
    }
  };
  if constexpr (kSWg == kWg) {
    run_tiles(std::true_type{});
  } else if (s_group) {
    run_tiles(std::true_type{});
  } else {
    run_tiles(std::false_type{});
  }
  // ---- the token's output (direct_output: this was its only split) or the partials: unnormalised O, running max
  // (log2 units) and sum per head. Either leaves through shared memory in bulk stores: warpgroup x stages its
  // kPvDims dims of the 64 heads as rows (x, h), and 64 of its threads each store one row, kPvDims floats that are
  // contiguous in out / part_o. (Written straight from the accumulators, a warp's 8-byte stores touched 8 rows
  // 2 KB apart per instruction, and those stores held the block's last microseconds: round 24 in
  // docs/cuda-dsv4-kernels-history.md.)
  // (Every warpgroup's last S and P V have read Q and the tiles, and the partial maxima: free.)
  const bool poisoned = __syncthreads_or(bad_index) != 0;
  float* stage = reinterpret_cast<float*>(sm.q);
  static_assert(kWg * kAttnBlockHeads * kStageStride<kPvDims> * sizeof(float) <= 3 * kTileBytes,
                "the staged rows fit in Q and the two tile buffers");
  float* row_a = stage + (kAttnBlockHeads * x + ha) * kStageStride<kPvDims>;
  float* row_b = stage + (kAttnBlockHeads * x + hb) * kStageStride<kPvDims>;
  if constexpr (kDirect) {
    // The 32 pairs' cosines and sines once per block, in the (now unused) partial maxima.
    float2* rope_cs = reinterpret_cast<float2*>(&sm.part_max[0][0]);
    static_assert(sizeof(sm.part_max) >= 32 * sizeof(float2), "the rope table fits");
    if (p.inverse_rope != 0) {
      if (tid < 32) rope_cs[tid] = inverse_rope_cos_sin(p, d.position, tid);
      __syncthreads();
    }
    const SingleSplitScale sa = single_split_scale(p, h0 + ha, m_a, l_a), sb = single_split_scale(p, h0 + hb, m_b, l_b);
#pragma unroll
    for (unsigned nb = 0; nb < kPvBlocks; ++nb) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
        const unsigned col = 64 * nb + 8 * i + 2 * tig, dim = kPvDims * x + col;
        float a0 = sa.apply(o[nb][4 * i]), a1 = sa.apply(o[nb][4 * i + 1]);
        float b0 = sb.apply(o[nb][4 * i + 2]), b1 = sb.apply(o[nb][4 * i + 3]);
        if (poisoned) a0 = a1 = b0 = b1 = quiet_nan();
        if (p.inverse_rope != 0 && dim >= kHeadDim - 64) {
          const float2 cs = rope_cs[(dim - (kHeadDim - 64)) / 2];
          inverse_rope_rotate(cs, a0, a1);
          inverse_rope_rotate(cs, b0, b1);
        }
        *reinterpret_cast<float2*>(row_a + col) = make_float2(a0, a1);
        *reinterpret_cast<float2*>(row_b + col) = make_float2(b0, b1);
      }
    }
  } else {
#pragma unroll
    for (unsigned nb = 0; nb < kPvBlocks; ++nb) {
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
        const unsigned col = 64 * nb + 8 * i + 2 * tig;
        *reinterpret_cast<float2*>(row_a + col) = make_float2(o[nb][4 * i], o[nb][4 * i + 1]);
        *reinterpret_cast<float2*>(row_b + col) = make_float2(o[nb][4 * i + 2], o[nb][4 * i + 3]);
      }
    }
    if (x == 0 && tig == 0) {
      p.part_ml[part_of(ha) * 2] = m_a;
      p.part_ml[part_of(ha) * 2 + 1] = poisoned ? quiet_nan() : l_a;
      p.part_ml[part_of(hb) * 2] = m_b;
      p.part_ml[part_of(hb) * 2 + 1] = poisoned ? quiet_nan() : l_b;
    }
  }
  fence_shared_for_async();  // the staged rows, before the bulk copies read them
  warpgroup_barrier(x);
  if (tid % 128 < kAttnBlockHeads) {
    const unsigned h = tid % 128;
    float* dst = kDirect ? p.out + (static_cast<std::uint64_t>(token) * p.heads + h0 + h) * kHeadDim
                         : p.part_o + part_of(h) * kHeadDim;
    tq::detail::bulk_store(dst + kPvDims * x, stage + (kAttnBlockHeads * x + h) * kStageStride<kPvDims>,
                           kPvDims * sizeof(float));
    tq::detail::bulk_store_commit_and_wait_read();  // (the block's shared memory must outlive the reads)
  }
}

}  // namespace

cudaError_t prepare_attention_wgmma() {
  for (const void* kernel :
       {reinterpret_cast<const void*>(attention_split_wgmma_kernel<true, false>),
        reinterpret_cast<const void*>(attention_split_wgmma_kernel<false, false>),
        reinterpret_cast<const void*>(attention_split_wgmma_kernel<true, true>),
        reinterpret_cast<const void*>(attention_split_wgmma_kernel<false, true>)}) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_attention_split_wgmma(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.splits, p.count, p.heads / kAttnBlockHeads);
  const std::size_t smem = kSmemBytes;
  if (p.storage == kRowBf16) {
    return p.direct_output != 0
               ? launch_after_previous(attention_split_wgmma_kernel<true, true>, grid, dim3(kBf16Threads), smem, stream, p)
               : launch_after_previous(attention_split_wgmma_kernel<true, false>, grid, dim3(kBf16Threads), smem, stream, p);
  }
  return p.direct_output != 0
             ? launch_after_previous(attention_split_wgmma_kernel<false, true>, grid, dim3(kFp8Threads), smem, stream, p)
             : launch_after_previous(attention_split_wgmma_kernel<false, false>, grid, dim3(kFp8Threads), smem, stream, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
