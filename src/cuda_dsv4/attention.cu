// DeepSeek-V4 sparse attention with the sink on the GPU: per token, rows = window (oldest first) then the
// layer's compressed rows (top-k list for ratio 4, all visible for ratio 128), K = V = the row, s = q.c/sqrt(512).
// Split kernel: a block takes one token, up to 64 heads and one split of the row list; rows are decoded (bf16 or
// FP8 layout) to fp16 in shared memory in tiles of 64 (the next tile's raw bytes arrive by cp.async while the
// current one is multiplied), QK^T and PV run on mma.sync m16n8k16 (fp16 inputs,
// fp32 accumulation) with an online softmax in the log2 domain. The merge kernel (attention_merge.cu) combines the
// splits with the sink, normalises and applies the inverse RoPE to the output tail.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attention_rows.cuh"
#include "cuda/bulk_copy.cuh"
#include "cuda/wgmma.cuh"
#include "kernels_device.cuh"
#include "kernels_params.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

constexpr unsigned kQStride = kHeadDim + 8;  // halfs per row in shared memory (conflict-free fragments)
constexpr unsigned kKStride = kHeadDim + 8;
constexpr unsigned kSStride = kAttnTileRows + 4;  // floats
constexpr unsigned kPStride = kAttnTileRows + 8;  // halfs

// Raw bytes of the next row tile arrive here by cp.async while the current tile is computed (a BF16 row is
// 1024 bytes, an FP8 row 584: 56 pieces of 8 e4m3 codes, 16 pieces of 4 bf16 tail values, 8 scale bytes).
constexpr unsigned kRawStride = 1024;
constexpr unsigned kFp8Pieces = 73;  // 8-byte pieces of an FP8 row, the scale bytes included

// Floats per staged row of the partial O in the epilogue (a head's 512, padded: attention_rows.cuh).
constexpr unsigned kOStageStride = kHeadDim + kStagedRowPad;

struct AttnSmem {
  __half q[kAttnBlockHeads * kQStride];
  __half k[kAttnTileRows * kKStride];
  std::uint8_t raw[kAttnTileRows * kRawStride];
  float s[kAttnBlockHeads * kSStride];
  __half pr[kAttnBlockHeads * kPStride];
  float alpha[kAttnBlockHeads];
  float m[kAttnBlockHeads];
  float l[kAttnBlockHeads];
  const std::uint8_t* rows[2][kAttnTileRows];  // the current tile's rows and the next one's (null: no row)
};
static_assert(sizeof(AttnSmem) <= 227 * 1024, "one block per multiprocessor needs <= 227 KB of shared memory");
static_assert(offsetof(AttnSmem, q) == 0 && offsetof(AttnSmem, s) >= kAttnBlockHeads * kOStageStride * sizeof(float),
              "the epilogue's staged partial O fits in the query, tile and raw buffers");

// ldmatrix rows: 16-byte aligned, and an odd number of 16-byte units apart so 8 rows are bank-conflict free.
static_assert(offsetof(AttnSmem, q) % 16 == 0 && offsetof(AttnSmem, k) % 16 == 0 && offsetof(AttnSmem, pr) % 16 == 0);
static_assert(kQStride * 2 % 32 == 16 && kKStride * 2 % 32 == 16 && kPStride * 2 % 32 == 16);

// Issues the cp.async copies of a row tile's raw bytes (rows[r] null: nothing, the decode writes zeros).
// BF16: 16-byte pieces, thread tid takes pieces tid, tid + 512, ... (the same pieces it decodes). FP8: 8-byte
// pieces (rows are only 8-byte aligned), the scale bytes as piece 72; the decode reads them after a barrier.
__device__ __forceinline__ void stage_rows(std::uint8_t* raw, const std::uint8_t* const* rows, std::uint32_t storage) {
  const unsigned tid = threadIdx.x;
  if (storage == kRowBf16) {
#pragma unroll
    for (unsigned j = 0; j < kAttnTileRows * 64 / kAttnThreads; ++j) {
      const unsigned c = j * kAttnThreads + tid, r = c / 64, pc = c % 64;
      if (rows[r] != nullptr) cp_async16(raw + r * kRawStride + pc * 16, rows[r] + pc * 16);
    }
  } else {
    for (unsigned c = tid; c < kAttnTileRows * kFp8Pieces; c += kAttnThreads) {
      const unsigned r = c / kFp8Pieces, pc = c % kFp8Pieces;
      if (rows[r] != nullptr) cp_async8(raw + r * kRawStride + pc * 8, rows[r] + pc * 8);
    }
  }
  cp_async_commit();
}

// Block: one token, up to 64 heads, one split of the row list. Warp w: head group w / 4 (16 heads) and
// quarter w % 4 (rows [16q, 16q + 16) of a tile for QK^T, dims [128q, 128q + 128) for PV).
__global__ void __launch_bounds__(kAttnThreads, 1) attention_split_kernel(AttentionParams p) {
  wait_for_previous_grid();
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  AttnSmem& sm = *reinterpret_cast<AttnSmem*>(smem_raw);
  const std::uint32_t split = blockIdx.x, token = blockIdx.y, h0 = blockIdx.z * p.block_heads;
  const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const unsigned hg = warp / 4, quarter = warp % 4;
  const std::uint32_t nh = min(p.block_heads, p.heads - h0);  // a multiple of 16, at most kAttnBlockHeads
  const bool active = hg * kAttnHeadGroup < nh;
  const TokenRowsDev d = p.tokens[token];
  if (token_beyond_bound(p, d)) return;  // (the merge writes the token's NaN output)
  const SplitRows range = split_rows(p, d, split);
  if (range.empty()) return write_empty_split(p, token, h0, nh, split);
  const std::uint32_t nw = range.nw, r_begin = range.begin, r_end = range.end();
  auto part_of = [&](std::uint32_t h) { return partial_index(p, token, h0, h, split); };
  bool bad_index = false;  // this thread met an index outside [-1, visible rows): the split's sums become NaN
  auto tile_rows = [&](const std::uint8_t** rows, std::uint32_t t0) {
    if (tid < kAttnTileRows) {
      rows[tid] = t0 + tid < r_end ? attention_row_pointer(p, d, token, t0 + tid, nw, bad_index) : nullptr;
    }
  };
  // The first tile's copies are issued before the query is loaded, so both latencies overlap.
  tile_rows(sm.rows[0], r_begin);
  __syncthreads();
  stage_rows(sm.raw, sm.rows[0], p.storage);

  // The block's query (up to 64 heads x 512 floats = 128 KB): every load of a thread is issued before the first
  // conversion, so the block waits one memory latency for it rather than one per loop trip. (At batch 1 a block
  // often has a single row tile; on the H200 this moved the batch-1 attention time by ~2 % only: the block is
  // bound by its own instruction issue.)
  const float* qsrc = p.q + (static_cast<std::uint64_t>(token) * p.heads + h0) * kHeadDim;
  {
    constexpr unsigned kQPer = kAttnBlockHeads * kHeadDim / 4 / kAttnThreads;  // 16 float4 per thread
    float4 qv[kQPer];
#pragma unroll
    for (unsigned j = 0; j < kQPer; ++j) {
      const unsigned i = j * kAttnThreads + tid;
      qv[j] = i < nh * kHeadDim / 4 ? __ldg(reinterpret_cast<const float4*>(qsrc) + i) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (unsigned j = 0; j < kQPer; ++j) {
      const unsigned i = j * kAttnThreads + tid, h = (4 * i) / kHeadDim, c = (4 * i) % kHeadDim;
      if (i < nh * kHeadDim / 4) {
        *reinterpret_cast<uint2*>(&sm.q[h * kQStride + c]) =
            make_uint2(pack_half2(qv[j].x, qv[j].y), pack_half2(qv[j].z, qv[j].w));
      }
    }
  }
  if (tid < kAttnBlockHeads) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.0f;
  }
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (std::uint32_t t0 = r_begin, cur = 0; t0 < r_end; t0 += kAttnTileRows, cur ^= 1u) {
    const std::uint32_t rows_here = min(kAttnTileRows, r_end - t0);
    const bool has_next = t0 + kAttnTileRows < r_end;
    const std::uint8_t* const* rows = sm.rows[cur];
    if (has_next) tile_rows(sm.rows[cur ^ 1u], t0 + kAttnTileRows);
    cp_async_wait<0>();
    __syncthreads();  // the tile's raw bytes (every thread's copies), the query, m / l and the next rows are visible
    // ---- decode the tile's rows to fp16 (zeros for missing rows, so no NaN enters the MMA).
    if (p.storage == kRowBf16) {
#pragma unroll
      for (unsigned j = 0; j < kAttnTileRows * 64 / kAttnThreads; ++j) {  // 8 pieces of 16 B per thread
        const unsigned c = j * kAttnThreads + tid, r = c / 64, pc = c % 64;
        uint4 outv = make_uint4(0, 0, 0, 0);
        if (rows[r] != nullptr) {
          const uint4 v = *reinterpret_cast<const uint4*>(sm.raw + r * kRawStride + pc * 16);
          outv = make_uint4(bf16x2_to_half2(v.x), bf16x2_to_half2(v.y), bf16x2_to_half2(v.z), bf16x2_to_half2(v.w));
        }
        *reinterpret_cast<uint4*>(&sm.k[r * kKStride + pc * 8]) = outv;
      }
    } else {
      // 56 pieces of 8 e4m3 codes (block scale byte 576 + piece / 8), then 16 pieces of 4 bf16 (the tail).
      for (unsigned c = tid; c < kAttnTileRows * 72; c += kAttnThreads) {
        const unsigned r = c / 72, pc = c % 72;
        const std::uint8_t* src = sm.raw + r * kRawStride;
        const bool present = rows[r] != nullptr;
        const uint2 v = present ? *reinterpret_cast<const uint2*>(src + pc * 8) : make_uint2(0, 0);
        if (pc < 56) {
          // One scale per piece (8 divides the 64-dim block): cvt + half2 multiply, scalar only for odd scales.
          const int e = present ? static_cast<int>(src[576 + pc / 8]) - 127 : 0;
          *reinterpret_cast<uint4*>(&sm.k[r * kKStride + pc * 8]) = e4m3x8_scaled_to_half8(v, e);
        } else {
          *reinterpret_cast<uint2*>(&sm.k[r * kKStride + 448 + (pc - 56) * 4]) =
              make_uint2(bf16x2_to_half2(v.x), bf16x2_to_half2(v.y));
        }
      }
    }
    __syncthreads();
    // Every read of the raw tile is done: the next tile's copies run during this tile's MMAs and softmax.
    if (has_next) stage_rows(sm.raw, sm.rows[cur ^ 1u], p.storage);
    // ---- S = Q K^T: warp (group, quarter) takes 16 heads x rows [16 quarter, 16 quarter + 16).
    if (active) {
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      // Fragments by ldmatrix x4 (matrix i <- lanes 8i..8i+7). A: matrices (rows 0-7 | 8-15) x (cols c | c+8)
      // in a0..a3 order, so lane l points at row l % 16, col c + 8 (l / 16). B (K row-major per key row):
      // b0, b1 of n-tile 0 then of n-tile 1, so lane l points at key row (l % 8) + 8 (l / 16), col
      // c + 8 ((l / 8) % 2). Rows are 1040 bytes (16-byte aligned, 8 rows hit 8 distinct 16-byte bank groups).
      const __half* qa = &sm.q[(hg * 16 + (lane & 15)) * kQStride + (lane >> 4) * 8];
      const __half* kb = &sm.k[(quarter * 16 + (lane & 7) + (lane >> 4) * 8) * kKStride + ((lane >> 3) & 1) * 8];
      // Even and odd k-steps accumulate separately (four independent MMA chains instead of two), then add.
      float s_odd[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 2
      for (unsigned ks = 0; ks < kHeadDim / 16; ks += 2) {
        const unsigned c = ks * 16;
        std::uint32_t a[4], b[4], a1[4], b1[4];
        ldmatrix_x4(a, qa + c);
        ldmatrix_x4(b, kb + c);
        ldmatrix_x4(a1, qa + c + 16);
        ldmatrix_x4(b1, kb + c + 16);
        mma_f16(s[0], a, b[0], b[1]);
        mma_f16(s[1], a, b[2], b[3]);
        mma_f16(s_odd[0], a1, b1[0], b1[1]);
        mma_f16(s_odd[1], a1, b1[2], b1[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] += s_odd[nt][i];
      }
      float* srow_lo = &sm.s[(hg * 16 + g) * kSStride];
      float* srow_hi = srow_lo + 8 * kSStride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const unsigned r = quarter * 16 + nt * 8 + 2 * tig;
        const bool v0 = r < rows_here && rows[r] != nullptr;
        const bool v1 = r + 1 < rows_here && rows[r + 1] != nullptr;
        srow_lo[r] = v0 ? s[nt][0] * p.scale_log2 : -INFINITY;
        srow_lo[r + 1] = v1 ? s[nt][1] * p.scale_log2 : -INFINITY;
        srow_hi[r] = v0 ? s[nt][2] * p.scale_log2 : -INFINITY;
        srow_hi[r + 1] = v1 ? s[nt][3] * p.scale_log2 : -INFINITY;
      }
    }
    __syncthreads();
    // ---- online softmax: warp w updates heads 4w .. 4w + 3 (all four or none: nh is a multiple of 16), the
    // four heads' shuffle reductions interleaved.
    static_assert(kAttnThreads / 32 * 4 == kAttnBlockHeads, "16 warps x 4 heads");
    if (warp * 4 < nh) {
      constexpr unsigned kH = 4;
      float v0[kH], v1[kH], mx[kH], m_old[kH];
#pragma unroll
      for (unsigned hh = 0; hh < kH; ++hh) {
        const unsigned h = warp * kH + hh;
        v0[hh] = sm.s[h * kSStride + lane];
        v1[hh] = sm.s[h * kSStride + lane + 32];
        mx[hh] = fmaxf(v0[hh], v1[hh]);
        m_old[hh] = sm.m[h];
      }
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) {
#pragma unroll
        for (unsigned hh = 0; hh < kH; ++hh) mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xFFFFFFFFu, mx[hh], o2));
      }
      float sum[kH], alpha[kH], m_new[kH];
#pragma unroll
      for (unsigned hh = 0; hh < kH; ++hh) {
        const unsigned h = warp * kH + hh;
        m_new[hh] = fmaxf(m_old[hh], mx[hh]);
        float p0 = 0.0f, p1 = 0.0f;
        alpha[hh] = 1.0f;
        if (m_new[hh] != -INFINITY) {
          p0 = exp2f(v0[hh] - m_new[hh]);
          p1 = exp2f(v1[hh] - m_new[hh]);
          alpha[hh] = exp2f(m_old[hh] - m_new[hh]);
        }
        const __half x0 = __float2half_rn(p0), x1 = __float2half_rn(p1);
        sm.pr[h * kPStride + lane] = x0;
        sm.pr[h * kPStride + lane + 32] = x1;
        sum[hh] = __half2float(x0) + __half2float(x1);
      }
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) {
#pragma unroll
        for (unsigned hh = 0; hh < kH; ++hh) sum[hh] += __shfl_xor_sync(0xFFFFFFFFu, sum[hh], o2);
      }
      __syncwarp();  // every lane has read m_old before lane 0 replaces it
      if (lane == 0) {
#pragma unroll
        for (unsigned hh = 0; hh < kH; ++hh) {
          const unsigned h = warp * kH + hh;
          sm.l[h] = sm.l[h] * alpha[hh] + sum[hh];
          sm.m[h] = m_new[hh];
          sm.alpha[h] = alpha[hh];
        }
      }
    }
    __syncthreads();
    // ---- O = alpha O + P V: warp (group, quarter) owns 16 heads x dims [128 quarter, 128 quarter + 128).
    if (active) {
      const float al = sm.alpha[hg * 16 + g], ah = sm.alpha[hg * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        o[nt][0] *= al;
        o[nt][1] *= al;
        o[nt][2] *= ah;
        o[nt][3] *= ah;
      }
      // A as in QK^T: lane l points at row l % 16, col c + 8 (l / 16); rows are 144 bytes (aligned, conflict-free).
      const __half* pa = &sm.pr[(hg * 16 + (lane & 15)) * kPStride + (lane >> 4) * 8];
      const unsigned krow = (lane & 7) + ((lane >> 3) & 1) * 8;
      const unsigned kcol = quarter * 128 + (lane >> 4) * 8;
#pragma unroll
      for (unsigned ks = 0; ks < kAttnTileRows / 16; ++ks) {
        const unsigned c = ks * 16;
        std::uint32_t a[4];
        ldmatrix_x4(a, pa + c);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          std::uint32_t b[4];
          ldmatrix_x4_trans(b, &sm.k[(c + krow) * kKStride + kcol + np * 16]);
          mma_f16(o[2 * np], a, b[0], b[1]);
          mma_f16(o[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }
  // ---- partials: unnormalised O, running max (log2 units) and sum per head. O leaves through shared memory (the
  // query, tile and raw buffers are free after the loop's last barrier), one bulk store of a head's 512 floats
  // per thread, as in attention_wgmma.cu's epilogue (rows kOStageStride floats apart: conflict-free stores).
  float* stage = reinterpret_cast<float*>(sm.q);
  if (active) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      const unsigned dim = quarter * 128 + nt * 8 + 2 * tig;
      *reinterpret_cast<float2*>(stage + (hg * 16 + g) * kOStageStride + dim) = make_float2(o[nt][0], o[nt][1]);
      *reinterpret_cast<float2*>(stage + (hg * 16 + g + 8) * kOStageStride + dim) = make_float2(o[nt][2], o[nt][3]);
    }
  }
  fence_shared_for_async();
  const bool poisoned = __syncthreads_or(bad_index) != 0;
  if (tid < nh) {
    tq::detail::bulk_store(p.part_o + part_of(tid) * kHeadDim, stage + tid * kOStageStride, kHeadDim * sizeof(float));
    tq::detail::bulk_store_commit_and_wait_read();  // (the block's shared memory must outlive the reads)
    p.part_ml[part_of(tid) * 2] = sm.m[tid];
    p.part_ml[part_of(tid) * 2 + 1] = poisoned ? quiet_nan() : sm.l[tid];
  }
}

}  // namespace

cudaError_t prepare_attention() {
  const cudaError_t e = cudaFuncSetAttribute(attention_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(sizeof(AttnSmem)));
  return e != cudaSuccess ? e : prepare_attention_wgmma();
}

cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  const dim3 grid(p.splits, p.count, (p.heads + p.block_heads - 1) / p.block_heads);
  // Full 64-head blocks take the warpgroup-MMA kernel (attention_wgmma.cu). With one split per token (a prefill
  // chunk's thousands of tokens; attention.cpp sets direct_output) it writes the output itself: the merge would
  // only read the partials back (as many bytes again as the output, per layer) to normalise them.
  const bool wgmma = p.block_heads == kAttnBlockHeads && p.heads % kAttnBlockHeads == 0;
  if (p.direct_output != 0 && (!wgmma || p.splits != 1)) return cudaErrorInvalidValue;
  const cudaError_t e =
      wgmma ? launch_attention_split_wgmma(p, stream)
            : launch_after_previous(attention_split_kernel, grid, dim3(kAttnThreads), sizeof(AttnSmem), stream, p);
  if (e != cudaSuccess || p.direct_output != 0) return e;
  return launch_attention_merge(p, stream);
}

}  // namespace kvcompact::cuda::dsv4::detail
