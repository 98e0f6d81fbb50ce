// Packed TurboQuant layout: per-token byte counts and one layer's region offsets (checked arithmetic).
#include "kvcompact/tq/layout.hpp"

#include "kvcompact/core/checked.hpp"

namespace kvcompact::tq {

Status validate_head_dim(std::uint32_t head_dim) {
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim || head_dim % 16 != 0) {
    return make_error(ErrorCode::Unsupported,
                      "head_dim {} is not supported: it must be a multiple of 16 in [{}, {}] (powers of two use one "
                      "Hadamard block, others a block-diagonal Hadamard, see docs/turboquant-math.md)",
                      head_dim, kMinHeadDim, kMaxHeadDim);
  }
  return ok_status();
}

TokenBytes token_bytes(std::uint32_t head_dim, const QuantConfig& config) {
  TokenBytes bytes;
  bytes.key_codes = packed_code_bytes(head_dim, config.key_code_bits());
  bytes.key_signs = config.has_qjl() ? packed_sign_bytes(head_dim) : 0;
  bytes.key_norm = 4;
  bytes.key_residual_norm = config.has_qjl() ? 2 : 0;
  bytes.value_codes = packed_code_bytes(head_dim, config.value_bits);
  bytes.value_norm = 4;
  return bytes;
}

namespace {

Result<std::uint64_t> align_up(std::uint64_t value) {
  KVC_ASSIGN_OR_RETURN(std::uint64_t bumped, checked_add(value, kRegionAlignment - 1));
  return bumped / kRegionAlignment * kRegionAlignment;
}

// Places a region of `bytes` at the aligned cursor and advances it.
Result<std::uint64_t> place_region(std::uint64_t& cursor, std::uint64_t bytes) {
  KVC_ASSIGN_OR_RETURN(std::uint64_t start, align_up(cursor));
  KVC_ASSIGN_OR_RETURN(cursor, checked_add(start, bytes));
  return start;
}

}  // namespace

Result<LayerLayout> plan_layer_layout(std::uint32_t head_dim, std::uint32_t kv_heads, std::uint32_t sequences,
                                      std::uint32_t capacity, const QuantConfig& config) {
  KVC_TRY(validate_head_dim(head_dim));
  KVC_TRY(config.validate());
  if (kv_heads == 0 || sequences == 0 || capacity == 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "a layer layout needs kv_heads, sequences and capacity > 0 (got {}, {}, {})", kv_heads,
                      sequences, capacity);
  }
  if (capacity > kMaxCapacity) {
    return make_error(ErrorCode::Unsupported, "capacity {} is above the supported {} positions per sequence",
                      capacity, kMaxCapacity);
  }
  if (config.exact_window > capacity) {
    return make_error(ErrorCode::InvalidArgument, "exact window {} exceeds capacity {}", config.exact_window,
                      capacity);
  }
  LayerLayout layout;
  layout.head_dim = head_dim;
  layout.kv_heads = kv_heads;
  layout.sequences = sequences;
  layout.capacity = capacity;
  layout.exact_window = config.exact_window;
  layout.token = token_bytes(head_dim, config);

  KVC_ASSIGN_OR_RETURN(std::uint64_t slots, checked_product({sequences, kv_heads, capacity}));
  KVC_ASSIGN_OR_RETURN(std::uint64_t window_floats,
                       checked_product({sequences, kv_heads, config.exact_window, head_dim}));
  KVC_ASSIGN_OR_RETURN(std::uint64_t window_bytes, checked_mul(window_floats, sizeof(float)));
  const TokenBytes& t = layout.token;
  std::uint64_t cursor = 0;
  KVC_ASSIGN_OR_RETURN(std::uint64_t key_codes, checked_mul(slots, t.key_codes));
  KVC_ASSIGN_OR_RETURN(layout.key_codes_offset, place_region(cursor, key_codes));
  KVC_ASSIGN_OR_RETURN(std::uint64_t key_signs, checked_mul(slots, t.key_signs));
  KVC_ASSIGN_OR_RETURN(layout.key_signs_offset, place_region(cursor, key_signs));
  KVC_ASSIGN_OR_RETURN(std::uint64_t key_norms, checked_mul(slots, t.key_norm));
  KVC_ASSIGN_OR_RETURN(layout.key_norms_offset, place_region(cursor, key_norms));
  KVC_ASSIGN_OR_RETURN(std::uint64_t key_residuals, checked_mul(slots, t.key_residual_norm));
  KVC_ASSIGN_OR_RETURN(layout.key_residual_norms_offset, place_region(cursor, key_residuals));
  KVC_ASSIGN_OR_RETURN(std::uint64_t value_codes, checked_mul(slots, t.value_codes));
  KVC_ASSIGN_OR_RETURN(layout.value_codes_offset, place_region(cursor, value_codes));
  KVC_ASSIGN_OR_RETURN(std::uint64_t value_norms, checked_mul(slots, t.value_norm));
  KVC_ASSIGN_OR_RETURN(layout.value_norms_offset, place_region(cursor, value_norms));
  KVC_ASSIGN_OR_RETURN(layout.window_keys_offset, place_region(cursor, window_bytes));
  KVC_ASSIGN_OR_RETURN(layout.window_values_offset, place_region(cursor, window_bytes));
  KVC_ASSIGN_OR_RETURN(layout.total_bytes, align_up(cursor));
  return layout;
}

}  // namespace kvcompact::tq
