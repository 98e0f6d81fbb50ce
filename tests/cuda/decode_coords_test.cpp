// The decode kernel's coordinate orders and 2-bit register dequantisation (src/cuda/decode_coords.hpp),
// checked on the CPU (no device needed, so CI runs these): every order is a permutation of a lane's slice,
// and dequant2 returns, for random code words, the centroids of exactly the coordinates the orders name.
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
// at the coordinates key_coord / value_first name.
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
  // Keys: a lane's slice of D / 4 coordinates = D / 64 words.
  std::vector<std::uint32_t> kw(D / 64 > 0 ? D / 64 : 1);
  for (auto& w : kw) w = any(rng);
  for (unsigned kk = 0; kk < D / 16; ++kk) {
    const KeyPairSource src = key_pair_source(kk);
    const std::uint32_t n = nibble_codes(kw[src.word], src.j, src.upper);
    const std::uint32_t a0 = dequant2(n, false, lo, hi), a2 = dequant2(n, true, lo, hi);
    EXPECT_EQ(a0, half(code_at(kw, key_coord<2>(kk, 0))) | (half(code_at(kw, key_coord<2>(kk, 1))) << 16)) << "kk " << kk;
    EXPECT_EQ(a2, half(code_at(kw, key_coord<2>(kk, 2))) | (half(code_at(kw, key_coord<2>(kk, 3))) << 16)) << "kk " << kk;
  }
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

TEST(DecodeCoords, RegisterDequantOfTwoBitCodesFollowsTheOrders) {
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
