// The DSV4 math's one entry to threading: core/parallel.hpp's parallel_for when the core module has it,
// otherwise a plain loop. Bodies write disjoint outputs, so results never depend on the thread count.
#pragma once

#include <cstddef>
#include <functional>

#if __has_include("kvcompact/core/parallel.hpp")
#include "kvcompact/core/parallel.hpp"
#define KVC_DSV4_HAVE_PARALLEL 1
#endif

namespace kvcompact::dsv4 {

template <typename Body>
void math_parallel_for(std::size_t begin, std::size_t end, std::size_t grain, Body&& body) {
  if (begin >= end) return;
#ifdef KVC_DSV4_HAVE_PARALLEL
  // std::ref keeps the std::function parameter from copying (and allocating for) a large lambda.
  ::kvcompact::parallel_for(begin, end, grain, std::ref(body));
#else
  (void)grain;
  body(begin, end);
#endif
}

}  // namespace kvcompact::dsv4
