// Sparse attention with the sink: fast path against the float64 oracle across awkward shapes, the sink's
// closed form on one row, a -inf sink as plain softmax, the inverse RoPE on the tail, window positions.
#include "kvcompact/dsv4/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kvcompact/core/parallel.hpp"
#include "math_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::close_to;
using testutil::to_f64;

TEST(DsvAttention, WindowPositions) {
  EXPECT_EQ(window_positions(0), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(window_positions(2), (std::vector<std::int64_t>{0, 1, 2}));
  const auto w = window_positions(500);
  ASSERT_EQ(w.size(), 128u);
  EXPECT_EQ(w.front(), 373);
  EXPECT_EQ(w.back(), 500);
  EXPECT_EQ(window_positions(127).size(), 128u);
  EXPECT_EQ(window_positions(127).front(), 0);
}

TEST(DsvAttention, RowCountIsTheAttentionWidth) {
  EXPECT_EQ(attention_row_count(0, 0, 512), 1u);
  EXPECT_EQ(attention_row_count(0, 5000, 512), 128u);
  EXPECT_EQ(attention_row_count(4, 2, 512), 3u);
  EXPECT_EQ(attention_row_count(4, 3, 512), 5u);  // the token completing group 0 sees its row
  EXPECT_EQ(attention_row_count(4, (1 << 20) - 1, 512), 128u + 512u);
  EXPECT_EQ(attention_row_count(4, 4095, 1024), 128u + 1024u);
  EXPECT_EQ(attention_row_count(128, 126, 512), 127u);
  EXPECT_EQ(attention_row_count(128, 127, 512), 129u);
  EXPECT_EQ(attention_row_count(128, (1 << 20) - 1, 512), 8320u);  // the reference's HCA width at 1M
}

TEST(DsvAttention, FastMatchesOracle) {
  KVC_SEEDED(rng);
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(4));
  AttentionScratch scratch;
  for (std::size_t heads : {1u, 3u, 8u, 13u, 64u, 128u}) {
    for (std::size_t n : {1u, 7u, 128u, 129u, 600u}) {
      const std::vector<float> q = rng.normals(heads * 512, 1.0f);
      const std::vector<float> data = rng.normals(n * 512, 1.0f);
      std::vector<const float*> rows(n);
      for (std::size_t j = 0; j < n; ++j) rows[j] = data.data() + j * 512;
      const std::vector<float> sink = rng.normals(heads, 2.0f);
      const std::int64_t pos = rng.integer(0, 1 << 20);
      RopeCosSin cs;
      rope_cos_sin(cs, rope, pos);
      std::vector<float> out(heads * 512, std::numeric_limits<float>::quiet_NaN());
      sparse_attention(out.data(), q.data(), heads, rows.data(), n, sink.data(), &cs, scratch);
      const std::vector<double> oracle = sparse_attention_f64(q, heads, rows, sink, &rope, pos);
      for (std::size_t h = 0; h < heads; ++h) {
        EXPECT_TRUE(close_to(std::span<const float>(out).subspan(h * 512, 512),
                             std::span<const double>(oracle).subspan(h * 512, 512), 2e-5, 1e-6))
            << heads << " heads, " << n << " rows, head " << h;
      }
    }
  }
}

// attention.hpp: each head's arithmetic order is fixed, so the result does not depend on the thread count.
TEST(DsvAttention, ResultDoesNotDependOnTheThreadCount) {
  KVC_SEEDED(rng);
  const std::size_t heads = 64, n = 300;
  const std::vector<float> q = rng.normals(heads * 512, 1.0f);
  const std::vector<float> data = rng.normals(n * 512, 1.0f);
  std::vector<const float*> rows(n);
  for (std::size_t j = 0; j < n; ++j) rows[j] = data.data() + j * 512;
  const std::vector<float> sink = rng.normals(heads, 2.0f);
  AttentionScratch scratch;
  std::vector<std::vector<float>> outs;
  for (std::size_t threads : {1u, 3u, 8u}) {
    set_num_threads(threads);
    std::vector<float> out(heads * 512, std::numeric_limits<float>::quiet_NaN());
    sparse_attention(out.data(), q.data(), heads, rows.data(), n, sink.data(), nullptr, scratch);
    outs.push_back(std::move(out));
  }
  set_num_threads(0);
  EXPECT_TRUE(testutil::same_bits(outs[0], outs[1]));
  EXPECT_TRUE(testutil::same_bits(outs[0], outs[2]));
}

TEST(DsvAttention, SinkClosedFormOnOneRow) {
  // One row c: o = c * e^s / (e^sink + e^s) with s = q.c / sqrt(512).
  std::vector<float> c(512, 0.0f), q(512, 0.0f);
  c[0] = 2.0f;
  c[5] = -1.0f;
  q[0] = std::sqrt(512.0f);  // s = 2
  const float sink = 1.0f;
  const float* rows[1] = {c.data()};
  AttentionScratch scratch;
  std::vector<float> out(512);
  sparse_attention(out.data(), q.data(), 1, rows, 1, &sink, nullptr, scratch);
  const double p = std::exp(2.0) / (std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(out[0], 2.0 * p, 1e-6);
  EXPECT_NEAR(out[5], -1.0 * p, 1e-6);
  // A -inf sink adds no mass: the output is the row itself.
  const float no_sink = -std::numeric_limits<float>::infinity();
  sparse_attention(out.data(), q.data(), 1, rows, 1, &no_sink, nullptr, scratch);
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  EXPECT_FLOAT_EQ(out[5], -1.0f);
  // No rows: 0, with a finite sink and with a -inf one (where exp(-inf - -inf) would make it NaN), as the oracle.
  for (const float s : {sink, no_sink}) {
    std::fill(out.begin(), out.end(), 7.0f);
    sparse_attention(out.data(), q.data(), 1, rows, 0, &s, nullptr, scratch);
    const std::vector<double> want = sparse_attention_f64(q, 1, {}, {&s, 1}, nullptr, 0);
    for (std::size_t i = 0; i < 512; ++i) {
      ASSERT_EQ(out[i], 0.0f) << "sink " << s << " dim " << i;
      ASSERT_EQ(want[i], 0.0);
    }
  }
}

TEST(DsvAttention, InverseRopeOnTailOnly) {
  KVC_SEEDED(rng);
  const RopeFrequencies rope = make_rope_frequencies(rope_config_for_ratio(0));
  const std::vector<float> q = rng.normals(2 * 512);
  const std::vector<float> data = rng.normals(5 * 512);
  std::vector<const float*> rows(5);
  for (std::size_t j = 0; j < 5; ++j) rows[j] = data.data() + j * 512;
  const std::vector<float> sink = {0.0f, -1.0f};
  AttentionScratch scratch;
  std::vector<float> plain(2 * 512), roped(2 * 512);
  sparse_attention(plain.data(), q.data(), 2, rows.data(), 5, sink.data(), nullptr, scratch);
  RopeCosSin cs;
  rope_cos_sin(cs, rope, 77);
  sparse_attention(roped.data(), q.data(), 2, rows.data(), 5, sink.data(), &cs, scratch);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t i = 0; i < 448; ++i) ASSERT_EQ(plain[h * 512 + i], roped[h * 512 + i]);
    std::vector<float> tail(plain.begin() + static_cast<std::ptrdiff_t>(h * 512 + 448),
                            plain.begin() + static_cast<std::ptrdiff_t>(h * 512 + 512));
    rope_rotate(tail.data(), cs, true);
    for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(tail[i], roped[h * 512 + 448 + i]);
  }
}

}  // namespace
}  // namespace kvcompact::dsv4
