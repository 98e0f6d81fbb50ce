// decode_attention's re-check of a DecodePlan's fields (src/cuda/decode_plan_check.hpp), on the CPU: plans built
// as plan_decode builds them (random shapes, modes, split counts and the wide variant where it exists) pass, and
// each hand edit that would make the kernels leave their buffers or skip tokens is an InvalidArgument naming the
// field. (CudaDecode.EditedPlansAreTypedErrors checks the same edits through decode_attention on a GPU.)
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "cuda/cuda_test_util.hpp"
#include "cuda/decode_plan_check.hpp"
#include "cuda/decode_split.hpp"
#include "cuda/params.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/layout.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::cuda::testing::refused_naming;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;

// A plan with plan_decode's fields for a random resident-block count (plan_decode asks the occupancy calculator,
// which needs a device).
DecodePlan consistent_plan(std::mt19937_64& rng, const QuantConfig& config, std::uint32_t d, bool wide) {
  const std::uint32_t kv_heads = 1 + static_cast<std::uint32_t>(rng() % 8);
  const std::uint32_t q_heads = kv_heads * (1 + static_cast<std::uint32_t>(rng() % 12));
  const std::uint32_t sequences = 1 + static_cast<std::uint32_t>(rng() % 70);
  const std::uint32_t capacity = 1 + static_cast<std::uint32_t>(rng() % 300000);
  DecodePlan plan;
  plan.layout = *kvcompact::tq::plan_layer_layout(d, kv_heads, sequences, capacity, config);
  plan.config = config;
  plan.q_heads = q_heads;
  plan.max_length = static_cast<std::uint32_t>(rng() % (std::uint64_t{capacity} + 1));
  plan.wide = wide;
  const std::uint64_t base = std::uint64_t{sequences} * kv_heads * ((q_heads / kv_heads + kDecodeGroup - 1) / kDecodeGroup);
  const DecodeSplit split = choose_decode_split(plan.max_length, base, 1 + rng() % 400,
                                                decode_tile_tokens(d, config.key_code_bits(), config.value_bits, wide));
  plan.chunk = static_cast<std::uint32_t>(split.chunk);
  plan.splits = static_cast<std::uint32_t>(split.splits);
  plan.workspace_bytes = decode_workspace(plan.layout, q_heads, plan.splits).bytes;
  return plan;
}

TEST(DecodePlanCheck, ConsistentPlansPassAndEveryEditIsRefused) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int checked = 0, wide_checked = 0;
  for (const char* mode : {"k=mse4,v=mse3,nc", "k=prod3,v=mse2", "k=mse2,v=mse2", "k=mse4,v=mse4,w=8",
                           "k=prod4,v=mse3", "k=mse5,v=mse3,nc"}) {
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    for (const std::uint32_t d : {64u, 128u, 256u}) {
      if (!decode_supported(d, config)) continue;
      const bool has_wide = decode_has_wide(d, config.key_code_bits(), config.has_qjl());
      for (int i = 0; i < 40; ++i) {
        const bool wide = has_wide && rng() % 2 == 0;
        const DecodePlan plan = consistent_plan(rng, config, d, wide);
        SCOPED_TRACE(std::string(mode) + " d " + std::to_string(d) + " max_length " + std::to_string(plan.max_length) +
                     " chunk " + std::to_string(plan.chunk) + " splits " + std::to_string(plan.splits) +
                     (wide ? " wide" : ""));
        // The workspace's regions (partial outputs, log-sum-exps, arrival words) are disjoint and inside it.
        const DecodeWorkspace w = decode_workspace(plan.layout, plan.q_heads, plan.splits);
        const std::uint64_t parts = std::uint64_t{plan.layout.sequences} * plan.q_heads * (plan.splits + 1);
        const std::uint64_t words = std::uint64_t{plan.layout.sequences} * plan.layout.kv_heads *
                                    ((plan.q_heads / plan.layout.kv_heads + kDecodeGroup - 1) / kDecodeGroup);
        EXPECT_GE(w.lse_offset, parts * d * 4);
        EXPECT_GE(w.arrivals_offset, w.lse_offset + parts * 4);
        EXPECT_GE(w.bytes, w.arrivals_offset + words * 8);
        EXPECT_EQ(w.lse_offset % 256 + w.arrivals_offset % 256, 0u);
        const Status fine = check_decode_plan(plan);
        ASSERT_TRUE(fine.ok()) << fine.error().to_string();
        ++checked;
        wide_checked += wide ? 1 : 0;
        const std::uint32_t tile = decode_tile_tokens(d, config.key_code_bits(), config.value_bits, wide);

        DecodePlan e = plan;
        e.max_length = plan.layout.capacity + 1;  // (checked before the splits' cover of it)
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "max_length"));
        if (!has_wide) {
          e = plan;
          e.wide = true;
          EXPECT_TRUE(refused_naming(check_decode_plan(e), "wide"));
        }
        e = plan;
        e.chunk = 0;
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "chunk"));
        e = plan;
        e.chunk = plan.chunk + tile / 2;  // covers as much, but splits no longer start on a tile
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "chunk"));
        e = plan;
        e.splits = 0;
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "splits"));
        e = plan;
        e.splits = static_cast<std::uint32_t>(kMaxDecodeSplits) + 1;
        e.workspace_bytes = decode_workspace(e.layout, e.q_heads, e.splits).bytes;
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "splits"));
        if (plan.max_length > tile) {  // a chunk of one tile with the plan's splits can leave tokens out
          e = plan;
          e.chunk = tile;
          e.splits = (plan.max_length - 1) / tile;  // one split short
          e.workspace_bytes = decode_workspace(e.layout, e.q_heads, e.splits).bytes;
          if (e.splits >= 1) {
            EXPECT_TRUE(refused_naming(check_decode_plan(e), "cover"));
          }
        }
        e = plan;
        e.splits = plan.splits + 1;  // one more split in a workspace sized for the plan's
        if (e.splits <= kMaxDecodeSplits) {
          EXPECT_TRUE(refused_naming(check_decode_plan(e), "workspace_bytes"));
        }
        e = plan;
        e.workspace_bytes = plan.workspace_bytes - 1;
        EXPECT_TRUE(refused_naming(check_decode_plan(e), "workspace_bytes"));
        e = plan;
        e.q_heads = plan.q_heads + 1;  // no longer a multiple of kv_heads (or, for one KV head, a larger workspace)
        const Status heads = check_decode_plan(e);
        EXPECT_FALSE(heads.ok());
        if (!heads.ok()) {
          EXPECT_EQ(heads.error().code, ErrorCode::InvalidArgument) << heads.error().to_string();
        }
      }
    }
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(wide_checked, 10);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
