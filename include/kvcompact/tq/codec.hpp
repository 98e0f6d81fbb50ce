// TurboQuant codec for one model layer: encode key / value vectors into packed records, decode them
// (the float64 oracle's explicit dequantisation), and the pieces a fast attention path needs
// (query preparation, packed scoring, rotated-space value accumulation).
//
// Encode, prod keys (b total bits): n = ‖k‖; y = R_p(k/n); idx = LloydMax_{b−1}(y); r = y − c[idx];
// ρ = ‖r‖; σ = sign(H·D_j·r). Score estimate ⟨q,k⟩ ≈ n·(⟨q_rot, c[idx]⟩ + ρ·√(π/(2d))·⟨q_jl, σ⟩)
// with q_rot = R_p(q), q_jl = R_j(q_rot). mse keys and values store codes + n only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/config.hpp"
#include "kvcompact/tq/layout.hpp"

namespace kvcompact::tq {

class Codebook;
class Rotation;

// Pointers to one token-head's packed key; signs / residual_norm are null for mse keys.
struct KeyRecord {
  std::uint8_t* codes = nullptr;
  std::uint8_t* signs = nullptr;
  float* norm = nullptr;
  std::uint16_t* residual_norm = nullptr;  // f16 bits
};
struct ConstKeyRecord {
  const std::uint8_t* codes = nullptr;
  const std::uint8_t* signs = nullptr;
  const float* norm = nullptr;
  const std::uint16_t* residual_norm = nullptr;
};
struct ValueRecord {
  std::uint8_t* codes = nullptr;
  float* norm = nullptr;
};
struct ConstValueRecord {
  const std::uint8_t* codes = nullptr;
  const float* norm = nullptr;
};

// Read / write the code of coordinate j in a little-endian bit stream of `bits`-wide codes.
std::uint32_t read_code(const std::uint8_t* codes, std::uint32_t j, std::uint32_t bits);
void write_code(std::uint8_t* codes, std::uint32_t j, std::uint32_t bits, std::uint32_t code);

class LayerCodec {
 public:
  // layer_index counts every model layer (attention or not): per-layer seed = config.seed ^ layer_index.
  static Result<LayerCodec> create(std::uint32_t head_dim, const QuantConfig& config, std::uint32_t layer_index);

  LayerCodec(LayerCodec&&) noexcept;
  LayerCodec& operator=(LayerCodec&&) noexcept;
  ~LayerCodec();

  std::uint32_t head_dim() const { return head_dim_; }
  const QuantConfig& config() const { return config_; }
  std::uint32_t layer_index() const { return layer_index_; }
  TokenBytes token_bytes() const;
  // √(π/(2d)): the QJL scale of the unbiased estimator.
  float qjl_scale() const { return qjl_scale_; }

  const Codebook& key_codebook() const { return *key_codebook_; }
  const Codebook& value_codebook() const { return *value_codebook_; }
  const Rotation& main_rotation() const { return *main_rotation_; }
  const Rotation& qjl_rotation() const { return *qjl_rotation_; }

  // Encode one vector (head_dim floats). NaN / inf input → NonFinite error; zero vector → all-zero record.
  // `scratch` needs 2·head_dim floats (caller-owned so the hot loop allocates nothing).
  Status encode_key(std::span<const float> key, KeyRecord out, std::span<float> scratch) const;
  Status encode_value(std::span<const float> value, ValueRecord out, std::span<float> scratch) const;

  // Explicit dequantisation in float64 (the oracle): k̂ = n·R_p⁻¹(c[idx] + ρ·√(π/(2d))·R_j⁻¹(σ)).
  void decode_key(ConstKeyRecord in, std::span<double> out) const;
  void decode_value(ConstValueRecord in, std::span<double> out) const;

  // Fast path. prepare_query writes q_rot = R_p(q) and (prod keys) q_jl = R_j(q_rot), each head_dim floats.
  void prepare_query(std::span<const float> query, std::span<float> q_rot, std::span<float> q_jl) const;
  // Estimated ⟨q, k⟩ from a prepared query.
  float score_key(std::span<const float> q_rot, std::span<const float> q_jl, ConstKeyRecord key) const;
  // acc += weight · n · c[idx]  (rotated space; apply finish_values once at the end).
  void accumulate_value(ConstValueRecord value, float weight, std::span<float> acc_rotated) const;
  // out = R_p⁻¹(acc_rotated).
  void finish_values(std::span<const float> acc_rotated, std::span<float> out) const;

 private:
  LayerCodec() = default;
  std::uint32_t head_dim_ = 0;
  std::uint32_t layer_index_ = 0;
  QuantConfig config_{};
  float qjl_scale_ = 0.0f;
  const Codebook* key_codebook_ = nullptr;
  const Codebook* value_codebook_ = nullptr;
  std::unique_ptr<Rotation> main_rotation_;
  std::unique_ptr<Rotation> qjl_rotation_;
};

}  // namespace kvcompact::tq
