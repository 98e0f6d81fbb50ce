// Host launcher of the window-write kernel (window.cu): the shared span checks, the params in pieces of
// kMaxItemsPerLaunch sequences, and the NaN / inf report (cache_internal.hpp finish_launches).
#include <algorithm>

#include "cache_internal.hpp"
#include "cache_params.hpp"
#include "cuda/check.hpp"

namespace kvcompact::cuda::dsv4 {

Status write_window(std::span<const LayerSpan> spans, std::uint32_t layer, const KernelOptions& options,
                    void* stream) {
  KVC_TRY(validate_spans(spans, layer));
  const kd::CachePlan& plan = spans[0].cache->plan();
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  Status launched = [&]() -> Status {
    for (std::size_t base = 0; base < spans.size(); base += detail::kMaxItemsPerLaunch) {
      const std::size_t n = std::min<std::size_t>(detail::kMaxItemsPerLaunch, spans.size() - base);
      detail::WindowParams p{};
      p.n_items = static_cast<std::uint32_t>(n);
      p.storage = static_cast<std::uint32_t>(plan.storage.attention);
      p.row_bytes = plan.layers[layer].attention_row_bytes;
      p.capacity = plan.window_capacity;
      p.check_finite = options.check_finite ? 1u : 0u;
      std::uint64_t max_count = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const LayerSpan& s = spans[base + i];
        const DeviceLayerView v = s.cache->layer_view(layer);
        p.items[i] = detail::WindowItem{v.window, s.kv, s.chunk_rows, s.cache->status_word(), s.cache->position(),
                                        s.count};
        max_count = std::max(max_count, s.count);
      }
      KVC_CUDA_TRY(detail::launch_window_write(p, max_count, st));
    }
    return ok_status();
  }();
  if (!launched.ok()) {
    for (const LayerSpan& s : spans) {
      if (!s.cache->poisoned()) s.cache->poison("window write launch failed: " + launched.error().to_string());
    }
    return launched;
  }
  return finish_launches(spans, layer, "window write", options, stream);
}

}  // namespace kvcompact::cuda::dsv4
