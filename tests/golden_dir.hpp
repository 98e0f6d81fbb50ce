// Where the golden fixtures live: KVCOMPACT_TEST_DATA when set (ctest sets it), else tests/golden as
// configured at build time, so a test binary run by hand finds them too.
#pragma once

#include <cstdlib>
#include <filesystem>

namespace kvcompact::testing_support {

inline std::filesystem::path golden_dir() {
  if (const char* dir = std::getenv("KVCOMPACT_TEST_DATA"); dir != nullptr && *dir != '\0') return dir;
  return KVCOMPACT_GOLDEN_DIR;
}

}  // namespace kvcompact::testing_support
