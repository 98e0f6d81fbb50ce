// Float64 reference attention: explicit dequantisation of every stored row, then textbook softmax
// attention in double, one (row, head) at a time. Deliberately simple; speed does not matter here.
#include "kvcompact/tq/attention_oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kvcompact::tq {

namespace {

// softmax(scale · q·k_t, with an optional sink logit in the denominator) · v over t in [0, visible).
void attend_one(const float* query, const double* keys, const double* values, std::size_t key_stride,
                std::uint32_t visible, std::uint32_t d, double scale, const float* sink, double* out) {
  std::vector<double> logits(visible);
  double top = -std::numeric_limits<double>::infinity();
  for (std::uint32_t t = 0; t < visible; ++t) {
    const double* k = keys + t * key_stride;
    double s = 0.0;
    for (std::uint32_t j = 0; j < d; ++j) s += static_cast<double>(query[j]) * k[j];
    logits[t] = scale * s;
    top = std::max(top, logits[t]);
  }
  if (sink != nullptr) top = std::max(top, static_cast<double>(*sink));
  double denominator = 0.0;
  for (std::uint32_t t = 0; t < visible; ++t) {
    logits[t] = std::exp(logits[t] - top);
    denominator += logits[t];
  }
  if (sink != nullptr) denominator += std::exp(static_cast<double>(*sink) - top);
  std::fill(out, out + d, 0.0);
  for (std::uint32_t t = 0; t < visible; ++t) {
    const double* v = values + t * key_stride;
    const double p = logits[t] / denominator;
    for (std::uint32_t j = 0; j < d; ++j) out[j] += p * v[j];
  }
}

Status check_options(std::uint32_t kv_heads, const AttentionOptions& options) {
  if (options.q_heads == 0 || kv_heads == 0 || options.q_heads % kv_heads != 0) {
    return make_error(ErrorCode::InvalidArgument, "q_heads {} must be a positive multiple of kv_heads {}",
                      options.q_heads, kv_heads);
  }
  return ok_status();
}

double oracle_scale(const AttentionOptions& options, std::uint32_t head_dim) {
  return options.scale != 0.0f ? static_cast<double>(options.scale) : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace

Result<std::vector<std::vector<double>>> dense_attention_oracle(std::uint32_t head_dim, std::uint32_t kv_heads,
                                                                std::span<const DenseOracleRequest> requests,
                                                                const AttentionOptions& options) {
  KVC_TRY(check_options(kv_heads, options));
  const std::uint32_t d = head_dim;
  const std::uint32_t group = options.q_heads / kv_heads;
  const double scale = oracle_scale(options, head_dim);
  std::vector<std::vector<double>> outputs;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const DenseOracleRequest& req = requests[r];
    if (static_cast<std::uint64_t>(req.first_position) + req.rows > req.length) {
      return make_error(ErrorCode::OutOfRange, "oracle request {}: positions [{}, {}) past length {}", r,
                        req.first_position, static_cast<std::uint64_t>(req.first_position) + req.rows, req.length);
    }
    std::vector<double> out(static_cast<std::size_t>(req.rows) * options.q_heads * d);
    for (std::uint32_t i = 0; i < req.rows; ++i) {
      for (std::uint32_t h = 0; h < options.q_heads; ++h) {
        const std::uint32_t kv = h / group;
        const std::size_t offset = (static_cast<std::size_t>(i) * options.q_heads + h) * d;
        attend_one(req.queries + offset, req.keys + static_cast<std::size_t>(kv) * d,
                   req.values + static_cast<std::size_t>(kv) * d, static_cast<std::size_t>(kv_heads) * d,
                   req.first_position + i + 1, d, scale, options.sinks != nullptr ? options.sinks + h : nullptr,
                   out.data() + offset);
      }
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

Result<std::vector<std::vector<double>>> attention_oracle(const LayerView& layer,
                                                          std::span<const AttentionRequest> requests,
                                                          const AttentionOptions& options) {
  KVC_TRY(validate_attention(layer, requests, options));
  const LayerLayout& layout = *layer.layout;
  const LayerCodec& codec = *layer.codec;
  const std::uint32_t d = layout.head_dim;
  const std::uint32_t kv_heads = layout.kv_heads;
  const TokenBytes& tb = layout.token;
  std::vector<std::vector<double>> outputs;
  for (const AttentionRequest& req : requests) {
    const std::uint32_t visible = req.first_position + req.rows;
    const std::uint32_t exact_begin =
        exact_window_begin(layer.lengths[req.seq], layer.window_begins[req.seq], layout.exact_window);
    // Dense double rows [visible, kv_heads, d]: decoded records, or the exact rows of the window.
    std::vector<double> keys(static_cast<std::size_t>(visible) * kv_heads * d);
    std::vector<double> values(keys.size());
    for (std::uint32_t t = 0; t < visible; ++t) {
      for (std::uint32_t h = 0; h < kv_heads; ++h) {
        double* k = keys.data() + (static_cast<std::size_t>(t) * kv_heads + h) * d;
        double* v = values.data() + (static_cast<std::size_t>(t) * kv_heads + h) * d;
        if (t >= exact_begin) {
          const std::uint64_t row = layout.window_row(req.seq, h, t) * d;
          const float* wk = reinterpret_cast<const float*>(layer.data + layout.window_keys_offset) + row;
          const float* wv = reinterpret_cast<const float*>(layer.data + layout.window_values_offset) + row;
          for (std::uint32_t j = 0; j < d; ++j) {
            k[j] = wk[j];
            v[j] = wv[j];
          }
          continue;
        }
        const std::uint64_t slot = layout.slot(req.seq, h, t);
        ConstKeyRecord key;
        key.codes = layer.data + layout.key_codes_offset + slot * tb.key_codes;
        key.norm = reinterpret_cast<const float*>(layer.data + layout.key_norms_offset) + slot;
        if (codec.config().has_qjl()) {
          key.signs = layer.data + layout.key_signs_offset + slot * tb.key_signs;
          key.residual_norm = reinterpret_cast<const std::uint16_t*>(layer.data + layout.key_residual_norms_offset) + slot;
        }
        codec.decode_key(key, {k, d});
        ConstValueRecord value;
        value.codes = layer.data + layout.value_codes_offset + slot * tb.value_codes;
        value.norm = reinterpret_cast<const float*>(layer.data + layout.value_norms_offset) + slot;
        codec.decode_value(value, {v, d});
      }
    }
    DenseOracleRequest dense;
    dense.length = visible;
    dense.first_position = req.first_position;
    dense.rows = req.rows;
    dense.keys = keys.data();
    dense.values = values.data();
    dense.queries = req.queries;
    KVC_ASSIGN_OR_RETURN(auto out, dense_attention_oracle(d, kv_heads, {&dense, 1}, options));
    outputs.push_back(std::move(out[0]));
  }
  return outputs;
}

}  // namespace kvcompact::tq
