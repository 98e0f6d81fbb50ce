// Names for error codes, used in messages and by the bindings.
#include "kvcompact/core/error.hpp"

namespace kvcompact {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::Unsupported: return "Unsupported";
    case ErrorCode::Overflow: return "Overflow";
    case ErrorCode::OutOfRange: return "OutOfRange";
    case ErrorCode::NonFinite: return "NonFinite";
    case ErrorCode::Truncated: return "Truncated";
    case ErrorCode::Corrupt: return "Corrupt";
    case ErrorCode::Mismatch: return "Mismatch";
    case ErrorCode::CapacityExceeded: return "CapacityExceeded";
    case ErrorCode::Io: return "Io";
    case ErrorCode::EmptyContext: return "EmptyContext";
    case ErrorCode::ContextBound: return "ContextBound";
    case ErrorCode::SlidingWindow: return "SlidingWindow";
    case ErrorCode::LayerCount: return "LayerCount";
    case ErrorCode::CompressionRatio: return "CompressionRatio";
    case ErrorCode::MalformedConfig: return "MalformedConfig";
    case ErrorCode::Accounting: return "Accounting";
    case ErrorCode::Poisoned: return "Poisoned";
    case ErrorCode::ContextExhausted: return "ContextExhausted";
    case ErrorCode::StepOutOfOrder: return "StepOutOfOrder";
    case ErrorCode::EmptyPrefill: return "EmptyPrefill";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

}  // namespace kvcompact
