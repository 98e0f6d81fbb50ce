// Internal device-side pieces shared by the TurboQuant kernels: the per-layer table struct that
// DeviceCodec uploads (rotation signs / scales, codebooks, flags) and warp-level rotation helpers (in shared
// memory for any head_dim; in registers for one power-of-two block of 64, 128 or 256).
#pragma once

#include <cstdint>

#include "encode_quantiser.hpp"

namespace kvcompact::cuda::tq::detail {

inline constexpr std::uint32_t kMaxBlocks = 8;       // power-of-two rotation blocks of a head_dim ≤ 1024
inline constexpr std::uint32_t kMaxHeadDim = 1024;

struct Tables {
  std::uint32_t head_dim;
  std::uint32_t block_count;
  std::uint32_t block_size[kMaxBlocks];
  std::uint32_t block_offset[kMaxBlocks];
  float block_scale[kMaxBlocks];  // 1.0f / sqrtf(block) in f32, as the CPU rotation computes it
  std::uint32_t key_code_bits;
  std::uint32_t value_bits;
  std::uint32_t has_qjl;
  std::uint32_t norm_correction;
  float qjl_scale;  // √(π/(2d)) rounded to f32 (LayerCodec::qjl_scale)
  // Scales α applied to the centroids before they are rounded to fp16 in the decode and prefill lookup tables,
  // chosen so that the α·c_k are nearly fp16 values (the smallest weighted RMS rounding error: lut_scale.hpp); the
  // kernels divide α out in fp32 (docs/cuda.md, "Precision").
  float key_lut_scale;
  float value_lut_scale;
  float key_centroids[32];
  float key_boundaries[32];
  double key_centroids_f64[32];
  float value_centroids[32];
  float value_boundaries[32];
  double value_centroids_f64[32];
  // The fast encode kernel's quantisers (head_dim 64 / 128 / 256 only; zero otherwise): key thresholds in the
  // domain of the scaled y when the keys carry QJL, of the unscaled one otherwise; value thresholds unscaled.
  EncodeQuantiser key_quantiser;
  EncodeQuantiser value_quantiser;
  float qjl_sign_threshold;  // scaled_threshold(0, 1/√b): the QJL sign bit is y ≥ it (no ·1/√b)
  float main_signs[kMaxHeadDim];
  float qjl_signs[kMaxHeadDim];
};

#ifdef __CUDACC__
// y ← R(y) in place (forward) on one warp's shared-memory row: ·signs, butterflies with strides 1, 2, 4, ...
// per block, ·1/√b. The float operations and their order equal the CPU rotation, so results are bit-identical
// (explicit _rn intrinsics: no contraction can change a rounding).
__device__ inline void warp_rotate_forward(float* x, const Tables& t, const float* signs, unsigned lane) {
  const unsigned d = t.head_dim;
  for (unsigned j = lane; j < d; j += 32) x[j] = __fmul_rn(x[j], signs[j]);
  __syncwarp();
  for (unsigned k = 0; k < t.block_count; ++k) {
    const unsigned off = t.block_offset[k];
    const unsigned b = t.block_size[k];
    for (unsigned h = 1; h < b; h <<= 1) {
      for (unsigned p = lane; p < b / 2; p += 32) {
        const unsigned i = off + (p / h) * 2 * h + (p % h);
        const float a = x[i];
        const float c = x[i + h];
        x[i] = __fadd_rn(a, c);
        x[i + h] = __fsub_rn(a, c);
      }
      __syncwarp();
    }
    for (unsigned j = lane; j < b; j += 32) x[off + j] = __fmul_rn(x[off + j], t.block_scale[k]);
  }
  __syncwarp();
}

// x ← R⁻¹(x) in place: ·1/√b, butterflies, ·signs.
__device__ inline void warp_rotate_inverse(float* x, const Tables& t, const float* signs, unsigned lane) {
  const unsigned d = t.head_dim;
  for (unsigned k = 0; k < t.block_count; ++k) {
    const unsigned off = t.block_offset[k];
    const unsigned b = t.block_size[k];
    for (unsigned j = lane; j < b; j += 32) x[off + j] = x[off + j] * t.block_scale[k];
    __syncwarp();
    for (unsigned h = 1; h < b; h <<= 1) {
      for (unsigned p = lane; p < b / 2; p += 32) {
        const unsigned i = off + (p / h) * 2 * h + (p % h);
        const float a = x[i];
        const float c = x[i + h];
        x[i] = a + c;
        x[i + h] = a - c;
      }
      __syncwarp();
    }
  }
  for (unsigned j = lane; j < d; j += 32) x[j] = x[j] * signs[j];
  __syncwarp();
}

// The Hadamard butterflies of one head of D = 64, 128 or 256 coordinates (one block: a power of two is its own
// binary decomposition), coordinate lane + 32i in v[i]: strides 1, 2, …, D/2 with the operations and in the
// order of warp_rotate_forward / warp_rotate_inverse above, which do them in shared memory for any block
// structure. Strides below 32 pair lanes (a shuffle: the lower lane keeps a + c, the upper a − c), larger ones
// a lane's registers.
template <int D>
__device__ __forceinline__ void butterflies_in_registers(float (&v)[D / 32], unsigned lane) {
  constexpr int R = D / 32;
#pragma unroll
  for (unsigned h = 1; h < 32; h <<= 1) {
    const bool upper = (lane & h) != 0u;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, v[i], h);
      v[i] = upper ? __fsub_rn(other, v[i]) : __fadd_rn(v[i], other);
    }
  }
#pragma unroll
  for (int h = 1; h < R; h <<= 1) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], c = v[i + h];
        v[i] = __fadd_rn(a, c);
        v[i + h] = __fsub_rn(a, c);
      }
    }
  }
}
// A lane's signs of a rotation, sign[i] of coordinate lane + 32i (loaded ahead of the rotation, so that the
// load's latency overlaps other work).
template <int D>
__device__ __forceinline__ void load_lane_signs(float (&sign)[D / 32], const float* signs, unsigned lane) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i) sign[i] = signs[lane + 32 * i];
}
// x ← R(x) = (H·(signs ⊙ x))·scale and x ← R⁻¹(x) = signs ⊙ (H·(x·scale)), scale = 1/√D; `sign` from
// load_lane_signs.
template <int D>
__device__ __forceinline__ void rotate_forward_in_registers(float (&v)[D / 32], const float (&sign)[D / 32],
                                                            float scale, unsigned lane) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] = __fmul_rn(v[i], sign[i]);
  butterflies_in_registers<D>(v, lane);
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] = __fmul_rn(v[i], scale);
}
template <int D>
__device__ __forceinline__ void rotate_inverse_in_registers(float (&v)[D / 32], const float (&sign)[D / 32],
                                                            float scale, unsigned lane) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] = __fmul_rn(v[i], scale);
  butterflies_in_registers<D>(v, lane);
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] = __fmul_rn(v[i], sign[i]);
}
#endif

}  // namespace kvcompact::cuda::tq::detail
