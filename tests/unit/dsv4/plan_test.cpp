// DeepSeek-V4 cache plan: the seed's exact 1M shapes and byte totals (arithmetic only, nothing is
// allocated), validation order, FP8 sizes, and the step / prefill arithmetic against a token-by-token
// counting oracle.
#include "kvcompact/dsv4/plan.hpp"

#include <random>

#include <gtest/gtest.h>

#include "protocol_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

constexpr std::uint64_t kMillion = 1u << 20;

CachePlan flash_plan(std::uint64_t context, StorageConfig storage = {}) {
  auto plan = plan_cache(*preset_config("deepseek-v4-flash"), context, storage);
  EXPECT_TRUE(plan.ok()) << plan.error().to_string();
  return *plan;
}

TEST(Dsv4Plan, SeedShapesAtOneMillion) {
  CachePlan plan = flash_plan(kMillion);
  const LayerPlan& csa = plan.layers[2];
  ASSERT_EQ(csa.ratio, 4u);
  EXPECT_EQ(csa.kind, LayerKind::Csa);
  EXPECT_EQ(csa.compressed_rows, 262144u);  // compressed view [262144, 512]
  EXPECT_EQ(csa.attention_rows, 262272u);   // attention [262272, 512]
  EXPECT_EQ(csa.indexer_rows, 262144u);     // indexer [262144, 128]
  EXPECT_EQ(csa.state_rows, 8u);            // states [1, 8, 1024]
  EXPECT_EQ(csa.state_cols, 1024u);
  EXPECT_EQ(csa.indexer_state_rows, 8u);    // [1, 8, 256]
  EXPECT_EQ(csa.indexer_state_cols, 256u);
  EXPECT_EQ(csa.attention_row_bytes, 1024u);
  EXPECT_EQ(csa.indexer_row_bytes, 256u);
  EXPECT_EQ(csa.compressed_offset, 128u * 1024u);
  EXPECT_EQ(csa.compressed_offset, csa.window_bytes);

  const LayerPlan& hca = plan.layers[3];
  ASSERT_EQ(hca.ratio, 128u);
  EXPECT_EQ(hca.compressed_rows, 8192u);  // [8192, 512]
  EXPECT_EQ(hca.attention_rows, 8320u);   // [8320, 512]
  EXPECT_EQ(hca.state_rows, 128u);        // [1, 128, 512]
  EXPECT_EQ(hca.state_cols, 512u);
  EXPECT_EQ(hca.indexer_rows, 0u);
  EXPECT_EQ(hca.indexer_state_bytes, 0u);

  const LayerPlan& window = plan.layers[0];
  EXPECT_EQ(window.kind, LayerKind::Window);
  EXPECT_EQ(window.attention_rows, 128u);
  EXPECT_EQ(window.compressed_rows, 0u);
  EXPECT_EQ(window.state_bytes, 0u);
  EXPECT_EQ(window.resident_bytes, 128u * 1024u);
}

TEST(Dsv4Plan, ResidentBytesAreTheSumOfTheBuffers) {
  CachePlan plan = flash_plan(kMillion);
  // Hand-computed from the shapes: csa 268566528 + 67108864 + 2*65536 + 2*16384; hca 8519680 + 2*524288.
  EXPECT_EQ(plan.layers[2].resident_bytes, 335757312u);
  EXPECT_EQ(plan.layers[3].resident_bytes, 9043968u);
  EXPECT_EQ(plan.total_bytes, 21ull * 335757312ull + 20ull * 9043968ull + 2ull * 131072ull);
  EXPECT_EQ(plan.total_bytes, 7232045056u);  // ~6.7 GiB
  std::uint64_t sum = 0;
  for (const LayerPlan& l : plan.layers) {
    EXPECT_EQ(l.resident_bytes,
              l.attention_bytes + l.indexer_bytes + 2 * l.state_bytes + 2 * l.indexer_state_bytes);
    sum += l.resident_bytes;
  }
  EXPECT_EQ(sum, plan.total_bytes);
  // Against an uncompressed cache of the same dims: 43 GiB.
  EXPECT_EQ(*uncompressed_bytes(plan.model, kMillion), 43ull << 30);
}

TEST(Dsv4Plan, BytesPerTokenMatchTheReference) {
  ModelConfig flash = *preset_config("deepseek-v4-flash");
  ModelConfig pro = *preset_config("deepseek-v4-pro");
  EXPECT_DOUBLE_EQ(long_context_bytes_per_token(flash, StorageConfig::bf16()), 6880.0);
  EXPECT_DOUBLE_EQ(long_context_bytes_per_token(flash, StorageConfig::fp8()), 3850.25);
  EXPECT_DOUBLE_EQ(long_context_bytes_per_token(flash, {RowStorage::Fp8, IndexerStorage::Mxfp4}), 3514.25);
  EXPECT_DOUBLE_EQ(long_context_bytes_per_token(pro, StorageConfig::bf16()), 9848.0);
  EXPECT_NEAR(long_context_bytes_per_token(pro, StorageConfig::fp8()), 5511.0, 0.5);
  EXPECT_NEAR(long_context_bytes_per_token(pro, {RowStorage::Fp8, IndexerStorage::Mxfp4}), 5031.0, 0.5);
}

TEST(Dsv4Plan, Fp8RowSizes) {
  CachePlan plan = flash_plan(kMillion, StorageConfig::fp8());
  const LayerPlan& csa = plan.layers[2];
  EXPECT_EQ(csa.attention_row_bytes, 584u);
  EXPECT_EQ(csa.indexer_row_bytes, 132u);
  EXPECT_EQ(csa.attention_bytes, 262272u * 584u);
  EXPECT_EQ(csa.compressed_offset, 128u * 584u);
  CachePlan mx = flash_plan(1000, {RowStorage::Fp8, IndexerStorage::Mxfp4});
  EXPECT_EQ(mx.layers[2].indexer_row_bytes, 68u);
  EXPECT_EQ(mx.layers[2].indexer_bytes, 250u * 68u);
}

TEST(Dsv4Plan, ValidationOrderMatchesTheSeed) {
  ModelConfig good = *preset_config("deepseek-v4-flash");
  auto code = [](const Result<CachePlan>& r) { return r.ok() ? ErrorCode::Internal : r.error().code; };
  EXPECT_EQ(code(plan_cache(good, 0)), ErrorCode::EmptyContext);
  auto bound = plan_cache(good, kMillion + 1);
  EXPECT_EQ(code(bound), ErrorCode::ContextBound);
  EXPECT_EQ(bound.error().expected, static_cast<std::int64_t>(kMillion));
  EXPECT_EQ(bound.error().actual, static_cast<std::int64_t>(kMillion + 1));
  ModelConfig bad = good;
  bad.sliding_window = 256;
  bad.compress_ratios.pop_back();
  EXPECT_EQ(code(plan_cache(bad, 0)), ErrorCode::EmptyContext);  // context first
  EXPECT_EQ(code(plan_cache(bad, 10)), ErrorCode::SlidingWindow);
  bad.sliding_window = 128;
  EXPECT_EQ(code(plan_cache(bad, 10)), ErrorCode::LayerCount);
  bad = good;
  bad.compress_ratios[7] = 64;
  EXPECT_EQ(code(plan_cache(bad, 10)), ErrorCode::CompressionRatio);
  EXPECT_TRUE(plan_cache(good, kMillion).ok());
  EXPECT_TRUE(plan_cache(good, 1).ok());
}

TEST(Dsv4Plan, HugeBoundOverflowsAsATypedError) {
  ModelConfig m = *preset_config("deepseek-v4-flash");
  m.max_position_embeddings = ~std::uint64_t{0};
  auto r = plan_cache(m, ~std::uint64_t{0} / 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Overflow);
}

TEST(Dsv4Plan, SmallContextsClampTheWindow) {
  CachePlan plan = flash_plan(5);
  EXPECT_EQ(plan.window_capacity, 5u);
  EXPECT_EQ(plan.layers[2].window_rows, 5u);
  EXPECT_EQ(plan.layers[2].compressed_rows, 1u);
  EXPECT_EQ(plan.layers[3].compressed_rows, 0u);
  EXPECT_EQ(plan.layers[3].attention_rows, 5u);
}

// Token-by-token oracle: counts complete groups and the ring as tokens arrive.
TEST(Dsv4Plan, StepArithmeticMatchesACountingOracle) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (std::uint64_t context : {1ull, 3ull, 5ull, 127ull, 128ull, 129ull, 600ull, 1000ull}) {
    auto plan = plan_cache(testing::tiny_model(), context);
    ASSERT_TRUE(plan.ok());
    std::vector<std::uint64_t> groups(plan->layers.size(), 0);
    std::vector<std::uint64_t> in_group(plan->layers.size(), 0);
    std::uint64_t ring_fill = 0;
    std::uint64_t next_slot = 0;
    for (std::uint64_t p = 0; p < context; ++p) {
      auto step = plan_step_at(*plan, p);
      ASSERT_TRUE(step.ok());
      EXPECT_EQ(step->window_write_slot, next_slot) << "p=" << p;
      next_slot = (next_slot + 1 == plan->window_capacity) ? 0 : next_slot + 1;
      ring_fill = std::min(ring_fill + 1, plan->window_capacity);
      EXPECT_EQ(step->window_valid_after, ring_fill);
      EXPECT_EQ(step->window_start_position, p + 1 - ring_fill);
      for (std::size_t l = 0; l < plan->layers.size(); ++l) {
        const std::uint32_t m = plan->layers[l].ratio;
        const LayerStepPlan& ls = step->layers[l];
        if (m == 0) {
          EXPECT_EQ(ls.compressed_valid_after, 0u);
          EXPECT_FALSE(ls.compressed_write_slot.has_value());
          continue;
        }
        EXPECT_EQ(ls.state_write_row, (m == 4 ? m : 0) + in_group[l]);
        bool completes = ++in_group[l] == m;
        if (completes) {
          in_group[l] = 0;
          ASSERT_TRUE(ls.compressed_write_slot.has_value()) << "p=" << p << " layer " << l;
          EXPECT_EQ(*ls.compressed_write_slot, groups[l]);
          ++groups[l];
        } else {
          EXPECT_FALSE(ls.compressed_write_slot.has_value()) << "p=" << p;
        }
        EXPECT_EQ(ls.compressed_valid_after, groups[l]);
        if (m == 4) {
          EXPECT_EQ(ls.indexer_write_slot, ls.compressed_write_slot);
          EXPECT_EQ(ls.indexer_valid_after, groups[l]);
        } else {
          EXPECT_FALSE(ls.indexer_write_slot.has_value());
          EXPECT_EQ(ls.indexer_valid_after, 0u);
        }
      }
    }
    auto done = plan_step_at(*plan, context);
    ASSERT_FALSE(done.ok());
    EXPECT_EQ(done.error().code, ErrorCode::ContextExhausted);

    // Prefill spans from random starts agree with running the steps one by one.
    for (int trial = 0; trial < 50; ++trial) {
      std::uint64_t s = rng() % context;
      std::uint64_t k = 1 + rng() % (context - s);
      auto pf = plan_prefill_at(*plan, s, k);
      ASSERT_TRUE(pf.ok());
      auto last = plan_step_at(*plan, s + k - 1);
      EXPECT_EQ(pf->end, s + k);
      EXPECT_EQ(pf->window_write_start, s % plan->window_capacity);
      EXPECT_EQ(pf->window_valid_after, last->window_valid_after);
      EXPECT_EQ(pf->window_start_position, last->window_start_position);
      for (std::size_t l = 0; l < plan->layers.size(); ++l) {
        std::uint64_t written = 0;
        std::optional<std::uint64_t> first;
        for (std::uint64_t q = s; q < s + k; ++q) {
          auto st = plan_step_at(*plan, q);
          if (st->layers[l].compressed_write_slot) {
            if (!first) first = *st->layers[l].compressed_write_slot;
            ++written;
          }
        }
        const LayerPrefillPlan& lp = pf->layers[l];
        EXPECT_EQ(lp.compressed_count, written) << "s=" << s << " k=" << k << " layer " << l;
        if (first) {
          EXPECT_EQ(lp.compressed_write_start, *first);
        }
        EXPECT_EQ(lp.compressed_valid_after, last->layers[l].compressed_valid_after);
        EXPECT_EQ(lp.indexer_count, plan->layers[l].ratio == 4 ? written : 0u);
      }
    }
  }
}

TEST(Dsv4Plan, PrefillErrors) {
  auto plan = plan_cache(testing::tiny_model(), 300);
  auto empty = plan_prefill_at(*plan, 10, 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, ErrorCode::EmptyPrefill);
  auto over = plan_prefill_at(*plan, 200, 101);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, ErrorCode::ContextBound);
  auto wrap = plan_prefill_at(*plan, ~std::uint64_t{0}, 2);
  ASSERT_FALSE(wrap.ok());
  EXPECT_EQ(wrap.error().code, ErrorCode::ContextBound);
  EXPECT_TRUE(plan_prefill_at(*plan, 200, 100).ok());
}

}  // namespace
}  // namespace kvcompact::dsv4
