// TurboQuant quantisation configuration: how keys and values are coded, with named presets.
// Mode names: keys "mse<b>" (b Lloyd–Max code bits) or "prod<b>" (b−1 code bits + 1 QJL sign bit);
// values "mse<b>". See docs/turboquant.md for the math and docs/formats.md for the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvcompact/core/error.hpp"

namespace kvcompact::tq {

enum class KeyMode : std::uint8_t { Mse = 0, Prod = 1 };

struct QuantConfig {
  KeyMode key_mode = KeyMode::Prod;
  std::uint8_t key_bits = 3;    // total bits per key coordinate (prod: key_bits − 1 code bits + 1 QJL bit); 2..5
  std::uint8_t value_bits = 2;  // bits per value coordinate; 2..4
  // Store n / ‖c[idx]‖ instead of n so a reconstructed vector has the true norm (mse modes only:
  // it would bias the prod estimator, so prod keys reject it).
  bool norm_correction = false;
  std::uint64_t seed = 0;        // rotation seed; per-layer seed = seed XOR layer index
  std::uint32_t exact_window = 0;  // the W most recent tokens also kept unquantised (f32); 0 = none

  // Lloyd–Max code bits actually stored per key coordinate.
  std::uint32_t key_code_bits() const { return key_mode == KeyMode::Prod ? key_bits - 1u : key_bits; }
  bool has_qjl() const { return key_mode == KeyMode::Prod; }

  Status validate() const;
  // "k=prod3,v=mse2" (+ ",nc" with norm correction, + ",w=128" with an exact window).
  std::string name() const;

  // The seed system's configuration (cera 0.4.0): keys prod3 (2-bit codes + QJL), values mse2.
  // Unlike the seed, the QJL correction uses the unbiased scale √(π/(2d)).
  static QuantConfig seed_system(std::uint64_t seed = 0);
  // kvcompact's recommended default; docs/turboquant.md gives the measurements behind it.
  static QuantConfig recommended(std::uint64_t seed = 0);
  // Parse a preset name ("seed", "recommended") or a mode string like "k=prod4,v=mse3,nc,w=64".
  static Result<QuantConfig> parse(std::string_view text, std::uint64_t seed = 0);
};

}  // namespace kvcompact::tq
