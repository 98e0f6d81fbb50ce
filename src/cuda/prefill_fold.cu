// Folded QJL keys for the warpgroup prefill kernel (Fast precision; docs/cuda-prefill.md, "Folded QJL keys").
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
__global__ void __launch_bounds__(kWarps * 32) fold_qjl_keys_kernel(PrefillParams p) {
  const std::uint32_t tile = blockIdx.x, kvh = blockIdx.y, entry = blockIdx.z;
  std::uint32_t seq = 0;
  const std::uint32_t kend = entry_key_end(p, entry, seq);
  if (tile * kTileTokens >= kend) return;
  const Tables& t = *p.tables;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float qjl_sign[D / 32];
  load_lane_signs<D>(qjl_sign, t.qjl_signs, lane);
  const float alpha = t.key_lut_scale, rho_scale = t.key_lut_scale * t.qjl_scale, rotation_scale = t.block_scale[0];
  float centroid[D / 32];  // (per coordinate, after the code is known)
  const std::uint64_t slot0 = (static_cast<std::uint64_t>(seq) * p.kv_heads + kvh) * p.capacity;
  std::uint8_t* out =
      p.folded_keys + ((static_cast<std::uint64_t>(entry) * p.kv_heads + kvh) * p.fold_tiles + tile) * kFoldedTileBytes;
  for (unsigned r = warp; r < kTileTokens; r += kWarps) {
    const std::uint32_t pos = tile * kTileTokens + r;
    float v[D / 32];
    if (pos < kend) {
      const std::uint64_t slot = slot0 + pos;
      const std::uint8_t* codes = p.layer + p.key_codes + slot * p.kc_bytes;
      const std::uint8_t* signs = p.layer + p.key_signs + slot * p.ks_bytes;
      const unsigned short rho_bits = *reinterpret_cast<const unsigned short*>(p.layer + p.key_rho + slot * 2u);
      const float rho = __half2float(__ushort_as_half(rho_bits));
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        const std::uint32_t j = lane + 32u * i;
        centroid[i] = t.key_centroids[row_code(codes, j, p.key_code_bits)];
        v[i] = (signs[j / 8] >> (j % 8)) & 1u ? 1.0f : -1.0f;  // σ (bit set: +1, as the CPU's sign_sum)
      }
      rotate_inverse_in_registers<D>(v, qjl_sign, rotation_scale, lane);  // R_j⁻¹σ
#pragma unroll
      for (int i = 0; i < D / 32; ++i) v[i] = fmaf(rho * rho_scale, v[i], alpha * centroid[i]);
    } else {
#pragma unroll
      for (int i = 0; i < D / 32; ++i) v[i] = 0.0f;
    }
    // K_hi = fp16(α·k̂) into the fp16 tile; K_lo = α·k̂ − K_hi (exact in f32) and K_hi, scaled, as e4m3 bytes
    // at columns j and 128 + j of the FP8 tile (whose byte layout is an fp16 tile's: byte column b at the fp16
    // offset of column b / 2, plus b % 2).
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const std::uint32_t j = lane + 32u * i;
      const __half hi = __float2half_rn(v[i]);
      const float lo = v[i] - __half2float(hi);
      *reinterpret_cast<__half*>(out + sw128_offset(r, j, kTileTokens)) = hi;
      const std::uint16_t codes = e4m3x2_of(lo * kFoldKloScale, __half2float(hi) * kFoldKhiScale);
      std::uint8_t* fp8 = out + kFoldedHalfTileBytes;
      fp8[sw128_offset(r, j / 2, kTileTokens) + j % 2] = static_cast<std::uint8_t>(codes & 0xFFu);
      fp8[sw128_offset(r, 64 + j / 2, kTileTokens) + j % 2] = static_cast<std::uint8_t>(codes >> 8);
    }
  }
}

}  // namespace

cudaError_t launch_fold_qjl_keys(const PrefillParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.fold_tiles == 0) return cudaSuccess;
  fold_qjl_keys_kernel<<<dim3(p.fold_tiles, p.kv_heads, p.batch), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::tq::detail
