// Seeds of the randomised tests: a fresh one per call, which the tests print on failure (SCOPED_TRACE); with
// KVCOMPACT_TEST_SEED set to a decimal seed every call returns that seed instead, so a failure seen once can be
// replayed (a test that draws several seeds then runs all its cases on the one given).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>

namespace kvcompact::testing_support {

inline std::uint64_t fresh_seed() {
  if (const char* env = std::getenv("KVCOMPACT_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 10);
  }
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace kvcompact::testing_support
