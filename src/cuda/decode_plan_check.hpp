// Internal: what a DecodePlan's fields must satisfy for decode_attention's kernels to stay inside the layer
// buffer, the workspace and their own shared memory. plan_decode makes plans that satisfy it; decode_attention
// re-checks every plan, because plans are plain structs and a field edited by hand (more splits, a larger
// max_length, the wide variant for a mode without one) would otherwise make the kernels read or write past their
// buffers or leave tokens out silently. Pure host code: unit-tested on the CPU (tests/cuda/decode_plan_check_test.cpp).
#pragma once

#include <cstdint>

#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/tq.hpp"

namespace kvcompact::cuda::tq::detail {

// The plan-time shape checks (plan_decode's): q_heads a positive multiple of kv_heads and a kernel for the
// head_dim and mode, the exact window within the kernels' limit (Unsupported), the grid's y and z dimensions
// within CUDA's 65535 (OutOfRange).
Status check_decode_shape(const LayerLayout& layout, const kvcompact::tq::QuantConfig& config, std::uint32_t q_heads);

// The workspace for `splits` splits: the partial outputs (f32, head_dim per part) and log-sum-exps of every
// (sequence, query head, split + 1), then one arrival word per (sequence, KV head, head group), each region
// 256-byte aligned. plan_decode sizes it, decode_attention points the kernels into it.
struct DecodeWorkspace {
  std::uint64_t lse_offset = 0;       // the log-sum-exps (the partial outputs start at 0)
  std::uint64_t arrivals_offset = 0;  // the arrival words of the in-kernel merge
  std::uint64_t bytes = 0;            // the whole workspace
};
DecodeWorkspace decode_workspace(const LayerLayout& layout, std::uint32_t q_heads, std::uint64_t splits);

// A plan's fields against each other: the shape checks above, then (InvalidArgument, naming the field)
// max_length ≤ the layout's capacity, `wide` only where the kernel has a wide variant, `chunk` a positive
// multiple of the instance's tile, 1 ≤ `splits` ≤ kMaxDecodeSplits, splits · chunk ≥ max_length (every token of
// a sequence within the plan falls in a split) and workspace_bytes ≥ decode_workspace's bytes.
Status check_decode_plan(const DecodePlan& plan);

}  // namespace kvcompact::cuda::tq::detail
