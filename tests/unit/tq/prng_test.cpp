// PRNG streams: SplitMix64 and xoshiro256** against their published reference outputs, the seeding
// chain the seed system uses (xoshiro state = first four SplitMix64 outputs), and the seed derivations.
// Expected values were computed independently with a Python transcription of the published algorithms.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <set>

#include "kvcompact/tq/prng.hpp"
#include "test_seed.hpp"

namespace kvcompact::tq {
namespace {

TEST(SplitMix64, PublishedOutputsForSeed1234567) {
  // Rosetta Code "Pseudo-random numbers/Splitmix64" reference sequence.
  SplitMix64 rng(1234567);
  const std::array<std::uint64_t, 5> expected = {6457827717110365317ull, 3203168211198807973ull,
                                                 9817491932198370423ull, 4593380528125082431ull,
                                                 16408922859458223821ull};
  for (const auto value : expected) EXPECT_EQ(rng.next(), value);
}

TEST(SplitMix64, OutputsForSeedZero) {
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
}

TEST(Xoshiro256StarStar, PublishedOutputsForState1234) {
  // Reference xoshiro256starstar.c with s = {1, 2, 3, 4}.
  auto rng = Xoshiro256StarStar::from_state({1, 2, 3, 4});
  const std::array<std::uint64_t, 6> expected = {11520ull,
                                                 0ull,
                                                 1509978240ull,
                                                 1215971899390074240ull,
                                                 1216172134540287360ull,
                                                 607988272756665600ull};
  for (const auto value : expected) EXPECT_EQ(rng.next_u64(), value);
}

TEST(Xoshiro256StarStar, SeededFromFirstFourSplitMixOutputs) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SplitMix64 expander(seed);
  std::array<std::uint64_t, 4> state{};
  for (auto& word : state) word = expander.next();
  Xoshiro256StarStar seeded(seed);
  EXPECT_EQ(seeded.state(), state);
  auto direct = Xoshiro256StarStar::from_state(state);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(seeded.next_u64(), direct.next_u64()) << "output " << i;
}

TEST(Xoshiro256StarStar, KnownOutputsFromSeeds) {
  Xoshiro256StarStar zero(0);
  EXPECT_EQ(zero.next_u64(), 0x99EC5F36CB75F2B4ull);
  EXPECT_EQ(zero.next_u64(), 0xBF6E1F784956452Aull);
  EXPECT_EQ(zero.next_u64(), 0x1A5F849D4933E6E0ull);
  EXPECT_EQ(zero.next_u64(), 0x6AA594F1262D2D2Cull);
  Xoshiro256StarStar forty_two(42);
  EXPECT_EQ(forty_two.next_u64(), 0x15780B2E0C2EC716ull);
  EXPECT_EQ(forty_two.next_u64(), 0x6104D9866D113A7Eull);
  EXPECT_EQ(forty_two.next_u64(), 0xAE17533239E499A1ull);
  EXPECT_EQ(forty_two.next_u64(), 0xECB8AD4703B360A1ull);
}

TEST(Xoshiro256StarStar, LowBitIsBalanced) {
  // The sign stream uses the low bit; it must be close to fair (binomial, n = 2^16: σ = 128).
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Xoshiro256StarStar rng(seed);
  int ones = 0;
  for (int i = 0; i < (1 << 16); ++i) ones += static_cast<int>(rng.next_u64() & 1u);
  EXPECT_NEAR(ones, 1 << 15, 6 * 128);
}

TEST(SeedDerivation, LayerSeedIsXor) {
  EXPECT_EQ(layer_seed(42, 3), 41u);
  EXPECT_EQ(layer_seed(0, 7), 7u);
  EXPECT_EQ(layer_seed(0xFFFFFFFF00000000ull, 5), 0xFFFFFFFF00000005ull);
}

TEST(SeedDerivation, QjlSeedWrapsModulo2To64) {
  EXPECT_EQ(qjl_stream_seed(0), 1u);
  EXPECT_EQ(qjl_stream_seed(1), 0x9E3779B97F4A7C16ull);
  EXPECT_EQ(qjl_stream_seed(41), 0x56E27EB562EDDF5Eull);  // layer_seed(42, 3)
  EXPECT_EQ(qjl_stream_seed(0xFFFFFFFFFFFFFFFFull), 0x61C8864680B583ECull);  // −γ + 1
}

TEST(SeedDerivation, StreamsOfDifferentLayersAreDistinct) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::set<std::uint64_t> seeds;
  for (std::uint32_t layer = 0; layer < 256; ++layer) {
    const std::uint64_t s = layer_seed(seed, layer);
    seeds.insert(s);
    seeds.insert(qjl_stream_seed(s));
  }
  EXPECT_EQ(seeds.size(), 512u);
}

}  // namespace
}  // namespace kvcompact::tq
