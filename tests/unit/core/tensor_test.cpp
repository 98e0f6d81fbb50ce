// TensorView: indexing against hand-computed offsets on random shapes and strides, contiguity, slices,
// const conversion, and checked_view's rejection of views that reach outside their buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvcompact/core/tensor.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

TEST(TensorView, MakeViewIsRowMajorContiguous) {
  std::vector<int> buf(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int>(i);
  auto v = make_view(buf.data(), {2, 3, 4, 5});
  EXPECT_EQ(v.rank(), 4u);
  EXPECT_EQ(v.numel(), 120u);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.stride(0), 60u);
  EXPECT_EQ(v.stride(1), 20u);
  EXPECT_EQ(v.stride(2), 5u);
  EXPECT_EQ(v.stride(3), 1u);
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t c = 0; c < 4; ++c)
        for (std::size_t d = 0; d < 5; ++d) ASSERT_EQ(v(a, b, c, d), static_cast<int>(((a * 3 + b) * 4 + c) * 5 + d));
  v(1, 2, 3, 4) = -7;
  EXPECT_EQ(buf.back(), -7);
  auto r1 = make_view(buf.data(), {7});
  EXPECT_EQ(r1(6), 6);
  EXPECT_EQ(r1.at(6), 6);
}

TEST(TensorView, RandomStridedViewsIndexLikeTheFormula) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    const std::size_t rank = 1 + rng() % 4;
    std::vector<std::size_t> shape(rank), strides(rank);
    std::size_t extent = 1;
    std::size_t dense_stride = 1;
    for (std::size_t k = rank; k-- > 0;) {
      shape[k] = 1 + rng() % 5;
      // Arbitrary (may overlap or broadcast), except every 4th round row-major dense so that
      // is_contiguous() sees both answers; a size-1 axis then gets a random stride.
      strides[k] = (round % 4 == 0 && shape[k] != 1) ? dense_stride : rng() % 40;
      dense_stride *= shape[k];
      extent += (shape[k] - 1) * strides[k];
    }
    std::vector<std::int64_t> buf(extent + rng() % 3);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::int64_t>(i) * 3 + 1;
    auto made = checked_view(buf.data(), buf.size(), std::span<const std::size_t>(shape),
                             std::span<const std::size_t>(strides));
    ASSERT_TRUE(made.ok()) << made.error().to_string() << " seed " << seed;
    TensorView<const std::int64_t> v = *made;
    std::size_t numel = 1;
    for (std::size_t d : shape) numel *= d;
    ASSERT_EQ(v.numel(), numel);
    std::array<std::size_t, 4> ix{};
    bool dense = true;  // contiguous by definition: element i in row-major order sits at offset i
    for (std::size_t flat = 0; flat < numel; ++flat) {
      std::size_t rest = flat;
      std::size_t offset = 0;
      for (std::size_t k = rank; k-- > 0;) {
        ix[k] = rest % shape[k];
        rest /= shape[k];
        offset += ix[k] * strides[k];
      }
      if (offset != flat) dense = false;
      const std::int64_t want = buf[offset];
      std::int64_t got = 0;
      switch (rank) {
        case 1: got = v(ix[0]); break;
        case 2: got = v(ix[0], ix[1]); break;
        case 3: got = v(ix[0], ix[1], ix[2]); break;
        default: got = v.at(ix[0], ix[1], ix[2], ix[3]); break;
      }
      ASSERT_EQ(got, want) << "seed " << seed << " round " << round << " flat " << flat;
    }
    EXPECT_EQ(v.is_contiguous(), dense) << "seed " << seed << " round " << round;
  }
}

TEST(TensorView, ContiguityEdgeCases) {
  float x[64] = {};
  auto a = checked_view(x, 64, {4, 1, 8}, {8, 999, 1});  // size-1 axis: its stride is irrelevant
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->is_contiguous());
  auto b = checked_view(x, 64, {4, 8}, {16, 1});  // row padding
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->is_contiguous());
  auto c = checked_view(x, 64, {8, 4}, {1, 8});  // transposed
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->is_contiguous());
  auto d = checked_view(x, 64, {3, 5}, {0, 1});  // broadcast rows
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->is_contiguous());
  EXPECT_EQ(&(*d)(2, 4), &x[4]);
}

TEST(TensorView, SliceSelectsTheSubRange) {
  std::vector<int> buf(6 * 10);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int>(i);
  auto v = make_view(buf.data(), {6, 10});
  auto rows = v.slice(0, 2, 5);
  EXPECT_EQ(rows.dim(0), 3u);
  EXPECT_EQ(rows.numel(), 30u);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows(0, 0), 20);
  EXPECT_EQ(rows(2, 9), 49);
  auto cols = v.slice(1, 3, 7);
  EXPECT_EQ(cols.numel(), 24u);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols(5, 3), 59 - 3);
  auto none = v.slice(0, 6, 6);
  EXPECT_EQ(none.numel(), 0u);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data(), v.data());
}

TEST(TensorView, ConstConversionAndDefault) {
  std::vector<float> buf(12, 1.5f);
  TensorView<float> v = make_view(buf.data(), {3, 4});
  TensorView<const float> c = v;
  static_assert(std::is_same_v<decltype(c(0, 0)), const float&>);
  static_assert(!std::is_convertible_v<TensorView<const float>, TensorView<float>>);
  EXPECT_EQ(c.data(), buf.data());
  EXPECT_EQ(c.numel(), 12u);
  EXPECT_EQ(c(2, 3), 1.5f);
  TensorView<int> empty;
  EXPECT_EQ(empty.rank(), 0u);
  EXPECT_EQ(empty.numel(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(CheckedView, AcceptsExactFitRejectsOneElementShort) {
  std::vector<float> buf(100);
  // Reaches element (3-1)*30 + (4-1)*7 + (5-1)*1 = 85, so 86 elements are needed.
  EXPECT_TRUE(checked_view(buf.data(), 86, {3, 4, 5}, {30, 7, 1}).ok());
  auto short_by_one = checked_view(buf.data(), 85, {3, 4, 5}, {30, 7, 1});
  ASSERT_FALSE(short_by_one.ok());
  EXPECT_EQ(short_by_one.error().code, ErrorCode::OutOfRange);
  const std::string& msg = short_by_one.error().message;
  EXPECT_NE(msg.find("85"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[30, 7, 1]"), std::string::npos) << msg;
  // Contiguous form: 4*5 = 20 elements.
  EXPECT_TRUE(checked_view(buf.data(), 20, {4, 5}).ok());
  auto contiguous_short = checked_view(buf.data(), 19, {4, 5});
  ASSERT_FALSE(contiguous_short.ok());
  EXPECT_EQ(contiguous_short.error().code, ErrorCode::OutOfRange);
  EXPECT_NE(contiguous_short.error().message.find("19"), std::string::npos) << contiguous_short.error().message;
  auto ok = checked_view(buf.data(), 20, {4, 5});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->is_contiguous());
  EXPECT_EQ(ok->stride(0), 5u);
}

TEST(CheckedView, RandomShapesAgainstExtentFormula) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<char> buf(4096);
  for (int round = 0; round < 2000; ++round) {
    const std::size_t rank = 1 + rng() % 4;
    std::vector<std::size_t> shape(rank), strides(rank);
    for (std::size_t k = 0; k < rank; ++k) {
      shape[k] = rng() % 7;  // 0 sometimes: an empty view reaches nothing
      strides[k] = rng() % 50;
    }
    const std::size_t available = rng() % 600;
    // Oracle (the numbers are small, so no overflow): last reachable element + 1, or 0 when empty.
    bool empty = false;
    std::uint64_t last = 0;
    for (std::size_t k = 0; k < rank; ++k) {
      if (shape[k] == 0) {
        empty = true;
      } else {
        last += (shape[k] - 1) * strides[k];
      }
    }
    const bool fits = empty || last + 1 <= available;
    auto v = checked_view(buf.data(), available, std::span<const std::size_t>(shape),
                          std::span<const std::size_t>(strides));
    ASSERT_EQ(v.ok(), fits) << "seed " << seed << " round " << round << (v.ok() ? "" : v.error().to_string());
    if (!v.ok()) {
      EXPECT_EQ(v.error().code, ErrorCode::OutOfRange);
    }
  }
}

TEST(CheckedView, RejectsBadRankStridesOverflowAndNull) {
  float x[8] = {};
  auto rank0 = checked_view(x, 8, std::span<const std::size_t>(), std::span<const std::size_t>());
  ASSERT_FALSE(rank0.ok());
  EXPECT_EQ(rank0.error().code, ErrorCode::InvalidArgument);
  auto rank5 = checked_view(x, 8, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1});
  ASSERT_FALSE(rank5.ok());
  EXPECT_EQ(rank5.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(rank5.error().message.find("rank 5"), std::string::npos) << rank5.error().message;
  auto mismatch = checked_view(x, 8, {2, 4}, {4});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().code, ErrorCode::InvalidArgument);
  // Element count overflows 64 bits.
  auto big = checked_view(x, kMax, {std::size_t{1} << 32, std::size_t{1} << 32}, {0, 0});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, ErrorCode::Overflow);
  // Reach overflows 64 bits although the count does not.
  auto far = checked_view(x, kMax, {3, 2}, {kMax / 2 + 1, 1});
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.error().code, ErrorCode::Overflow);
  auto contiguous_big = checked_view(x, kMax, {kMax, 2});
  ASSERT_FALSE(contiguous_big.ok());
  EXPECT_EQ(contiguous_big.error().code, ErrorCode::Overflow);
  // Null data only for an empty view.
  auto null_data = checked_view(static_cast<float*>(nullptr), 8, {2, 2});
  ASSERT_FALSE(null_data.ok());
  EXPECT_EQ(null_data.error().code, ErrorCode::InvalidArgument);
  // ... also when the claimed buffer is too small for the shape (the null pointer is reported, not the reach).
  EXPECT_EQ(checked_view(static_cast<float*>(nullptr), 0, {3}).error().code, ErrorCode::InvalidArgument);
  auto null_empty = checked_view(static_cast<float*>(nullptr), 0, {0, 5});
  ASSERT_TRUE(null_empty.ok());
  EXPECT_EQ(null_empty->numel(), 0u);
  // A zero dim makes the view empty whatever the other dims are.
  auto zero_first = checked_view(x, 0, {0, kMax, kMax}, {1, 1, 1});
  ASSERT_TRUE(zero_first.ok());
  EXPECT_EQ(zero_first->numel(), 0u);
}

// at() always checks; operator() checks when KVCOMPACT_CHECK_BOUNDS is on. Out-of-range is a bug: abort.
TEST(TensorViewDeathTest, AtAbortsOutsideTheShape) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> buf(6);
  auto v = make_view(buf.data(), {2, 3});
  EXPECT_DEATH((void)v.at(2, 0), "index outside the shape");
  EXPECT_DEATH((void)v.at(0, 3), "index outside the shape");
  EXPECT_DEATH((void)v.at(-1, 0), "index outside the shape");
  EXPECT_DEATH((void)v.at(1), "number of indices");
  EXPECT_DEATH((void)v.slice(0, 1, 3), "range outside the axis");
  EXPECT_DEATH((void)v.dim(2), "beyond the rank");
#if KVCOMPACT_CHECK_BOUNDS
  EXPECT_DEATH((void)v(0, 3), "index outside the shape");
#endif
}

}  // namespace
}  // namespace kvcompact
