// Deterministic pseudo-random streams for TurboQuant's rotation signs: SplitMix64 (seed expansion) and
// xoshiro256** (the sign stream), plus the seed derivations shared with the seed system (cera 0.4.0),
// so a cache written by either system draws the same ±1 signs. docs/turboquant-math.md has the details.
#pragma once

#include <array>
#include <cstdint>

namespace kvcompact::tq {

// Weyl increment of SplitMix64 (2^64 / golden ratio); also the multiplier of the QJL seed derivation.
inline constexpr std::uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c): state += γ, then a 64-bit mix of the state.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  std::uint64_t state() const { return state_; }

 private:
  std::uint64_t state_;
};

// xoshiro256** 1.0 (Blackman, Vigna 2018). The seeding constructor fills the four state words with the
// first four SplitMix64(seed) outputs, exactly as the seed system does.
class Xoshiro256StarStar {
 public:
  explicit Xoshiro256StarStar(std::uint64_t seed);
  // Raw state, for known-answer tests against the published reference outputs. Not all zero.
  static Xoshiro256StarStar from_state(const std::array<std::uint64_t, 4>& state);

  std::uint64_t next_u64();
  const std::array<std::uint64_t, 4>& state() const { return state_; }

 private:
  Xoshiro256StarStar() = default;
  std::array<std::uint64_t, 4> state_{};
};

// Per-layer seed: the configuration seed XOR the model layer index (every layer counts, attention or not).
constexpr std::uint64_t layer_seed(std::uint64_t seed, std::uint32_t layer_index) {
  return seed ^ static_cast<std::uint64_t>(layer_index);
}

// Seed of the QJL sign stream, derived from the *per-layer* seed (not the base seed):
// layer_seed · 0x9E3779B97F4A7C15 + 1, wrapping mod 2^64.
constexpr std::uint64_t qjl_stream_seed(std::uint64_t layer_seed_value) {
  return layer_seed_value * kGoldenGamma + 1u;
}

}  // namespace kvcompact::tq
