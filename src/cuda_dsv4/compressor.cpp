// Host launcher of the compressor kernels (compressor.cu): the shared span checks, the weights, the
// compressed layers' RoPE table (dsv4::LayerRunner's: rope_config_for_layer(model, 4)), the params in
// pieces of kMaxItemsPerLaunch sequences, and the NaN / inf report.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cache_internal.hpp"
#include "cache_params.hpp"
#include "cuda/check.hpp"
#include "kvcompact/dsv4/rope.hpp"

namespace kvcompact::cuda::dsv4 {

Status run_compressors(std::span<const LayerSpan> spans, std::uint32_t layer, const CompressorWeights& weights,
                       const KernelOptions& options, void* stream) {
  KVC_TRY(validate_spans(spans, layer));
  const kd::CachePlan& plan = spans[0].cache->plan();
  const kd::LayerPlan& lp = plan.layers[layer];
  const std::uint32_t m = lp.ratio;
  if (m == 0) return ok_status();
  if (weights.ape == nullptr || weights.norm == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "layer {} (ratio {}) needs the compressor ape and norm weights",
                      layer, m);
  }
  if (m == 4 && (weights.indexer_ape == nullptr || weights.indexer_norm == nullptr)) {
    return make_error(ErrorCode::InvalidArgument, "layer {} (ratio 4) needs the indexer ape and norm weights", layer);
  }
  if (!std::isfinite(weights.norm_eps) || weights.norm_eps < 0.0f) {
    return make_error(ErrorCode::InvalidArgument, "norm_eps {} is not a finite non-negative value", weights.norm_eps);
  }
  const kd::RopeFrequencies rope = kd::make_rope_frequencies(kd::rope_config_for_layer(plan.model, m));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  Status launched = [&]() -> Status {
    for (std::size_t base = 0; base < spans.size(); base += detail::kMaxItemsPerLaunch) {
      const std::size_t n = std::min<std::size_t>(detail::kMaxItemsPerLaunch, spans.size() - base);
      detail::CompressorParams p{};
      p.n_items = static_cast<std::uint32_t>(n);
      p.ratio = m;
      p.coff = lp.coff;
      p.storage = static_cast<std::uint32_t>(plan.storage.attention);
      p.row_bytes = lp.attention_row_bytes;
      p.ape = weights.ape;
      p.norm = weights.norm;
      static_assert(sizeof(p.inv_freq) == sizeof(rope.inv_freq));
      std::memcpy(p.inv_freq, rope.inv_freq.data(), sizeof(p.inv_freq));
      p.norm_eps = weights.norm_eps;
      p.hadamard_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kd::kIndexerHeadDim)));
      p.check_finite = options.check_finite ? 1u : 0u;
      detail::CompressorLaunch how;
      for (std::size_t i = 0; i < n; ++i) {
        const LayerSpan& s = spans[base + i];
        const DeviceLayerView v = s.cache->layer_view(layer);
        p.items[i] = detail::CompressorItem{v.kv_state,        v.score_state, v.compressed, s.compressor_kv,
                                            s.compressor_score, s.cache->status_word(), s.cache->position(), s.count};
        how.max_count = std::max(how.max_count, s.count);
        how.max_emitted = std::max(how.max_emitted, (s.cache->position() + s.count) / m - s.cache->position() / m);
      }
      // Decode batches (one token each) walk the state; a batch with a longer span emits its rows in parallel.
      how.parallel = how.max_count > 1 && !options.sequential_compressor;
      KVC_CUDA_TRY(detail::launch_compressor_main(p, how, st));
      if (m == 4) {
        detail::CompressorParams ip = p;
        ip.storage = static_cast<std::uint32_t>(plan.storage.indexer);
        ip.row_bytes = lp.indexer_row_bytes;
        ip.ape = weights.indexer_ape;
        ip.norm = weights.indexer_norm;
        for (std::size_t i = 0; i < n; ++i) {
          const LayerSpan& s = spans[base + i];
          const DeviceLayerView v = s.cache->layer_view(layer);
          ip.items[i] = detail::CompressorItem{v.indexer_kv_state, v.indexer_score_state, v.indexer,
                                               s.indexer_kv,       s.indexer_score,       s.cache->status_word(),
                                               s.cache->position(), s.count};
        }
        KVC_CUDA_TRY(detail::launch_compressor_indexer(ip, how, st));
      }
    }
    return ok_status();
  }();
  if (!launched.ok()) {
    for (const LayerSpan& s : spans) {
      if (!s.cache->poisoned()) s.cache->poison("compressor launch failed: " + launched.error().to_string());
    }
    return launched;
  }
  return finish_launches(spans, layer, "compressor", options, stream);
}

}  // namespace kvcompact::cuda::dsv4
