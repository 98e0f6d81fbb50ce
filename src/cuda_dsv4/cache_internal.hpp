// Internal: the DeviceDeepseek4Cache's implementation (shared bookkeeping + device buffers), shared by the
// cache (cache.cpp), its snapshots / anchor images (cache_image.cpp) and the kernel launchers (window.cpp,
// compressor.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dsv4/cache_bookkeeping.hpp"
#include "kvcompact/cuda/dsv4_cache.hpp"
#include "kvcompact/cuda/runtime.hpp"

namespace kvcompact::cuda::dsv4 {

struct DeviceLayerBuffers {
  DeviceBuffer attention;  // [window_rows + compressed_rows] x attention_row_bytes
  DeviceBuffer indexer;    // [indexer_rows] x indexer_row_bytes (m = 4)
  DeviceBuffer kv_state;   // F32 [state_rows, state_cols]
  DeviceBuffer score_state;
  DeviceBuffer indexer_kv_state;  // F32 [8, 256] (m = 4)
  DeviceBuffer indexer_score_state;
  std::uint64_t allocated() const {
    return attention.size() + indexer.size() + kv_state.size() + score_state.size() + indexer_kv_state.size() +
           indexer_score_state.size();
  }
};

struct DeviceDeepseek4Cache::Impl : kd::CacheBookkeeping {
  std::vector<DeviceLayerBuffers> layers;
  DeviceBuffer status;  // one word the kernels OR flags into

  Status fill_states();  // kv 0, score -inf (synchronous uploads)
};

struct CacheAccessDevice {
  static DeviceDeepseek4Cache::Impl& impl(DeviceDeepseek4Cache& c) { return *c.impl_; }
  static const DeviceDeepseek4Cache::Impl& impl(const DeviceDeepseek4Cache& c) { return *c.impl_; }
};

// The runs of ring slots that positions [position - rows, position) occupy, in position order: at most two
// (the ring wraps once). Each run: first slot, first row of the position-ordered list, row count.
struct RingRun {
  std::uint64_t slot = 0;
  std::uint64_t first_row = 0;
  std::uint64_t rows = 0;
};
std::vector<RingRun> ring_runs(std::uint64_t position, std::uint64_t rows, std::uint64_t capacity);

// The launchers' common checks (see dsv4_cache.hpp "Checks shared by both launchers"). On success every
// span's cache is distinct, healthy, of the first cache's model and storage, with room for its tokens.
Status validate_spans(std::span<const LayerSpan> spans, std::uint32_t layer);

// After launches on `stream`: with checking, wait, read and clear each cache's status word; a set flag
// poisons every cache of the batch (their buffers were written) and returns NonFinite naming `what`.
Status finish_launches(std::span<const LayerSpan> spans, std::uint32_t layer, const char* what,
                       const KernelOptions& options, void* stream);

}  // namespace kvcompact::cuda::dsv4
