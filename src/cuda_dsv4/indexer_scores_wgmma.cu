// DeepSeek-V4 lightning indexer scores on FP8 key rows with warpgroup MMAs (wgmma, sm_90a): the same scores,
// bit for bit, as the CPU. A block is one warpgroup. The key tile is the A operand, from registers: warp w widens
// its own 16 rows of a 64-row tile (e4m3 -> f16, exact) straight into its MMA fragments, and eight m64n64k16
// instructions multiply them by the query (64 heads x 128 dims as f16 integer codes, the B operand, in shared
// memory for the whole loop): the accumulators hold I = q.k / (2^fq 2^k) exactly (products of at most 7 + 4
// significant bits, f32 sums of at most 22 bits; docs/cuda-dsv4-kernels.md). A warp stages, widens, checks and
// scores its rows alone: no block barrier per tile, and the tile never goes back to shared memory as f16.
//
// Two permutations make that cheap, both applied to the query when it is written to shared memory:
// - Dims. Thread (warp w, lane l; j = l % 4) holds A rows 16 w + l / 4 and + 8 and, per k-step s, the fragment
//   positions 2 j, 2 j + 1, 2 j + 8, 2 j + 9; it loads them as one 32-bit word of 4 codes per row, dims
//   32 j + 4 s .. 32 j + 4 s + 3 (so position p of k-step s is dim 32 ((p % 8) / 2) + 4 s + 2 (p / 8) + p % 2).
//   With rows 132 bytes (33 words) apart, the 32 lanes' words fall in 32 different banks. The MMA's sums are
//   exact, so the order of the dims in them does not matter.
// - Heads. The accumulator gives thread (w, l) columns 8 i + 2 j + c (i < 8, c < 2) of its two rows. Column n
//   holds head column_head(n) = 32 a + 16 m + 2 g + b with b = c, i = 4 m + 2 g1 + g0, j = 2 a + g2
//   (g = 4 g2 + 2 g1 + g0), so the CPU's head tree (dsv4/indexer_head_sum.hpp: pairs b, then m, then g bit 0, 1,
//   2, then a) runs in the thread for b, m, g0 and g1, and across the lanes 1 and 2 apart for g2 and a.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bulk_copy.cuh"
#include "cuda/mbarrier.cuh"
#include "cuda/wgmma.cuh"
#include "fp8_grid_check.hpp"
#include "indexer_rows16.cuh"
#include "indexer_score_parts.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kFp8RowBytes = 132;                              // 128 e4m3 codes + the f32 scale
constexpr unsigned kWarpRows = 16;                                  // a warp's key rows: its A rows
constexpr unsigned kQueryBytes = kIndexerMaxHeads * kIndexerDim * 2;  // the query as a 64 x 128 f16 operand (16 KB)
constexpr unsigned kColumnBlockBytes = kIndexerMaxHeads * 128;        // 64 dims of it (8 KB)
static_assert(kScoreThreads == 4 * 32 && kScoreTileRows == 4 * kWarpRows, "one warpgroup; 16 rows per warp");
static_assert(kIndexerMaxHeads == 64, "the query is one n64 operand");

struct WgScoreSmem {
  std::uint8_t q[kQueryBytes];  // B: row n = head column_head(n), K = dims in the permuted order (1024-byte aligned)
  std::uint8_t raw[2][kScoreTileRows * kFp8RowBytes];  // FP8 tiles as stored, double-buffered, by warp
  std::uint64_t ready[2][4];  // [buffer][warp]: the warp's rows of the buffer have landed (mbarrier phases)
  TokenChecks checks;
};
constexpr std::size_t kWgScoreSmemBytes = sizeof(WgScoreSmem) + 1024;  // (+ alignment of the base to 1024)

// The head of B row (accumulator column) n: see the file comment.
__device__ __forceinline__ unsigned column_head(unsigned n) {
  const unsigned i = n / 8, j = (n / 2) % 4, b = n % 2;
  const unsigned m = i / 4, g = 4 * (j % 2) + i % 4, a = j / 2;
  return 32 * a + 16 * m + 2 * g + b;
}

__global__ void __launch_bounds__(kScoreThreads, 4) score_fp8_wgmma_kernel(ScoreParams p) {
  wait_for_previous_grid();
  extern __shared__ std::uint8_t smem_raw[];
  WgScoreSmem& sm = *reinterpret_cast<WgScoreSmem*>(
      smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  const unsigned token = blockIdx.y;
  const TokenRowsDev desc = p.tokens[token];
  if (rows_beyond_bound(desc.position, 4, p.max_visible)) return write_beyond_bound_scores(p, token);
  const std::uint32_t visible = static_cast<std::uint32_t>((desc.position + 1) / 4);
  const std::uint32_t tiles = (visible + kScoreTileRows - 1) / kScoreTileRows;
  if (blockIdx.x >= tiles) return;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32, j = lane % 4;
  std::uint32_t tile = blockIdx.x;
  // Warp w copies rows [16 w, 16 w + 16) of tile t (those before the token's end) into raw[buf] and completes
  // the phase of ready[buf][w] when they have landed: one bulk copy by lane 0 when their bytes are a multiple of
  // 16 (every tile but a token's last), else cp.async by the lanes, waited for at once (once per token at most).
  namespace tqd = tq::detail;
  auto stage = [&](unsigned buf, std::uint32_t t) {
    const std::uint32_t first = t * kScoreTileRows + kWarpRows * warp;
    const std::uint32_t rows = first < visible ? min(kWarpRows, visible - first) : 0u;
    const std::uint8_t* src = desc.indexer_rows + static_cast<std::uint64_t>(first) * kFp8RowBytes;
    std::uint8_t* dst = sm.raw[buf] + kWarpRows * warp * kFp8RowBytes;
    std::uint64_t* bar = &sm.ready[buf][warp];
    const unsigned bytes = rows * kFp8RowBytes;
    if (bytes % 16 == 0) {
      if (lane == 0) {
        tqd::mbar_arrive_expect_tx(bar, bytes);
        if (bytes != 0) tqd::bulk_copy(dst, src, bytes, bar);
      }
    } else {
      for (unsigned c = lane; c < bytes / 16; c += 32) cp_async16(dst + c * 16, src + c * 16);
      for (unsigned c = bytes / 16 * 4 + lane; c < bytes / 4; c += 32) cp_async4(dst + c * 4, src + c * 4);
      cp_async_commit();
      cp_async_wait<0>();
      __syncwarp();
      if (lane == 0) tqd::mbar_arrive(bar);
    }
  };
  if (lane == 0) {
    tqd::mbar_init(&sm.ready[0][warp], 1);
    tqd::mbar_init(&sm.ready[1][warp], 1);
    fence_shared_for_async();  // the initialised barriers, before the bulk copies complete on them
  }
  __syncwarp();
  stage(0, tile);

  const ScoreToken tk = score_token(p, token);
  float* out = p.scores + static_cast<std::uint64_t>(token) * p.score_stride;
  if (tid == 0) sm.checks.reset();
  __syncthreads();
  if (tid < p.heads) sm.checks.add_head(tk, tid);
  // The query's B operand: thread t writes K positions [64 half, 64 half + 64) of row n = t / 2 (half = t % 2).
  // Its 16-byte chunk q holds positions 64 half + 8 q .. + 7, i.e. dims 32 e + 16 half + 2 q, + 1 for e < 4: the
  // 16-bit pair q of the query's 16-byte chunks at dims 32 e + 16 half. Zero for heads past the last.
  {
    const unsigned n = tid / 2, half = tid % 2, h = column_head(n);
    uint4 chunk[4] = {};
    if (h < p.heads) {
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) {
        chunk[e] = *reinterpret_cast<const uint4*>(tk.qi + h * kIndexerDim + 32 * e + 16 * half);
      }
    }
#pragma unroll
    for (unsigned q = 0; q < 8; ++q) {
      std::uint32_t v[4];
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) {
        const std::uint32_t word = (&chunk[e].x)[q / 2];
        v[e] = codes_to_16bit_pair<F16Bits>(q % 2 == 0 ? word & 0xFFFFu : word >> 16);
      }
      *reinterpret_cast<uint4*>(sm.q + sw128_offset(n, 64 * half + 8 * q, kIndexerMaxHeads)) =
          make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  // w_h 2^fq_h of this thread's accumulator columns 8 i + 2 j + c.
  float wq[8][2];
#pragma unroll
  for (unsigned i = 0; i < 8; ++i) {
#pragma unroll
    for (unsigned c = 0; c < 2; ++c) {
      const unsigned h = column_head(8 * i + 2 * j + c);
      wq[i][c] = h < p.heads ? weight_times_2fq(tk, h) : 0.0f;
    }
  }
  const GmmaDesc desc_q = sw128_descriptor(sm.q, 16, 1024);
  fence_shared_for_async();
  __syncthreads();
  const bool q_ok = sm.checks.q_ok != 0;
  const Fp8ScaleBounds bounds(ScoreExponents{sm.checks.fq_min, sm.checks.fq_max, sm.checks.wq_emin, sm.checks.wq_emax});

  std::uint32_t parities = 0;  // bit b: the parity of ready[b]'s next phase
  for (unsigned buf = 0; tile < tiles; buf ^= 1u) {
    const std::uint32_t row0 = tile * kScoreTileRows;
    const std::uint32_t nrows = min(kScoreTileRows, visible - row0);
    const std::uint32_t next = tile + gridDim.x;
    // (raw[buf ^ 1] was last read by this warp in the previous tile, before its closing __syncwarp.)
    if (next < tiles) stage(buf ^ 1u, next);
    tqd::mbar_wait(&sm.ready[buf][warp], (parities >> buf) & 1u);  // the warp's rows of this tile are in
    parities ^= 1u << buf;
    // ---- widen: row r0 = 16 w + l / 4 gives a[s][0] (dims 32 j + 4 s, + 1) and a[s][2] (+ 2, + 3); row r0 + 8
    // gives a[s][1] and a[s][3].
    const unsigned r0 = kWarpRows * warp + lane / 4;
    const std::uint8_t* raw0 = sm.raw[buf] + r0 * kFp8RowBytes;
    const std::uint8_t* raw1 = raw0 + 8 * kFp8RowBytes;
    std::uint32_t a[8][4];
    std::uint32_t failures0 = 0u, failures1 = 0u;  // the grid check of rows r0 and r0 + 8 (fp8_grid_check.hpp)
#pragma unroll
    for (unsigned s = 0; s < 8; ++s) {
      const std::uint32_t c0 = *reinterpret_cast<const std::uint32_t*>(raw0 + 32 * j + 4 * s);
      const std::uint32_t c1 = *reinterpret_cast<const std::uint32_t*>(raw1 + 32 * j + 4 * s);
      a[s][0] = e4m3x2_half_of_word_to_half2_bits<false>(c0);
      a[s][2] = e4m3x2_half_of_word_to_half2_bits<true>(c0);
      a[s][1] = e4m3x2_half_of_word_to_half2_bits<false>(c1);
      a[s][3] = e4m3x2_half_of_word_to_half2_bits<true>(c1);
      failures0 = fp8_grid_failures(failures0, c0);
      failures1 = fp8_grid_failures(failures1, c1);
    }
    // ---- I = K Q^T: the warpgroup's 64 key rows x 64 head columns, k-step s = K positions 16 s .. 16 s + 15.
    float d[32];
    wgmma_fence();
#pragma unroll
    for (unsigned s = 0; s < kIndexerDim / 16; ++s) {
      wgmma_m64n64k16_rs<0>(d, a[s], desc_q.at((s / 4) * kColumnBlockBytes + (s % 4) * 32), s > 0);
    }
    wgmma_commit();
    // ---- while the MMAs run: the tensor-path check of the lane's row r = r0 + 8 (j % 2): the grid check's failure
    // bits of both rows over the lane's codes, a reduce-scatter over the quad (the lane ^ 1 sends the row this lane
    // keeps, the lane ^ 2 keeps the same one), then the scale's check once per lane. Lanes j = 0 and 1 own rows r0
    // and r0 + 8. (After the MMAs in the source, ptxas places the grid check's last instructions between them: an
    // MMA's issue holds the warp until the tensor cores take it, so work there is free. Round 28: -2 % of the
    // FP8 batch-8 indexer part.)
    const unsigned odd = j % 2, r = r0 + 8 * odd;
    std::uint32_t failures = (odd ? failures1 : failures0) |
                             __shfl_xor_sync(0xFFFFFFFFu, odd ? failures0 : failures1, 1);
    failures |= __shfl_xor_sync(0xFFFFFFFFu, failures, 2);
    bool ok = q_ok && (failures & kFp8GridFailMask) == 0u;
    // (A row past the tile's end reads stale codes and scale 1: checked like any row, never used.)
    const std::uint32_t scale =
        r < nrows ? *reinterpret_cast<const std::uint32_t*>((odd ? raw1 : raw0) + 128) : 0x3F800000u;
    const int k = fp8_row_scale_check(kFp8GridTopExponent, scale, bounds, ok);
    wgmma_wait<0>();
    // ---- terms fl((w_h 2^fq_h) max(I, 0)) and the head tree: pairs b in t[i] (columns 8 i + 2 j, + 1), then m
    // (i, i + 4), g0 (i, i + 1), g1 (i, i + 2) in the thread; then g2 across the lanes 1 apart as a reduce-scatter
    // (the lane keeps its row r, the partner sends it), and a across the lanes 2 apart.
    float v[2];
#pragma unroll
    for (unsigned row = 0; row < 2; ++row) {
      float t[8];
#pragma unroll
      for (unsigned i = 0; i < 8; ++i) {
        t[i] = __fadd_rn(__fmul_rn(wq[i][0], fmaxf(d[4 * i + 2 * row], 0.0f)),
                         __fmul_rn(wq[i][1], fmaxf(d[4 * i + 2 * row + 1], 0.0f)));
      }
      const float m0 = __fadd_rn(t[0], t[4]), m1 = __fadd_rn(t[1], t[5]), m2 = __fadd_rn(t[2], t[6]),
                  m3 = __fadd_rn(t[3], t[7]);
      v[row] = __fadd_rn(__fadd_rn(m0, m1), __fadd_rn(m2, m3));
    }
    float total = __fadd_rn(odd ? v[1] : v[0], __shfl_xor_sync(0xFFFFFFFFu, odd ? v[0] : v[1], 1));
    total = __fadd_rn(total, __shfl_xor_sync(0xFFFFFFFFu, total, 2));
    // Lane j = 0 stores row r0, j = 1 row r0 + 8 (times the row's scale: exact, see indexer_scores.cu).
    if (j < 2 && r < nrows && ok) out[row0 + r] = __fmul_rn(__fadd_rn(total, 0.0f), pow2f(k));
    // ---- rows off the tensor cores' grid: the warp scores them one by one on the exact scalar path (bit 4 q of
    // the ballot: row 16 w + q; bit 4 q + 1: row 16 w + 8 + q).
    for (std::uint32_t flagged = __ballot_sync(0xFFFFFFFFu, j < 2 && r < nrows && !ok); flagged != 0u;
         flagged &= flagged - 1u) {
      const unsigned bit = static_cast<unsigned>(__ffs(flagged) - 1);
      score_scalar_row(p, desc.indexer_rows, token, row0 + kWarpRows * warp + bit / 4 + 8 * (bit % 4), lane, tk.qf,
                       tk.w);
    }
    __syncwarp();  // every lane's reads of raw[buf] are done before the next tile's copies reuse it
    tile = next;
  }
}

}  // namespace

ScoreKernelInfo prepare_indexer_scores_fp8_wgmma() {
  ScoreKernelInfo info;
  info.error = cudaFuncSetAttribute(score_fp8_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kWgScoreSmemBytes));
  if (info.error == cudaSuccess) {
    info.error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info.blocks_per_sm, score_fp8_wgmma_kernel,
                                                               kScoreThreads, kWgScoreSmemBytes);
  }
  return info;
}

cudaError_t launch_indexer_scores_fp8_wgmma(const ScoreParams& p, cudaStream_t stream) {
  return launch_after_previous(score_fp8_wgmma_kernel, dim3(p.blocks_per_token, p.count), dim3(kScoreThreads),
                               kWgScoreSmemBytes, stream, p);
}

}  // namespace kvcompact::cuda::dsv4::detail
