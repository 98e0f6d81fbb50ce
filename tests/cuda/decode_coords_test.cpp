// The decode kernel's coordinate orders and 2-bit register dequantisation (src/cuda/decode_coords.hpp),
// checked on the CPU (no device needed, so CI runs these): every order is a permutation of a lane's slice,
// the code byte the kernel reads for a k-step holds exactly the key codes of that step's slots, and dequant2
// returns, for random value code words, the centroids of exactly the coordinates the orders name.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/decode_coords.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq::detail {
namespace {

using kvcompact::tq::testing::fresh_seed;

template <int CB, int D>
void expect_key_order_is_a_permutation() {
  std::vector<int> seen(D / 4, 0);
  for (unsigned kk = 0; kk < D / 16; ++kk) {
    for (unsigned e = 0; e < 4; ++e) {
      const unsigned c = key_coord<CB>(kk, e);
      ASSERT_LT(c, D / 4u) << "CB " << CB << " D " << D << " kk " << kk << " e " << e;
      ++seen[c];
    }
  }
  for (unsigned c = 0; c < D / 4u; ++c) EXPECT_EQ(seen[c], 1) << "CB " << CB << " D " << D << " coordinate " << c;
}

template <int VB, int D>
void expect_value_order_is_a_permutation() {
  std::vector<int> seen(D / 8, 0);
  for (unsigned jb = 0; jb < D / 16; ++jb) {
    const unsigned a = value_first<D, VB>(jb), b = a + value_second_offset<VB>();
    ASSERT_LT(b, D / 8u) << "VB " << VB << " D " << D << " jb " << jb;
    ++seen[a];
    ++seen[b];
  }
  for (unsigned c = 0; c < D / 8u; ++c) EXPECT_EQ(seen[c], 1) << "VB " << VB << " D " << D << " coordinate " << c;
}

TEST(DecodeCoords, KeyAndValueOrdersArePermutations) {
  expect_key_order_is_a_permutation<1, 64>();
  expect_key_order_is_a_permutation<2, 64>();
  expect_key_order_is_a_permutation<2, 128>();
  expect_key_order_is_a_permutation<2, 256>();
  expect_key_order_is_a_permutation<3, 128>();
  expect_key_order_is_a_permutation<4, 256>();
  expect_key_order_is_a_permutation<5, 128>();
  expect_value_order_is_a_permutation<2, 64>();
  expect_value_order_is_a_permutation<2, 128>();
  expect_value_order_is_a_permutation<2, 256>();
  expect_value_order_is_a_permutation<3, 128>();
  expect_value_order_is_a_permutation<4, 64>();
}

TEST(DecodeCoords, BytePermMatchesPtxPrmtSemantics) {
  // {y:x} bytes 0..7 = 0x00..0x77 pattern: selector nibble k picks byte k.
  const std::uint32_t x = 0x33221100u, y = 0x77665544u;
  EXPECT_EQ(byte_perm(x, y, 0x3210), x);
  EXPECT_EQ(byte_perm(x, y, 0x7654), y);
  EXPECT_EQ(byte_perm(x, y, 0x5140), 0x55114400u);
  EXPECT_EQ(byte_perm(x, y, 0x7362), 0x77336622u);
}

// A word of sixteen random 2-bit codes per slice word; dequant2 must return the (lo, hi) table bytes of the codes
// at the coordinates value_first names.
template <int D>
void check_dequant(std::mt19937_64& rng) {
  std::uniform_int_distribution<std::uint32_t> any;
  std::uint16_t table[4];
  for (auto& t : table) t = static_cast<std::uint16_t>(any(rng));
  std::uint32_t lo = 0, hi = 0;
  for (unsigned e = 0; e < 4; ++e) {
    lo |= std::uint32_t{table[e] & 0xFFu} << (8 * e);
    hi |= std::uint32_t{static_cast<std::uint32_t>(table[e] >> 8)} << (8 * e);
  }
  auto code_at = [](const std::vector<std::uint32_t>& words, unsigned c) { return (words[c / 16] >> (2 * (c % 16))) & 3u; };
  auto half = [&](std::uint32_t code) { return std::uint32_t{table[code]}; };
  // Values: a lane group's slice of D / 8 coordinates (d = 64: eight codes in the low half of one word).
  std::vector<std::uint32_t> vw(D / 8 >= 16 ? D / 128 : 1);
  for (auto& w : vw) w = any(rng);
  if (D / 8 < 16) vw[0] &= 0xFFFFu;
  for (unsigned jb = 0; jb < D / 16; ++jb) {
    const ValuePairSource<D> src = value_pair_source<D>(jb);
    const std::uint32_t got = dequant2(nibble_codes(vw[src.word], src.j, src.upper), src.second, lo, hi);
    const unsigned first = value_first<D, 2>(jb), second = first + value_second_offset<2>();
    EXPECT_EQ(got, half(code_at(vw, first)) | (half(code_at(vw, second)) << 16)) << "D " << D << " jb " << jb;
  }
}

// The code-byte lookups of 2- and 4-bit keys: for random slices, the byte key_byte_source names holds the codes
// of key_coord's slots (2-bit: slots 0..3 as bits 0-1, 2-3, 4-5, 6-7; 4-bit: slots 0, 1 or 2, 3 as nibbles) —
// the order in which the kernel's table entries (low half first) hand them to the A fragment.
template <int CB, int D>
void check_key_bytes(std::mt19937_64& rng) {
  std::uniform_int_distribution<std::uint32_t> any;
  std::vector<std::uint32_t> words(D * CB / 4 / 32);
  for (auto& w : words) w = any(rng);
  auto code_at = [&](unsigned c) { return (words[CB * c / 32] >> (CB * c % 32)) & ((1u << CB) - 1u); };
  constexpr unsigned per_byte = 8 / CB;
  for (unsigned kk = 0; kk < D / 16; ++kk) {
    for (unsigned first = 0; first < 4; first += per_byte) {
      const KeyByteSource src = key_byte_source<CB>(kk, first);
      ASSERT_LT(src.word, words.size());
      const std::uint32_t byte = (words[src.word] >> (8 * src.byte)) & 0xFFu;
      for (unsigned i = 0; i < per_byte; ++i) {
        EXPECT_EQ((byte >> (CB * i)) & ((1u << CB) - 1u), code_at(key_coord<CB>(kk, first + i)))
            << "CB " << CB << " D " << D << " kk " << kk << " slot " << first + i;
      }
    }
  }
}

TEST(DecodeCoords, KeyCodeBytesHoldTheSlotsOfTheirStep) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 50; ++round) {
    check_key_bytes<2, 64>(rng);
    check_key_bytes<2, 128>(rng);
    check_key_bytes<2, 256>(rng);
    check_key_bytes<4, 64>(rng);
    check_key_bytes<4, 128>(rng);
    check_key_bytes<4, 256>(rng);
  }
}

TEST(DecodeCoords, RegisterDequantOfTwoBitValuesFollowsTheOrders) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    check_dequant<64>(rng);
    check_dequant<128>(rng);
    check_dequant<256>(rng);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
