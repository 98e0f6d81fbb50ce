// The packed TurboQuant layout every backend shares — the single source of truth for bytes.
// docs/formats.md describes the same thing in prose. All multi-byte values are little-endian.
//
// Per token and KV head, a key is stored as
//   codes          head_dim·code_bits/8 bytes: code of coordinate j at bits [j·b, j·b+b) of a
//                  little-endian bit stream (for b = 2: bits 2·(j mod 4) of byte j/4, the seed's packing)
//   signs          head_dim/8 bytes (prod only): QJL bit of coordinate j at bit j mod 8 of byte j/8
//   norm           f32: ‖k‖ (or the norm-corrected scale)
//   residual_norm  f16 (prod only): ρ = ‖y − c[idx]‖ of the unit vector y, so ρ ≤ 2 and never overflows
// and a value as codes + f32 norm. Regions are stored separately (struct of arrays), see LayerLayout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/config.hpp"

namespace kvcompact::tq {

inline constexpr std::uint32_t kMinHeadDim = 16;
inline constexpr std::uint32_t kMaxHeadDim = 1024;
inline constexpr std::uint64_t kRegionAlignment = 256;  // every region of a layer starts at a multiple of this
// Positions per sequence at most (the attention paths step through positions in 32-bit blocks).
inline constexpr std::uint32_t kMaxCapacity = 1u << 31;

constexpr std::uint32_t packed_code_bytes(std::uint32_t head_dim, std::uint32_t code_bits) {
  return head_dim * code_bits / 8;
}
constexpr std::uint32_t packed_sign_bytes(std::uint32_t head_dim) { return head_dim / 8; }

// Bytes of one token of one KV head, per region.
struct TokenBytes {
  std::uint32_t key_codes = 0;
  std::uint32_t key_signs = 0;          // 0 for mse keys
  std::uint32_t key_norm = 4;           // f32
  std::uint32_t key_residual_norm = 0;  // 2 (f16) for prod keys
  std::uint32_t value_codes = 0;
  std::uint32_t value_norm = 4;  // f32

  std::uint32_t key_total() const { return key_codes + key_signs + key_norm + key_residual_norm; }
  std::uint32_t value_total() const { return value_codes + value_norm; }
  std::uint32_t total() const { return key_total() + value_total(); }
};

TokenBytes token_bytes(std::uint32_t head_dim, const QuantConfig& config);

// head_dim must be a multiple of 16 in [16, 1024]; returns a typed error naming the value otherwise.
Status validate_head_dim(std::uint32_t head_dim);

// Byte offsets of one layer's regions inside one contiguous buffer. A slot is one (sequence, KV head,
// position) triple: slot = (seq · kv_heads + head) · capacity + position.
// Region order: key codes, key signs, key norms, key residual norms, value codes, value norms,
// exact window keys, exact window values (window: f32 [seqs, kv_heads, W, head_dim], ring slot
// position mod W). Empty regions have size 0. Every offset is a multiple of kRegionAlignment.
struct LayerLayout {
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t sequences = 0;
  std::uint32_t capacity = 0;
  std::uint32_t exact_window = 0;
  TokenBytes token{};

  std::uint64_t key_codes_offset = 0;
  std::uint64_t key_signs_offset = 0;
  std::uint64_t key_norms_offset = 0;
  std::uint64_t key_residual_norms_offset = 0;
  std::uint64_t value_codes_offset = 0;
  std::uint64_t value_norms_offset = 0;
  std::uint64_t window_keys_offset = 0;
  std::uint64_t window_values_offset = 0;
  std::uint64_t total_bytes = 0;

  std::uint64_t slot(std::uint32_t seq, std::uint32_t head, std::uint32_t position) const {
    return (static_cast<std::uint64_t>(seq) * kv_heads + head) * capacity + position;
  }
  std::uint64_t window_row(std::uint32_t seq, std::uint32_t head, std::uint32_t position) const {
    return (static_cast<std::uint64_t>(seq) * kv_heads + head) * exact_window + position % exact_window;
  }
};

// Checked: overflow of any region size is a typed Overflow error; a capacity above kMaxCapacity is Unsupported.
Result<LayerLayout> plan_layer_layout(std::uint32_t head_dim, std::uint32_t kv_heads, std::uint32_t sequences,
                                      std::uint32_t capacity, const QuantConfig& config);

}  // namespace kvcompact::tq
