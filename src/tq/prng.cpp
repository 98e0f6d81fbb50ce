// SplitMix64 and xoshiro256** as published by their authors (constants and shifts from the papers);
// tests/unit/tq/prng_test.cpp checks them against the published reference outputs.
#include "kvcompact/tq/prng.hpp"

#include <bit>

#include "kvcompact/core/assert.hpp"

namespace kvcompact::tq {

std::uint64_t SplitMix64::next() {
  state_ += kGoldenGamma;
  std::uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Xoshiro256StarStar::Xoshiro256StarStar(std::uint64_t seed) {
  SplitMix64 expander(seed);
  for (auto& word : state_) word = expander.next();
}

Xoshiro256StarStar Xoshiro256StarStar::from_state(const std::array<std::uint64_t, 4>& state) {
  // The all-zero state is the generator's only fixed point; it would emit zeros forever.
  KVC_ASSERT(state[0] != 0 || state[1] != 0 || state[2] != 0 || state[3] != 0,
             "xoshiro256** state must not be all zero");
  Xoshiro256StarStar generator;
  generator.state_ = state;
  return generator;
}

std::uint64_t Xoshiro256StarStar::next_u64() {
  auto& s = state_;
  const std::uint64_t result = std::rotl(s[1] * 5u, 7) * 9u;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = std::rotl(s[3], 45);
  return result;
}

}  // namespace kvcompact::tq
