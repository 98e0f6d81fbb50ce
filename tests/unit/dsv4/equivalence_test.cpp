// Equivalences through the real Deepseek4Cache (layers of ratio 0, 4 and 128): prefill in chunks of any
// sizes equals token-by-token decode (cache contents and states bit for bit, outputs bit for bit, which
// is within any tolerance); snapshot -> continue -> restore -> continue and anchor image -> hydrate ->
// continue equal an uninterrupted run; a poisoned cache refuses everything until reset or restore.
#include <gtest/gtest.h>

#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/dsv4/snapshot.hpp"
#include "math_layer_fixture.hpp"

namespace kvcompact::dsv4 {
namespace {

using testutil::dump_valid;
using testutil::Outputs;
using testutil::run_chunks;
using testutil::run_decode;
using testutil::same_bits;
using testutil::SyntheticModel;
using testutil::TokenStream;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const auto& kvc_st_ = (expr);                             \
    ASSERT_TRUE(kvc_st_.ok()) << kvc_st_.error().to_string(); \
  } while (0)

// Outputs of tokens [from, to) of every layer are bit-identical.
::testing::AssertionResult same_outputs(const Outputs& a, const Outputs& b, std::size_t from, std::size_t to) {
  const std::size_t w = static_cast<std::size_t>(a.heads) * 512;
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    auto r = same_bits(std::span<const float>(a.layers[l]).subspan(from * w, (to - from) * w),
                       std::span<const float>(b.layers[l]).subspan(from * w, (to - from) * w));
    if (!r) return r << " (layer " << l << ")";
  }
  return ::testing::AssertionSuccess();
}

struct Harness {
  SyntheticModel model;
  TokenStream stream;
  LayerRunner runner;
  Harness(testutil::Rng& rng, std::vector<std::uint32_t> ratios, std::uint32_t heads, std::uint32_t index_heads,
        std::uint32_t topk, std::size_t tokens)
      : model(rng, testutil::synthetic_config(std::move(ratios), index_heads, topk), heads),
        stream(rng, model, tokens),
        runner(model.config) {}
  Deepseek4Cache cache(std::uint64_t context, StorageConfig storage = {}) {
    auto c = Deepseek4Cache::create(model.config, context, storage);
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return std::move(c).value();
  }
};

void check_chunkings(StorageConfig storage, std::vector<std::vector<std::size_t>> patterns) {
  KVC_SEEDED(rng);
  const std::size_t n = 300;  // crosses the window (128), groups of 4 and two groups of 128
  Harness s(rng, {0, 4, 128}, 2, 2, 8, n);
  Deepseek4Cache ref = s.cache(n, storage);
  Outputs ref_out(3, n, s.model.heads);
  ASSERT_OK(run_decode(s.runner, ref, s.model, s.stream, ref_out, 0, n));
  const std::vector<std::uint8_t> ref_dump = dump_valid(ref);
  std::vector<std::size_t> random_sizes;
  for (int i = 0; i < 12; ++i) random_sizes.push_back(static_cast<std::size_t>(rng.integer(1, 90)));
  patterns.push_back(random_sizes);
  for (const auto& sizes : patterns) {
    SCOPED_TRACE(::testing::Message() << "chunk sizes starting " << sizes[0] << " (" << sizes.size() << " sizes)");
    Deepseek4Cache c = s.cache(n, storage);
    Outputs out(3, n, s.model.heads);
    ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, n, sizes));
    EXPECT_EQ(c.position(), n);
    EXPECT_TRUE(dump_valid(c) == ref_dump) << "cache contents differ from token-by-token decode";
    EXPECT_TRUE(same_outputs(out, ref_out, 0, n));
  }
  // One chunk worked internally in pieces of 37 tokens, and of 0 tokens, which counts as 1 (layer_runner.hpp):
  // the same cache and outputs.
  for (const std::uint32_t span : {37u, 0u}) {
    s.runner.max_span_tokens = span;
    Deepseek4Cache c = s.cache(n, storage);
    Outputs out(3, n, s.model.heads);
    ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, n, {n}));
    EXPECT_TRUE(dump_valid(c) == ref_dump) << "pieces of " << span;
    EXPECT_TRUE(same_outputs(out, ref_out, 0, n)) << "pieces of " << span;
  }
  s.runner.max_span_tokens = 2048;
}

TEST(DsvEquivalence, PrefillChunksEqualDecodeBf16) {
  check_chunkings(StorageConfig::bf16(), {{1}, {3}, {127}, {128}, {129}, {300}, {5, 1, 127, 2, 130}});
}
TEST(DsvEquivalence, PrefillChunksEqualDecodeFp8) { check_chunkings(StorageConfig::fp8(), {{3}, {129}, {5, 1, 127, 2, 130}}); }

TEST(DsvEquivalence, Prefill4096EqualsDecode) {
  KVC_SEEDED(rng);
  // One ratio-4 layer (overlapping compressor, indexer with 1024 visible rows at the end, top-k 16) and one
  // head keep 4096 decode steps fast; ratio 128 across several groups is covered by the 300-token tests.
  const std::size_t n = 4096;
  Harness s(rng, {4}, 1, 1, 16, n);
  Deepseek4Cache ref = s.cache(n);
  Outputs ref_out(1, n, 1);
  ASSERT_OK(run_decode(s.runner, ref, s.model, s.stream, ref_out, 0, n));
  Deepseek4Cache one = s.cache(n);
  Outputs out(1, n, 1);
  ASSERT_OK(run_chunks(s.runner, one, s.model, s.stream, out, 0, n, {4096}));
  EXPECT_TRUE(dump_valid(one) == dump_valid(ref));
  EXPECT_TRUE(same_outputs(out, ref_out, 0, n));
}

TEST(DsvEquivalence, SnapshotContinueRestoreContinue) {
  KVC_SEEDED(rng);
  const std::size_t n1 = 203, n2 = 275;
  Harness s(rng, {0, 4, 128}, 2, 2, 8, n2);
  TokenStream other(rng, s.model, n2);  // a different continuation, later rolled back
  Deepseek4Cache ref = s.cache(300);
  Outputs ref_out(3, n2, 2);
  ASSERT_OK(run_chunks(s.runner, ref, s.model, s.stream, ref_out, 0, n1, {64}));
  ASSERT_OK(run_decode(s.runner, ref, s.model, s.stream, ref_out, n1, n2));

  Deepseek4Cache c = s.cache(300);
  Outputs out(3, n2, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, n1, {64}));
  auto snap = take_snapshot(c);
  ASSERT_OK(snap);
  Outputs junk(3, n2, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, other, junk, n1, n2, {5, 17}));  // crosses a 128-group boundary
  ASSERT_OK(restore_snapshot(c, *snap));
  EXPECT_EQ(c.position(), n1);
  ASSERT_OK(run_decode(s.runner, c, s.model, s.stream, out, n1, n2));
  EXPECT_TRUE(dump_valid(c) == dump_valid(ref));
  EXPECT_TRUE(same_outputs(out, ref_out, n1, n2));
}

TEST(DsvEquivalence, AnchorImageHydrateContinue) {
  KVC_SEEDED(rng);
  const std::size_t n1 = 259, n2 = 330;
  Harness s(rng, {0, 4, 128}, 2, 2, 8, n2);
  Deepseek4Cache ref = s.cache(400);
  Outputs ref_out(3, n2, 2);
  ASSERT_OK(run_chunks(s.runner, ref, s.model, s.stream, ref_out, 0, n2, {n1, n2 - n1}));

  Deepseek4Cache a = s.cache(n1);  // a smaller cache that ends exactly at the anchor
  Outputs out(3, n2, 2);
  ASSERT_OK(run_chunks(s.runner, a, s.model, s.stream, out, 0, n1, {100, 3}));
  std::vector<std::uint32_t> tokens(n1);
  for (std::size_t i = 0; i < n1; ++i) tokens[i] = static_cast<std::uint32_t>(i * 7 + 1);
  auto image = encode_anchor_image(a, tokens);
  ASSERT_OK(image);
  Deepseek4Cache c = s.cache(400);
  std::vector<std::uint32_t> ledger;
  ASSERT_OK(hydrate_from_anchor_image(c, *image, &ledger));
  EXPECT_EQ(ledger, tokens);
  ASSERT_EQ(c.position(), n1);
  ASSERT_OK(run_decode(s.runner, c, s.model, s.stream, out, n1, n1 + 10));
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, n1 + 10, n2, {61}));
  EXPECT_TRUE(dump_valid(c) == dump_valid(ref));
  EXPECT_TRUE(same_outputs(out, ref_out, n1, n2));
}

TEST(DsvEquivalence, PoisonedCacheRefusesUntilResetOrRestore) {
  KVC_SEEDED(rng);
  const std::size_t n = 140;
  Harness s(rng, {0, 4, 128}, 2, 2, 8, n);
  Deepseek4Cache ref = s.cache(200);
  Outputs ref_out(3, n, 2);
  ASSERT_OK(run_chunks(s.runner, ref, s.model, s.stream, ref_out, 0, n, {70}));

  Deepseek4Cache c = s.cache(200);
  Outputs out(3, n, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, 70, {70}));
  auto snap = take_snapshot(c);
  ASSERT_OK(snap);
  // A failure after the layer's first write (the compressor stage) poisons the cache.
  s.runner.stage_hook = [](std::string_view stage) {
    return stage == "compressor" ? Status(make_error(ErrorCode::Internal, "injected")) : ok_status();
  };
  Status st = testutil::run_span(s.runner, c, s.model, s.stream, out, 70, 1, true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Internal);
  EXPECT_TRUE(c.poisoned());
  s.runner.stage_hook = nullptr;
  const std::vector<std::uint8_t> poisoned_dump = dump_valid(c);
  // Everything is refused and nothing changes.
  Status d = testutil::run_span(s.runner, c, s.model, s.stream, out, 70, 1, true);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::Poisoned);
  Status p = testutil::run_span(s.runner, c, s.model, s.stream, out, 70, 5, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, ErrorCode::Poisoned);
  std::vector<float> o(2 * 512);
  Status r = s.runner.run_layer(c, 0, 1, s.model.weights[0], s.stream.slice(0, 70), o.data());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Poisoned);
  EXPECT_FALSE(take_snapshot(c).ok());
  EXPECT_FALSE(encode_anchor_image(c, std::vector<std::uint32_t>(c.position())).ok());
  EXPECT_TRUE(dump_valid(c) == poisoned_dump);
  // Restore clears the poison; the continuation equals the uninterrupted run.
  ASSERT_OK(restore_snapshot(c, *snap));
  EXPECT_FALSE(c.poisoned());
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 70, n, {70}));
  EXPECT_TRUE(dump_valid(c) == dump_valid(ref));
  EXPECT_TRUE(same_outputs(out, ref_out, 70, n));
  // Poison again, then reset: a run from position 0 equals a fresh cache's.
  c.poison("test");
  EXPECT_EQ(testutil::run_span(s.runner, c, s.model, s.stream, out, n, 1, true).error().code, ErrorCode::Poisoned);
  c.reset();
  Outputs again(3, n, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, again, 0, n, {70}));
  EXPECT_TRUE(dump_valid(c) == dump_valid(ref));
  EXPECT_TRUE(same_outputs(again, ref_out, 0, n));
}

TEST(DsvEquivalence, FailureBeforeAnyWriteDoesNotPoison) {
  KVC_SEEDED(rng);
  Harness s(rng, {0, 4, 128}, 2, 2, 8, 40);
  Deepseek4Cache c = s.cache(64);
  Outputs out(3, 40, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, 20, {20}));
  const std::vector<std::uint8_t> before = dump_valid(c);
  // The first layer's first stage (reads only) fails: nothing was written, nothing is poisoned.
  s.runner.stage_hook = [](std::string_view stage) {
    return stage == "window" ? Status(make_error(ErrorCode::Internal, "injected")) : ok_status();
  };
  ASSERT_FALSE(testutil::run_span(s.runner, c, s.model, s.stream, out, 20, 1, true).ok());
  EXPECT_FALSE(c.poisoned());
  EXPECT_TRUE(dump_valid(c) == before);
  // A non-finite input is refused before any work.
  s.runner.stage_hook = nullptr;
  s.stream.layers[2].q[20 * 2 * 512 + 5] = std::numeric_limits<float>::quiet_NaN();
  Status st = testutil::run_span(s.runner, c, s.model, s.stream, out, 20, 3, false);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::NonFinite);
  EXPECT_FALSE(c.poisoned());
  EXPECT_TRUE(dump_valid(c) == before);
  // A failure in a later layer, after the first layer wrote, poisons (the step is half done).
  s.stream.layers[2].q[20 * 2 * 512 + 5] = 0.5f;
  int calls = 0;
  s.runner.stage_hook = [&calls](std::string_view stage) {
    return (stage == "window" && ++calls == 2) ? Status(make_error(ErrorCode::Internal, "injected")) : ok_status();
  };
  ASSERT_FALSE(testutil::run_span(s.runner, c, s.model, s.stream, out, 20, 1, true).ok());
  EXPECT_TRUE(c.poisoned());
}

TEST(DsvEquivalence, CorruptStoredRowPoisons) {
  KVC_SEEDED(rng);
  Harness s(rng, {128}, 2, 2, 8, 140);
  Deepseek4Cache c = s.cache(200);
  Outputs out(1, 140, 2);
  ASSERT_OK(run_chunks(s.runner, c, s.model, s.stream, out, 0, 130, {130}));
  // bf16 NaN in compressed row 0, which every later token of a ratio-128 layer reads.
  auto row = c.compressed_rows(0).row(0);
  row[0] = 0xC0;
  row[1] = 0x7F;
  Status st = testutil::run_span(s.runner, c, s.model, s.stream, out, 130, 1, true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::NonFinite);
  EXPECT_TRUE(c.poisoned());
}

}  // namespace
}  // namespace kvcompact::dsv4
