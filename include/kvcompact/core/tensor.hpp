// TensorView<T>: a non-owning, rank 1-4 strided view of a host array (T may be const), for passing rows,
// heads and tiles around without copying. Strides count elements, are non-negative, and may be 0 (broadcast).
// checked_view() validates shapes that come from callers; make_view() is for shapes the code already trusts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/checked.hpp"
#include "kvcompact/core/error.hpp"

// operator() checks rank and bounds only when this is 1 (the default in builds without NDEBUG);
// at() always checks.
#ifndef KVCOMPACT_CHECK_BOUNDS
#ifdef NDEBUG
#define KVCOMPACT_CHECK_BOUNDS 0
#else
#define KVCOMPACT_CHECK_BOUNDS 1
#endif
#endif

namespace kvcompact {

inline constexpr std::size_t kMaxTensorRank = 4;

namespace detail {
// "[2, 3, 4]" for error messages.
inline std::string format_dims(std::span<const std::size_t> dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += i == 0 ? fmt::format("{}", dims[i]) : fmt::format(", {}", dims[i]);
  return out + "]";
}

// Product of the dims: 0 if any dim is 0 (whatever the others), else Overflow if it does not fit.
inline Result<std::uint64_t> dims_product(std::span<const std::size_t> dims) {
  for (std::size_t d : dims) {
    if (d == 0) return std::uint64_t{0};
  }
  std::uint64_t acc = 1;
  for (std::size_t d : dims) {
    KVC_ASSIGN_OR_RETURN(acc, checked_mul(acc, d));
  }
  return acc;
}

// Number of elements from the first to one past the last reachable element (0 for an empty view).
inline Result<std::uint64_t> dims_extent(std::span<const std::size_t> shape, std::span<const std::size_t> strides) {
  for (std::size_t d : shape) {
    if (d == 0) return std::uint64_t{0};
  }
  std::uint64_t last = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    KVC_ASSIGN_OR_RETURN(const std::uint64_t reach, checked_mul(shape[k] - 1, strides[k]));
    KVC_ASSIGN_OR_RETURN(last, checked_add(last, reach));
  }
  return checked_add(last, 1);
}
}  // namespace detail

template <typename T>
class TensorView {
 public:
  using element_type = T;

  // An empty view: no data, rank 0, numel 0.
  TensorView() = default;

  // TensorView<U> -> TensorView<const U>.
  template <typename U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  TensorView(const TensorView<U>& other)  // NOLINT: implicit like T* -> const T*
      : data_(other.data_), rank_(other.rank_), shape_(other.shape_), strides_(other.strides_),
        numel_(other.numel_) {}

  T* data() const { return data_; }
  std::size_t rank() const { return rank_; }
  std::span<const std::size_t> shape() const { return {shape_.data(), rank_}; }
  std::span<const std::size_t> strides() const { return {strides_.data(), rank_}; }
  std::size_t dim(std::size_t k) const {
    KVC_ASSERT(k < rank_, "TensorView::dim: axis beyond the rank");
    return shape_[k];
  }
  std::size_t stride(std::size_t k) const {
    KVC_ASSERT(k < rank_, "TensorView::stride: axis beyond the rank");
    return strides_[k];
  }
  // Product of the shape; it was checked not to overflow when the view was made.
  std::size_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }

  // Row-major dense: the last axis has stride 1 and each axis steps over the whole of the next.
  // Axes of size 1 may have any stride; a view with 0 or 1 elements is contiguous.
  bool is_contiguous() const {
    if (numel_ <= 1) return true;
    std::size_t expected = 1;
    for (std::size_t k = rank_; k-- > 0;) {
      if (shape_[k] != 1 && strides_[k] != expected) return false;
      expected *= shape_[k];
    }
    return true;
  }

  // Element at the given indices (one per axis). Unchecked in release builds; see KVCOMPACT_CHECK_BOUNDS.
  template <typename... I>
    requires(sizeof...(I) >= 1 && sizeof...(I) <= kMaxTensorRank && (std::is_integral_v<I> && ...))
  T& operator()(I... idx) const {
    const std::array<std::size_t, sizeof...(I)> ix{static_cast<std::size_t>(idx)...};
#if KVCOMPACT_CHECK_BOUNDS
    check_indices(ix);
#endif
    return data_[offset_of(ix)];
  }

  // operator() that always checks rank and bounds (aborts: an index outside the view is a bug).
  template <typename... I>
    requires(sizeof...(I) >= 1 && sizeof...(I) <= kMaxTensorRank && (std::is_integral_v<I> && ...))
  T& at(I... idx) const {
    // Negative indices become huge after the cast, so the bounds check rejects them too.
    const std::array<std::size_t, sizeof...(I)> ix{static_cast<std::size_t>(idx)...};
    check_indices(ix);
    return data_[offset_of(ix)];
  }

  // The sub-range [begin, end) of axis `dim`, same rank. Asserts the range lies inside the axis.
  TensorView slice(std::size_t dim, std::size_t begin, std::size_t end) const {
    KVC_ASSERT(dim < rank_, "TensorView::slice: axis beyond the rank");
    KVC_ASSERT(begin <= end && end <= shape_[dim], "TensorView::slice: range outside the axis");
    TensorView out = *this;
    out.shape_[dim] = end - begin;
    // Cannot overflow: every dim is no larger than in this view, whose product was checked.
    out.numel_ = static_cast<std::size_t>(detail::dims_product(out.shape()).value());
    // An empty result keeps the old pointer so no pointer is formed past the buffer.
    if (out.numel_ != 0) out.data_ = data_ + begin * strides_[dim];
    return out;
  }

 private:
  template <typename>
  friend class TensorView;
  template <typename U>
  friend TensorView<U> make_view(U*, std::span<const std::size_t>);
  template <typename U>
  friend Result<TensorView<U>> checked_view(U*, std::size_t, std::span<const std::size_t>,
                                            std::span<const std::size_t>);

  template <std::size_t N>
  void check_indices(const std::array<std::size_t, N>& ix) const {
    KVC_ASSERT(N == rank_, "TensorView: number of indices differs from the rank");
    for (std::size_t k = 0; k < N; ++k) KVC_ASSERT(ix[k] < shape_[k], "TensorView: index outside the shape");
  }

  template <std::size_t N>
  std::size_t offset_of(const std::array<std::size_t, N>& ix) const {
    std::size_t off = 0;
    for (std::size_t k = 0; k < N; ++k) off += ix[k] * strides_[k];
    return off;
  }

  T* data_ = nullptr;
  std::size_t rank_ = 0;
  std::array<std::size_t, kMaxTensorRank> shape_{};
  std::array<std::size_t, kMaxTensorRank> strides_{};
  std::size_t numel_ = 0;
};

// Contiguous row-major view of a buffer the caller knows is large enough. Asserts rank 1-4 and that the
// element count fits 64 bits; use checked_view for shapes from outside.
template <typename T>
TensorView<T> make_view(T* ptr, std::span<const std::size_t> shape) {
  KVC_ASSERT(shape.size() >= 1 && shape.size() <= kMaxTensorRank, "make_view: rank must be 1..4");
  auto numel = detail::dims_product(shape);
  KVC_ASSERT(numel.ok(), "make_view: element count overflows 64 bits");
  TensorView<T> view;
  view.data_ = ptr;
  view.rank_ = shape.size();
  std::size_t stride = 1;
  for (std::size_t k = shape.size(); k-- > 0;) {
    view.shape_[k] = shape[k];
    view.strides_[k] = stride;
    stride *= shape[k];  // no overflow: bounded by the checked product (or 0 when a dim is 0)
  }
  view.numel_ = static_cast<std::size_t>(*numel);
  return view;
}

template <typename T>
TensorView<T> make_view(T* ptr, std::initializer_list<std::size_t> shape) {
  return make_view(ptr, std::span<const std::size_t>(shape.begin(), shape.size()));
}

// A view over a buffer of `available_elements` elements starting at ptr, validated: rank 1-4, as many
// strides as dims, no 64-bit overflow, and every reachable element inside the buffer. An empty view
// (some dim 0) is valid for any pointer; a non-empty one needs a non-null pointer.
template <typename T>
Result<TensorView<T>> checked_view(T* ptr, std::size_t available_elements, std::span<const std::size_t> shape,
                                   std::span<const std::size_t> strides) {
  if (shape.size() < 1 || shape.size() > kMaxTensorRank) {
    return make_error(ErrorCode::InvalidArgument, "tensor rank {} (shape {}) is outside 1..{}", shape.size(),
                      detail::format_dims(shape), kMaxTensorRank);
  }
  if (strides.size() != shape.size()) {
    return make_error(ErrorCode::InvalidArgument, "shape {} has {} dims but strides {} has {}",
                      detail::format_dims(shape), shape.size(), detail::format_dims(strides), strides.size());
  }
  auto numel = detail::dims_product(shape);
  if (!numel.ok()) {
    return make_error(ErrorCode::Overflow, "element count of shape {} overflows 64 bits", detail::format_dims(shape));
  }
  // (Before the reach: a null pointer is the clearer error whatever size the caller claims for it.)
  if (ptr == nullptr && *numel != 0) {
    return make_error(ErrorCode::InvalidArgument, "null data pointer for a view of shape {}",
                      detail::format_dims(shape));
  }
  auto extent = detail::dims_extent(shape, strides);
  if (!extent.ok()) {
    return make_error(ErrorCode::Overflow, "shape {} with strides {} reaches past 2^64 elements",
                      detail::format_dims(shape), detail::format_dims(strides));
  }
  if (*extent > available_elements) {
    return make_error(ErrorCode::OutOfRange,
                      "shape {} with strides {} reaches element {} but the buffer holds {} elements",
                      detail::format_dims(shape), detail::format_dims(strides), *extent - 1, available_elements);
  }
  TensorView<T> view;
  view.data_ = ptr;
  view.rank_ = shape.size();
  for (std::size_t k = 0; k < shape.size(); ++k) {
    view.shape_[k] = shape[k];
    view.strides_[k] = strides[k];
  }
  view.numel_ = static_cast<std::size_t>(*numel);
  return view;
}

template <typename T>
Result<TensorView<T>> checked_view(T* ptr, std::size_t available_elements, std::initializer_list<std::size_t> shape,
                                   std::initializer_list<std::size_t> strides) {
  return checked_view(ptr, available_elements, std::span<const std::size_t>(shape.begin(), shape.size()),
                      std::span<const std::size_t>(strides.begin(), strides.size()));
}

// Contiguous row-major form: the strides follow from the shape.
template <typename T>
Result<TensorView<T>> checked_view(T* ptr, std::size_t available_elements, std::span<const std::size_t> shape) {
  if (shape.size() < 1 || shape.size() > kMaxTensorRank) {
    return make_error(ErrorCode::InvalidArgument, "tensor rank {} (shape {}) is outside 1..{}", shape.size(),
                      detail::format_dims(shape), kMaxTensorRank);
  }
  auto numel = detail::dims_product(shape);
  if (!numel.ok()) {
    return make_error(ErrorCode::Overflow, "element count of shape {} overflows 64 bits", detail::format_dims(shape));
  }
  std::array<std::size_t, kMaxTensorRank> strides{};
  std::size_t stride = 1;
  for (std::size_t k = shape.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= shape[k];  // bounded by the checked product, or 0 once a dim is 0
  }
  return checked_view(ptr, available_elements, shape, std::span<const std::size_t>(strides.data(), shape.size()));
}

template <typename T>
Result<TensorView<T>> checked_view(T* ptr, std::size_t available_elements, std::initializer_list<std::size_t> shape) {
  return checked_view(ptr, available_elements, std::span<const std::size_t>(shape.begin(), shape.size()));
}

}  // namespace kvcompact
