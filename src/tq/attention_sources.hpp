// Internal to the CPU attention (attention.cpp, included there only): where the kernels' keys and values come
// from — PackedSource (packed records, the exact-window ring, the codec's rotations) and DenseSource (dense f32
// rows, the exact baseline).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "tq/attention_math.hpp"

namespace kvcompact::tq {

namespace {

// ---- key / value sources --------------------------------------------------------------------------
// PackedSource gives the lookup-table kernel the packed records, the exact window ring and the codec's
// rotations. DenseSource turns dense f32 rows into scores and weighted value sums for the generic kernel
// (the exact baseline). Both finish a (row, head) from its accumulators.
class PackedSource {
 public:
  PackedSource(const LayerView& view) : view_(view), layout_(*view.layout), codec_(*view.codec) {
    d_ = layout_.head_dim;
    qjl_ = codec_.config().has_qjl();
    qjl_scale_ = codec_.qjl_scale();
  }

  std::uint32_t head_dim() const { return d_; }
  bool has_exact() const { return layout_.exact_window > 0; }
  const LayerView& view() const { return view_; }
  const LayerLayout& layout() const { return layout_; }
  const LayerCodec& codec() const { return codec_; }
  bool qjl() const { return qjl_; }
  float qjl_scale() const { return qjl_scale_; }
  const float* window_row_ptr(std::uint64_t region, std::uint32_t seq, std::uint32_t head, std::uint32_t t) const {
    return window_row(region, seq, head, t);
  }
  // Floats of prepared state per query head: q_rot, q_jl, and the original query for exact rows.
  std::uint32_t query_floats() const { return 3 * d_; }
  std::uint32_t exact_begin(std::uint32_t seq) const {
    return exact_window_begin(view_.lengths[seq], view_.window_begins[seq], layout_.exact_window);
  }

  void prepare(const float* query, float* state) const {
    std::memcpy(state + 2 * d_, query, d_ * sizeof(float));
    codec_.prepare_query({query, d_}, {state, d_}, {state + d_, d_});
  }

  // out = (R⁻¹(acc_rot) + acc_exact) · inv_sum. acc_rot is used as scratch.
  void finish(float* acc_rot, const float* acc_exact, float inv_sum, float* out) const {
    codec_.finish_values({acc_rot, d_}, {out, d_});
    if (has_exact()) {
      for (std::uint32_t j = 0; j < d_; ++j) out[j] = (out[j] + acc_exact[j]) * inv_sum;
    } else {
      scale_in_place(inv_sum, out, d_);
    }
  }

 private:
  const float* window_row(std::uint64_t region, std::uint32_t seq, std::uint32_t head, std::uint32_t t) const {
    const std::uint64_t row = layout_.window_row(seq, head, t);
    return reinterpret_cast<const float*>(view_.data + region) + row * d_;
  }

  const LayerView& view_;
  const LayerLayout& layout_;
  const LayerCodec& codec_;
  std::uint32_t d_ = 0;
  bool qjl_ = false;
  float qjl_scale_ = 0.0f;
};

// Dense f32 rows: exact attention with the same schedule, the baseline the packed path is timed against.
class DenseSource {
 public:
  DenseSource(std::uint32_t head_dim, std::uint32_t kv_heads, std::span<const DenseAttentionRequest> requests)
      : d_(head_dim), kv_heads_(kv_heads), requests_(requests) {}

  std::uint32_t head_dim() const { return d_; }
  bool has_exact() const { return false; }
  std::uint32_t query_floats() const { return d_; }
  std::uint32_t exact_begin(std::uint32_t) const { return std::numeric_limits<std::uint32_t>::max(); }
  void prepare(const float* query, float* state) const { std::memcpy(state, query, d_ * sizeof(float)); }

  struct Token {
    const float* row = nullptr;
  };
  void load_key(std::uint32_t req, std::uint32_t head, std::uint32_t t, std::uint32_t, Token& tok, float*) const {
    tok.row = requests_[req].keys + (static_cast<std::size_t>(t) * kv_heads_ + head) * d_;
  }
  float score(const Token& tok, const float*, const float* state) const { return dot(state, tok.row, d_); }
  void load_value(std::uint32_t req, std::uint32_t head, std::uint32_t t, std::uint32_t, Token& tok, float*) const {
    tok.row = requests_[req].values + (static_cast<std::size_t>(t) * kv_heads_ + head) * d_;
  }
  void accumulate(const Token& tok, const float*, float p, float* acc, float*) const { axpy(p, tok.row, acc, d_); }
  void finish(float* acc, const float*, float inv_sum, float* out) const {
    for (std::uint32_t j = 0; j < d_; ++j) out[j] = acc[j] * inv_sum;
  }

 private:
  std::uint32_t d_;
  std::uint32_t kv_heads_;
  std::span<const DenseAttentionRequest> requests_;
};

}  // namespace
}  // namespace kvcompact::tq
