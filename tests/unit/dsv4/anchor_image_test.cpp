// Anchor images: a cache written to an image hydrates a fresh cache (same or larger context) with the
// same rows, states, position and ledger; every truncation and random corruption decodes to a typed
// error; model / storage / context mismatches are typed; describe / magic check for `kvcompact inspect`.
#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/dsv4/snapshot.hpp"

#include <algorithm>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "kvcompact/core/checksum.hpp"
#include "protocol_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testing::tiny_model;

Deepseek4Cache make_cache(std::uint64_t context, StorageConfig storage = {}) {
  auto cache = Deepseek4Cache::create(tiny_model(), context, storage);
  EXPECT_TRUE(cache.ok()) << cache.error().to_string();
  return std::move(cache).value();
}

std::vector<std::uint32_t> decode_tokens(Deepseek4Cache& cache, std::uint64_t tokens, std::uint64_t salt) {
  std::vector<std::uint32_t> ledger;
  for (std::uint64_t i = 0; i < tokens; ++i) {
    auto step = cache.plan_next_step();
    EXPECT_TRUE(step.ok());
    testing::write_step(cache, *step, salt);
    EXPECT_TRUE(cache.commit_step(step->position).ok());
    ledger.push_back(static_cast<std::uint32_t>(testing::mix(salt + i)));
  }
  return ledger;
}

bool same_state(const Deepseek4Cache& a, const Deepseek4Cache& b) {
  for (std::uint32_t l = 0; l < a.num_layers(); ++l) {
    auto eq = [](ConstStateBuffer x, ConstStateBuffer y) {
      return x.data.size() == y.data.size() &&
             (x.data.empty() || std::memcmp(x.data.data(), y.data.data(), x.data.size() * 4) == 0);
    };
    if (!eq(a.kv_state(l), b.kv_state(l)) || !eq(a.score_state(l), b.score_state(l)) ||
        !eq(a.indexer_kv_state(l), b.indexer_kv_state(l)) ||
        !eq(a.indexer_score_state(l), b.indexer_score_state(l))) {
      return false;
    }
  }
  return true;
}

TEST(Dsv4AnchorImage, HydratesAFreshCacheExactly) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (StorageConfig storage : {StorageConfig::bf16(), StorageConfig{RowStorage::Fp8, IndexerStorage::Mxfp4}}) {
    for (std::uint64_t context : {3ull, 130ull, 300ull}) {
      std::uint64_t salt = rng();
      Deepseek4Cache src = make_cache(context, storage);
      std::uint64_t tokens = 1 + rng() % context;
      auto ledger = decode_tokens(src, tokens, salt);
      auto image = encode_anchor_image(src, ledger);
      ASSERT_TRUE(image.ok()) << image.error().to_string();
      EXPECT_TRUE(looks_like_anchor_image(*image));
      for (std::uint64_t dst_context : {tokens, context, context + 333}) {
        Deepseek4Cache dst = make_cache(dst_context, storage);
        std::vector<std::uint32_t> got_ledger;
        auto st = hydrate_from_anchor_image(dst, *image, &got_ledger);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        EXPECT_EQ(dst.position(), tokens);
        EXPECT_EQ(got_ledger, ledger);
        EXPECT_TRUE(testing::rows_match_oracle(dst, salt)) << "context " << context << " -> " << dst_context;
        EXPECT_TRUE(same_state(src, dst));
        // Re-encoding the hydrated cache gives the same payload (the context field may differ).
        auto again = encode_anchor_image(dst, got_ledger);
        ASSERT_TRUE(again.ok());
        EXPECT_EQ(again->size(), image->size());
        if (dst_context == context) {
          EXPECT_EQ(*again, *image);
        }
      }
    }
  }
}

TEST(Dsv4AnchorImage, EncodeErrors) {
  Deepseek4Cache cache = make_cache(64);
  auto ledger = decode_tokens(cache, 10, 1);
  ledger.pop_back();
  EXPECT_EQ(encode_anchor_image(cache, ledger).error().code, ErrorCode::InvalidArgument);
  cache.poison("x");
  ledger.push_back(0);
  EXPECT_EQ(encode_anchor_image(cache, ledger).error().code, ErrorCode::Poisoned);
  // More layers than the format holds: refused when writing, not only when reading the image back.
  ModelConfig many = testing::tiny_model();
  many.num_hidden_layers = kAnchorImageMaxLayers + 1;
  many.compress_ratios.assign(many.num_hidden_layers, 0);
  auto wide = Deepseek4Cache::create(many, 4);
  ASSERT_TRUE(wide.ok()) << wide.error().to_string();
  const auto image = encode_anchor_image(*wide, {});
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.error().code, ErrorCode::Unsupported);
}

TEST(Dsv4AnchorImage, HydrateMismatchesAreTyped) {
  Deepseek4Cache src = make_cache(300);
  auto ledger = decode_tokens(src, 200, 9);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok());
  Deepseek4Cache small = make_cache(199);
  auto bound = hydrate_from_anchor_image(small, *image);
  EXPECT_EQ(bound.error().code, ErrorCode::ContextBound);
  EXPECT_EQ(bound.error().expected, 199);
  EXPECT_EQ(bound.error().actual, 200);
  Deepseek4Cache fp8 = make_cache(300, StorageConfig::fp8());
  EXPECT_EQ(hydrate_from_anchor_image(fp8, *image).error().code, ErrorCode::Mismatch);
  ModelConfig other = tiny_model();
  other.index_topk = 256;  // a different model, same shapes
  auto other_cache = Deepseek4Cache::create(other, 300);
  ASSERT_TRUE(other_cache.ok());
  EXPECT_EQ(hydrate_from_anchor_image(*other_cache, *image).error().code, ErrorCode::Mismatch);
  EXPECT_EQ(other_cache->position(), 0u);
}

TEST(Dsv4AnchorImage, HydrateClearsPoisonAndStalesOldSnapshots) {
  Deepseek4Cache src = make_cache(100);
  auto ledger = decode_tokens(src, 50, 4);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok()) << image.error().to_string();
  Deepseek4Cache dst = make_cache(100);
  decode_tokens(dst, 10, 5);
  auto before = take_snapshot(dst);  // of dst's own history, before the hydrate
  ASSERT_TRUE(before.ok());
  dst.poison("x");
  ASSERT_TRUE(hydrate_from_anchor_image(dst, *image).ok());
  EXPECT_FALSE(dst.poisoned());
  auto step = dst.plan_next_step();
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->position, 50u);
  // The hydrate rewrote the compressed rows from position 0: the earlier snapshot no longer restores.
  const Status stale = restore_snapshot(dst, *before);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, ErrorCode::Mismatch);
  EXPECT_EQ(dst.position(), 50u);
}

TEST(Dsv4AnchorImage, EveryTruncationIsATypedError) {
  Deepseek4Cache src = make_cache(140, StorageConfig::fp8());
  auto ledger = decode_tokens(src, 133, 2);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok());
  for (std::size_t n = 0; n < image->size(); n += (n < 300 ? 1 : 4099)) {
    std::vector<std::uint8_t> cut(image->begin(), image->begin() + static_cast<std::ptrdiff_t>(n));
    auto view = decode_anchor_image(cut);
    ASSERT_FALSE(view.ok()) << n;
    ErrorCode code = view.error().code;
    EXPECT_TRUE(code == ErrorCode::Truncated || (n < 8 && code == ErrorCode::Corrupt)) << n << " " << view.error().to_string();
  }
  std::vector<std::uint8_t> longer = *image;
  longer.push_back(0);
  EXPECT_EQ(decode_anchor_image(longer).error().code, ErrorCode::Corrupt);
}

TEST(Dsv4AnchorImage, CorruptionIsATypedError) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Deepseek4Cache src = make_cache(140);
  auto ledger = decode_tokens(src, 131, 3);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok());
  ASSERT_TRUE(decode_anchor_image(*image).ok());
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<std::uint8_t> bad = *image;
    // Half the flips land in the header and layer headers where they change structure.
    std::size_t at = trial % 2 == 0 ? rng() % 200 : rng() % bad.size();
    bad[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    auto view = decode_anchor_image(bad);
    ASSERT_FALSE(view.ok()) << "byte " << at;
    ErrorCode code = view.error().code;
    EXPECT_TRUE(code == ErrorCode::Corrupt || code == ErrorCode::Truncated || code == ErrorCode::Unsupported)
        << view.error().to_string();
  }
}

// A structurally hostile image with a valid checksum: counts that contradict the position.
TEST(Dsv4AnchorImage, ConsistentChecksumDoesNotHideBadCounts) {
  Deepseek4Cache src = make_cache(140);
  auto ledger = decode_tokens(src, 20, 3);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok());
  auto reseal = [](std::vector<std::uint8_t>& b) {
    std::uint64_t sum = xxh64(std::span<const std::uint8_t>(b.data(), b.size() - 8));
    for (int i = 0; i < 8; ++i) b[b.size() - 8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(sum >> (8 * i));
  };
  std::vector<std::uint8_t> bad = *image;
  bad[56] = 21;  // position 21 with a 20-token ledger
  reseal(bad);
  EXPECT_EQ(decode_anchor_image(bad).error().code, ErrorCode::Corrupt);
  bad = *image;
  const std::size_t layer0 = kAnchorImageHeaderBytes + 4 * 20;
  bad[layer0 + 8] = 19;  // window count
  reseal(bad);
  EXPECT_EQ(decode_anchor_image(bad).error().code, ErrorCode::Corrupt);
  bad = *image;
  bad[layer0] = 8;  // ratio 8
  reseal(bad);
  EXPECT_EQ(decode_anchor_image(bad).error().code, ErrorCode::Corrupt);
  bad = *image;
  bad[8] = 2;  // version 2
  reseal(bad);
  EXPECT_EQ(decode_anchor_image(bad).error().code, ErrorCode::Unsupported);
}

TEST(Dsv4AnchorImage, DescribeForInspect) {
  Deepseek4Cache src = make_cache(140);
  auto ledger = decode_tokens(src, 20, 3);
  auto image = encode_anchor_image(src, ledger);
  ASSERT_TRUE(image.ok());
  auto text = describe_anchor_image(*image);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("position           20 tokens"), std::string::npos) << *text;
  EXPECT_NE(text->find("verification       ok"), std::string::npos) << *text;
  EXPECT_NE(text->find(fmt::format("{:016x}", src.plan().model_fingerprint)), std::string::npos) << *text;
  std::vector<std::uint8_t> bad = *image;
  bad[bad.size() / 2] ^= 0x10;
  auto damaged = describe_anchor_image(bad);
  ASSERT_TRUE(damaged.ok());
  EXPECT_NE(damaged->find("verification       FAILED"), std::string::npos) << *damaged;
  // A payload-size field near 2^64: the header's total is not printed wrapped around.
  std::vector<std::uint8_t> huge_payload = *image;
  std::fill(huge_payload.begin() + 72, huge_payload.begin() + 80, std::uint8_t{0xFF});
  auto huge = describe_anchor_image(huge_payload);
  ASSERT_TRUE(huge.ok());
  EXPECT_NE(huge->find("beyond 2^64"), std::string::npos) << *huge;
  EXPECT_NE(huge->find("verification       FAILED"), std::string::npos) << *huge;
  std::vector<std::uint8_t> tiny(image->begin(), image->begin() + 40);
  EXPECT_FALSE(describe_anchor_image(tiny).ok());
  EXPECT_FALSE(looks_like_anchor_image(std::span<const std::uint8_t>(image->data(), 7)));
  std::vector<std::uint8_t> other = {'K', 'V', 'C', 'B', 0, 0, 0, 0, 0};
  EXPECT_FALSE(looks_like_anchor_image(other));
}

}  // namespace
}  // namespace kvcompact::dsv4
