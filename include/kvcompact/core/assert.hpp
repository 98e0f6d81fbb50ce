// Internal invariants: KVC_ASSERT stays on in release builds (it guards cheap checks whose failure
// means a bug in kvcompact, not a bad input). Bad inputs return typed errors instead.
#pragma once

namespace kvcompact::detail {
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const char* message);
}

#define KVC_ASSERT(cond, message)                                                        \
  do {                                                                                   \
    if (!(cond)) ::kvcompact::detail::assertion_failed(#cond, __FILE__, __LINE__, message); \
  } while (0)
