// Migration under the real layer math: a cache decoded in a small context (its window ring shorter than
// 128) and migrated into a larger one continues exactly like a cache that had the large context from
// the start — same stored bytes, same outputs bit for bit.
#include <gtest/gtest.h>

#include "kvcompact/dsv4/snapshot.hpp"
#include "math_layer_fixture.hpp"

namespace kvcompact::dsv4 {
namespace {

using namespace testutil;

bool same_outputs(const Outputs& a, const Outputs& b, std::size_t from, std::size_t to) {
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    const std::size_t w = static_cast<std::size_t>(a.heads) * 512;
    if (std::memcmp(a.layers[l].data() + from * w, b.layers[l].data() + from * w, (to - from) * w * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

TEST(Dsv4SnapshotMigrate, MigratedCacheContinuesLikeTheLargeOne) {
  KVC_SEEDED(rng);
  const std::size_t small = 60;  // a 60-row window ring, re-slotted into a 128-row one
  const std::size_t total = 160;
  SyntheticModel model(rng, synthetic_config({0, 4, 128}, 2, 8), 2);
  TokenStream stream(rng, model, total);
  LayerRunner runner(model.config);

  auto ref = Deepseek4Cache::create(model.config, 400, StorageConfig::fp8());
  ASSERT_TRUE(ref.ok());
  Outputs ref_out(3, total, 2);
  ASSERT_TRUE(run_chunks(runner, *ref, model, stream, ref_out, 0, total, {37}).ok());

  auto src = Deepseek4Cache::create(model.config, small, StorageConfig::fp8());
  ASSERT_TRUE(src.ok());
  Outputs out(3, total, 2);
  ASSERT_TRUE(run_chunks(runner, *src, model, stream, out, 0, small, {37}).ok());
  auto dst = migrate(*src, 400);
  ASSERT_TRUE(dst.ok()) << dst.error().to_string();
  ASSERT_EQ(dst->position(), small);
  ASSERT_TRUE(run_decode(runner, *dst, model, stream, out, small, small + 5).ok());
  ASSERT_TRUE(run_chunks(runner, *dst, model, stream, out, small + 5, total, {50}).ok());
  EXPECT_TRUE(dump_valid(*dst) == dump_valid(*ref)) << "small context " << small;
  EXPECT_TRUE(same_outputs(out, ref_out, 0, total)) << "small context " << small;
}

}  // namespace
}  // namespace kvcompact::dsv4
