// The one place kvcompact aborts: a broken internal invariant (never a bad input).
#include "kvcompact/core/assert.hpp"

#include <cstdio>
#include <cstdlib>

namespace kvcompact::detail {

void assertion_failed(const char* expr, const char* file, int line, const char* message) {
  std::fprintf(stderr, "kvcompact internal invariant failed: %s (%s) at %s:%d\n", expr, message, file, line);
  std::abort();
}

}  // namespace kvcompact::detail
