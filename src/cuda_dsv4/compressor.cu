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
    // 3. RMSNorm with weight (compressor_finish_row): eight lanes of squares, summed as a fixed tree.
    const std::uint64_t group = t / m;
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
      encode_indexer_row(item.rows + group * p.row_bytes, x, j, p.storage, scratch);
    } else {
      x = row_s[j];
      __syncthreads();
      x = fp8_sim_main(x, j, scratch);
      encode_attention_row(item.rows + group * p.row_bytes, x, j, p.storage, scratch);
    }
  }
}

}  // namespace

cudaError_t launch_compressor_main(const CompressorParams& p, cudaStream_t stream) {
  if (p.n_items == 0) return cudaSuccess;
  compressor_kernel<kWidth, false><<<p.n_items, kWidth, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_compressor_indexer(const CompressorParams& p, cudaStream_t stream) {
  if (p.n_items == 0) return cudaSuccess;
  compressor_kernel<128, true><<<p.n_items, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
