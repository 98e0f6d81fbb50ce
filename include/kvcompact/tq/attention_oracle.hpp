// Float64 reference attention: the readable oracle the fast CPU path is tested against.
// It dequantises every stored key / value explicitly (LayerCodec::decode_key / decode_value, or the
// exact f32 row inside the window) and runs plain softmax attention in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/attention.hpp"

namespace kvcompact::tq {

// Per request, the output [rows, q_heads, head_dim] in double. Request output pointers are ignored.
Result<std::vector<std::vector<double>>> attention_oracle(const LayerView& layer,
                                                          std::span<const AttentionRequest> requests,
                                                          const AttentionOptions& options);

// Dense rows in double, for oracles built outside a cache (trace replays, explicit dequantisation).
struct DenseOracleRequest {
  std::uint32_t length = 0;
  std::uint32_t first_position = 0;
  std::uint32_t rows = 0;
  const double* keys = nullptr;    // [length, kv_heads, head_dim]
  const double* values = nullptr;  // [length, kv_heads, head_dim]
  const float* queries = nullptr;  // [rows, q_heads, head_dim]
};

// Exact softmax attention in double over dense rows, same semantics as attention_cpu.
Result<std::vector<std::vector<double>>> dense_attention_oracle(std::uint32_t head_dim, std::uint32_t kv_heads,
                                                                std::span<const DenseOracleRequest> requests,
                                                                const AttentionOptions& options);

}  // namespace kvcompact::tq
