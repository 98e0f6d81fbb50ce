// Checked 64-bit size arithmetic: every size computed from untrusted numbers (blob headers, configs,
// user shapes) goes through these, so an overflow becomes a typed error instead of a short allocation.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kvcompact/core/error.hpp"

namespace kvcompact {

inline Result<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return make_error(ErrorCode::Overflow, "{} + {} overflows 64 bits", a, b);
  }
  return out;
}

inline Result<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return make_error(ErrorCode::Overflow, "{} * {} overflows 64 bits", a, b);
  }
  return out;
}

// Product of all factors, or Overflow naming the first pair that overflowed.
inline Result<std::uint64_t> checked_product(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t acc = 1;
  for (std::uint64_t f : factors) {
    KVC_ASSIGN_OR_RETURN(acc, checked_mul(acc, f));
  }
  return acc;
}

inline Result<std::uint64_t> checked_sum(std::initializer_list<std::uint64_t> terms) {
  std::uint64_t acc = 0;
  for (std::uint64_t t : terms) {
    KVC_ASSIGN_OR_RETURN(acc, checked_add(acc, t));
  }
  return acc;
}

}  // namespace kvcompact
