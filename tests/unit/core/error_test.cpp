// Result / Error plumbing and checked arithmetic.
#include <gtest/gtest.h>

#include <limits>

#include "kvcompact/core/checked.hpp"
#include "kvcompact/core/error.hpp"

namespace kvcompact {
namespace {

Result<int> half_of_even(int x) {
  if (x % 2 != 0) return make_error(ErrorCode::InvalidArgument, "{} is odd", x);
  return x / 2;
}

Result<int> quarter(int x) {
  KVC_ASSIGN_OR_RETURN(int h, half_of_even(x));
  KVC_ASSIGN_OR_RETURN(int q, half_of_even(h));
  return q;
}

TEST(Error, PropagatesWithMessageNamingValue) {
  EXPECT_EQ(*quarter(8), 2);
  auto r = quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(r.error().message, "3 is odd");
  EXPECT_EQ(r.error().to_string(), "InvalidArgument: 3 is odd");
}

TEST(Checked, DetectsOverflow) {
  constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(*checked_add(2, 3), 5u);
  EXPECT_FALSE(checked_add(kMax, 1).ok());
  EXPECT_EQ(checked_add(kMax, 1).error().code, ErrorCode::Overflow);
  EXPECT_EQ(*checked_mul(1u << 20, 1u << 20), 1ull << 40);
  EXPECT_FALSE(checked_mul(1ull << 32, 1ull << 32).ok());
  EXPECT_EQ(*checked_product({2, 3, 7}), 42u);
  EXPECT_FALSE(checked_product({1ull << 40, 1ull << 30}).ok());
  EXPECT_EQ(*checked_sum({1, 2, 3}), 6u);
  EXPECT_FALSE(checked_sum({kMax, 0, 1}).ok());
}

}  // namespace
}  // namespace kvcompact
