// RoPE for DeepSeek-V4: interleaved pairs on the last 64 dims of a row, theta 10000 without YaRN for
// window-only layers and compress_rope_theta 160000 with YaRN for ratio-4 / ratio-128 layers. The
// frequency table and the angles are built in float32 exactly as the reference inference code does,
// so the rotation is the model's; a float64 oracle and a float32 fast path share that angle definition.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcompact/dsv4/config.hpp"

namespace kvcompact::dsv4 {

inline constexpr std::size_t kRopePairs = kRopeDims / 2;  // 32

// Frequency parameters of one layer type.
struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;                      // YaRN frequency correction on / off
  double factor = 16.0;                   // YaRN scaling factor
  double original_length = 65536.0;       // YaRN original context length
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// The model's two regimes: ratio 0 -> theta 10000, no YaRN; ratio 4 / 128 -> theta 160000 with YaRN
// (factor 16, original 65536, beta_fast 32, beta_slow 1). Any other ratio is a bug (asserts).
RopeConfig rope_config_for_ratio(std::uint32_t ratio);

// The same from a parsed model config (rope_theta / compress_rope_theta / rope_scaling); a compressed
// layer without rope_scaling gets no YaRN, as in the reference (original_seq_len 0).
RopeConfig rope_config_for_layer(const ModelConfig& config, std::uint32_t ratio);

// YaRN's correction range over the 32 pair indices: [floor(d(beta_fast)), ceil(d(beta_slow))] clamped
// to [0, 63], with d(r) = 64 * ln(L / (2 pi r)) / (2 ln theta). (15, 25) for the compressed layers.
struct YarnRange {
  int low = 0;
  int high = 0;
};
YarnRange yarn_correction_range(const RopeConfig& config);

// Per-pair inverse frequencies in float32, as the reference computes them:
//   f_i = 1 / theta^(2i/64);  with YaRN  f_i' = f_i / factor * (1 - smooth_i) + f_i * smooth_i,
//   smooth_i = 1 - clamp((i - low) / (high - low), 0, 1).
struct RopeFrequencies {
  std::array<float, kRopePairs> inv_freq{};
};
RopeFrequencies make_rope_frequencies(const RopeConfig& config);

// Angle of pair i at `position`: float32(float(position) * inv_freq[i]) — the reference's float32
// outer product. Positions below 2^24 convert to float exactly.
float rope_angle(const RopeFrequencies& freqs, std::int64_t position, std::size_t pair);

// ---- float64 oracle ---------------------------------------------------------------------------------
// Rotates the 64 tail values in place: (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a) per
// interleaved pair, with a = -angle when `inverse`. cos / sin are evaluated in double.
void rope_rotate_f64(std::span<double> tail64, std::int64_t position, const RopeFrequencies& freqs,
                     bool inverse);

// ---- float32 fast path ------------------------------------------------------------------------------
// cos / sin of every pair at one position (float of the double cos / sin of the float angle); compute
// once per position and reuse across rows / heads.
struct RopeCosSin {
  std::array<float, kRopePairs> cos{};
  std::array<float, kRopePairs> sin{};
};
void rope_cos_sin(RopeCosSin& out, const RopeFrequencies& freqs, std::int64_t position);

// Rotate the 64 floats at `tail` in place (forward, or inverse with the conjugate rotation).
void rope_rotate(float* tail, const RopeCosSin& cs, bool inverse);

// Rotate the tails of `rows` rows: row r's tail starts at x + r * stride + tail_offset.
void rope_rotate_rows(float* x, std::size_t rows, std::size_t stride, std::size_t tail_offset,
                      const RopeCosSin& cs, bool inverse);

}  // namespace kvcompact::dsv4
