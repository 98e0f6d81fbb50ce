// LayerSnapshot validation shared by the CPU and CUDA TurboQuant caches.
#include "kvcompact/tq/snapshot_check.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvcompact/core/dtypes.hpp"

namespace kvcompact::tq {

std::array<SnapshotRegion, 6> snapshot_regions(const LayerSnapshot& snap, const LayerLayout& lay) {
  return {{
      {"key codes", &snap.key_codes, lay.token.key_codes, lay.key_codes_offset},
      {"key signs", &snap.key_signs, lay.token.key_signs, lay.key_signs_offset},
      {"key norms", &snap.key_norms, lay.token.key_norm, lay.key_norms_offset},
      {"key residual norms", &snap.key_residual_norms, lay.token.key_residual_norm, lay.key_residual_norms_offset},
      {"value codes", &snap.value_codes, lay.token.value_codes, lay.value_codes_offset},
      {"value norms", &snap.value_norms, lay.token.value_norm, lay.value_norms_offset},
  }};
}

bool same_quant_config(const QuantConfig& a, const QuantConfig& b) {
  return a.key_mode == b.key_mode && a.key_bits == b.key_bits && a.value_bits == b.value_bits &&
         a.norm_correction == b.norm_correction && a.seed == b.seed && a.exact_window == b.exact_window;
}

namespace {

bool same_token_bytes(const TokenBytes& a, const TokenBytes& b) {
  return a.key_codes == b.key_codes && a.key_signs == b.key_signs && a.key_norm == b.key_norm &&
         a.key_residual_norm == b.key_residual_norm && a.value_codes == b.value_codes && a.value_norm == b.value_norm;
}

// Little-endian f32 norms (LayerSnapshot::key_norms / value_norms).
Status check_norms(const std::vector<std::uint8_t>& bytes, const char* what) {
  for (std::size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    float norm;
    std::memcpy(&norm, bytes.data() + i, 4);  // (the snapshot's bytes are the cache's: host order, little-endian)
    if (!std::isfinite(norm)) return make_error(ErrorCode::NonFinite, "snapshot {} norm {} is {}", what, i / 4, norm);
    if (norm < 0.0f) {
      return make_error(ErrorCode::Corrupt, "snapshot {} norm {} is {}; norms must be non-negative", what, i / 4, norm);
    }
  }
  return ok_status();
}

Error with_numbers(Error e, std::uint64_t expected, std::uint64_t actual) {
  e.expected = static_cast<std::int64_t>(expected);
  e.actual = static_cast<std::int64_t>(actual);
  return e;
}

}  // namespace

Status validate_snapshot(const LayerSnapshot& snap, const SnapshotTarget& target) {
  if (snap.layer_index != target.layer) {
    return make_error(ErrorCode::Mismatch,
                      "snapshot of layer {} cannot restore into layer {} (each layer has its own rotation seed)",
                      snap.layer_index, target.layer);
  }
  if (snap.head_dim != target.head_dim || snap.kv_heads != target.kv_heads) {
    return make_error(ErrorCode::Mismatch, "snapshot shape head_dim {} kv_heads {} != cache layer {}: {} / {}",
                      snap.head_dim, snap.kv_heads, target.layer, target.head_dim, target.kv_heads);
  }
  if (!same_quant_config(snap.config, target.config)) {
    return make_error(ErrorCode::Mismatch, "snapshot config '{}' seed {} != cache config '{}' seed {}",
                      snap.config.name(), snap.config.seed, target.config.name(), target.config.seed);
  }
  const TokenBytes want = token_bytes(target.head_dim, target.config);
  if (!same_token_bytes(snap.token, want)) {
    return make_error(ErrorCode::Mismatch, "snapshot per-token byte counts ({} key, {} value) != the cache's ({}, {})",
                      snap.token.key_total(), snap.token.value_total(), want.key_total(), want.value_total());
  }
  if (target.kv_heads == 0) {
    if (snap.length != 0) {
      return make_error(ErrorCode::Mismatch, "snapshot of non-attention layer {} claims length {}", target.layer,
                        snap.length);
    }
    return ok_status();
  }
  const std::uint32_t length = snap.length;
  if (length > target.capacity) {
    return with_numbers(make_error(ErrorCode::CapacityExceeded, "snapshot length {} exceeds the cache capacity {}",
                                   length, target.capacity),
                        target.capacity, length);
  }
  const std::uint64_t tokens = static_cast<std::uint64_t>(target.kv_heads) * length;
  LayerLayout sizes;  // only the per-token counts are needed for the size checks
  sizes.token = want;
  for (const SnapshotRegion& r : snapshot_regions(snap, sizes)) {
    const std::uint64_t expected = tokens * r.per_token;
    if (r.bytes->size() != expected) {
      return with_numbers(
          make_error(r.bytes->size() < expected ? ErrorCode::Truncated : ErrorCode::Corrupt,
                     "snapshot {} hold {} bytes, expected {} ({} heads × {} tokens × {} bytes)", r.name,
                     r.bytes->size(), expected, target.kv_heads, length, r.per_token),
          expected, r.bytes->size());
    }
  }
  const std::uint32_t w = target.exact_window;
  if (snap.window_begin > length || length - snap.window_begin > w) {
    return make_error(ErrorCode::Corrupt, "snapshot window [{}, {}) does not fit an exact window of {}",
                      snap.window_begin, length, w);
  }
  const std::uint64_t floats = static_cast<std::uint64_t>(target.kv_heads) * (length - snap.window_begin) *
                               target.head_dim;
  if (snap.window_keys.size() != floats || snap.window_values.size() != floats) {
    return make_error(snap.window_keys.size() < floats ? ErrorCode::Truncated : ErrorCode::Corrupt,
                      "snapshot window rows hold {} / {} floats, expected {}", snap.window_keys.size(),
                      snap.window_values.size(), floats);
  }
  for (std::size_t i = 0; i < snap.window_keys.size(); ++i) {
    if (!std::isfinite(snap.window_keys[i]) || !std::isfinite(snap.window_values[i])) {
      return make_error(ErrorCode::NonFinite, "snapshot window float {} is not finite", i);
    }
  }
  // The norms as the blob decoder requires them (blob.cpp, validate_blob_values): finite and non-negative, or
  // attention over the restored tokens would be NaN.
  KVC_TRY(check_norms(snap.key_norms, "key"));
  KVC_TRY(check_norms(snap.value_norms, "value"));
  for (std::size_t i = 0; i + 2 <= snap.key_residual_norms.size(); i += 2) {
    std::uint16_t half;
    std::memcpy(&half, snap.key_residual_norms.data() + i, 2);
    const float rho = f16_to_f32(half);
    if (!std::isfinite(rho)) return make_error(ErrorCode::NonFinite, "snapshot key residual norm {} is {}", i / 2, rho);
    if (rho < 0.0f) {
      return make_error(ErrorCode::Corrupt, "snapshot key residual norm {} is {}; it must be non-negative", i / 2, rho);
    }
  }
  return ok_status();
}

}  // namespace kvcompact::tq
