// Argument checks shared by the CUDA attention entry points (see attention_checks.hpp).
#include "attention_checks.hpp"

#include <cmath>

namespace kvcompact::cuda::tq::detail {

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
