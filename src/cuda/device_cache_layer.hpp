// Internal: one layer of a DeviceCache — its layout, codec, device buffer and the host / device copies of the
// sequences' lengths and window starts. Shared by tq_cache.cpp, tq_cache_deferred.cpp and
// tq_cache_device_lengths.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "append_commit.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_cache.hpp"

namespace kvcompact::cuda::tq {

struct DeviceCache::Layer {
  std::uint32_t kv_heads = 0;
  LayerLayout layout{};
  std::unique_ptr<DeviceCodec> codec;
  DeviceBuffer data;                        // [layer_buffer_bytes(layout)]
  std::vector<std::uint32_t> lengths;       // host copies
  std::vector<std::uint32_t> window_begins;
  // Device mirror for the kernels: lengths, then window_begins ([2][sequences], so one upload commits both); the
  // layer's part of DeviceCache::positions_ (so one copy brings every layer's back).
  std::uint32_t* device_positions = nullptr;
  std::uint32_t* device_lengths() { return device_positions; }
  const std::uint32_t* device_lengths() const { return device_positions; }
  std::uint32_t* device_window_begins() { return device_lengths() + lengths.size(); }
  const std::uint32_t* device_window_begins() const { return device_lengths() + lengths.size(); }
  // The commit kernel's targets in this layer (append_commit.hpp): the device lengths and the exact-window ring
  // it writes the accepted rows to; the caller adds where the verdicts go.
  detail::CommitTargets commit_targets() {
    detail::CommitTargets t;
    t.lengths = device_lengths();
    t.ring.layer = static_cast<std::uint8_t*>(data.data());
    t.ring.keys_offset = layout.window_keys_offset;
    t.ring.values_offset = layout.window_values_offset;
    t.ring.window = layout.exact_window;
    t.ring.kv_heads = layout.kv_heads;
    t.ring.head_dim = layout.head_dim;
    return t;
  }
};

}  // namespace kvcompact::cuda::tq
