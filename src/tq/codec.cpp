// TurboQuant codec for one layer: encode / decode of packed key and value records and the
// per-record primitives of the fast attention path. The math is in docs/turboquant.md.
#include "kvcompact/tq/codec.hpp"

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/normalise.hpp"
#include "kvcompact/tq/prng.hpp"
#include "kvcompact/tq/rotation.hpp"

namespace kvcompact::tq {

std::uint32_t read_code(const std::uint8_t* codes, std::uint32_t j, std::uint32_t bits) {
  const std::uint32_t bit = j * bits;
  // A code spans at most two bytes (bits ≤ 8); read both when the second exists.
  std::uint32_t word = codes[bit / 8];
  if ((bit % 8) + bits > 8) word |= static_cast<std::uint32_t>(codes[bit / 8 + 1]) << 8;
  return (word >> (bit % 8)) & ((1u << bits) - 1u);
}

void write_code(std::uint8_t* codes, std::uint32_t j, std::uint32_t bits, std::uint32_t code) {
  const std::uint32_t bit = j * bits;
  const std::uint32_t mask = ((1u << bits) - 1u) << (bit % 8);
  const std::uint32_t shifted = (code << (bit % 8)) & mask;
  codes[bit / 8] = static_cast<std::uint8_t>((codes[bit / 8] & ~mask) | shifted);
  if ((bit % 8) + bits > 8) {
    codes[bit / 8 + 1] = static_cast<std::uint8_t>((codes[bit / 8 + 1] & ~(mask >> 8)) | (shifted >> 8));
  }
}

namespace {

// Loads the b bytes holding codes 8g .. 8g+7 (a group of 8 codes is always byte aligned).
// Assembled from byte loads: a runtime-sized memcpy becomes a library call and, for 3- and 5-bit codes,
// a store-forwarding stall.
inline std::uint64_t load_code_group(const std::uint8_t* codes, std::uint32_t group, std::uint32_t bits) {
  const std::uint8_t* bytes = codes + static_cast<std::size_t>(group) * bits;
  std::uint64_t word = 0;
  for (std::uint32_t i = 0; i < bits; ++i) word |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return word;
}

Status check_finite(std::span<const float> x, std::string_view what) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      return make_error(ErrorCode::NonFinite, "{} coordinate {} is {}; only finite values can be encoded", what, i,
                        x[i]);
    }
  }
  return ok_status();
}

// ‖x‖ in double: squares of finite floats (≤ 1.2e77) cannot overflow a double.
double norm_f64(std::span<const float> x) {
  double sum = 0.0;
  for (float v : x) sum += static_cast<double>(v) * static_cast<double>(v);
  return std::sqrt(sum);
}

Result<float> norm_to_f32(double norm, std::string_view what) {
  if (norm > static_cast<double>(std::numeric_limits<float>::max())) {
    return make_error(ErrorCode::OutOfRange, "{} norm {:g} exceeds the float32 range of the stored norm", what,
                      norm);
  }
  return static_cast<float>(norm);
}

// The norm-corrected stored norm RN32(‖x‖ / ‖c‖). ‖c‖ < 1 for most code vectors, so a norm within a few per cent
// of FLT_MAX can round to inf here although ‖x‖ itself fits: a typed error, as for ‖x‖ beyond float32.
Result<float> corrected_norm_to_f32(double norm, double code_norm_sq, std::string_view what) {
  const float stored = static_cast<float>(norm / std::sqrt(code_norm_sq));
  if (std::isinf(stored)) {
    return make_error(ErrorCode::OutOfRange,
                      "{} norm {:g} exceeds the float32 range of the stored norm after norm correction (/ {:g})", what,
                      norm, std::sqrt(code_norm_sq));
  }
  return stored;
}

// y = x / ‖x‖ as the codec defines it (kvcompact/tq/normalise.hpp; the CUDA encode kernels do the same).
void normalise(std::span<const float> x, double norm, std::span<float> y) {
  if (normalises_by_product(norm)) {
    const float r = unit_reciprocal(norm);
    for (std::size_t j = 0; j < x.size(); ++j) y[j] = unit_coordinate(x[j], r);
  } else {
    for (std::size_t j = 0; j < x.size(); ++j) y[j] = unit_coordinate_f64(x[j], norm);
  }
}

// Writes Lloyd–Max codes of the unit vector y, returns ‖c[idx]‖² (double).
double quantize_codes(const Codebook& codebook, std::span<const float> y, std::uint8_t* codes) {
  const std::uint32_t bits = codebook.bits();
  std::memset(codes, 0, packed_code_bytes(static_cast<std::uint32_t>(y.size()), bits));
  const auto centroids = codebook.centroids();
  double norm_sq = 0.0;
  for (std::uint32_t j = 0; j < y.size(); ++j) {
    const std::uint32_t code = codebook.quantize(y[j]);
    write_code(codes, j, bits, code);
    norm_sq += centroids[code] * centroids[code];
  }
  return norm_sq;
}

}  // namespace

Result<LayerCodec> LayerCodec::create(std::uint32_t head_dim, const QuantConfig& config, std::uint32_t layer_index) {
  KVC_TRY(validate_head_dim(head_dim));
  KVC_TRY(config.validate());
  LayerCodec codec;
  codec.head_dim_ = head_dim;
  codec.layer_index_ = layer_index;
  codec.config_ = config;
  codec.qjl_scale_ = static_cast<float>(std::sqrt(std::numbers::pi / (2.0 * head_dim)));
  KVC_ASSIGN_OR_RETURN(codec.key_codebook_, lloyd_max_codebook(head_dim, config.key_code_bits()));
  KVC_ASSIGN_OR_RETURN(codec.value_codebook_, lloyd_max_codebook(head_dim, config.value_bits));
  const std::uint64_t seed = layer_seed(config.seed, layer_index);
  KVC_ASSIGN_OR_RETURN(Rotation main_rotation, Rotation::create(head_dim, seed));
  KVC_ASSIGN_OR_RETURN(Rotation qjl_rotation, Rotation::create(head_dim, qjl_stream_seed(seed)));
  codec.main_rotation_ = std::make_unique<Rotation>(std::move(main_rotation));
  codec.qjl_rotation_ = std::make_unique<Rotation>(std::move(qjl_rotation));
  return codec;
}

LayerCodec::LayerCodec(LayerCodec&&) noexcept = default;
LayerCodec& LayerCodec::operator=(LayerCodec&&) noexcept = default;
LayerCodec::~LayerCodec() = default;

TokenBytes LayerCodec::token_bytes() const { return tq::token_bytes(head_dim_, config_); }

Status LayerCodec::encode_key(std::span<const float> key, KeyRecord out, std::span<float> scratch) const {
  KVC_ASSERT(key.size() == head_dim_ && scratch.size() >= 2u * head_dim_, "encode_key span sizes");
  KVC_TRY(check_finite(key, "key"));
  const std::uint32_t d = head_dim_;
  const double norm = norm_f64(key);
  KVC_ASSIGN_OR_RETURN(float stored_norm, norm_to_f32(norm, "key"));
  std::span<float> y = scratch.subspan(0, d);
  std::span<float> residual = scratch.subspan(d, d);
  if (norm == 0.0) {
    // A zero vector: all codes 0 and zero norms decode to exactly zero.
    std::memset(out.codes, 0, packed_code_bytes(d, key_codebook_->bits()));
    if (config_.has_qjl()) {
      std::memset(out.signs, 0, packed_sign_bytes(d));
      *out.residual_norm = 0;
    }
    *out.norm = 0.0f;
    return ok_status();
  }
  normalise(key, norm, y);
  main_rotation_->forward(y, y);
  const double code_norm_sq = quantize_codes(*key_codebook_, y, out.codes);
  if (config_.norm_correction) {
    KVC_ASSIGN_OR_RETURN(stored_norm, corrected_norm_to_f32(norm, code_norm_sq, "key"));
  }
  *out.norm = stored_norm;
  if (!config_.has_qjl()) return ok_status();

  const auto centroids = key_codebook_->centroids_f32();
  const std::uint32_t bits = key_codebook_->bits();
  double residual_sq = 0.0;
  for (std::uint32_t j = 0; j < d; ++j) {
    residual[j] = y[j] - centroids[read_code(out.codes, j, bits)];
    residual_sq += static_cast<double>(residual[j]) * residual[j];
  }
  *out.residual_norm = f32_to_f16(static_cast<float>(std::sqrt(residual_sq)));
  // Only the sign of the projection is kept, so the residual need not be normalised first.
  qjl_rotation_->forward(residual, residual);
  std::memset(out.signs, 0, packed_sign_bytes(d));
  for (std::uint32_t j = 0; j < d; ++j) {
    if (residual[j] >= 0.0f) out.signs[j / 8] = static_cast<std::uint8_t>(out.signs[j / 8] | (1u << (j % 8)));
  }
  return ok_status();
}

Status LayerCodec::encode_value(std::span<const float> value, ValueRecord out, std::span<float> scratch) const {
  KVC_ASSERT(value.size() == head_dim_ && scratch.size() >= head_dim_, "encode_value span sizes");
  KVC_TRY(check_finite(value, "value"));
  const std::uint32_t d = head_dim_;
  const double norm = norm_f64(value);
  KVC_ASSIGN_OR_RETURN(float stored_norm, norm_to_f32(norm, "value"));
  if (norm == 0.0) {
    std::memset(out.codes, 0, packed_code_bytes(d, value_codebook_->bits()));
    *out.norm = 0.0f;
    return ok_status();
  }
  std::span<float> y = scratch.subspan(0, d);
  normalise(value, norm, y);
  main_rotation_->forward(y, y);
  const double code_norm_sq = quantize_codes(*value_codebook_, y, out.codes);
  if (config_.norm_correction) {
    KVC_ASSIGN_OR_RETURN(stored_norm, corrected_norm_to_f32(norm, code_norm_sq, "value"));
  }
  *out.norm = stored_norm;
  return ok_status();
}

void LayerCodec::decode_key(ConstKeyRecord in, std::span<double> out) const {
  KVC_ASSERT(out.size() == head_dim_, "decode_key span size");
  const std::uint32_t d = head_dim_;
  const auto centroids = key_codebook_->centroids();
  const std::uint32_t bits = key_codebook_->bits();
  std::vector<double> rotated(d);
  for (std::uint32_t j = 0; j < d; ++j) rotated[j] = centroids[read_code(in.codes, j, bits)];
  if (config_.has_qjl()) {
    std::vector<double> signs(d);
    for (std::uint32_t j = 0; j < d; ++j) signs[j] = ((in.signs[j / 8] >> (j % 8)) & 1u) ? 1.0 : -1.0;
    qjl_rotation_->inverse(signs, signs);
    const double rho = f16_to_f32(*in.residual_norm);
    const double scale = std::sqrt(std::numbers::pi / (2.0 * d));
    for (std::uint32_t j = 0; j < d; ++j) rotated[j] += rho * scale * signs[j];
  }
  main_rotation_->inverse(rotated, out);
  const double norm = *in.norm;
  for (double& v : out) v *= norm;
}

void LayerCodec::decode_value(ConstValueRecord in, std::span<double> out) const {
  KVC_ASSERT(out.size() == head_dim_, "decode_value span size");
  const auto centroids = value_codebook_->centroids();
  const std::uint32_t bits = value_codebook_->bits();
  std::vector<double> rotated(head_dim_);
  for (std::uint32_t j = 0; j < head_dim_; ++j) rotated[j] = centroids[read_code(in.codes, j, bits)];
  main_rotation_->inverse(rotated, out);
  const double norm = *in.norm;
  for (double& v : out) v *= norm;
}

void LayerCodec::prepare_query(std::span<const float> query, std::span<float> q_rot, std::span<float> q_jl) const {
  KVC_ASSERT(query.size() == head_dim_ && q_rot.size() == head_dim_, "prepare_query span sizes");
  main_rotation_->forward(query, q_rot);
  if (config_.has_qjl()) {
    KVC_ASSERT(q_jl.size() == head_dim_, "prepare_query q_jl size");
    qjl_rotation_->forward(q_rot, q_jl);
  }
}

float LayerCodec::score_key(std::span<const float> q_rot, std::span<const float> q_jl, ConstKeyRecord key) const {
  const std::uint32_t d = head_dim_;
  const std::uint32_t bits = key_codebook_->bits();
  const std::uint64_t mask = (1u << bits) - 1u;
  const float* centroids = key_codebook_->centroids_f32().data();
  float code_sum = 0.0f;
  for (std::uint32_t g = 0; g < d / 8; ++g) {
    const std::uint64_t word = load_code_group(key.codes, g, bits);
    const float* q = q_rot.data() + 8 * g;
    for (std::uint32_t k = 0; k < 8; ++k) code_sum += q[k] * centroids[(word >> (k * bits)) & mask];
  }
  if (!config_.has_qjl()) return *key.norm * code_sum;
  float sign_sum = 0.0f;
  for (std::uint32_t g = 0; g < d / 8; ++g) {
    const std::uint32_t byte = key.signs[g];
    const float* q = q_jl.data() + 8 * g;
    for (std::uint32_t k = 0; k < 8; ++k) sign_sum += ((byte >> k) & 1u) ? q[k] : -q[k];
  }
  const float rho = f16_to_f32(*key.residual_norm);
  return *key.norm * (code_sum + rho * qjl_scale_ * sign_sum);
}

void LayerCodec::accumulate_value(ConstValueRecord value, float weight, std::span<float> acc_rotated) const {
  const std::uint32_t bits = value_codebook_->bits();
  const std::uint64_t mask = (1u << bits) - 1u;
  const float* centroids = value_codebook_->centroids_f32().data();
  const float w = weight * *value.norm;
  for (std::uint32_t g = 0; g < head_dim_ / 8; ++g) {
    const std::uint64_t word = load_code_group(value.codes, g, bits);
    float* acc = acc_rotated.data() + 8 * g;
    for (std::uint32_t k = 0; k < 8; ++k) acc[k] += w * centroids[(word >> (k * bits)) & mask];
  }
}

void LayerCodec::finish_values(std::span<const float> acc_rotated, std::span<float> out) const {
  main_rotation_->inverse(acc_rotated, out);
}

}  // namespace kvcompact::tq
