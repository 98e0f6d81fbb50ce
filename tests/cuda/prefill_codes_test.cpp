// The warpgroup prefill producer's code arithmetic (src/cuda/prefill_codes.hpp), on the CPU: for every code width
// 1..5 and random staged tiles, the pair-table entries each producer thread computes for each of its groups equal
// the pairs of the codec's own read_code on the same bytes (the entry of coordinates 2k, 2k + 1 of a group is
// code(2k + 1) · 2^bits + code(2k)). On the device the 4-bit pairs are byte permutes (the GPU tests cover them).
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

// The producer's mapping (prefill_dequant.cuh): 128 threads, head_dim 128, 64-token tiles; thread pt takes group
// gg = pt % 16 of tokens pt / 16 + 8 j.
constexpr unsigned kD = 128, kTokens = 64, kThreads = 128, kGroups = kD / 8, kTokenStep = kThreads / kGroups;

template <unsigned kBits>
void check_width(std::mt19937_64& rng) {
  constexpr unsigned kRowBytes = kD * kBits / 8;
  SCOPED_TRACE("bits " + std::to_string(kBits));
  // A staged tile, 16-byte aligned (u32 storage), with the 4 bytes past the last row that a 3- or 5-bit group's
  // second word may read.
  std::vector<std::uint32_t> storage((kTokens * kRowBytes + 16) / 4);
  for (int round = 0; round < 20; ++round) {
    for (std::uint32_t& w : storage) w = static_cast<std::uint32_t>(rng());
    const auto* codes = reinterpret_cast<const std::uint8_t*>(storage.data());
    for (unsigned pt = 0; pt < kThreads; ++pt) {
      const unsigned gg = pt % kGroups, tt0 = pt / kGroups;
      const CodeGroups<kBits> groups(codes + tt0 * kRowBytes + gg * kBits);
      for (unsigned j = 0; j < kTokens / kTokenStep; ++j) {
        const unsigned tt = tt0 + j * kTokenStep;
        std::uint32_t e[4];
        pair_entries<kBits>(groups.at(j * kTokenStep * kRowBytes), e);
        const std::uint8_t* row = codes + tt * kRowBytes;
        for (unsigned k = 0; k < 4; ++k) {
          const std::uint32_t lo = kvcompact::tq::read_code(row, 8 * gg + 2 * k, kBits);
          const std::uint32_t hi = kvcompact::tq::read_code(row, 8 * gg + 2 * k + 1, kBits);
          ASSERT_EQ(e[k], (hi << kBits) | lo) << "thread " << pt << " token " << tt << " pair " << k;
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

// A group of 3 or 5 bits may start at any byte of its aligned word: the per-thread shift takes it to bit 0 for
// every start (byte offsets 0..3 past a 16-byte boundary, the staged row's first group and later ones).
TEST(PrefillCodes, MisalignedGroupsAreShiftedToBitZero) {
  std::vector<std::uint32_t> storage(8);
  auto* bytes = reinterpret_cast<std::uint8_t*>(storage.data());
  for (unsigned i = 0; i < 32; ++i) bytes[i] = static_cast<std::uint8_t>(0x11 * (i + 1));
  for (unsigned off = 0; off < 16; ++off) {
    const CodeGroups<5> five(bytes + off);
    std::uint64_t expect = 0;
    for (unsigned b = 0; b < 5; ++b) expect |= std::uint64_t{bytes[off + b]} << (8 * b);
    EXPECT_EQ(five.at(0) & ((std::uint64_t{1} << 40) - 1), expect) << "offset " << off;
    const CodeGroups<3> three(bytes + off);
    EXPECT_EQ(three.at(0) & 0xFFFFFFu, expect & 0xFFFFFFu) << "offset " << off;
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail::prefill
