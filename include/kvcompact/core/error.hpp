// Typed errors and Result<T> for every fallible public call.
// Expected outcomes (bad arguments, corrupt blobs, cache full) are values, never exceptions or aborts;
// the message always names the offending values so a user can act on it without a debugger.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kvcompact {

enum class ErrorCode : std::uint8_t {
  InvalidArgument,   // a value outside what the API accepts
  Unsupported,       // a valid value this build / mode does not handle
  Overflow,          // checked 64-bit size arithmetic overflowed
  OutOfRange,        // an index or position outside the valid range
  NonFinite,         // NaN or inf in input data
  Truncated,         // a blob / image shorter than its header says
  Corrupt,           // checksum or structural damage in a blob / image
  Mismatch,          // a well-formed blob that belongs to another seed / mode / shape / plan
  CapacityExceeded,  // a cache has no room for the requested tokens
  Io,                // file system failure
  // DeepSeek-V4 cache protocol (see docs/deepseek-v4.md)
  EmptyContext,
  ContextBound,
  SlidingWindow,
  LayerCount,
  CompressionRatio,
  MalformedConfig,
  Accounting,
  Poisoned,
  ContextExhausted,
  StepOutOfOrder,
  EmptyPrefill,
  Internal,
};

std::string_view error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  // Structured detail for errors that carry two numbers (StepOutOfOrder{expected, actual},
  // ContextBound{limit, requested}, ...); zero when unused.
  std::int64_t expected = 0;
  std::int64_t actual = 0;

  std::string to_string() const { return fmt::format("{}: {}", error_code_name(code), message); }
};

template <typename... Args>
Error make_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Error{code, fmt::format(format, std::forward<Args>(args)...), 0, 0};
}

// Result<T>: a value or an Error. Result<void> is the plain status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : storage_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return storage_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(storage_); }
  const T& value() const& { return std::get<0>(storage_); }
  T&& value() && { return std::get<0>(std::move(storage_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { return std::get<1>(storage_); }
  Error&& error() && { return std::get<1>(std::move(storage_)); }

 private:
  std::variant<T, Error> storage_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const& { return error_; }
  Error&& error() && { return std::move(error_); }

 private:
  Error error_{};
  bool ok_ = true;
};

using Status = Result<void>;

inline Status ok_status() { return Status{}; }

}  // namespace kvcompact

#define KVC_CONCAT_INNER(a, b) a##b
#define KVC_CONCAT(a, b) KVC_CONCAT_INNER(a, b)

// Propagate an error from an expression returning Result<...>.
#define KVC_TRY(expr)                                            \
  do {                                                           \
    auto&& kvc_try_result_ = (expr);                             \
    if (!kvc_try_result_.ok()) return std::move(kvc_try_result_).error(); \
  } while (0)

// `KVC_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its error.
#define KVC_ASSIGN_OR_RETURN(decl, expr) \
  KVC_ASSIGN_OR_RETURN_IMPL(KVC_CONCAT(kvc_result_, __LINE__), decl, expr)
#define KVC_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).error();    \
  decl = std::move(tmp).value()
