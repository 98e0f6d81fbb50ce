// The warpgroup prefill producer's code arithmetic (src/cuda/prefill_codes.hpp), on the CPU: the threads' quads
// cover a tile once, and for every code width 1..5 and random staged tiles the pair-table entries each producer
// thread computes for its quads equal the pairs of the codec's own read_code on the same bytes (the entry of
// coordinates 2k, 2k + 1 is code(2k + 1) · 2^bits + code(2k)). On the device the 2- and 4-bit quads are loaded as
// one vector (the GPU tests cover that).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/prefill_codes.hpp"
#include "kvcompact/tq/codec.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail::prefill {
namespace {

using kvcompact::tq::testing::fresh_seed;

// The producer's shape (prefill_dequant.cuh): 128 threads, head_dim 128, 64-token tiles.
constexpr unsigned kD = 128, kTokens = 64, kThreads = 128, kTokenStep = kThreads / kQuadGroups;

// Every (token, quad) of a tile is taken by exactly one thread and round.
TEST(PrefillCodes, QuadSlotsCoverATileOnce) {
  std::vector<int> taken(kTokens * kQuadGroups, 0);
  for (unsigned pt = 0; pt < kThreads; ++pt) {
    const QuadSlot slot = quad_slot(pt);
    ASSERT_LT(slot.token, kTokenStep);
    ASSERT_LT(slot.quad, kQuadGroups);
    for (unsigned j = 0; j < kTokens / kTokenStep; ++j) ++taken[(slot.token + j * kTokenStep) * kQuadGroups + slot.quad];
  }
  for (unsigned i = 0; i < taken.size(); ++i) EXPECT_EQ(taken[i], 1) << "token " << i / 4 << " quad " << i % 4;
}

// quad_slot's claim: within each quarter-warp (8 lanes), the 4-bit quads' 16-byte loads hit 8 distinct 16-byte bank
// slots of the staged rows, and each of its four 16-byte stores (group g of the quad) hits 8 distinct chunk
// positions of the SW128 tile (position ((column mod 64) / 8) XOR (row mod 8), as wgmma.cuh's sw128_offset).
TEST(PrefillCodes, QuarterWarpsLoadAndStoreWithoutBankConflicts) {
  for (unsigned j = 0; j < kTokens / kTokenStep; ++j) {
    for (unsigned u = 0; u < kThreads / 8; ++u) {
      for (unsigned g = 0; g < kQuadGroups; ++g) {
        std::vector<int> load_slot(8, 0), store_slot(8, 0);
        for (unsigned v = 0; v < 8; ++v) {
          const QuadSlot slot = quad_slot(8 * u + v);
          const unsigned tt = slot.token + j * kTokenStep;
          ++load_slot[(tt * 64 + slot.quad * 16) / 16 % 8];
          const unsigned col = (kQuadGroups * slot.quad + g) * 8;
          ++store_slot[((col % 64) / 8) ^ (tt % 8)];
        }
        for (unsigned i = 0; i < 8; ++i) {
          EXPECT_EQ(load_slot[i], 1) << "quarter-warp " << u << " load slot " << i;
          EXPECT_EQ(store_slot[i], 1) << "quarter-warp " << u << " group " << g << " store position " << i;
        }
      }
    }
  }
}

template <unsigned kBits>
void check_width(std::mt19937_64& rng) {
  constexpr unsigned kRowBytes = kD * kBits / 8;
  SCOPED_TRACE("bits " + std::to_string(kBits));
  std::vector<std::uint32_t> storage(kTokens * kRowBytes / 4);  // a staged tile, 16-byte aligned rows
  for (int round = 0; round < 20; ++round) {
    for (std::uint32_t& w : storage) w = static_cast<std::uint32_t>(rng());
    const auto* codes = reinterpret_cast<const std::uint8_t*>(storage.data());
    for (unsigned pt = 0; pt < kThreads; ++pt) {
      const QuadSlot slot = quad_slot(pt);
      for (unsigned j = 0; j < kTokens / kTokenStep; ++j) {
        const unsigned tt = slot.token + j * kTokenStep;
        const std::uint8_t* row = codes + tt * kRowBytes;
        const CodeQuad<kBits> quad(row + slot.quad * kQuadGroups * kBits);
        for (unsigned k = 0; k < 16; ++k) {  // pair k: coordinates 2k, 2k + 1 of the quad's 32
          const unsigned c = 32 * slot.quad + 2 * k;
          const std::uint32_t lo = kvcompact::tq::read_code(row, c, kBits);
          const std::uint32_t hi = kvcompact::tq::read_code(row, c + 1, kBits);
          ASSERT_EQ(quad.pair(k), (hi << kBits) | lo) << "thread " << pt << " token " << tt << " pair " << k;
        }
      }
    }
  }
}

TEST(PrefillCodes, PairEntriesEqualTheCodecsCodesForEveryWidth) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  check_width<1>(rng);
  check_width<2>(rng);
  check_width<3>(rng);
  check_width<4>(rng);
  check_width<5>(rng);
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail::prefill
