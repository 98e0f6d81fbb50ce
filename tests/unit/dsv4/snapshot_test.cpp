// Snapshots and migration: restore gives back rows, states and position with no aliasing; snapshots of
// another plan or another cache, or made stale by a rewind, are rejected; migration into a larger
// context keeps every valid row and state (re-slotting the window ring when it grows).
#include "kvcompact/dsv4/snapshot.hpp"

#include <algorithm>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "dsv4/cache_access.hpp"
#include "protocol_test_util.hpp"

namespace kvcompact::dsv4 {
namespace {

using testing::tiny_model;

Deepseek4Cache make_cache(std::uint64_t context, StorageConfig storage = {}) {
  auto cache = Deepseek4Cache::create(tiny_model(), context, storage);
  EXPECT_TRUE(cache.ok()) << cache.error().to_string();
  return std::move(cache).value();
}

void decode(Deepseek4Cache& cache, std::uint64_t tokens, std::uint64_t salt) {
  for (std::uint64_t i = 0; i < tokens; ++i) {
    auto step = cache.plan_next_step();
    ASSERT_TRUE(step.ok()) << step.error().to_string();
    testing::write_step(cache, *step, salt);
    ASSERT_TRUE(cache.commit_step(step->position).ok());
  }
}

std::vector<std::vector<float>> all_states(const Deepseek4Cache& c) {
  std::vector<std::vector<float>> out;
  for (std::uint32_t l = 0; l < c.num_layers(); ++l) {
    for (auto s : {c.kv_state(l), c.score_state(l), c.indexer_kv_state(l), c.indexer_score_state(l)}) {
      out.emplace_back(s.data.begin(), s.data.end());
    }
  }
  return out;
}

bool same_floats(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  }
  return true;
}

TEST(Dsv4Snapshot, RestoreGivesBackRowsStateAndPosition) {
  const std::uint64_t salt = testing::fresh_seed();
  SCOPED_TRACE("salt " + std::to_string(salt));
  Deepseek4Cache cache = make_cache(600);
  decode(cache, 203, salt);
  auto states = all_states(cache);
  auto snap = take_snapshot(cache);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->position, 203u);
  EXPECT_EQ(snap->layers[0].window.size(), 128u * 1024u);

  // Run ahead with other content (crossing an m = 128 boundary), and scribble on the snapshot's
  // source buffers: the snapshot must not alias them.
  decode(cache, 90, salt ^ 1);
  cache.kv_state(1).data[0] = 42.0f;
  ASSERT_TRUE(restore_snapshot(cache, *snap).ok());
  EXPECT_EQ(cache.position(), 203u);
  EXPECT_TRUE(same_floats(all_states(cache), states));
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));

  // Decoding again from the restored point, then restoring the same snapshot again, still works.
  decode(cache, 30, salt ^ 2);
  ASSERT_TRUE(restore_snapshot(cache, *snap).ok());
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));
  // And a restored cache continues as if never diverted.
  decode(cache, 100, salt);
  EXPECT_TRUE(testing::rows_match_oracle(cache, salt));
}

TEST(Dsv4Snapshot, RestoreClearsPoisonButSnapshotOfPoisonedIsRefused) {
  Deepseek4Cache cache = make_cache(64);
  decode(cache, 10, 7);
  auto snap = take_snapshot(cache);
  ASSERT_TRUE(snap.ok());
  cache.poison("failed");
  auto refused = take_snapshot(cache);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::Poisoned);
  ASSERT_TRUE(restore_snapshot(cache, *snap).ok());
  EXPECT_FALSE(cache.poisoned());
  EXPECT_EQ(cache.position(), 10u);
}

TEST(Dsv4Snapshot, SnapshotOfAnotherPlanOrCacheIsRejected) {
  Deepseek4Cache a = make_cache(64);
  Deepseek4Cache other_plan = make_cache(65);
  Deepseek4Cache other_storage = make_cache(64, StorageConfig::fp8());
  Deepseek4Cache twin = make_cache(64);
  decode(a, 9, 3);
  auto snap = take_snapshot(a);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(restore_snapshot(other_plan, *snap).error().code, ErrorCode::Mismatch);
  EXPECT_EQ(restore_snapshot(other_storage, *snap).error().code, ErrorCode::Mismatch);
  // Same plan, different cache: its compressed rows are not in the snapshot.
  EXPECT_EQ(restore_snapshot(twin, *snap).error().code, ErrorCode::Mismatch);
  EXPECT_EQ(twin.position(), 0u);
}

TEST(Dsv4Snapshot, RewindBelowTheSnapshotMakesItStale) {
  Deepseek4Cache cache = make_cache(300);
  decode(cache, 20, 5);
  auto early = take_snapshot(cache);
  decode(cache, 20, 5);
  auto late = take_snapshot(cache);
  ASSERT_TRUE(early.ok() && late.ok());
  ASSERT_TRUE(restore_snapshot(cache, *early).ok());  // rewinds to 20
  decode(cache, 25, 6);                                 // rewrites compressed rows 5..11
  auto stale = restore_snapshot(cache, *late);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, ErrorCode::Mismatch);
  EXPECT_TRUE(restore_snapshot(cache, *early).ok());
  cache.reset();
  EXPECT_EQ(restore_snapshot(cache, *early).error().code, ErrorCode::Mismatch);
}

// A snapshot's fields are public: one edited to a position past the context must not restore (its compressed
// rows would lie beyond the buffers), and nothing changes.
TEST(Dsv4Snapshot, SnapshotPastTheContextIsRejected) {
  Deepseek4Cache cache = make_cache(300);
  decode(cache, 20, 7);
  auto snap = take_snapshot(cache);
  ASSERT_TRUE(snap.ok());
  Snapshot edited = *snap;
  edited.position = 301;
  // Window bytes sized for the edited position, so that only the position is wrong.
  for (std::size_t l = 0; l < edited.layers.size(); ++l) {
    edited.layers[l].window.resize(std::min<std::uint64_t>(301, cache.plan().window_capacity) *
                                   cache.plan().layers[l].attention_row_bytes);
  }
  const Status st = restore_snapshot(cache, edited);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::ContextBound);
  EXPECT_EQ(st.error().expected, 300);
  EXPECT_EQ(st.error().actual, 301);
  EXPECT_EQ(cache.position(), 20u);
  EXPECT_TRUE(restore_snapshot(cache, *snap).ok());
}

// A write that fails part-way after rewriting compressed rows from position 0 (the GPU cache's hydrate when an
// upload fails: CacheBookkeeping::poison_rows_rewritten) poisons the cache and makes every earlier snapshot
// stale, so none can clear the poison over the rewritten rows; a reset still recovers the cache.
TEST(Dsv4Snapshot, RowsRewrittenByAFailedWriteMakeEarlierSnapshotsStale) {
  Deepseek4Cache cache = make_cache(300);
  decode(cache, 30, 8);
  auto snap = take_snapshot(cache);
  ASSERT_TRUE(snap.ok());
  detail::CacheAccess::impl(cache).poison_rows_rewritten("upload failed part-way");
  EXPECT_TRUE(cache.poisoned());
  const Status st = restore_snapshot(cache, *snap);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Mismatch);
  EXPECT_TRUE(cache.poisoned());
  cache.reset();
  EXPECT_FALSE(cache.poisoned());
  decode(cache, 3, 9);
  EXPECT_EQ(cache.position(), 3u);
}

TEST(Dsv4Snapshot, MigrateIntoALargerContext) {
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Small sources (ring smaller than 128) re-slot into the larger ring; big ones copy straight.
  for (std::uint64_t src_context : {5ull, 50ull, 130ull, 400ull}) {
    for (int trial = 0; trial < 3; ++trial) {
      std::uint64_t salt = rng();
      Deepseek4Cache src = make_cache(src_context, StorageConfig::fp8());
      std::uint64_t tokens = rng() % (src_context + 1);
      decode(src, tokens, salt);
      std::uint64_t dst_context = src_context + 1 + rng() % 500;
      auto dst = migrate(src, dst_context);
      ASSERT_TRUE(dst.ok()) << dst.error().to_string();
      EXPECT_EQ(dst->plan().context, dst_context);
      EXPECT_EQ(dst->position(), tokens);
      EXPECT_TRUE(testing::rows_match_oracle(*dst, salt)) << "src " << src_context << " tokens " << tokens;
      EXPECT_TRUE(same_floats(all_states(*dst), all_states(src)));
      // The migrated cache keeps decoding with the same content stream.
      std::uint64_t more = std::min<std::uint64_t>(dst_context - tokens, 140);
      decode(*dst, more, salt);
      EXPECT_TRUE(testing::rows_match_oracle(*dst, salt));
    }
  }
}

TEST(Dsv4Snapshot, MigrationErrors) {
  Deepseek4Cache src = make_cache(300);
  decode(src, 100, 1);
  EXPECT_EQ(migrate(src, 99).error().code, ErrorCode::ContextBound);
  EXPECT_EQ(migrate(src, 5000).error().code, ErrorCode::ContextBound);  // beyond the model's bound
  Deepseek4Cache fp8 = make_cache(400, StorageConfig::fp8());
  EXPECT_EQ(migrate_into(src, fp8).error().code, ErrorCode::Mismatch);
  auto other_model = Deepseek4Cache::create(*preset_config("deepseek-v4-flash"), 400);
  ASSERT_TRUE(other_model.ok());
  EXPECT_EQ(migrate_into(src, *other_model).error().code, ErrorCode::Mismatch);
  src.poison("x");
  EXPECT_EQ(migrate(src, 400).error().code, ErrorCode::Poisoned);
}

}  // namespace
}  // namespace kvcompact::dsv4
