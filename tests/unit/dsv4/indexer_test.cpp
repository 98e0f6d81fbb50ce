// Lightning indexer: scores against the float64 oracle, the top-k tie-break (higher score, then lower
// index), -1 fill, k = min(topk, visible), NaN ranking, and the fast selection valid under oracle scores.
#include "kvcompact/dsv4/indexer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kvcompact/dsv4/fp_sim.hpp"
#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::to_f64;

TEST(DsvIndexer, VisibleRows) {
  EXPECT_EQ(visible_compressed_rows(4, 0), 0u);
  EXPECT_EQ(visible_compressed_rows(4, 2), 0u);
  EXPECT_EQ(visible_compressed_rows(4, 3), 1u);  // the token completing a group already sees its row
  EXPECT_EQ(visible_compressed_rows(4, 8), 2u);
  EXPECT_EQ(visible_compressed_rows(128, 126), 0u);
  EXPECT_EQ(visible_compressed_rows(128, 127), 1u);
  EXPECT_EQ(visible_compressed_rows(0, 500), 0u);
}

TEST(DsvIndexer, ScoresMatchOracle) {
  KVC_SEEDED(rng);
  for (std::size_t rows : {1u, 7u, 129u, 600u}) {
    for (std::size_t heads : {1u, 4u, 64u}) {
      const std::vector<float> q = rng.normals(heads * 128);
      std::vector<float> w = rng.normals(heads, 0.1f);  // signed weights, never clamped
      const std::vector<float> keys = rng.normals(rows * 128);
      const std::vector<double> oracle = indexer_scores_f64(q, w, keys, heads, 128);
      std::vector<float> fast(rows, std::numeric_limits<float>::quiet_NaN());
      indexer_scores_contiguous(fast.data(), q.data(), w.data(), keys.data(), rows, heads, 128);
      // Each term is |w| * |q.k|; the bound scales with their sum, not with the (cancelling) total.
      double mag = 0.0;
      for (double v : oracle) mag = std::max(mag, std::fabs(v));
      // (Measured over 60 draws: at most 6.4e-3 of a 2e-5 coefficient, so 1e-6 keeps a margin of about 8.)
      EXPECT_TRUE(close_to(fast, oracle, 0.0, 1e-6 * (1.0 + mag) * std::sqrt(static_cast<double>(heads))))
          << rows << " rows, " << heads << " heads";
      std::vector<const float*> ptrs(rows);
      for (std::size_t s = 0; s < rows; ++s) ptrs[s] = keys.data() + s * 128;
      std::vector<float> fast2(rows);
      indexer_scores(fast2.data(), q.data(), w.data(), ptrs.data(), rows, heads, 128);
      EXPECT_TRUE(testutil::same_bits(fast, fast2));
    }
  }
}

TEST(DsvIndexer, ReluAndSignedWeights) {
  // Two heads; row 0 has a negative dot with head 0 (ReLU -> 0), row 1 positive dots with both.
  std::vector<float> q(2 * 128, 0.0f), keys(2 * 128, 0.0f);
  q[0] = 1.0f;          // head 0 reads dim 0
  q[128 + 1] = 1.0f;    // head 1 reads dim 1
  keys[0] = -3.0f;      // row 0: head 0 dot -3 -> 0
  keys[1] = 2.0f;       // row 0: head 1 dot 2
  keys[128] = 5.0f;     // row 1: head 0 dot 5
  keys[129] = 1.0f;     // row 1: head 1 dot 1
  const std::vector<float> w = {0.5f, -2.0f};
  float s[2];
  indexer_scores_contiguous(s, q.data(), w.data(), keys.data(), 2, 2, 128);
  EXPECT_EQ(s[0], -4.0f);  // 0.5 * 0 + (-2) * 2
  EXPECT_EQ(s[1], 0.5f);   // 0.5 * 5 + (-2) * 1
}

// The head sum's order is part of the contract (the GPU kernel reproduces it bit for bit): per block of 64
// heads, h = 32 a + 16 m + 2 g + b summed as pairs b, then m, then g bit by bit (0, 1, 2), then a; then + 0.
// Written here as an adjacent pairwise tree over the heads permuted to position 32 a + 16 g2 + 8 g1 + 4 g0 +
// 2 m + b. Terms spread over 2^-20 .. 2^20 make any other order give other bits.
float documented_head_tree(const std::vector<float>& terms) {
  std::vector<float> level(64, 0.0f);
  for (std::size_t h = 0; h < terms.size(); ++h) {
    const std::size_t a = h / 32, m = (h / 16) % 2, g = (h / 2) % 8, b = h % 2;
    level[32 * a + 16 * (g / 4) + 8 * ((g / 2) % 2) + 4 * (g % 2) + 2 * m + b] = terms[h];
  }
  while (level.size() > 1) {
    std::vector<float> next(level.size() / 2);
    for (std::size_t i = 0; i < next.size(); ++i) next[i] = level[2 * i] + level[2 * i + 1];
    level = next;
  }
  return level[0] + 0.0f;
}

TEST(DsvIndexer, HeadSumIsTheDocumentedTree) {
  KVC_SEEDED(rng);
  for (std::size_t heads : {64u, 40u, 3u}) {
    for (int trial = 0; trial < 20; ++trial) {
      // Head h reads dim h only (q one-hot, weight 1 or -1), so its term is +-max(key[h], 0) exactly.
      std::vector<float> q(heads * 128, 0.0f), w(heads), key(128, 0.0f), terms(heads);
      for (std::size_t h = 0; h < heads; ++h) {
        q[h * 128 + h] = 1.0f;
        w[h] = rng.integer(0, 1) != 0 ? 1.0f : -1.0f;
        key[h] = std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.integer(-20, 20)));
        terms[h] = w[h] * std::max(key[h], 0.0f);
      }
      float score = 0.0f;
      indexer_scores_contiguous(&score, q.data(), w.data(), key.data(), 1, heads, 128);
      EXPECT_TRUE(testutil::same_bits(std::vector<float>{score}, std::vector<float>{documented_head_tree(terms)}))
          << heads << " heads, trial " << trial;
    }
  }
  // Negative weights on positive dots and zero dots: terms -0 and negative; an all-zero total is +0.
  std::vector<float> q(2 * 128, 0.0f), key(128, 0.0f);
  q[0] = 1.0f;
  q[128 + 1] = 1.0f;
  const std::vector<float> w = {-1.0f, -2.0f};  // dots 0 and 0: terms -0, -0
  float score = 1.0f;
  indexer_scores_contiguous(&score, q.data(), w.data(), key.data(), 1, 2, 128);
  EXPECT_EQ(score, 0.0f);
  EXPECT_FALSE(std::signbit(score));
}

TEST(DsvIndexer, TopkTieBreakAndFill) {
  const std::vector<float> scores = {1.0f, 3.0f, 3.0f, -1.0f, 3.0f, 2.0f};
  TopkScratch scratch;
  std::vector<std::int32_t> out(4, 99);
  EXPECT_EQ(indexer_topk(out.data(), out.size(), scores.data(), scores.size(), scratch), 4u);
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 2, 4, 5}));
  std::vector<std::int32_t> wide(9, 99);
  EXPECT_EQ(indexer_topk(wide.data(), wide.size(), scores.data(), scores.size(), scratch), 6u);
  EXPECT_EQ(wide, (std::vector<std::int32_t>{1, 2, 4, 5, 0, 3, -1, -1, -1}));
  std::vector<std::int32_t> none(3, 99);
  EXPECT_EQ(indexer_topk(none.data(), none.size(), scores.data(), 0, scratch), 0u);
  EXPECT_EQ(none, (std::vector<std::int32_t>{-1, -1, -1}));
  // NaN ranks below every number, then by index.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = {nan, -5.0f, nan, 0.0f};
  std::vector<std::int32_t> o(4);
  indexer_topk(o.data(), 4, with_nan.data(), 4, scratch);
  EXPECT_EQ(o, (std::vector<std::int32_t>{3, 1, 0, 2}));
  // ... in the oracle too (its comparator used to put NaN anywhere: no strict weak order).
  std::vector<std::int32_t> o_ref(4);
  indexer_topk_f64(o_ref, to_f64(with_nan));
  EXPECT_EQ(o_ref, o);
  const std::vector<float> mixed = {nan, 1.0f, 2.0f, nan, 0.5f};
  std::vector<std::int32_t> fast_mixed(5), ref_mixed(5);
  indexer_topk(fast_mixed.data(), 5, mixed.data(), 5, scratch);
  indexer_topk_f64(ref_mixed, to_f64(mixed));
  EXPECT_EQ(fast_mixed, (std::vector<std::int32_t>{2, 1, 4, 0, 3}));
  EXPECT_EQ(ref_mixed, fast_mixed);
  // The oracle agrees on the tie order.
  std::vector<std::int32_t> ref(9);
  indexer_topk_f64(ref, to_f64(scores));
  EXPECT_EQ(ref, wide);
}

TEST(DsvIndexer, TopkMatchesOracleOnRandomScoresWithTies) {
  KVC_SEEDED(rng);
  TopkScratch scratch;
  for (int trial = 0; trial < 30; ++trial) {
    const std::size_t rows = static_cast<std::size_t>(rng.integer(0, 3000));
    const std::size_t topk = static_cast<std::size_t>(rng.integer(1, 1100));
    std::vector<float> scores(rows);
    for (float& s : scores) s = static_cast<float>(rng.integer(-40, 40)) * 0.25f;  // many ties
    std::vector<std::int32_t> fast(topk), oracle(topk);
    const std::size_t k = indexer_topk(fast.data(), topk, scores.data(), rows, scratch);
    EXPECT_EQ(k, std::min(topk, rows));
    indexer_topk_f64(oracle, to_f64(scores));
    ASSERT_EQ(fast, oracle) << rows << " rows, topk " << topk;
  }
}

TEST(DsvIndexer, FastSelectionIsATopkUnderOracleScores) {
  KVC_SEEDED(rng);
  TopkScratch scratch;
  const std::size_t heads = 8, rows = 700, topk = 64;
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> q = rng.normals(heads * 128);
    prepare_indexer_query(q.data(), heads);
    const std::vector<float> w = rng.normals(heads, 0.1f);
    std::vector<float> keys = rng.normals(rows * 128);
    for (std::size_t s = 0; s < rows; ++s) simulate_indexer_row(keys.data() + s * 128);
    std::vector<float> fast(rows);
    indexer_scores_contiguous(fast.data(), q.data(), w.data(), keys.data(), rows, heads, 128);
    std::vector<std::int32_t> sel(topk);
    indexer_topk(sel.data(), topk, fast.data(), rows, scratch);
    const std::vector<double> oracle = indexer_scores_f64(q, w, keys, heads, 128);
    // Every selected row's oracle score is at least every unselected row's, up to the float error.
    std::vector<bool> chosen(rows, false);
    double worst_selected = std::numeric_limits<double>::infinity();
    for (std::int32_t s : sel) {
      chosen[static_cast<std::size_t>(s)] = true;
      worst_selected = std::min(worst_selected, oracle[static_cast<std::size_t>(s)]);
    }
    double best_unselected = -std::numeric_limits<double>::infinity();
    for (std::size_t s = 0; s < rows; ++s) {
      if (!chosen[s]) best_unselected = std::max(best_unselected, oracle[s]);
    }
    EXPECT_GE(worst_selected, best_unselected - 1e-4);
  }
}

TEST(DsvIndexer, PrepareQueryMatchesOracle) {
  KVC_SEEDED(rng);
  const std::size_t heads = 4;
  std::vector<float> q = rng.normals(heads * 128);
  std::vector<float> fast = q;
  prepare_indexer_query(fast.data(), heads);
  // Decomposed as in the compressor test: fast Hadamard per head, then the oracle FP4 exactly.
  std::vector<float> rotated = q;
  for (std::size_t h = 0; h < heads; ++h) hadamard(rotated.data() + h * 128, 128);
  std::vector<double> expect = to_f64(rotated);
  fp4_block_sim_f64(expect);
  EXPECT_TRUE(testutil::same_values(fast, expect));
  // And the whole preparation is within one FP4 step of the float64 preparation.
  std::vector<double> oracle = to_f64(q);
  prepare_indexer_query_f64(oracle, heads);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < fast.size(); ++i) differing += static_cast<double>(fast[i]) != oracle[i];
  EXPECT_LE(differing, 2u) << "more rounding flips than float error explains";
}

}  // namespace
}  // namespace kvcompact::dsv4
