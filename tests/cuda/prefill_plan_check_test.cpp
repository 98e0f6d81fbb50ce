// prefill_attention's re-check of a PrefillPlan's shape fields (src/cuda/prefill_plan_check.hpp), on the CPU:
// plans with plan_prefill's fields (random shapes, modes, head_dims, precisions and kernels) pass, and each hand
// edit of a shape field is an InvalidArgument naming it. (The key splits, folded keys and workspace size are
// re-checked in prefill_attention itself: CudaPrefill.BadArgumentsAreTypedErrors.)
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "cuda/cuda_test_util.hpp"
#include "cuda/prefill_params.hpp"
#include "cuda/prefill_plan_check.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"
#include "kvcompact/tq/layout.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::cuda::testing::refused_naming;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;

// The shape fields plan_prefill gives (its occupancy query and key split need a device and are not shape fields).
PrefillPlan consistent_plan(std::mt19937_64& rng, const QuantConfig& config, std::uint32_t d, PrefillKernel kernel,
                            PrefillPrecision precision) {
  const std::uint32_t kv_heads = 1 + static_cast<std::uint32_t>(rng() % 8);
  // Groups up to 300 query heads per KV head, so that some are wider than a block (head_groups > 1).
  const std::uint32_t group = rng() % 4 == 0 ? 1 + static_cast<std::uint32_t>(rng() % 300)
                                             : 1 + static_cast<std::uint32_t>(rng() % 16);
  const std::uint32_t capacity = 1 + static_cast<std::uint32_t>(rng() % 200000);
  PrefillPlan plan;
  plan.layout = *kvcompact::tq::plan_layer_layout(d, kv_heads, 1 + static_cast<std::uint32_t>(rng() % 8), capacity,
                                                  config);
  plan.config = config;
  plan.precision = precision;
  plan.kernel = kernel;
  plan.q_heads = kv_heads * group;
  plan.max_length = 1 + static_cast<std::uint32_t>(rng() % capacity);
  plan.max_rows = 1 + static_cast<std::uint32_t>(rng() % plan.max_length);
  plan.max_batch = 1 + static_cast<std::uint32_t>(rng() % 64);
  plan.folded_keys = prefill_folds_keys(kernel, precision);
  plan.block_rows = prefill_plan_block_rows(d, config.has_qjl(), kernel, plan.folded_keys);
  const PrefillTiling t = prefill_tiling(group, plan.block_rows, plan.max_rows);
  plan.heads_per_block = t.heads_per_block;
  plan.tokens_per_block = t.tokens_per_block;
  plan.head_groups = t.head_groups;
  plan.tiles = static_cast<std::uint32_t>(t.tiles);
  return plan;
}

TEST(PrefillPlanCheck, ConsistentPlansPassAndEveryShapeEditIsRefused) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int checked = 0, warpgroup_checked = 0, wide_groups = 0;
  for (const char* mode : {"k=mse4,v=mse3,nc", "k=prod3,v=mse2", "k=mse2,v=mse2", "k=mse4,v=mse4,w=8",
                           "k=prod4,v=mse3"}) {
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    for (const std::uint32_t d : {64u, 128u, 256u}) {
      if (!prefill_supported(d, config)) continue;
      const bool has_warpgroup = prefill_wgmma_supported(d, config.has_qjl());
      for (int i = 0; i < 30; ++i) {
        const PrefillKernel kernel =
            has_warpgroup && rng() % 2 == 0 ? PrefillKernel::Warpgroup : PrefillKernel::Portable;
        const PrefillPrecision precision = rng() % 2 == 0 ? PrefillPrecision::Fast : PrefillPrecision::HiLo;
        const PrefillPlan plan = consistent_plan(rng, config, d, kernel, precision);
        SCOPED_TRACE(std::string(mode) + " d " + std::to_string(d) +
                     (kernel == PrefillKernel::Warpgroup ? " warpgroup" : " portable") +
                     (precision == PrefillPrecision::Fast ? " fast" : " hilo") + " q_heads " +
                     std::to_string(plan.q_heads) + " max_rows " + std::to_string(plan.max_rows));
        const Status fine = check_prefill_plan_shape(plan);
        ASSERT_TRUE(fine.ok()) << fine.error().to_string();
        ++checked;
        warpgroup_checked += kernel == PrefillKernel::Warpgroup ? 1 : 0;
        wide_groups += plan.head_groups > 1 ? 1 : 0;

        // One hand edit of the plan at a time, refused naming its field.
        auto refuses = [&](auto edit, const char* field) {
          PrefillPlan e = plan;
          edit(e);
          return refused_naming(check_prefill_plan_shape(e), field);
        };
        EXPECT_TRUE(refuses([](PrefillPlan& e) { e.precision = static_cast<PrefillPrecision>(7); }, "precision"));
        EXPECT_TRUE(refuses([](PrefillPlan& e) { e.kernel = PrefillKernel::Auto; }, "kernel"));
        if (!has_warpgroup) {
          EXPECT_TRUE(refuses([](PrefillPlan& e) { e.kernel = PrefillKernel::Warpgroup; }, "kernel"));
        }
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.max_length = plan.layout.capacity + 1; }, "max_length"));
        EXPECT_TRUE(refuses([](PrefillPlan& e) { e.max_rows = 0; }, "max_rows"));
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.max_rows = plan.max_length + 1; }, "max_rows"));
        EXPECT_TRUE(refuses([](PrefillPlan& e) { e.max_batch = 0; }, "max_batch"));
        EXPECT_TRUE(refuses([](PrefillPlan& e) { e.max_batch = 70000; }, "max_batch"));
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.block_rows = plan.block_rows + 1; }, "block_rows"));
        // (Fewer tiles leave rows unwritten, more put a block past them.)
        const std::uint64_t other_tiles = plan.tiles > 1 ? plan.tiles - 1 : plan.tiles + 1;
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.tiles = other_tiles; }, "tiling"));
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.tokens_per_block = plan.tokens_per_block * 2; }, "tiling"));
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.heads_per_block = plan.heads_per_block + 1; }, "tiling"));
        EXPECT_TRUE(refuses([&](PrefillPlan& e) { e.head_groups = plan.head_groups + 1; }, "tiling"));
        PrefillPlan e = plan;
        e.q_heads = plan.q_heads + plan.layout.kv_heads * 7;  // another group size: another tiling
        const PrefillTiling other = prefill_tiling(e.q_heads / plan.layout.kv_heads, plan.block_rows, plan.max_rows);
        if (other.heads_per_block != plan.heads_per_block || other.tokens_per_block != plan.tokens_per_block ||
            other.head_groups != plan.head_groups || other.tiles != plan.tiles) {
          EXPECT_TRUE(refused_naming(check_prefill_plan_shape(e), "tiling"));
        }
        e = plan;
        e.q_heads = plan.q_heads + 1;
        const Status heads = check_prefill_plan_shape(e);
        if (plan.layout.kv_heads > 1) {
          EXPECT_TRUE(refused_naming(heads, "q_heads")) << "not a multiple of kv_heads";
        }
      }
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(warpgroup_checked, 20);
  EXPECT_GT(wide_groups, 5);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
