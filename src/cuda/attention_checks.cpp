// Argument checks shared by the CUDA attention entry points (see attention_checks.hpp).
#include "attention_checks.hpp"

#include <cmath>

namespace kvcompact::cuda::tq::detail {

Status check_plan_heads_and_mode(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config,
                                 std::uint32_t q_heads, bool supported, const char* what) {
  if (layout.kv_heads == 0 || q_heads == 0 || q_heads % layout.kv_heads != 0) {
    return make_error(ErrorCode::InvalidArgument, "q_heads {} must be a positive multiple of kv_heads {}", q_heads,
                      layout.kv_heads);
  }
  if (!supported) {
    return make_error(ErrorCode::Unsupported,
                      "CUDA {} attention has no kernel for head_dim {} with mode {} (head_dim 64/128/256, key code bits "
                      "1..5, value bits 2..4)",
                      what, layout.head_dim, config.name());
  }
  return ok_status();
}

Status check_codec_matches_plan(const DeviceCodec& codec, const LayerLayout& layout,
                                const kvcompact::tq::QuantConfig& config) {
  if (codec.head_dim() != layout.head_dim || codec.config().key_code_bits() != config.key_code_bits() ||
      codec.config().value_bits != config.value_bits || codec.config().has_qjl() != config.has_qjl()) {
    return make_error(ErrorCode::Mismatch, "codec (head_dim {}, mode {}) does not match the plan (head_dim {}, mode {})",
                      codec.head_dim(), codec.config().name(), layout.head_dim, config.name());
  }
  return ok_status();
}

Status check_attention_inputs(const LayerLayout& layout, const void* layer_data, const std::uint32_t* window_begins,
                              float scale) {
  if (reinterpret_cast<std::uintptr_t>(layer_data) % 16 != 0) {
    return make_error(ErrorCode::InvalidArgument, "layer data at {} is not 16-byte aligned",
                      reinterpret_cast<std::uintptr_t>(layer_data));
  }
  if (layout.exact_window > 0 && window_begins == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "a layout with an exact window needs window_begins");
  }
  if (!std::isfinite(scale)) return make_error(ErrorCode::InvalidArgument, "scale {} is not finite", scale);
  return ok_status();
}

}  // namespace kvcompact::cuda::tq::detail
