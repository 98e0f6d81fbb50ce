// RoPE / YaRN frequency tables and rotations (see rope.hpp). The float32 table follows the reference
// code's float32 arithmetic step by step so that rows rotated here match rows rotated by the model.
#include "kvcompact/dsv4/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kvcompact/core/assert.hpp"

namespace kvcompact::dsv4 {

RopeConfig rope_config_for_ratio(std::uint32_t ratio) {
  KVC_ASSERT(ratio == 0 || ratio == 4 || ratio == 128, "rope_config_for_ratio: ratio not in {0, 4, 128}");
  RopeConfig c;
  if (ratio == 0) {
    c.theta = 10000.0;
    c.yarn = false;
  } else {
    c.theta = 160000.0;
    c.yarn = true;
    c.factor = 16.0;
    c.original_length = 65536.0;
    c.beta_fast = 32.0;
    c.beta_slow = 1.0;
  }
  return c;
}

RopeConfig rope_config_for_layer(const ModelConfig& config, std::uint32_t ratio) {
  RopeConfig c;
  if (ratio == 0) {
    c.theta = config.rope_theta;
    c.yarn = false;
    return c;
  }
  c.theta = config.compress_rope_theta;
  if (config.rope_scaling.has_value()) {
    c.yarn = true;
    c.factor = config.rope_scaling->factor;
    c.original_length = static_cast<double>(config.rope_scaling->original_max_position_embeddings);
    c.beta_fast = config.rope_scaling->beta_fast;
    c.beta_slow = config.rope_scaling->beta_slow;
  }
  return c;
}

namespace {
// Pair index (in units of the full 64 dims) at which `rotations` full turns fit in the original length.
double correction_dim(double rotations, const RopeConfig& c) {
  const double dim = static_cast<double>(kRopeDims);
  return dim * std::log(c.original_length / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(c.theta));
}

// x as an int, saturated at ±2^30 in double before the conversion (NaN as 0): a config that validation accepts
// can still make d(r) infinite or NaN (theta = 1: ln theta = 0; a beta of 1e-320) or beyond any int (theta a
// hair above 1), which no int conversion may take. Values within ±2^30 convert exactly as before.
int saturated_int(double x) {
  constexpr double kLimit = 1073741824.0;  // 2^30: (i - low) / (high - low) stays finite in the callers
  if (std::isnan(x)) return 0;
  return static_cast<int>(std::clamp(x, -kLimit, kLimit));
}
}  // namespace

YarnRange yarn_correction_range(const RopeConfig& c) {
  const int low = saturated_int(std::floor(correction_dim(c.beta_fast, c)));
  const int high = saturated_int(std::ceil(correction_dim(c.beta_slow, c)));
  return YarnRange{std::max(low, 0), std::min(high, static_cast<int>(kRopeDims) - 1)};
}

RopeFrequencies make_rope_frequencies(const RopeConfig& c) {
  RopeFrequencies f;
  const float theta = static_cast<float>(c.theta);
  for (std::size_t i = 0; i < kRopePairs; ++i) {
    // theta ** (2i / 64) in float32 (the exponent is exact), then 1 / that in float32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(kRopeDims);
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(expo)));
    f.inv_freq[i] = 1.0f / p;
  }
  if (c.yarn) {
    const YarnRange r = yarn_correction_range(c);
    float lo = static_cast<float>(r.low);
    float hi = static_cast<float>(r.high);
    if (lo == hi) hi += 0.001f;
    const float factor = static_cast<float>(c.factor);
    for (std::size_t i = 0; i < kRopePairs; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - lo) / (hi - lo), 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      const float fi = f.inv_freq[i];
      f.inv_freq[i] = fi / factor * (1.0f - smooth) + fi * smooth;
    }
  }
  return f;
}

float rope_angle(const RopeFrequencies& freqs, std::int64_t position, std::size_t pair) {
  return static_cast<float>(position) * freqs.inv_freq[pair];
}

void rope_rotate_f64(std::span<double> tail64, std::int64_t position, const RopeFrequencies& freqs,
                     bool inverse) {
  KVC_ASSERT(tail64.size() == kRopeDims, "rope_rotate_f64: tail must hold 64 values");
  for (std::size_t i = 0; i < kRopePairs; ++i) {
    double a = static_cast<double>(rope_angle(freqs, position, i));
    if (inverse) a = -a;
    const double x0 = tail64[2 * i];
    const double x1 = tail64[2 * i + 1];
    tail64[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
    tail64[2 * i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
  }
}

void rope_cos_sin(RopeCosSin& out, const RopeFrequencies& freqs, std::int64_t position) {
  for (std::size_t i = 0; i < kRopePairs; ++i) {
    const double a = static_cast<double>(rope_angle(freqs, position, i));
    out.cos[i] = static_cast<float>(std::cos(a));
    out.sin[i] = static_cast<float>(std::sin(a));
  }
}

void rope_rotate(float* tail, const RopeCosSin& cs, bool inverse) {
  const float sign = inverse ? -1.0f : 1.0f;
  for (std::size_t i = 0; i < kRopePairs; ++i) {
    const float c = cs.cos[i];
    const float s = sign * cs.sin[i];
    const float x0 = tail[2 * i];
    const float x1 = tail[2 * i + 1];
    tail[2 * i] = x0 * c - x1 * s;
    tail[2 * i + 1] = x0 * s + x1 * c;
  }
}

void rope_rotate_rows(float* x, std::size_t rows, std::size_t stride, std::size_t tail_offset,
                      const RopeCosSin& cs, bool inverse) {
  for (std::size_t r = 0; r < rows; ++r) rope_rotate(x + r * stride + tail_offset, cs, inverse);
}

}  // namespace kvcompact::dsv4
