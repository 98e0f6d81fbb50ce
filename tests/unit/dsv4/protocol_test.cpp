// Deepseek4Cache on the CPU: exact allocation against the plan, initial buffer contents, the seed's
// step-protocol checks (complete-group publication, exhaustion, poisoning, prefill across window and
// group boundaries), cohort commits, and random traces replayed against a dense oracle.
#include "kvcompact/dsv4/cache.hpp"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "protocol_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testing::tiny_model;

Deepseek4Cache make_cache(std::uint64_t context, StorageConfig storage = {}, ModelConfig model = tiny_model()) {
  auto cache = Deepseek4Cache::create(model, context, storage);
  EXPECT_TRUE(cache.ok()) << cache.error().to_string();
  return std::move(cache).value();
}

TEST(Dsv4Protocol, SmallPlanAllocatesExactlyItsBytes) {
  for (StorageConfig storage : {StorageConfig::bf16(), StorageConfig::fp8(),
                                StorageConfig{RowStorage::Fp8, IndexerStorage::Mxfp4}}) {
    Deepseek4Cache cache = make_cache(300, storage);
    const CachePlan& plan = cache.plan();
    EXPECT_EQ(cache.allocated_bytes(), plan.total_bytes);
    for (std::uint32_t l = 0; l < cache.num_layers(); ++l) {
      const LayerPlan& lp = plan.layers[l];
      auto all = cache.attention_rows(l);
      auto window = cache.window_rows(l);
      auto compressed = cache.compressed_rows(l);
      EXPECT_EQ(all.bytes.size(), lp.attention_bytes);
      EXPECT_EQ(window.bytes.data(), all.bytes.data());  // zero-copy views
      EXPECT_EQ(window.rows, 128u);
      EXPECT_EQ(compressed.bytes.data(), all.bytes.data() + lp.window_bytes);
      EXPECT_EQ(compressed.rows, lp.ratio == 0 ? 0u : 300u / lp.ratio);
      EXPECT_EQ(compressed.row_stride, attention_row_bytes(storage.attention));
      auto indexer = cache.indexer_rows(l);
      EXPECT_EQ(indexer.rows, lp.ratio == 4 ? 75u : 0u);
      for (std::uint8_t b : indexer.bytes) ASSERT_EQ(b, 0);
      for (std::uint8_t b : all.bytes) ASSERT_EQ(b, 0);
      auto kv = cache.kv_state(l);
      auto score = cache.score_state(l);
      EXPECT_EQ(kv.rows, lp.ratio == 4 ? 8u : (lp.ratio == 128 ? 128u : 0u));
      EXPECT_EQ(kv.cols, lp.ratio == 4 ? 1024u : (lp.ratio == 128 ? 512u : 0u));
      for (float v : kv.data) ASSERT_EQ(v, 0.0f);
      for (float v : score.data) ASSERT_TRUE(std::isinf(v) && v < 0);
      auto ikv = cache.indexer_kv_state(l);
      auto iscore = cache.indexer_score_state(l);
      EXPECT_EQ(ikv.rows * ikv.cols, lp.ratio == 4 ? 8u * 256u : 0u);
      for (float v : ikv.data) ASSERT_EQ(v, 0.0f);
      for (float v : iscore.data) ASSERT_TRUE(std::isinf(v) && v < 0);
    }
  }
}

TEST(Dsv4Protocol, AccountingMismatchIsTyped) {
  auto plan = plan_cache(tiny_model(), 300);
  std::vector<std::uint64_t> counts;
  for (const LayerPlan& l : plan->layers) counts.push_back(l.resident_bytes);
  EXPECT_TRUE(check_accounting(*plan, counts).ok());
  counts[2] += 4;
  auto bad = check_accounting(*plan, counts);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::Accounting);
  counts.pop_back();
  EXPECT_EQ(check_accounting(*plan, counts).error().code, ErrorCode::Accounting);
}

TEST(Dsv4Protocol, CreateRejectsBadPlans) {
  auto plan = plan_cache(tiny_model(), 300);
  ASSERT_TRUE(plan.ok());
  CachePlan edited = *plan;
  edited.layers[1].compressed_bytes += 1024;  // a hand-edited plan: views would overrun
  edited.layers[1].resident_bytes += 1024;
  edited.total_bytes += 1024;
  auto bad = Deepseek4Cache::create(edited);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::Accounting);
  EXPECT_TRUE(Deepseek4Cache::create(*plan).ok());
  EXPECT_EQ(Deepseek4Cache::create(tiny_model(), 0).error().code, ErrorCode::EmptyContext);
  EXPECT_EQ(Deepseek4Cache::create(tiny_model(100), 101).error().code, ErrorCode::ContextBound);
}

// The seed's publication check on a 4/128 pair: first write slot at p = 3 for m = 4; at p = 127 slot
// 31 for m = 4 and slot 0 for m = 128; then ContextExhausted at the end of a 128-token context.
TEST(Dsv4Protocol, CompleteGroupPublication) {
  Deepseek4Cache cache = make_cache(128);
  for (std::uint64_t p = 0; p < 128; ++p) {
    auto step = cache.plan_next_step();
    ASSERT_TRUE(step.ok());
    ASSERT_EQ(step->position, p);
    const LayerStepPlan& csa = step->layers[1];
    const LayerStepPlan& hca = step->layers[2];
    if (p < 3) {
      EXPECT_FALSE(csa.compressed_write_slot.has_value());
    }
    if (p == 3) {
      EXPECT_EQ(csa.compressed_write_slot, std::optional<std::uint64_t>(0));
    }
    if (p == 127) {
      EXPECT_EQ(csa.compressed_write_slot, std::optional<std::uint64_t>(31));
      EXPECT_EQ(csa.indexer_write_slot, std::optional<std::uint64_t>(31));
      EXPECT_EQ(hca.compressed_write_slot, std::optional<std::uint64_t>(0));
      EXPECT_EQ(hca.compressed_valid_after, 1u);
    } else {
      EXPECT_FALSE(hca.compressed_write_slot.has_value());
    }
    EXPECT_FALSE(step->layers[0].compressed_write_slot.has_value());
    ASSERT_TRUE(cache.commit_step(p).ok());
  }
  auto step = cache.plan_next_step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.error().code, ErrorCode::ContextExhausted);
  EXPECT_FALSE(cache.poisoned());  // planning is side-effect free
  auto commit = cache.commit_step(128);
  ASSERT_FALSE(commit.ok());
  EXPECT_EQ(commit.error().code, ErrorCode::ContextExhausted);
  EXPECT_TRUE(cache.poisoned());
}

TEST(Dsv4Protocol, OutOfOrderCommitPoisonsUntilReset) {
  Deepseek4Cache cache = make_cache(64);
  ASSERT_TRUE(cache.commit_step(0).ok());
  auto bad = cache.commit_step(5);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::StepOutOfOrder);
  EXPECT_EQ(bad.error().expected, 1);
  EXPECT_EQ(bad.error().actual, 5);
  EXPECT_TRUE(cache.poisoned());
  EXPECT_EQ(cache.position(), 1u);
  EXPECT_EQ(cache.plan_next_step().error().code, ErrorCode::Poisoned);
  EXPECT_EQ(cache.commit_step(1).error().code, ErrorCode::Poisoned);  // poison is checked first
  EXPECT_EQ(cache.plan_prefill(1, 3).error().code, ErrorCode::Poisoned);
  EXPECT_EQ(cache.commit_prefill(1, 3).error().code, ErrorCode::Poisoned);
  // Dirty the states, then reset refills them and clears poison; rows are left alone.
  cache.kv_state(1).data[5] = 3.0f;
  cache.score_state(2).data[7] = 1.0f;
  cache.window_rows(0).row(0)[0] = 0x5A;
  cache.reset();
  EXPECT_FALSE(cache.poisoned());
  EXPECT_EQ(cache.position(), 0u);
  EXPECT_EQ(cache.kv_state(1).data[5], 0.0f);
  EXPECT_TRUE(std::isinf(cache.score_state(2).data[7]));
  EXPECT_EQ(cache.window_rows(0).row(0)[0], 0x5A);
  EXPECT_TRUE(cache.plan_next_step().ok());
  EXPECT_TRUE(cache.commit_step(0).ok());
}

TEST(Dsv4Protocol, ExplicitPoisonAfterFailedWork) {
  Deepseek4Cache cache = make_cache(64);
  auto step = cache.plan_next_step();
  ASSERT_TRUE(step.ok());
  cache.poison("device work failed");
  EXPECT_TRUE(cache.poisoned());
  EXPECT_EQ(cache.poison_reason(), "device work failed");
  auto commit = cache.commit_step(step->position);
  ASSERT_FALSE(commit.ok());
  EXPECT_EQ(commit.error().code, ErrorCode::Poisoned);
  EXPECT_EQ(cache.position(), 0u);
}

// The seed's prefill check: 127 tokens, then 2, then 128 — across the window wrap and group edges.
TEST(Dsv4Protocol, PrefillAcrossWindowAndGroupBoundaries) {
  const std::uint64_t salt = testing::fresh_seed();
  SCOPED_TRACE("salt " + std::to_string(salt));
  Deepseek4Cache cache = make_cache(600);
  auto a = cache.plan_prefill(0, 127);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->window_write_start, 0u);
  EXPECT_EQ(a->window_valid_after, 127u);
  EXPECT_EQ(a->layers[1].compressed_count, 31u);
  EXPECT_EQ(a->layers[1].compressed_valid_after, 31u);
  EXPECT_EQ(a->layers[2].compressed_count, 0u);
  testing::write_prefill(cache, *a, salt);
  ASSERT_TRUE(cache.commit_prefill(0, 127).ok());
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));

  auto b = cache.plan_prefill(127, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->window_write_start, 127u);
  EXPECT_EQ(b->window_valid_after, 128u);
  EXPECT_EQ(b->window_start_position, 1u);
  EXPECT_EQ(b->layers[1].compressed_write_start, 31u);
  EXPECT_EQ(b->layers[1].compressed_count, 1u);   // group 31 = tokens 124..127
  EXPECT_EQ(b->layers[2].compressed_write_start, 0u);
  EXPECT_EQ(b->layers[2].compressed_count, 1u);   // group 0 = tokens 0..127
  EXPECT_EQ(b->layers[1].indexer_count, 1u);
  EXPECT_EQ(b->layers[2].indexer_count, 0u);
  testing::write_prefill(cache, *b, salt);
  ASSERT_TRUE(cache.commit_prefill(127, 2).ok());
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));

  auto c = cache.plan_prefill(129, 128);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->window_write_start, 1u);
  EXPECT_EQ(c->end, 257u);
  EXPECT_EQ(c->window_start_position, 129u);
  EXPECT_EQ(c->layers[1].compressed_write_start, 32u);
  EXPECT_EQ(c->layers[1].compressed_count, 32u);  // floor(257/4) - floor(129/4) = 64 - 32
  EXPECT_EQ(c->layers[2].compressed_write_start, 1u);
  EXPECT_EQ(c->layers[2].compressed_count, 1u);   // group 1 = tokens 128..255
  testing::write_prefill(cache, *c, salt);
  ASSERT_TRUE(cache.commit_prefill(129, 128).ok());
  EXPECT_EQ(cache.position(), 257u);
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));

  // Errors: wrong start, empty, past the context — each poisons (work was done).
  auto wrong = cache.commit_prefill(250, 3);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::StepOutOfOrder);
  EXPECT_EQ(wrong.error().expected, 257);
  EXPECT_EQ(wrong.error().actual, 250);
  EXPECT_TRUE(cache.poisoned());
}

TEST(Dsv4Protocol, PrefillCommitErrors) {
  Deepseek4Cache cache = make_cache(100);
  EXPECT_EQ(cache.plan_prefill(0, 0).error().code, ErrorCode::EmptyPrefill);
  EXPECT_EQ(cache.plan_prefill(50, 51).error().code, ErrorCode::ContextBound);
  EXPECT_TRUE(cache.plan_prefill(50, 50).ok());  // planning from any start
  EXPECT_FALSE(cache.poisoned());
  EXPECT_EQ(cache.commit_prefill(0, 0).error().code, ErrorCode::EmptyPrefill);
  EXPECT_TRUE(cache.poisoned());
  cache.reset();
  auto over = cache.commit_prefill(0, 101);
  EXPECT_EQ(over.error().code, ErrorCode::ContextBound);
  EXPECT_EQ(cache.position(), 0u);
}

TEST(Dsv4Protocol, CohortCommitIsAllOrNothing) {
  Deepseek4Cache a = make_cache(64);
  Deepseek4Cache b = make_cache(64);
  Deepseek4Cache c = make_cache(64);
  std::vector<Deepseek4Cache*> cohort = {&a, &b, &c};
  for (std::uint64_t p = 0; p < 5; ++p) ASSERT_TRUE(commit_cohort(cohort, p).ok());
  EXPECT_EQ(a.position(), 5u);
  EXPECT_EQ(c.position(), 5u);

  std::vector<Deepseek4Cache*> dup = {&a, &a};
  EXPECT_EQ(commit_cohort(dup, 5).error().code, ErrorCode::InvalidArgument);
  std::vector<Deepseek4Cache*> null = {&a, nullptr};
  EXPECT_EQ(commit_cohort(null, 5).error().code, ErrorCode::InvalidArgument);
  EXPECT_FALSE(a.poisoned());
  EXPECT_EQ(a.position(), 5u);

  // b falls out of lock-step: nobody advances, everybody is poisoned.
  ASSERT_TRUE(b.commit_step(5).ok());
  auto fail = commit_cohort(cohort, 5);
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.error().code, ErrorCode::StepOutOfOrder);
  EXPECT_EQ(fail.error().expected, 6);
  EXPECT_EQ(fail.error().actual, 5);
  EXPECT_NE(fail.error().message.find("cohort member 1"), std::string::npos) << fail.error().message;
  EXPECT_EQ(a.position(), 5u);
  EXPECT_EQ(b.position(), 6u);
  EXPECT_EQ(c.position(), 5u);
  EXPECT_TRUE(a.poisoned() && b.poisoned() && c.poisoned());
}

TEST(Dsv4Protocol, CohortCommitReportsExhaustion) {
  Deepseek4Cache a = make_cache(3);
  Deepseek4Cache b = make_cache(2);
  std::vector<Deepseek4Cache*> cohort = {&a, &b};
  ASSERT_TRUE(commit_cohort(cohort, 0).ok());
  ASSERT_TRUE(commit_cohort(cohort, 1).ok());
  auto fail = commit_cohort(cohort, 2);
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.error().code, ErrorCode::ContextExhausted);
  EXPECT_EQ(a.position(), 2u);
}

// Random traces of decode steps and prefill chunks, with resets, replayed against the dense oracle.
TEST(Dsv4Protocol, RandomTracesMatchTheDenseOracle) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (std::uint64_t context : {7ull, 129ull, 600ull}) {
    Deepseek4Cache cache = make_cache(context, StorageConfig::fp8());
    std::uint64_t salt = rng();
    int ops = 0;
    while (ops++ < 60) {
      std::uint64_t left = context - cache.position();
      if (left == 0 || rng() % 20 == 0) {
        cache.reset();
        salt = rng();
        continue;
      }
      if (rng() % 2 == 0) {
        auto step = cache.plan_next_step();
        ASSERT_TRUE(step.ok());
        testing::write_step(cache, *step, salt);
        ASSERT_TRUE(cache.commit_step(step->position).ok());
      } else {
        std::uint64_t k = 1 + rng() % std::min<std::uint64_t>(left, 300);
        auto p = cache.plan_prefill(cache.position(), k);
        ASSERT_TRUE(p.ok());
        testing::write_prefill(cache, *p, salt);
        ASSERT_TRUE(cache.commit_prefill(p->start, k).ok());
      }
      ASSERT_TRUE(testing::rows_match_oracle(cache, salt)) << "context " << context << " op " << ops;
      EXPECT_EQ(cache.window_valid(), std::min(cache.position(), cache.plan().window_capacity));
    }
  }
}

}  // namespace
}  // namespace kvcompact::dsv4
