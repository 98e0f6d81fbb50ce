// Sparse attention with a sink (see attention.hpp). The fast path works on blocks of heads so each gathered
// row is read once per block: scores, then a per-head softmax with the sink, then the weighted row sum.
#include "kvcompact/dsv4/attention.hpp"

#include "dsv4/math_dot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvcompact/core/assert.hpp"
#include "dsv4/math_parallel.hpp"

namespace kvcompact::dsv4 {

std::vector<std::int64_t> window_positions(std::int64_t position) {
  std::vector<std::int64_t> out;
  for (std::int64_t q = std::max<std::int64_t>(0, position - static_cast<std::int64_t>(kSlidingWindow) + 1);
       q <= position; ++q) {
    out.push_back(q);
  }
  return out;
}

std::size_t attention_row_count(std::uint32_t ratio, std::int64_t position, std::size_t index_topk) {
  const std::size_t n = static_cast<std::size_t>(position) + 1;
  const std::size_t window = std::min<std::size_t>(n, kSlidingWindow);
  if (ratio == 0) return window;
  if (ratio == 4) return window + std::min(index_topk, n / 4);
  return window + n / ratio;
}

std::vector<double> sparse_attention_f64(std::span<const float> q, std::size_t heads,
                                         std::span<const float* const> rows, std::span<const float> sink,
                                         const RopeFrequencies* rope, std::int64_t position) {
  const std::size_t d = kHeadDim;
  KVC_ASSERT(q.size() == heads * d && sink.size() == heads, "sparse_attention_f64: shapes disagree");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(heads * d, 0.0);
  for (std::size_t h = 0; h < heads; ++h) {
    std::vector<double> s(rows.size());
    double mx = sink[h];
    for (std::size_t j = 0; j < rows.size(); ++j) {
      double dot = 0.0;
      for (std::size_t i = 0; i < d; ++i) dot += static_cast<double>(q[h * d + i]) * rows[j][i];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double denom = std::exp(static_cast<double>(sink[h]) - mx);
    for (double v : s) denom += std::exp(v - mx);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      const double p = std::exp(s[j] - mx) / denom;
      for (std::size_t i = 0; i < d; ++i) out[h * d + i] += p * rows[j][i];
    }
    if (rope != nullptr) {
      rope_rotate_f64(std::span<double>(out).subspan(h * d + d - kRopeDims, kRopeDims), position, *rope, true);
    }
  }
  return out;
}

namespace {
constexpr std::size_t kHeadBlock = 8;

// Heads [h0, h1) (at most kHeadBlock); scores [h1 - h0, n_rows] from the scratch.
void attend_block(float* out, const float* q, std::size_t h0, std::size_t h1, const float* const* rows,
                  std::size_t n_rows, const float* sink, const RopeCosSin* inverse_rope, float* scores) {
  const std::size_t d = kHeadDim;
  const std::size_t nh = h1 - h0;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (std::size_t j = 0; j < n_rows; ++j) {
    const float* r = rows[j];
    for (std::size_t h = 0; h < nh; ++h) scores[h * n_rows + j] = detail::dot_f32(q + (h0 + h) * d, r, kHeadDim) * scale;
  }
  float inv_denom[kHeadBlock];
  for (std::size_t h = 0; h < nh; ++h) {
    float* s = scores + h * n_rows;
    float mx = sink[h0 + h];
    for (std::size_t j = 0; j < n_rows; ++j) mx = std::max(mx, s[j]);
    float denom = std::exp(sink[h0 + h] - mx);
    for (std::size_t j = 0; j < n_rows; ++j) {
      s[j] = std::exp(s[j] - mx);
      denom += s[j];
    }
    // No rows and a -inf sink leave nothing to weigh (exp(-inf - -inf) is NaN): the output is 0, as the oracle's.
    inv_denom[h] = mx == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f / denom;
    std::fill(out + (h0 + h) * d, out + (h0 + h + 1) * d, 0.0f);
  }
  for (std::size_t j = 0; j < n_rows; ++j) {
    const float* r = rows[j];
    for (std::size_t h = 0; h < nh; ++h) {
      const float p = scores[h * n_rows + j];
      float* o = out + (h0 + h) * d;
      for (std::size_t i = 0; i < d; ++i) o[i] += p * r[i];
    }
  }
  for (std::size_t h = 0; h < nh; ++h) {
    float* o = out + (h0 + h) * d;
    for (std::size_t i = 0; i < d; ++i) o[i] *= inv_denom[h];
    if (inverse_rope != nullptr) rope_rotate(o + d - kRopeDims, *inverse_rope, /*inverse=*/true);
  }
}
}  // namespace

void sparse_attention(float* out, const float* q, std::size_t heads, const float* const* rows, std::size_t n_rows,
                      const float* sink, const RopeCosSin* inverse_rope, AttentionScratch& scratch) {
  const std::size_t blocks = (heads + kHeadBlock - 1) / kHeadBlock;
  scratch.scores.resize(blocks * kHeadBlock * std::max<std::size_t>(n_rows, 1));
  float* scores = scratch.scores.data();
  math_parallel_for(0, blocks, 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t b = lo; b < hi; ++b) {
      const std::size_t h0 = b * kHeadBlock;
      const std::size_t h1 = std::min(heads, h0 + kHeadBlock);
      attend_block(out, q, h0, h1, rows, n_rows, sink, inverse_rope, scores + b * kHeadBlock * n_rows);
    }
  });
}

}  // namespace kvcompact::dsv4
