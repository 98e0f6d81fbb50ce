// Lightning-indexer scores and top-k (see indexer.hpp). The selection's comparator is a strict total
// order (score, then index), so nth_element + sort give the same answer as a full stable sort.
#include "kvcompact/dsv4/indexer.hpp"

#include "dsv4/indexer_head_sum.hpp"
#include "dsv4/math_dot.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "dsv4/math_parallel.hpp"

namespace kvcompact::dsv4 {

std::size_t visible_compressed_rows(std::uint32_t ratio, std::int64_t position) {
  if (ratio == 0) return 0;
  return static_cast<std::size_t>((position + 1) / ratio);
}

void prepare_indexer_query(float* q, std::size_t heads) {
  for (std::size_t h = 0; h < heads; ++h) simulate_indexer_row(q + h * kIndexerHeadDim);
}

void prepare_indexer_query_f64(std::span<double> q, std::size_t heads) {
  KVC_ASSERT(q.size() == heads * kIndexerHeadDim, "prepare_indexer_query_f64: q must be [heads, 128]");
  for (std::size_t h = 0; h < heads; ++h) simulate_indexer_row_f64(q.subspan(h * kIndexerHeadDim, kIndexerHeadDim));
}

std::vector<double> indexer_scores_f64(std::span<const float> q, std::span<const float> w,
                                       std::span<const float> keys, std::size_t heads, std::size_t dim) {
  KVC_ASSERT(q.size() == heads * dim && w.size() == heads && keys.size() % dim == 0,
             "indexer_scores_f64: shapes disagree");
  const std::size_t rows = keys.size() / dim;
  std::vector<double> scores(rows, 0.0);
  for (std::size_t s = 0; s < rows; ++s) {
    double total = 0.0;
    for (std::size_t h = 0; h < heads; ++h) {
      double dot = 0.0;
      for (std::size_t i = 0; i < dim; ++i) dot += static_cast<double>(q[h * dim + i]) * keys[s * dim + i];
      total += static_cast<double>(w[h]) * std::max(dot, 0.0);
    }
    scores[s] = total;
  }
  return scores;
}

void indexer_topk_f64(std::span<std::int32_t> out, std::span<const double> scores) {
  std::vector<std::int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  // Higher score first, a NaN below every number (the fast path's rule; a plain > is no strict weak order with
  // NaN in it), ties in index order (the stable sort).
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const double x = scores[static_cast<std::size_t>(a)], y = scores[static_cast<std::size_t>(b)];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return x > y;
  });
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = i < order.size() ? order[i] : -1;
}

namespace {

// Terms fl(w_h max(q_h . k, 0)) (zero past the last head), summed per block of 64 heads by head_block_sum
// (indexer_head_sum.hpp) and the blocks in order; the final + 0 makes a zero total +0 whatever the signs of the
// zero terms (the GPU's can differ).
float score_row(const float* q, const float* w, const float* key, std::size_t heads, std::size_t dim) {
  constexpr std::size_t kBlock = 64;
  float total = 0.0f;
  for (std::size_t h0 = 0; h0 < heads; h0 += kBlock) {
    float t[kBlock];
    for (std::size_t j = 0; j < kBlock; ++j) {
      const std::size_t h = h0 + j;
      t[j] = h < heads ? w[h] * std::max(detail::dot_f32(q + h * dim, key, dim), 0.0f) : 0.0f;
    }
    const float block = detail::head_block_sum(t);
    total = h0 == 0 ? block : total + block;
  }
  return total + 0.0f;
}
}  // namespace

void indexer_scores(float* scores, const float* q, const float* w, const float* const* keys, std::size_t rows,
                    std::size_t heads, std::size_t dim) {
  math_parallel_for(0, rows, 64, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t s = lo; s < hi; ++s) scores[s] = score_row(q, w, keys[s], heads, dim);
  });
}

void indexer_scores_contiguous(float* scores, const float* q, const float* w, const float* keys,
                               std::size_t rows, std::size_t heads, std::size_t dim) {
  math_parallel_for(0, rows, 64, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t s = lo; s < hi; ++s) scores[s] = score_row(q, w, keys + s * dim, heads, dim);
  });
}

std::size_t indexer_topk(std::int32_t* out, std::size_t out_len, const float* scores, std::size_t rows,
                         TopkScratch& scratch) {
  KVC_ASSERT(rows <= static_cast<std::size_t>(INT32_MAX), "indexer_topk: row count exceeds int32");
  const std::size_t k = std::min(out_len, rows);
  auto better = [scores](std::int32_t a, std::int32_t b) {
    const float sa = scores[static_cast<std::size_t>(a)];
    const float sb = scores[static_cast<std::size_t>(b)];
    const bool na = std::isnan(sa);
    const bool nb = std::isnan(sb);
    if (na != nb) return nb;  // a number ranks above NaN
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  auto& order = scratch.order;
  order.resize(rows);
  std::iota(order.begin(), order.end(), 0);
  if (k > 0 && k < rows) std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(), better);
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), better);
  for (std::size_t i = 0; i < out_len; ++i) out[i] = i < k ? order[i] : -1;
  return k;
}

}  // namespace kvcompact::dsv4
