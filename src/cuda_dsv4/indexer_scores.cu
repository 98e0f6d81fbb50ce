// DeepSeek-V4 lightning indexer on the GPU, scores I[s] = sum_h w_h ReLU(q_h . k_s) on tensor cores (mma.sync):
// bf16 MMAs straight on BF16 key rows, int8 MMAs on MXFP4 rows decoded to integer codes. (FP8 rows go to the
// warpgroup kernel, indexer_scores_wgmma.cu; launch_indexer_scores below dispatches by storage.) The scores are bit-identical to the CPU fast path (indexer_scores): FP4-grid values are small integers
// times a power of two, so every q_h . k_s is exact here (int32, or f32 sums of at most 22 significant bits) and
// exact in the CPU's float32 sums; the head sum then runs in the CPU's order with IEEE round-to-nearest
// multiplies and adds (no FMA contraction). Rows or queries that are not on such a grid take an exact scalar
// emulation of the CPU's arithmetic instead. The head sum is the CPU's fixed tree (dsv4/indexer.cpp,
// head_block_sum), reduced in registers and shuffles from the MMAs' accumulators. The argument in full:
// docs/cuda-dsv4-kernels.md.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "indexer_rows16.cuh"
#include "indexer_score_parts.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kScoreGroupsAtOnce = 2;  // row groups of 8 whose MMA chains a warp interleaves (bf16 path)
constexpr unsigned kKiStride = 144;  // bytes per key row in shared memory (conflict-free B fragments)
// BF16 rows lie in shared memory 256 B apart, their 16-byte chunk c
// at position c ^ (row % 8). That keeps every access conflict-free without padding: the 8 rows of an ldmatrix
// matrix read 8 distinct bank groups, the row check's quarter-warps too (see its read order), and the eight
// copies of a quarter-warp's cp.async land in one aligned 128-byte line. (A padded stride of 272 B split each
// quarter-warp's copies over two lines: 2.6x the ideal shared-memory wavefronts of the copies, Nsight Compute.)
constexpr unsigned kRow16Bytes = 256;
constexpr unsigned kRawBytes = kScoreTileRows * kRow16Bytes;  // per buffer; MXFP4 tiles are smaller
__device__ __forceinline__ unsigned row16_chunk(unsigned row, unsigned chunk) {
  return row * kRow16Bytes + ((chunk ^ (row % 8)) << 4);
}

// The int8 rows of an MXFP4 tile (64 x kKiStride bytes) are written over the tile's own raw buffer once every
// thread has its raw values in registers; four blocks (16 warps) fit on a multiprocessor (the registers allow
// four as well).
static_assert(kScoreTileRows * kKiStride <= kRawBytes);
struct ScoreSmem {
  std::uint8_t raw[2][kRawBytes];
  float upper[kScoreTileRows];  // each row's sum over heads 32 .. 63 (the odd warps' half of the head tree)
  float sk[kScoreTileRows];     // power of two of each row's head sum: 2^fk of MXFP4 codes, 1 for BF16 rows;
                                // 0 marks a row of the scalar path (which writes its own score)
  int flagged[kScoreTileRows];  // rows of the tile that take the exact scalar path
  int nflagged[2];              // their count, by tile parity (reset one tile ahead; see the loop)
  TokenChecks checks;
};

// Copies the raw bytes of key rows [row0, row0 + nrows) into a shared buffer (BF16: chunks at row16_chunk;
// MXFP4: contiguous; a tile starts 16-byte aligned because 64 rows of 68 B are a multiple of 16).
template <bool kBf16>
__device__ __forceinline__ void stage_tile(std::uint8_t* dst, const std::uint8_t* rows, std::uint32_t row0,
                                           std::uint32_t nrows, std::uint32_t row_bytes) {
  const std::uint8_t* src = rows + static_cast<std::uint64_t>(row0) * row_bytes;
  if (kBf16 && nrows == kScoreTileRows) {
    // A whole tile: piece tid + 128 j is chunk tid % 16 of row tid / 16 + 8 j (the same row % 8 for every j);
    // fixed offsets from two per-thread bases (the general loop below spent ~10 instructions of address
    // arithmetic per copy).
    const std::uint8_t* s0 = src + threadIdx.x * 16;
    std::uint8_t* d0 = dst + row16_chunk(threadIdx.x / 16, threadIdx.x % 16);
#pragma unroll
    for (unsigned j = 0; j < kScoreTileRows * 16 / kScoreThreads; ++j) {
      cp_async16(d0 + j * (kScoreThreads / 16) * kRow16Bytes, s0 + j * kScoreThreads * 16);
    }
  } else if (kBf16) {
    for (unsigned c = threadIdx.x; c < nrows * 16; c += kScoreThreads) {
      cp_async16(dst + row16_chunk(c / 16, c % 16), src + c * 16);
    }
  } else {
    const unsigned bytes = nrows * row_bytes;
    const unsigned n16 = bytes / 16;
    for (unsigned c = threadIdx.x; c < n16; c += kScoreThreads) cp_async16(dst + c * 16, src + c * 16);
    for (unsigned c = n16 * 4 + threadIdx.x; c < bytes / 4; c += kScoreThreads) cp_async4(dst + c * 4, src + c * 4);
  }
  cp_async_commit();
}

// 32 MXFP4 values (4 words of 8 nibbles, value 8k + b in nibble b of word k) of one block as int8 codes
// (2 |e2m1| << shift, signed) into packed[0..8), four codes per word: a byte permute looks up four magnitudes
// in the shifted table of 2 |e2m1| = {0, 1, 2, 3, 4, 6, 8, 12}, a second the negated table, a third picks per
// value by its sign bit. Returns whether every code is exact (|code| <= 127): with shift s the largest index
// allowed is 7 (s <= 3), 5 (s = 4), 3, 1, 0 (s >= 7, or s < 0: a block below the row's smallest exponent
// holds zeros only). A table entry that overflows its byte spills into the next, larger entry, which is then
// not allowed either, so an allowed row never reads a spoiled entry.
__device__ __forceinline__ bool mxfp4_block_codes(const std::uint32_t* wd, int shift, std::uint32_t* packed) {
  const unsigned s = static_cast<unsigned>(min(max(shift, 0), 7));
  const std::uint32_t t0 = 0x03020100u << s, t1 = 0x0C080604u << s;
  const std::uint32_t n0 = ((~t0) & 0xFFFFFF00u) + 0x01010100u, n1 = ~t1 + 0x01010101u;  // -t per byte; -0 = 0
  std::uint32_t any_index = 0, any_six_seven = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::uint32_t w = wd[k];
    any_index |= w;
    any_six_seven |= w & (w << 1);  // bit 2 of a nibble: index bits 2 and 1 both set (6 or 7)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t nib4 = w >> (16 * h);  // four nibbles in the low 16 bits
      const std::uint32_t index = nib4 & 0x7777u;
      const std::uint32_t pos = __byte_perm(t0, t1, index), neg = __byte_perm(n0, n1, index);
      packed[2 * k + h] = __byte_perm(pos, neg, 0x3210u | ((nib4 >> 1) & 0x4444u));
    }
  }
  if (shift >= 0 && shift <= 3) return true;
  if (shift == 4) return (any_six_seven & 0x44444444u) == 0;
  if (shift == 5) return (any_index & 0x44444444u) == 0;
  if (shift == 6) return (any_index & 0x66666666u) == 0;
  return (any_index & 0x77777777u) == 0;
}

// The CPU's head tree (dsv4/indexer.cpp, head_block_sum: heads h = 32 a + 16 m + 2 g + b; the pairs b, then
// the two m, then a butterfly over g, then the two a) from the MMA accumulators of a warp's quarter of a tile.
// Lane (g, tig) holds, for each group of 8 rows and each m-tile m, the terms of heads 32 a + 16 m + 2 g + b (A rows
// g, g + 8: b = 0, 1; a = warp % 2) against rows 2 tig + c: term(m, c) and term(m, c + 2). The pairs and the two m
// add in the lane; the butterfly over g is a reduce-scatter across the lanes 4, 8 and 16 apart, which leaves each
// lane one row's sum over its warp's 32 heads (row_of_lane). Float addition commutes exactly, so which lane's
// value comes first does not matter; the order of the tree is the CPU's.
struct HeadTree {
  float kept[2][2];  // after the first butterfly level: [pair of groups][c]

  // In-lane part for one group: ((t(2g) + t(2g+1)) + (t(16+2g) + t(17+2g))) of row 2 tig + c.
  template <typename Term>
  static __device__ __forceinline__ float lane_sum(Term term, unsigned c) {
    return __fadd_rn(__fadd_rn(term(0, c), term(0, c + 2)), __fadd_rn(term(1, c), term(1, c + 2)));
  }
  // First level (g and g ^ 1, lanes 4 apart) for groups 2 pair and 2 pair + 1 (v[i][c]): the lane keeps group
  // 2 pair + (g % 2).
  __device__ __forceinline__ void first_level(unsigned pair, const float (&v)[2][2], unsigned lane) {
    const bool odd = (lane >> 2) & 1u;
#pragma unroll
    for (unsigned c = 0; c < 2; ++c) {
      const float send = odd ? v[0][c] : v[1][c], keep = odd ? v[1][c] : v[0][c];
      kept[pair][c] = __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 4));
    }
  }
  // Second (lanes 8 apart: the lane keeps pair (g / 2) % 2) and third level (16 apart: c = g / 4).
  __device__ __forceinline__ float finish(unsigned lane) const {
    const bool b1 = (lane >> 3) & 1u, b2 = (lane >> 4) & 1u;
    float q[2];
#pragma unroll
    for (unsigned c = 0; c < 2; ++c) {
      const float send = b1 ? kept[0][c] : kept[1][c], keep = b1 ? kept[1][c] : kept[0][c];
      q[c] = __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 8));
    }
    const float send = b2 ? q[0] : q[1], keep = b2 ? q[1] : q[0];
    return __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 16));
  }
  // The row (of the warp's 32: 8 group + 2 tig + c) whose sum finish() leaves in this lane.
  static __device__ __forceinline__ unsigned row_of_lane(unsigned lane) {
    const unsigned g = lane / 4, group = 2 * ((g >> 1) & 1u) + (g & 1u);
    return 8 * group + 2 * (lane % 4) + (g >> 2);
  }
};

// Tensor-core terms of one warp's quarter of a tile of BF16 rows (row16_chunk layout) into its head tree: 32 heads
// (head0 + 16 mt + 2 g, + 1: A rows g, g + 8 of the fragments a[mt]) x 32 rows (groups group0 .. group0 + 3 of
// 8 rows), so that each warp reads half the tile's rows: a warp of 16 heads x 64 rows read every row four times
// per tile, and those ldmatrix wavefronts were the largest share of a shared-memory pipe that ran at ~87 %
// (Nsight Compute).
// ldmatrix register j of 32-dim chunk c holds dims 32 c + 8 j + 2 tig, + 1 of row 8 group + g, the B fragments of
// k-steps 2 c (j = 0, 1) and 2 c + 1 (j = 2, 3). Terms fl((w_h 2^fq_h) max(I, 0)); rows past the tile's end hold
// stale bytes, and their sums (each row's its own) are never stored.
__device__ __forceinline__ void mma_terms_bf16(HeadTree& tree, const std::uint8_t* rows,
                                               const std::uint32_t (&a)[2][8][4], const float (&wqa)[2],
                                               const float (&wqb)[2], unsigned group0, unsigned lane) {
  constexpr unsigned kGroupsAtOnce = kScoreGroupsAtOnce;
  static_assert(kGroupsAtOnce == 2, "the head tree's first level pairs the groups of one step");
  // Lane l addresses row l % 8 of matrix l / 8, whose 16-byte chunk 4 c + l / 8 lies at (4 c + l / 8) ^ (l % 8):
  // 8 (c / 2) + (x, or x ^ 4 for odd c), x = (l / 8) ^ (l % 8).
  const unsigned x = (lane / 8) ^ (lane % 8);
  const std::uint8_t* lane_row = rows + (group0 * 8 + lane % 8) * kRow16Bytes;
  auto mma = [](float (&d)[4], const std::uint32_t (&af)[4], std::uint32_t b0, std::uint32_t b1) {
    mma_bf16(d, af, b0, b1);
  };
#pragma unroll
  for (unsigned ng0 = 0; ng0 < 4; ng0 += kGroupsAtOnce) {
    float acc[kGroupsAtOnce][2][4];
#pragma unroll
    for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
#pragma unroll
      for (unsigned mt = 0; mt < 2; ++mt) acc[i][mt][0] = acc[i][mt][1] = acc[i][mt][2] = acc[i][mt][3] = 0.0f;
    }
#pragma unroll
    for (unsigned c = 0; c < kIndexerDim / 32; ++c) {
      std::uint32_t b[kGroupsAtOnce][4];
#pragma unroll
      for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
        ldmatrix_x4(b[i], lane_row + (ng0 + i) * 8 * kRow16Bytes + ((8 * (c / 2) + (c % 2 ? x ^ 4u : x)) << 4));
      }
#pragma unroll
      for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
#pragma unroll
        for (unsigned mt = 0; mt < 2; ++mt) mma(acc[i][mt], a[mt][2 * c], b[i][0], b[i][1]);
      }
#pragma unroll
      for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
#pragma unroll
        for (unsigned mt = 0; mt < 2; ++mt) mma(acc[i][mt], a[mt][2 * c + 1], b[i][2], b[i][3]);
      }
    }
    float v[kGroupsAtOnce][2];
#pragma unroll
    for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
#pragma unroll
      for (unsigned c = 0; c < 2; ++c) {
        v[i][c] = HeadTree::lane_sum([&](unsigned mt, unsigned j) {
          return __fmul_rn(j < 2 ? wqa[mt] : wqb[mt], fmaxf(acc[i][mt][j], 0.0f));
        }, c);
      }
    }
    tree.first_level(ng0 / kGroupsAtOnce, v, lane);
  }
}

// A row of the tile (r < nrows) that the tensor-core path cannot score joins the tile's list for the scalar path,
// which writes its score (its sk is then 0, so the tensor path's does not). Called by one of the row's two threads.
__device__ __forceinline__ void flag_for_scalar_path(ScoreSmem& sm, unsigned buf, unsigned r, std::uint32_t nrows,
                                                     bool tensor_path) {
  if (r < nrows && !tensor_path) sm.flagged[atomicAdd(&sm.nflagged[buf], 1)] = static_cast<int>(r);
}

// fl(wq max(I, 0)) of an integer dot I (|I| < 2^21) in two instructions: the bits 0x4B000000 + max(I, 0) (one
// add-and-max) are the float 2^23 + max(I, 0), exactly (the floats of [2^23, 2^24) are the integers), and one
// FMA with offset = -wq 2^23 rounds wq (2^23 + max(I, 0)) - wq 2^23 = wq max(I, 0) once. (A zero product comes out
// +0 where fl(wq 0) is -0 for a negative wq; the head sum starts at +0, so the sign of a zero term never shows.)
__device__ __forceinline__ float relu_product(float wq, float offset, int dot) {
  return __fmaf_rn(wq, __int_as_float(__viaddmax_s32(dot, 0x4B000000, 0x4B000000)), offset);
}

// Block: 4 warps; tiles of 64 key rows of one token, raw bytes double-buffered in shared memory with cp.async.
// Warp w scores heads 32 (w % 2) .. + 31 on rows 32 (w / 2) .. + 31 of a tile. The path by storage (per tile):
// - BF16 rows go to bf16 MMAs as they are: row check, MMA, head sums; two barriers.
// - MXFP4 rows become int8 codes at one exponent 2^fk per row for int8 MMAs, whose terms are over 2^fk (applied
//   to the head sum); four barriers.
enum class ScorePath { Bf16Rows, Mxfp4Codes };

template <ScorePath kPath>
__global__ void __launch_bounds__(kScoreThreads, 4) score_kernel(ScoreParams p) {
  wait_for_previous_grid();
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  ScoreSmem& sm = *reinterpret_cast<ScoreSmem*>(smem_raw);
  const unsigned token = blockIdx.y;
  const TokenRowsDev desc = p.tokens[token];
  if (rows_beyond_bound(desc.position, 4, p.max_visible)) return write_beyond_bound_scores(p, token);
  const std::uint32_t visible = static_cast<std::uint32_t>((desc.position + 1) / 4);
  const std::uint32_t tiles = (visible + kScoreTileRows - 1) / kScoreTileRows;
  if (blockIdx.x >= tiles) return;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
  std::uint32_t tile = blockIdx.x;
  constexpr bool kBf16 = kPath == ScorePath::Bf16Rows;
  stage_tile<kBf16>(sm.raw[0], desc.indexer_rows, tile * kScoreTileRows,
                    min(kScoreTileRows, visible - tile * kScoreTileRows), p.row_bytes);

  const ScoreToken tk = score_token(p, token);
  const std::int8_t* qi = tk.qi;
  const float* qf = tk.qf;
  const float* w = tk.w;
  if (tid == 0) {
    sm.checks.reset();
    sm.nflagged[0] = sm.nflagged[1] = 0;
  }
  __syncthreads();
  if (tid < p.heads) sm.checks.add_head(tk, tid);
  // A fragments stay in registers. Warp w scores heads 32 (w % 2) + [0, 32) (two m-tiles of 16; 8 k-steps of 16
  // on the bf16 path, 4 of 32 on the int8 path) on rows 32 (w / 2) + [0, 32) of each tile, so that each key row
  // is read by two warps, not four.
  using RowFormat = Bf16Bits;  // (the query codes of the bf16 path)
  constexpr bool kIntCodes = kPath == ScorePath::Mxfp4Codes;
  constexpr int kKSteps = kIntCodes ? 4 : 8;
  constexpr unsigned kMTiles = 2;
  std::uint32_t a[2][8][4];  // (the int8 path uses a[mt][0..3])
  const unsigned head0 = (warp % 2) * 32, group0 = (warp / 2) * 4;
  float wqa[2] = {0.0f, 0.0f}, wqb[2] = {0.0f, 0.0f};
#pragma unroll
  for (unsigned mt = 0; mt < kMTiles; ++mt) {
    const unsigned ha = head0 + 16 * mt + 2 * g, hb = ha + 1;  // A rows g and g + 8 (see HeadTree)
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if constexpr (!kIntCodes) {
        const unsigned col = ks * 16 + tig * 2;
        auto pair_at = [&](unsigned h, unsigned c) {
          return static_cast<std::uint32_t>(*reinterpret_cast<const std::uint16_t*>(qi + h * kIndexerDim + c));
        };
        a[mt][ks][0] = codes_to_16bit_pair<RowFormat>(pair_at(ha, col));
        a[mt][ks][1] = codes_to_16bit_pair<RowFormat>(pair_at(hb, col));
        a[mt][ks][2] = codes_to_16bit_pair<RowFormat>(pair_at(ha, col + 8));
        a[mt][ks][3] = codes_to_16bit_pair<RowFormat>(pair_at(hb, col + 8));
      } else {
        const unsigned col = ks * 32 + tig * 4;
        a[mt][ks][0] = *reinterpret_cast<const std::uint32_t*>(qi + ha * kIndexerDim + col);
        a[mt][ks][1] = *reinterpret_cast<const std::uint32_t*>(qi + hb * kIndexerDim + col);
        a[mt][ks][2] = *reinterpret_cast<const std::uint32_t*>(qi + ha * kIndexerDim + col + 16);
        a[mt][ks][3] = *reinterpret_cast<const std::uint32_t*>(qi + hb * kIndexerDim + col + 16);
      }
    }
    // w_h * 2^fq_h of the thread's heads (exact: checked above, else the whole token takes the scalar path).
    wqa[mt] = ha < p.heads ? weight_times_2fq(tk, ha) : 0.0f;
    wqb[mt] = hb < p.heads ? weight_times_2fq(tk, hb) : 0.0f;
  }
  // -wq 2^23 for relu_product (int8 path): exact unless it overflows, and then (w 2^fq above 2^104) the row checks
  // below flag every row, whose terms the scalar path writes.
  const float wqa_offset[2] = {__fmul_rn(wqa[0], -8388608.0f), __fmul_rn(wqa[1], -8388608.0f)};
  const float wqb_offset[2] = {__fmul_rn(wqb[0], -8388608.0f), __fmul_rn(wqb[1], -8388608.0f)};
  __syncthreads();
  const bool q_ok = sm.checks.q_ok != 0;
  const int fq_min = sm.checks.fq_min, fq_max = sm.checks.fq_max, wq_emin = sm.checks.wq_emin,
            wq_emax = sm.checks.wq_emax;

  for (unsigned buf = 0; tile < tiles; buf ^= 1u) {
    const std::uint32_t row0 = tile * kScoreTileRows;
    const std::uint32_t nrows = min(kScoreTileRows, visible - row0);
    const std::uint32_t next = tile + gridDim.x;
    if (next < tiles) {
      stage_tile<kBf16>(sm.raw[buf ^ 1u], desc.indexer_rows, next * kScoreTileRows,
                        min(kScoreTileRows, visible - next * kScoreTileRows), p.row_bytes);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the tile's raw rows are in; every thread is done with the previous tile
    // The next tile's flagged-row count is reset here: its last readers (the previous tile's scalar path) are
    // past this barrier, and its writers (the next tile's row checks) come after the next tile's first barrier.
    // This tile adds to nflagged[buf], reset one tile ago (the first tile's in the prologue).
    if (tid == 0) sm.nflagged[buf ^ 1u] = 0;
    HeadTree tree;
    if constexpr (kPath == ScorePath::Bf16Rows) {
      // ---- row check: two threads per key row (dims [64 half, 64 half + 64)), then the MMAs on the raw rows.
      // (Rows past a short tile's end hold stale bytes: checked like any row, never flagged, their terms never
      // summed; reading them unconditionally keeps the loads unpredicated.)
      // (The check is order-free: the thread of half 1 reads its chunks from the fifth on, so a quarter-warp's
      // four rows x two halves hit eight distinct bank groups.)
      const unsigned r = tid / 2, half = tid % 2;
      std::uint32_t words[32];
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        const uint4 q = *reinterpret_cast<const uint4*>(sm.raw[buf] + row16_chunk(r, 8 * half + (k ^ 4 * half)));
        words[4 * k] = q.x;
        words[4 * k + 1] = q.y;
        words[4 * k + 2] = q.z;
        words[4 * k + 3] = q.w;
      }
      bool ok = true;
      const int e = row_check_16bit<Bf16Bits>(words, ok);
      // The CPU's own float dot must be exact as well: its products are multiples of 2^(fq + e - 7) and its
      // partial sums below 2^(fq + e + 15). The terms fl((w 2^fq) max(I, 0)) are then the CPU's terms
      // fl(w max(q.k, 0)) themselves ((w 2^fq) I = w q.k exactly), whatever their magnitude: 2^fk = 1.
      ok = ok && fq_min + e - 7 >= -149 && fq_max + e + 15 <= 126;
      if (half == 0) {
        sm.sk[r] = q_ok && ok ? 1.0f : 0.0f;
        flag_for_scalar_path(sm, buf, r, nrows, q_ok && ok);
      }
      mma_terms_bf16(tree, sm.raw[buf], a, wqa, wqb, group0, lane);
    } else {
      // ---- MXFP4 decode: two threads per key row (dims [64 half, 64 half + 64)) to integer codes at one exponent.
      {
        const unsigned r = tid / 2, half = tid % 2;
        const std::uint8_t* raw = sm.raw[buf];
        std::uint32_t packed[16];
        int f = 0;
        bool ok = true;
        {
          const std::uint8_t* rr = raw + r * 68;
          std::uint32_t wd[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            wd[k] = r < nrows ? *reinterpret_cast<const std::uint32_t*>(rr + half * 32 + 4 * k) : 0u;
          }
          const std::uint32_t sw = r < nrows ? *reinterpret_cast<const std::uint32_t*>(rr + 64) : 0u;
          const int e0 = static_cast<int>((sw >> (16 * half)) & 0xFFu);
          const int e1 = static_cast<int>((sw >> (16 * half + 8)) & 0xFFu);
          const bool nz0 = ((wd[0] | wd[1] | wd[2] | wd[3]) & 0x77777777u) != 0;
          const bool nz1 = ((wd[4] | wd[5] | wd[6] | wd[7]) & 0x77777777u) != 0;
          int emin = min(nz0 ? e0 : 1000, nz1 ? e1 : 1000);
          emin = min(emin, __shfl_xor_sync(0xFFFFFFFFu, emin, 1));
          const bool zero_row = emin == 1000;
          f = zero_row ? 0 : emin - 128;  // value = e2m1 x 2^(e - 127) = (2 e2m1) x 2^(e - 128)
          ok = f >= -126 && f <= 100;
          const int sh0 = zero_row ? 0 : e0 - emin, sh1 = zero_row ? 0 : e1 - emin;
          const bool exact0 = mxfp4_block_codes(wd, sh0, packed), exact1 = mxfp4_block_codes(wd + 4, sh1, packed + 8);
          ok = ok && exact0 && exact1;
        }
        // (The shuffle runs in every lane: inside a short-circuited && it would not, and the warp would hang.)
        const bool partner_ok = __shfl_xor_sync(0xFFFFFFFFu, ok ? 1 : 0, 1) != 0;
        ok = ok && partner_ok;
        // Exactness of I * 2^fq * 2^fk (see the file comment): products above 2^-149, results below 2^121.
        ok = ok && fq_min + f >= -149 && fq_max + f <= 100;
        // The epilogue rounds (w 2^fq) I and the head sum scales by 2^fk at the end (see the head sum): exact
        // when every nonzero product is normal with and without 2^fk and no partial sum can overflow.
        ok = ok && wq_emin + min(f, 0) >= -126 && wq_emax + 27 + max(f, 0) <= 127;
        __syncthreads();  // every raw row is in registers: the int8 rows may now overwrite the raw buffer
        // Int8 row layout for the MMA: the B fragments of k-step ks are words 8 ks + tig (dims 32 ks + 4 tig ...)
        // and 8 ks + 4 + tig; they are stored at words 8 tig + 2 ks (+1), so that lane tig reads its eight words
        // of a row with two 16-byte loads. This thread holds words 16 half .. 16 half + 15.
        std::uint8_t* ki = sm.raw[buf] + r * kKiStride;
#pragma unroll
        for (int ks2 = 0; ks2 < 2; ++ks2) {
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const unsigned ks = 2 * half + ks2;
            *reinterpret_cast<uint2*>(ki + 4 * (8 * t + 2 * ks)) =
                make_uint2(packed[8 * ks2 + t], packed[8 * ks2 + 4 + t]);
          }
        }
        if (half == 0) {
          sm.sk[r] = q_ok && ok ? pow2f(f) : 0.0f;
          flag_for_scalar_path(sm, buf, r, nrows, q_ok && ok);
        }
      }
      __syncthreads();
      // ---- int8 MMA on the warp's quarter (32 heads x 32 rows, as on the bf16 path: each warp reads half the
      // tile's int8 rows; a warp of 16 heads x 64 rows read all of them): two groups of 8 rows at a time, each
      // against both m-tiles, so four independent MMA chains interleave (one chain of four dependent MMAs alone
      // stalls on every MMA's latency: the H200 profile showed a NOP and a fixed-latency wait between them); dots
      // exact, then fl((w_h 2^fq_h) max(I, 0)) into the head tree (2^fk is applied to the row's head sum).
      constexpr unsigned kGroupsAtOnce = 2;
#pragma unroll
      for (unsigned ng0 = 0; ng0 < 4; ng0 += kGroupsAtOnce) {
        int acc[kGroupsAtOnce][2][4] = {};
        uint4 k01[kGroupsAtOnce], k23[kGroupsAtOnce];
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
          // The int8 rows (see ScoreSmem and the decode's layout): this lane's eight B words of row 8 group + g.
          const std::uint8_t* kb = sm.raw[buf] + ((group0 + ng0 + i) * 8 + g) * kKiStride + tig * 32;
          k01[i] = *reinterpret_cast<const uint4*>(kb);
          k23[i] = *reinterpret_cast<const uint4*>(kb + 16);
        }
        auto mma_step = [&](unsigned ks, unsigned i, std::uint32_t b0, std::uint32_t b1) {
#pragma unroll
          for (unsigned mt = 0; mt < 2; ++mt) mma_s8(acc[i][mt], a[mt][ks], b0, b1);
        };
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) mma_step(0, i, k01[i].x, k01[i].y);
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) mma_step(1, i, k01[i].z, k01[i].w);
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) mma_step(2, i, k23[i].x, k23[i].y);
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) mma_step(3, i, k23[i].z, k23[i].w);
        float v[kGroupsAtOnce][2];
#pragma unroll
        for (unsigned i = 0; i < kGroupsAtOnce; ++i) {
#pragma unroll
          for (unsigned c = 0; c < 2; ++c) {
            v[i][c] = HeadTree::lane_sum([&](unsigned mt, unsigned j) {
              return j < 2 ? relu_product(wqa[mt], wqa_offset[mt], acc[i][mt][j])
                           : relu_product(wqb[mt], wqb_offset[mt], acc[i][mt][j]);
            }, c);
          }
        }
        tree.first_level(ng0 / kGroupsAtOnce, v, lane);
      }
    }
    // ---- head sums: each warp's 32 heads in registers (HeadTree), the odd warp's half through shared memory.
    const float half_sum = tree.finish(lane);
    const unsigned my_row = (warp / 2) * 32 + HeadTree::row_of_lane(lane);
    if (warp % 2 == 1) sm.upper[my_row] = half_sum;
    __syncthreads();  // the upper halves are in; the flagged rows are listed (sk = 0 for them)
    // Total = ((lower + upper) + 0) times the row's power of two sk (2^fk of MXFP4 codes; 1 for
    // BF16 rows, whose terms are the CPU's own); + 0 turns a zero total into +0 as the CPU does.
    // The CPU's terms are p_h sk with p_h = fl((w_h 2^fq_h) I_h): when p_h and p_h sk are both normal (checked per
    // row), rounding commutes with the power of two, so the terms are the CPU's bits over sk. Then so is every
    // partial sum, in any order of the adds: a rounded sum that is normal in both scales rounds the same relative
    // bits, and one that is subnormal in either scale is exact there (a sum of multiples of 2^-149 below 2^-126),
    // hence representable and exact in the other scale too; no partial sum can overflow (checked for all 64
    // terms, so for every subset). So the sum times sk is exactly the CPU's total, and the multiply does not round.
    if (warp % 2 == 0 && my_row < nrows) {
      const float sk = sm.sk[my_row];
      if (sk != 0.0f) {
        const float total = __fmul_rn(__fadd_rn(__fadd_rn(half_sum, sm.upper[my_row]), 0.0f), sk);
        p.scores[static_cast<std::uint64_t>(token) * p.score_stride + row0 + my_row] = total;
      }
    }
    // ---- exact scalar path for rows (or a query) off the integer grid.
    score_flagged_rows(p, desc.indexer_rows, token, row0, sm.flagged, sm.nflagged[buf], warp, lane, qf, w);
    // No barrier here: the next tile's copies go to the buffer this tile's MMAs have finished reading, and
    // upper / sk / flagged are written again only after the next tile's first barrier.
    tile = next;
  }
}

}  // namespace

ScoreKernelInfo prepare_indexer_scores() {
  ScoreKernelInfo info;
  info.blocks_per_sm = 1 << 20;
  for (auto kernel :
       {score_kernel<ScorePath::Bf16Rows>, score_kernel<ScorePath::Mxfp4Codes>}) {
    int blocks = 0;
    info.error =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(ScoreSmem)));
    if (info.error == cudaSuccess) {
      info.error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kScoreThreads, sizeof(ScoreSmem));
    }
    if (info.error != cudaSuccess) return info;
    info.blocks_per_sm = min(info.blocks_per_sm, blocks);  // the grid suits every variant
  }
  const ScoreKernelInfo wg = prepare_indexer_scores_fp8_wgmma();
  info.error = wg.error;
  info.blocks_per_sm = min(info.blocks_per_sm, wg.blocks_per_sm);
  return info;
}

cudaError_t launch_indexer_scores(const ScoreParams& p, cudaStream_t stream) {
  if (p.count == 0 || p.blocks_per_token == 0) return cudaSuccess;
  const dim3 grid(p.blocks_per_token, p.count);
  if (p.storage == kIdxFp8) return launch_indexer_scores_fp8_wgmma(p, stream);
  auto kernel = p.storage == kIdxBf16 ? score_kernel<ScorePath::Bf16Rows> : score_kernel<ScorePath::Mxfp4Codes>;
  return launch_after_previous(kernel, grid, dim3(kScoreThreads), sizeof(ScoreSmem), stream, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
