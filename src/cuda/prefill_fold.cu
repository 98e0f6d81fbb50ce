// Folded keys for the warpgroup prefill kernel (docs/cuda-prefill.md, "Folded keys"): every key tile of a launch
// written once, as the kernel's fp16 tile and an e4m3 tile for the cross terms of the S product, which the
// kernel's producer then copies instead of dequantising codes in every block that reads the tile.
//
// A QJL key scores as n·(q_rot·c + ρ·s·(R_j q_rot)·σ) (tq::LayerCodec::score_key; s = qjl_scale, σ = ±1 signs,
// R_j the QJL rotation). R_j is orthogonal, so (R_j q_rot)·σ = q_rot·(R_j⁻¹σ) and the key is one vector in the
// rotated space, k̂ = c + ρ·s·R_j⁻¹σ: the prefill kernel then needs one S product (the MSE keys' Q_hi·k̂ + Q_lo·k̂)
// instead of two (the code part and the QJL part against a ±ρ sign tile), and its producer copies k̂ instead of
// dequantising codes and signs. Every query tile of a chunk reads the same key tiles, so folding them once per
// launch costs a small fraction of what the kernel spent on them per block.
//
// Precision: K_hi = fp16(α·k̂) alone would put the key's fp16 rounding into every score (measured 1.1–1.8·10⁻³
// of the float64 oracle, over the budget), so each tile also carries the e4m3 operand [K_lo | K_hi] (scaled) of
// the cross terms Q_hi·K_lo + Q_lo·K_hi, which the kernel runs as one FP8 product (prefill_params.hpp). HiLo
// keeps the exact ±ρ sign tiles.
//
// MSE keys (k̂ = c): K_hi = fp16(α·c) is the producer's table value, whose residual the unfolded kernel leaves out
// as well; the e4m3 tile holds K_hi alone, for Q_lo·K_hi as an FP8 product (half an fp16 product's tensor time).
#include <cuda_fp16.h>

#include <cstdint>

#include "prefill_device.cuh"
#include "prefill_params.hpp"
#include "tq_device.cuh"
#include "wgmma.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

using namespace prefill;

constexpr int D = 128;
constexpr unsigned kTileTokens = 64, kWarps = 4;
static_assert(kFoldedHalfTileBytes == kTileTokens * D * 2, "a folded tile half is the prefill kernel's SW128 key tile");

// The key range an entry's blocks read: BlockRange::init's kend for the entry's last query row (every block's is
// at most that), 0 for a sequence index out of range (those blocks read no key).
__device__ std::uint32_t entry_key_end(const PrefillParams& p, std::uint32_t entry, std::uint32_t& seq) {
  seq = p.seqs != nullptr ? p.seqs[entry] : entry;
  if (seq >= p.sequences) return 0u;
  const std::uint32_t nrows = min(p.rows[entry], p.max_rows);
  std::uint32_t length = 0;
  const std::uint32_t eb = packed_end(p, seq, false, length);
  const std::uint64_t last_end = static_cast<std::uint64_t>(p.first_positions[entry]) + nrows;
  return static_cast<std::uint32_t>(min(last_end, static_cast<std::uint64_t>(eb)));
}

// The `bits`-bit code of coordinate j of a key row (code group j / 8, little-endian inside the group, so bit
// j·bits of the row). The second byte may be the next region's or the layer buffer's slack: its bits past the
// code are masked off.
__device__ __forceinline__ std::uint32_t row_code(const std::uint8_t* row, std::uint32_t j, std::uint32_t bits) {
  const std::uint32_t bit = j * bits, byte = bit / 8;
  const std::uint32_t two = row[byte] | (static_cast<std::uint32_t>(row[byte + 1]) << 8);
  return (two >> (bit % 8)) & ((1u << bits) - 1u);
}

// Block (tile, KV head, entry): the tile's 64 keys, one warp per row in turn, coordinate lane + 32 i in register
// i (the layout of rotate_inverse_in_registers). Tokens past the entry's key end are written as zeros (the kernel
// masks them, and zeros keep its products finite).
template <bool QJL>
__global__ void __launch_bounds__(kWarps * 32) fold_keys_kernel(PrefillParams p) {
  const std::uint32_t tile = blockIdx.x, kvh = blockIdx.y, entry = blockIdx.z;
  std::uint32_t seq = 0;
  const std::uint32_t kend = entry_key_end(p, entry, seq);
  if (tile * kTileTokens >= kend) return;
  const Tables& t = *p.tables;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  [[maybe_unused]] float qjl_sign[D / 32];
  if constexpr (QJL) load_lane_signs<D>(qjl_sign, t.qjl_signs, lane);
  const float alpha = t.key_lut_scale;
  [[maybe_unused]] const float rho_scale = t.key_lut_scale * t.qjl_scale, rotation_scale = t.block_scale[0];
  float centroid[D / 32];  // (per coordinate, after the code is known)
  const std::uint64_t slot0 = (static_cast<std::uint64_t>(seq) * p.kv_heads + kvh) * p.capacity;
  std::uint8_t* out = p.folded_keys + ((static_cast<std::uint64_t>(entry) * p.kv_heads + kvh) * p.fold_tiles + tile) *
                                          folded_tile_bytes(QJL);
  std::uint8_t* fp8 = out + kFoldedHalfTileBytes;
  for (unsigned r = warp; r < kTileTokens; r += kWarps) {
    const std::uint32_t pos = tile * kTileTokens + r;
    float v[D / 32];
    if (pos < kend) {
      const std::uint64_t slot = slot0 + pos;
      const std::uint8_t* codes = p.layer + p.key_codes + slot * p.kc_bytes;
#pragma unroll
      for (int i = 0; i < D / 32; ++i) centroid[i] = t.key_centroids[row_code(codes, lane + 32u * i, p.key_code_bits)];
      if constexpr (QJL) {
        const std::uint8_t* signs = p.layer + p.key_signs + slot * p.ks_bytes;
        const unsigned short rho_bits = *reinterpret_cast<const unsigned short*>(p.layer + p.key_rho + slot * 2u);
        const float rho = __half2float(__ushort_as_half(rho_bits));
#pragma unroll
        for (int i = 0; i < D / 32; ++i) {
          const std::uint32_t j = lane + 32u * i;
          v[i] = (signs[j / 8] >> (j % 8)) & 1u ? 1.0f : -1.0f;  // σ (bit set: +1, as the CPU's sign_sum)
        }
        rotate_inverse_in_registers<D>(v, qjl_sign, rotation_scale, lane);  // R_j⁻¹σ
#pragma unroll
        for (int i = 0; i < D / 32; ++i) v[i] = fmaf(rho * rho_scale, v[i], alpha * centroid[i]);
      } else {
#pragma unroll
        for (int i = 0; i < D / 32; ++i) v[i] = alpha * centroid[i];  // (the pair tables' fp16(α·c) below)
      }
    } else {
#pragma unroll
      for (int i = 0; i < D / 32; ++i) v[i] = 0.0f;
    }
    // K_hi = fp16(α·k̂) into the fp16 tile; the e4m3 tile's byte layout is an fp16 tile's (byte column b at the
    // fp16 offset of column b / 2, plus b % 2). QJL keys: K_lo = α·k̂ − K_hi (exact in f32) and K_hi, scaled, at
    // byte columns j and 128 + j; MSE keys: K_hi, scaled, at byte column j.
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const std::uint32_t j = lane + 32u * i;
      const __half hi = __float2half_rn(v[i]);
      *reinterpret_cast<__half*>(out + sw128_offset(r, j, kTileTokens)) = hi;
      const float lo = QJL ? v[i] - __half2float(hi) : 0.0f;
      const std::uint16_t codes = e4m3x2_of(lo * kFoldKloScale, __half2float(hi) * kFoldKhiScale);
      if constexpr (QJL) {
        fp8[sw128_offset(r, j / 2, kTileTokens) + j % 2] = static_cast<std::uint8_t>(codes & 0xFFu);
        fp8[sw128_offset(r, 64 + j / 2, kTileTokens) + j % 2] = static_cast<std::uint8_t>(codes >> 8);
      } else {
        fp8[sw128_offset(r, j / 2, kTileTokens) + j % 2] = static_cast<std::uint8_t>(codes >> 8);
      }
    }
  }
}

}  // namespace

cudaError_t launch_fold_keys(const PrefillParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.fold_tiles == 0) return cudaSuccess;
  const dim3 grid(p.fold_tiles, p.kv_heads, p.batch);
  if (p.qjl != 0) {
    fold_keys_kernel<true><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    fold_keys_kernel<false><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
