// DeepSeek-V4 lightning indexer scores on FP8 key rows with warpgroup MMAs (wgmma, sm_90a): the same scores,
// bit for bit, as the mma.sync kernel (indexer_scores.cu) and the CPU. A block is one warpgroup; per 64-row
// tile it widens the e4m3 codes to f16 (exact) into an SW128 tile, and eight m64n64k16 instructions multiply the
// query (64 heads x 128 dims, f16 integer codes, in shared memory for the whole loop) by it: the accumulators
// hold I = q.k / (2^fq 2^k) exactly (products of at most 7 + 4 significant bits, f32 sums of at most 22 bits;
// docs/cuda-dsv4-kernels.md). No query fragments live in registers and the tensor cores run asynchronously,
// where the mma.sync kernel spends 64 registers on fragments and 256 MMAs plus 64 ldmatrix per tile.
//
// The head sum is the CPU's tree (dsv4/indexer_head_sum.hpp: h = 32 a + 16 m + 2 g + b; pairs b, then m, then
// g bit 0, 1, 2, then a). The query's A rows are ordered so that the accumulator layout serves it: thread (warp
// w, lane l) holds A rows 16 w + l / 4 and + 8, which are heads with b = 0 and 1, m = (l / 4) / 4, g bit 0 and 1
// = (l / 4) % 4, g bit 2 = w % 2 and a = w / 2. So b adds in the lane, m, g bit 0 and g bit 1 across the lanes
// 16, 4 and 8 apart (a reduce-scatter: each lane ends with two key rows), g bit 2 and a across the warps.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/wgmma.cuh"
#include "indexer_rows16.cuh"
#include "indexer_score_parts.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kFp8RowBytes = 132;                                    // 128 e4m3 codes + the f32 scale
constexpr unsigned kSw128Bytes = kScoreTileRows * kIndexerDim * 2;        // a 64 x 128 f16 operand (16 KB)
constexpr unsigned kColumnBlockBytes = kScoreTileRows * 128;              // 64 dims of it (8 KB)
static_assert(kIndexerMaxHeads == kScoreTileRows, "the query and the key tile are both 64-row operands");

struct WgScoreSmem {
  std::uint8_t a[kSw128Bytes];  // the query as f16 codes, A row R = head a_row_head(R) (1024-byte aligned)
  std::uint8_t b[kSw128Bytes];  // the tile's key rows widened to f16, N = key rows, K = dims
  std::uint8_t raw[2][kScoreTileRows * kFp8RowBytes];  // FP8 tiles as stored, double-buffered (cp.async)
  float partial[4][kScoreTileRows];  // [warp][key row]: the row's sum over the warp's 16 heads
  float sk[kScoreTileRows];     // the row's scale 2^k; 0 marks a row of the scalar path
  int flagged[kScoreTileRows];  // rows of the tile that take the exact scalar path
  int nflagged[2];              // their count, by tile parity (reset one tile ahead)
  TokenChecks checks;
};
constexpr std::size_t kWgScoreSmemBytes = sizeof(WgScoreSmem) + 1024;  // (+ alignment of the base to 1024)

// The head of A row R (see the file comment): w = R / 16, b = (R / 8) % 2, l / 4 = R % 8.
__device__ __forceinline__ unsigned a_row_head(unsigned r) {
  const unsigned w = r / 16, b = (r / 8) % 2, gl = r % 8;
  return 32 * (w / 2) + 16 * (gl / 4) + 2 * (4 * (w % 2) + gl % 4) + b;
}

// One level of the reduce-scatter: of the 2n values v[0 .. 2n) (lower half v[0 .. n), upper v[n .. 2n)), the
// lane keeps the half selected by `upper` and adds the partner's (lane ^ apart) same half.
template <int N>
__device__ __forceinline__ void reduce_half(const float* v, float* out, bool upper, unsigned apart) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float keep = upper ? v[j + N] : v[j], send = upper ? v[j] : v[j + N];
    out[j] = __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, apart));
  }
}

__global__ void __launch_bounds__(kScoreThreads, 4) score_fp8_wgmma_kernel(ScoreParams p) {
  wait_for_previous_grid();
  extern __shared__ std::uint8_t smem_raw[];
  WgScoreSmem& sm = *reinterpret_cast<WgScoreSmem*>(
      smem_raw + ((1024u - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u));
  const unsigned token = blockIdx.y;
  const TokenRowsDev desc = p.tokens[token];
  const std::uint32_t visible = static_cast<std::uint32_t>((desc.position + 1) / 4);
  const std::uint32_t tiles = (visible + kScoreTileRows - 1) / kScoreTileRows;
  if (blockIdx.x >= tiles) return;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  std::uint32_t tile = blockIdx.x;
  auto stage = [&](std::uint8_t* dst, std::uint32_t t) {
    const std::uint32_t rows = min(kScoreTileRows, visible - t * kScoreTileRows);
    const std::uint8_t* src = desc.indexer_rows + static_cast<std::uint64_t>(t) * kScoreTileRows * kFp8RowBytes;
    const unsigned bytes = rows * kFp8RowBytes, n16 = bytes / 16;
    for (unsigned c = tid; c < n16; c += kScoreThreads) cp_async16(dst + c * 16, src + c * 16);
    for (unsigned c = n16 * 4 + tid; c < bytes / 4; c += kScoreThreads) cp_async4(dst + c * 4, src + c * 4);
    cp_async_commit();
  };
  stage(sm.raw[0], tile);

  const ScoreToken tk = score_token(p, token);
  const std::int8_t* qi = tk.qi;
  const float* qf = tk.qf;
  const float* w = tk.w;
  float* out = p.scores + static_cast<std::uint64_t>(token) * p.score_stride;
  if (tid == 0) {
    sm.checks.reset();
    sm.nflagged[0] = sm.nflagged[1] = 0;
  }
  __syncthreads();
  if (tid < p.heads) sm.checks.add_head(tk, tid);
  // The query's A operand: thread t writes dims [64 half, 64 half + 64) of A row t / 2 (half = t % 2), the
  // codes as f16 (zero for heads past the last), its 16-byte chunks in the order q ^ 4 half (the two halves of a
  // row then hit different bank groups).
  {
    const unsigned r = tid / 2, half = tid % 2, h = a_row_head(r);
#pragma unroll
    for (unsigned q = 0; q < 8; ++q) {
      const unsigned dim = 64 * half + 8 * (q ^ (4 * half));
      std::uint32_t v[4] = {0u, 0u, 0u, 0u};
      if (h < p.heads) {
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) {
          v[j] = codes_to_16bit_pair<F16Bits>(
              static_cast<std::uint32_t>(*reinterpret_cast<const std::uint16_t*>(qi + h * kIndexerDim + dim + 2 * j)));
        }
      }
      *reinterpret_cast<uint4*>(sm.a + sw128_offset(r, dim, kScoreTileRows)) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  // This thread's accumulator rows 16 w + l / 4 (b = 0) and + 8 (b = 1): heads ha and ha + 1.
  const unsigned ha = a_row_head(16 * warp + lane / 4);
  const float wqa = ha < p.heads ? weight_times_2fq(tk, ha) : 0.0f;
  const float wqb = ha + 1 < p.heads ? weight_times_2fq(tk, ha + 1) : 0.0f;
  const GmmaDesc desc_a = sw128_descriptor(sm.a, 16, 1024);
  const GmmaDesc desc_b = sw128_descriptor(sm.b, 16, 1024);
  __syncthreads();
  const bool q_ok = sm.checks.q_ok != 0;
  const ScoreExponents x{sm.checks.fq_min, sm.checks.fq_max, sm.checks.wq_emin, sm.checks.wq_emax};

  for (unsigned buf = 0; tile < tiles; buf ^= 1u) {
    const std::uint32_t row0 = tile * kScoreTileRows;
    const std::uint32_t nrows = min(kScoreTileRows, visible - row0);
    const std::uint32_t next = tile + gridDim.x;
    if (next < tiles) {
      stage(sm.raw[buf ^ 1u], next);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // The tile's raw rows are in; the previous tile is done (its MMAs read b, its finish read partial / sk).
    __syncthreads();
    if (tid == 0) sm.nflagged[buf ^ 1u] = 0;
    // ---- widen to f16 (two threads per key row: dims [64 half, 64 half + 64) are column block `half`) and check.
    {
      const unsigned r = tid / 2, half = tid % 2;
      std::uint32_t words[32];
      bool ok = true;
      const int k = widen_fp8_half_row(sm.raw[buf] + r * kFp8RowBytes, half, r < nrows, x, words, ok);
      // (Chunk q ^ 4 half at step q; the selects keep the word indices static, so words stays in registers.)
#pragma unroll
      for (unsigned q = 0; q < 8; ++q) {
        const unsigned q1 = q ^ 4u;
        const uint4 v = half == 0 ? make_uint4(words[4 * q], words[4 * q + 1], words[4 * q + 2], words[4 * q + 3])
                                  : make_uint4(words[4 * q1], words[4 * q1 + 1], words[4 * q1 + 2], words[4 * q1 + 3]);
        *reinterpret_cast<uint4*>(sm.b + sw128_offset(r, 64 * half + 8 * (q ^ (4 * half)), kScoreTileRows)) = v;
      }
      if (half == 0) {
        const bool tensor_path = q_ok && ok;
        sm.sk[r] = tensor_path ? pow2f(k) : 0.0f;
        if (r < nrows && !tensor_path) sm.flagged[atomicAdd(&sm.nflagged[buf], 1)] = static_cast<int>(r);
      }
    }
    fence_shared_for_async();
    __syncthreads();  // the f16 tile is in
    // ---- I = Q K^T: 64 heads x 64 key rows, k-step s = dims 16 s .. 16 s + 15.
    float d[32];
    wgmma_fence();
#pragma unroll
    for (unsigned ks = 0; ks < kIndexerDim / 16; ++ks) {
      const unsigned col = (ks / 4) * kColumnBlockBytes + (ks % 4) * 32;
      wgmma_m64n64k16_ss<0>(d, desc_a.at(col), desc_b.at(col), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    // ---- terms fl((w_h 2^fq_h) max(I, 0)) and the head tree. u[2 i + c]: key row 8 i + 2 tig + c, the pair b
    // (heads ha, ha + 1) added in the lane.
    float u[16];
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
#pragma unroll
      for (unsigned c = 0; c < 2; ++c) {
        u[2 * i + c] = __fadd_rn(__fmul_rn(wqa, fmaxf(d[4 * i + c], 0.0f)), __fmul_rn(wqb, fmaxf(d[4 * i + 2 + c], 0.0f)));
      }
    }
    // m (lanes 16 apart; the lane keeps i / 4 = lane bit 4), g bit 0 (4 apart; (i / 2) % 2 = lane bit 2), g bit 1
    // (8 apart; i % 2 = lane bit 3): two values left, key rows 8 i + 2 tig + c with i = 4 b4 + 2 b2 + b3.
    float u8[8], u4[4], u2[2];
    reduce_half<8>(u, u8, (lane >> 4) & 1u, 16);
    reduce_half<4>(u8, u4, (lane >> 2) & 1u, 4);
    reduce_half<2>(u4, u2, (lane >> 3) & 1u, 8);
    const unsigned i_row = 4 * ((lane >> 4) & 1u) + 2 * ((lane >> 2) & 1u) + ((lane >> 3) & 1u);
    const unsigned n0 = 8 * i_row + 2 * (lane % 4);
    sm.partial[warp][n0] = u2[0];
    sm.partial[warp][n0 + 1] = u2[1];
    __syncthreads();  // every warp's partial sums are in; the flagged rows are listed (sk = 0 for them)
    // ---- g bit 2 (warps w, w ^ 1), then a (warp pairs), + 0, times the row's scale (exact: see indexer_scores.cu).
    if (tid < nrows) {
      const float sk = sm.sk[tid];
      if (sk != 0.0f) {
        const float total = __fadd_rn(__fadd_rn(sm.partial[0][tid], sm.partial[1][tid]),
                                      __fadd_rn(sm.partial[2][tid], sm.partial[3][tid]));
        out[row0 + tid] = __fmul_rn(__fadd_rn(total, 0.0f), sk);
      }
    }
    score_flagged_rows(p, desc.indexer_rows, token, row0, sm.flagged, sm.nflagged[buf], warp, lane, qf, w);
    // No barrier here: the next tile's copies go to the other raw buffer, and b, partial, sk and flagged are
    // written again only after the next tile's first barrier.
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
