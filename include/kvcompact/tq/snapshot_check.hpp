// Validation of a LayerSnapshot against the cache layer restoring it, shared by the CPU and CUDA caches
// so both accept and refuse exactly the same snapshots, with the same typed errors.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kvcompact/core/error.hpp"
#include "kvcompact/tq/cache.hpp"

namespace kvcompact::tq {

// The restoring side: one layer of a cache.
struct SnapshotTarget {
  std::uint32_t layer = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t kv_heads = 0;  // 0: a layer without attention
  QuantConfig config{};
  std::uint32_t capacity = 0;
  std::uint32_t exact_window = 0;
};

// One packed region of a snapshot and where it goes in the layer's buffer (LayerLayout offsets).
struct SnapshotRegion {
  const char* name;
  const std::vector<std::uint8_t>* bytes;  // [kv_heads][length][per_token]
  std::uint32_t per_token;
  std::uint64_t offset;
};
std::array<SnapshotRegion, 6> snapshot_regions(const LayerSnapshot& snapshot, const LayerLayout& layout);

// Same modes, bits, norm correction, seed and window.
bool same_quant_config(const QuantConfig& a, const QuantConfig& b);

// Checks, in order: layer index, shape, configuration and per-token bytes (Mismatch); a non-attention
// layer must be empty; length ≤ capacity (CapacityExceeded); every region's size (Truncated when short,
// Corrupt when long); the exact window fits W (Corrupt) and is finite (NonFinite).
Status validate_snapshot(const LayerSnapshot& snapshot, const SnapshotTarget& target);

}  // namespace kvcompact::tq
