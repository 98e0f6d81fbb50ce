// Compressor kernels of the DeepSeek-V4 cache (src/dsv4/compressor.cpp on the GPU). One block per sequence
// walks its span's tokens in order (the state carries the dependency), thread j owning feature j of the
// branch's width D (512 main, 128 indexer): it writes state columns j and D + j, pools feature j over the
// state rows, and shifts its own columns, so the per-token work needs no barrier; the finishing steps of an
// emitted row (RMSNorm, RoPE, the model's rounding, the storage encoding) use shared memory and barriers.
// Float32 math in the CPU's order with explicit _rn intrinsics (no FMA contraction); exp / cos / sin are
// evaluated in double and rounded to float (the CPU's expf is within 0.502 ulp, its cos / sin are of the
// float angle in double, then rounded).
#include <cuda_runtime.h>

#include "cache_params.hpp"
#include "compressor_device.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

// FP4 rounding of an indexer row (fp_sim.hpp fp4_block_sim, blocks of 32 = one warp).
__device__ __forceinline__ float fp4_sim(float x) {
  const float amax = warp_max(fabsf(x));
  const float s = pow2_ceil_scale(amax, kFp4AmaxFloor, kFp4Max);
  const float inv_s = __fdiv_rn(1.0f, s);
  const float q = clampf(__fmul_rn(x, inv_s), -kFp4Max, kFp4Max);
  return __fmul_rn(fp4_e2m1_to_f32(f32_to_fp4_e2m1(q)), s);
}

// encode_indexer_row (storage.hpp) of a 128-wide row (blockDim 128, thread j holds dim j).
__device__ __forceinline__ void encode_indexer_row(std::uint8_t* out, float x, unsigned j, std::uint32_t storage,
                                                   float* scratch) {
  if (storage == kIndexerBf16) {
    *reinterpret_cast<std::uint16_t*>(out + 2 * j) = f32_to_bf16(x);
    return;
  }
  if (storage == kIndexerFp8) {
    const float a = warp_max(fabsf(x));
    if ((j & 31u) == 0) scratch[j >> 5] = a;
    __syncthreads();
    const float amax = fmaxf(fmaxf(scratch[0], scratch[1]), fmaxf(scratch[2], scratch[3]));
    const int e = storage_scale_exp(amax, 448.0);
    out[j] = f32_to_fp8_e4m3(ldexpf(x, -e));
    if (j < 4) {
      const std::uint32_t bits = __float_as_uint(ldexpf(1.0f, e));
      out[128 + j] = static_cast<std::uint8_t>(bits >> (8 * j));
    }
    __syncthreads();
    return;
  }
  // MXFP4: one warp per block of 32 dims; dim 2k in the low nibble of byte k, dim 2k + 1 in the high one.
  const float amax = warp_max(fabsf(x));
  const int e = storage_scale_exp(amax, 6.0);
  const unsigned nibble = f32_to_fp4_e2m1(ldexpf(x, -e));
  const unsigned high = __shfl_down_sync(0xFFFFFFFFu, nibble, 1);
  if ((j & 1u) == 0) out[j >> 1] = static_cast<std::uint8_t>(nibble | (high << 4));
  if ((j & 31u) == 0) out[64 + (j >> 5)] = static_cast<std::uint8_t>(e + 127);
}

// The finishing steps of an emitted row (compressor_finish_row) and its encoding into row `group` of `rows`:
// RMSNorm with weight, RoPE at group*m on the last 64 dims, the branch's rounding, the storage encoding.
// Called by every thread of the block (barriers inside); thread j passes the pooled value of dim j.
template <unsigned D, bool kIndexer>
__device__ __forceinline__ void finish_and_encode(const CompressorParams& p, std::uint8_t* rows, std::uint64_t group,
                                                  float x, unsigned j, float* row_s, float* lanes, float* scratch) {
  const std::uint64_t m = p.ratio;
  // 3. RMSNorm with weight (compressor_finish_row): eight lanes of squares, summed as a fixed tree.
  row_s[j] = x;
  __syncthreads();
  if (j < 8) {
    float acc = 0.0f;
    for (unsigned i = j; i < D; i += 8) acc = __fadd_rn(acc, __fmul_rn(row_s[i], row_s[i]));
    lanes[j] = acc;
  }
  __syncthreads();
  const float ss = __fadd_rn(__fadd_rn(__fadd_rn(lanes[0], lanes[1]), __fadd_rn(lanes[2], lanes[3])),
                             __fadd_rn(__fadd_rn(lanes[4], lanes[5]), __fadd_rn(lanes[6], lanes[7])));
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(D)), p.norm_eps)));
  x = __fmul_rn(p.norm[j], __fmul_rn(x, inv_rms));
  __syncthreads();  // every lane read of row_s is done
  row_s[j] = x;
  __syncthreads();
  // 4. RoPE at position g*m on the last 64 dims (interleaved pairs).
  constexpr unsigned kTail = D - 64;
  if (j >= kTail && ((j - kTail) & 1u) == 0) {
    const unsigned pair = (j - kTail) >> 1;
    const float angle = __fmul_rn(static_cast<float>(static_cast<long long>(group * m)), p.inv_freq[pair]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = static_cast<float>(sin(static_cast<double>(angle)));
    const float x0 = row_s[j];
    const float x1 = row_s[j + 1];
    row_s[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    row_s[j + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
  __syncthreads();
  // 5. The branch's rounding, then the storage encoding into row g.
  if constexpr (kIndexer) {
    for (unsigned h = 1; h < D; h *= 2) {  // Walsh-Hadamard butterflies (fp_sim.cpp hadamard)
      if ((j & h) == 0) {
        const float a = row_s[j];
        const float b = row_s[j + h];
        row_s[j] = __fadd_rn(a, b);
        row_s[j + h] = __fsub_rn(a, b);
      }
      __syncthreads();
    }
    x = fp4_sim(__fmul_rn(row_s[j], p.hadamard_scale));
    __syncthreads();  // row_s is rewritten by the next emission
    encode_indexer_row(rows + group * p.row_bytes, x, j, p.storage, scratch);
  } else {
    x = row_s[j];
    __syncthreads();
    x = fp8_sim_main(x, j, scratch);
    encode_attention_row(rows + group * p.row_bytes, x, j, p.storage, scratch);
  }
}

template <unsigned D, bool kIndexer>
__global__ void __launch_bounds__(D) compressor_kernel(const CompressorParams p) {
  __shared__ float row_s[D];
  __shared__ float lanes[8];
  __shared__ float scratch[D / 32];
  if (blockIdx.x >= p.n_items) return;
  const CompressorItem& item = p.items[blockIdx.x];
  const unsigned j = threadIdx.x;
  const std::uint64_t m = p.ratio;
  const unsigned coff = p.coff;
  const std::uint64_t pw = static_cast<std::uint64_t>(coff) * D;
  const std::uint64_t items = coff * m;
  float* kv = item.kv_state;
  float* sc = item.score_state;
  for (std::uint64_t k = 0; k < item.count; ++k) {
    const std::uint64_t t = item.start + k;
    const std::uint64_t slot = t % m;
    const std::uint64_t row = (coff - 1) * m + slot;
    // 1. The token's state row (compressor.cpp update_token): a_t, and z_t + ape[slot].
    for (unsigned h = 0; h < coff; ++h) {
      const std::uint64_t col = h * D + j;
      const float a = item.a[k * pw + col];
      const float z = item.z[k * pw + col];
      if (p.check_finite != 0 && !(isfinite(a) && isfinite(z))) atomicOr(item.status, kFlagNonFinite);
      kv[row * pw + col] = a;
      sc[row * pw + col] = __fadd_rn(z, p.ape[slot * pw + col]);
    }
    if ((t + 1) % m != 0) continue;  // uniform over the block
    // 2. Pooling of feature j (compressor.cpp pool_state): rows [0, m) give their first half with the overlap.
    float mx = -INFINITY;
    for (std::uint64_t i = 0; i < items; ++i) {
      const std::uint64_t col = (coff == 2 && i >= m) ? D : 0;
      const float s = sc[i * pw + col + j];
      mx = mx < s ? s : mx;
    }
    float sum = 0.0f;
    float out = 0.0f;
    for (std::uint64_t i = 0; i < items; ++i) {
      const std::uint64_t col = (coff == 2 && i >= m) ? D : 0;
      const float e = static_cast<float>(exp(static_cast<double>(__fsub_rn(sc[i * pw + col + j], mx))));
      sum = __fadd_rn(sum, e);
      out = __fadd_rn(out, __fmul_rn(e, kv[i * pw + col + j]));
    }
    float x = __fdiv_rn(out, sum);
    if (coff == 2) {  // the overlap shift: rows [m, 2m) become rows [0, m) (this thread's columns)
      for (std::uint64_t i = 0; i < m; ++i) {
        for (unsigned h = 0; h < coff; ++h) {
          const std::uint64_t col = h * D + j;
          kv[i * pw + col] = kv[(m + i) * pw + col];
          sc[i * pw + col] = sc[(m + i) * pw + col];
        }
      }
    }
    finish_and_encode<D, kIndexer>(p, item.rows, t / m, x, j, row_s, lanes, scratch);
  }
}

// ---- Prefill: all of a chunk's emissions in parallel ---------------------------------------------------------
// The state after token t holds only the tokens of the current and (m = 4) the previous group, so group g's row
// can be pooled straight from the chunk's inputs, taking the tokens before the chunk from the state as it was
// when the chunk began. Item order, scores (z + ape in float32) and values are those of the sequential update,
// so the rows are the same bits. compressor_emit_kernel writes the rows (reading the old state); then
// compressor_state_kernel writes the state the sequential walk would have left (and checks every input).

// Score and value of state item i (in pool_state's order) for feature j of group g. g0 = start / m is the
// chunk's first group; inputs a / z hold tokens [start, start + count).
template <unsigned D>
__device__ __forceinline__ void pooled_item(const CompressorParams& p, const CompressorItem& item, std::uint64_t g,
                                            std::uint64_t i, unsigned j, float& score, float& value) {
  const std::uint64_t m = p.ratio;
  const std::uint64_t pw = static_cast<std::uint64_t>(p.coff) * D;
  const std::uint64_t g0 = item.start / m;
  std::uint64_t token = 0;
  std::uint64_t col = 0;
  bool from_state = false;
  std::uint64_t state_row = 0;
  if (p.coff == 2 && i < m) {  // the previous group's first halves
    col = j;
    if (g == g0) {
      from_state = true;  // rows [0, m) hold group g0 - 1 (initial values while g0 == 0)
      state_row = i;
    } else {
      token = (g - 1) * m + i;
      from_state = token < item.start;  // group g0's tokens before the chunk are in rows [m, 2m)
      state_row = m + i;
    }
  } else {  // the current group's tokens (second halves with the overlap)
    const std::uint64_t slot = p.coff == 2 ? i - m : i;
    col = (p.coff == 2 ? D : 0) + j;
    token = g * m + slot;
    from_state = token < item.start;
    state_row = i;
  }
  if (from_state) {
    score = item.score_state[state_row * pw + col];
    value = item.kv_state[state_row * pw + col];
  } else {
    const std::uint64_t k = token - item.start;
    score = __fadd_rn(item.z[k * pw + col], p.ape[(token % m) * pw + col]);
    value = item.a[k * pw + col];
  }
}

template <unsigned D, bool kIndexer>
__global__ void __launch_bounds__(D) compressor_emit_kernel(const CompressorParams p) {
  __shared__ float row_s[D];
  __shared__ float lanes[8];
  __shared__ float scratch[D / 32];
  if (blockIdx.x >= p.n_items) return;
  const CompressorItem& item = p.items[blockIdx.x];
  const unsigned j = threadIdx.x;
  const std::uint64_t m = p.ratio;
  const std::uint64_t items = p.coff * m;
  const std::uint64_t g0 = item.start / m;
  const std::uint64_t emitted = (item.start + item.count) / m - g0;
  for (std::uint64_t e = blockIdx.y; e < emitted; e += gridDim.y) {  // uniform over the block
    const std::uint64_t g = g0 + e;
    float mx = -INFINITY;
    for (std::uint64_t i = 0; i < items; ++i) {
      float s = 0.0f, v = 0.0f;
      pooled_item<D>(p, item, g, i, j, s, v);
      mx = mx < s ? s : mx;
    }
    float sum = 0.0f;
    float out = 0.0f;
    for (std::uint64_t i = 0; i < items; ++i) {
      float s = 0.0f, v = 0.0f;
      pooled_item<D>(p, item, g, i, j, s, v);
      const float w = static_cast<float>(exp(static_cast<double>(__fsub_rn(s, mx))));
      sum = __fadd_rn(sum, w);
      out = __fadd_rn(out, __fmul_rn(w, v));
    }
    finish_and_encode<D, kIndexer>(p, item.rows, g, __fdiv_rn(out, sum), j, row_s, lanes, scratch);
  }
}

// The state after the chunk: current-half row (coff-1)*m + i holds the chunk's last token t with t % m == i (rows
// of slots the chunk did not reach keep their values); with the overlap, rows [0, m) hold the last emitted group
// when the chunk emitted one (tokens before the chunk come from the old rows [m, 2m), read before they are
// overwritten: each thread owns a column in every row). Also checks every input of the chunk for NaN / inf.
__global__ void __launch_bounds__(256) compressor_state_kernel(const CompressorParams p, unsigned width) {
  if (blockIdx.x >= p.n_items) return;
  const CompressorItem& item = p.items[blockIdx.x];
  const std::uint64_t m = p.ratio;
  const std::uint64_t pw = static_cast<std::uint64_t>(p.coff) * width;
  const std::uint64_t start = item.start;
  const std::uint64_t end = item.start + item.count;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.y) * blockDim.x;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (p.check_finite != 0) {
    bool bad = false;
    for (std::uint64_t x = first; x < item.count * pw; x += stride) {
      bad = bad || !(isfinite(item.a[x]) && isfinite(item.z[x]));
    }
    if (bad) atomicOr(item.status, kFlagNonFinite);
  }
  const std::uint64_t base = (p.coff - 1) * m;
  for (std::uint64_t col = first; col < pw; col += stride) {
    if (p.coff == 2 && end / m > start / m) {
      const std::uint64_t last = end / m - 1;  // the last emitted group
      float kv[4], sc[4];
      for (std::uint64_t i = 0; i < m && i < 4; ++i) {
        const std::uint64_t token = last * m + i;
        if (token >= start) {
          kv[i] = item.a[(token - start) * pw + col];
          sc[i] = __fadd_rn(item.z[(token - start) * pw + col], p.ape[i * pw + col]);
        } else {
          kv[i] = item.kv_state[(m + i) * pw + col];
          sc[i] = item.score_state[(m + i) * pw + col];
        }
      }
      for (std::uint64_t i = 0; i < m && i < 4; ++i) {
        item.kv_state[i * pw + col] = kv[i];
        item.score_state[i * pw + col] = sc[i];
      }
    }
    for (std::uint64_t i = 0; i < m; ++i) {
      if (end - 1 < i) continue;
      const std::uint64_t token = ((end - 1 - i) / m) * m + i;  // the last token of slot i before `end`
      if (token < start) continue;
      item.kv_state[(base + i) * pw + col] = item.a[(token - start) * pw + col];
      item.score_state[(base + i) * pw + col] = __fadd_rn(item.z[(token - start) * pw + col], p.ape[i * pw + col]);
    }
  }
}

}  // namespace

namespace {
unsigned grid_y(std::uint64_t n) { return static_cast<unsigned>(n == 0 ? 1 : (n < kMaxGridY ? n : kMaxGridY)); }

template <unsigned D, bool kIndexer>
cudaError_t launch(const CompressorParams& p, const CompressorLaunch& how, cudaStream_t stream) {
  if (p.n_items == 0) return cudaSuccess;
  if (!how.parallel) {
    compressor_kernel<D, kIndexer><<<p.n_items, D, 0, stream>>>(p);
    return cudaGetLastError();
  }
  if (how.max_emitted > 0) {
    compressor_emit_kernel<D, kIndexer><<<dim3(p.n_items, grid_y(how.max_emitted)), D, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const std::uint64_t pw = static_cast<std::uint64_t>(p.coff) * D;
  const std::uint64_t col_blocks = (pw + 255) / 256;
  const std::uint64_t check_blocks = (how.max_count * pw + 256 * 64 - 1) / (256 * 64);  // ~64 inputs per thread
  compressor_state_kernel<<<dim3(p.n_items, grid_y(col_blocks > check_blocks ? col_blocks : check_blocks)), 256, 0,
                            stream>>>(p, D);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_compressor_main(const CompressorParams& p, const CompressorLaunch& how, cudaStream_t stream) {
  return launch<kWidth, false>(p, how, stream);
}

cudaError_t launch_compressor_indexer(const CompressorParams& p, const CompressorLaunch& how, cudaStream_t stream) {
  return launch<128, true>(p, how, stream);
}

}  // namespace kvcompact::cuda::dsv4::detail
