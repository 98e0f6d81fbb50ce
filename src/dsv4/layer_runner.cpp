// One DSV4 layer over the cache (see layer_runner.hpp). Order of the work for a span [s, e):
//   1. decode the window rows of positions [max(0, s-127), s) from the ring (reads only);
//   2. the span's rows c_t: FP8 simulation, encode, decode back (so the span sees exactly what the ring
//      will hold), then write the last min(count, cap) of them into the ring         <- first write
//   3. compressor(s): the per-token state update in the cache's state buffers, emitted rows encoded into
//      the compressed / indexer rows (append-only, so later tokens of the span can read them back);
//   4. per token: window rows (oldest first) + compressed rows (indexer top-k for m = 4, all visible for
//      m = 128), sparse attention with the sink, inverse RoPE on the output tails.
// Decode is the one-token span, so decode and any prefill chunking run the same code on the same values.
#include "kvcompact/dsv4/layer_runner.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "dsv4/math_parallel.hpp"
#include "kvcompact/core/assert.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"

namespace kvcompact::dsv4 {

namespace {

constexpr std::size_t kD = kHeadDim;
constexpr std::size_t kIndexerBlockRows = 64;
constexpr std::size_t kIndexerDecodeOnceBytes = std::size_t{64} << 20;

Status check_finite(const float* x, std::size_t n, std::string_view what) {
  // x * 0 is 0 for every finite x and NaN for inf / NaN: a vectorisable pass, then a slow one to name it.
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i] * 0.0f;
    s1 += x[i + 1] * 0.0f;
    s2 += x[i + 2] * 0.0f;
    s3 += x[i + 3] * 0.0f;
  }
  float acc = (s0 + s1) + (s2 + s3);
  for (; i < n; ++i) acc += x[i] * 0.0f;
  if (acc == 0.0f) return ok_status();
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return make_error(ErrorCode::NonFinite, "{} holds a non-finite value {} at element {}", what, x[i], i);
    }
  }
  return ok_status();
}

Status require(const void* p, std::string_view what, std::uint32_t layer, std::uint32_t ratio) {
  if (p == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "layer {} (ratio {}) needs {}, which is null", layer, ratio, what);
  }
  return ok_status();
}

// Every argument check that needs no cache write.
Status validate_layer(const CachePlan& plan, std::uint32_t layer, std::uint64_t count, const LayerWeights& w,
                      const LayerInputs& in, const float* out) {
  if (layer >= plan.layers.size()) {
    return make_error(ErrorCode::InvalidArgument, "layer {} is out of range: the cache has {} layers", layer,
                      plan.layers.size());
  }
  const std::uint32_t m = plan.layers[layer].ratio;
  if (w.heads == 0) return make_error(ErrorCode::InvalidArgument, "layer {}: heads is 0", layer);
  KVC_TRY(require(w.attn_sink, "attn_sink", layer, m));
  KVC_TRY(require(in.kv, "the kv rows", layer, m));
  KVC_TRY(require(in.q, "the queries", layer, m));
  KVC_TRY(require(out, "an output buffer", layer, m));
  const std::size_t n = static_cast<std::size_t>(count);
  KVC_TRY(check_finite(w.attn_sink, w.heads, "attn_sink"));
  KVC_TRY(check_finite(in.kv, n * kD, "the kv rows"));
  KVC_TRY(check_finite(in.q, n * w.heads * kD, "the queries"));
  if (m != 0) {
    const std::size_t pw = (m == 4 ? 2u : 1u) * kD;
    KVC_TRY(require(w.compressor_ape, "compressor_ape", layer, m));
    KVC_TRY(require(w.compressor_norm, "compressor_norm", layer, m));
    KVC_TRY(require(in.compressor_kv, "compressor_kv", layer, m));
    KVC_TRY(require(in.compressor_score, "compressor_score", layer, m));
    KVC_TRY(check_finite(w.compressor_ape, m * pw, "compressor_ape"));
    KVC_TRY(check_finite(w.compressor_norm, kD, "compressor_norm"));
    KVC_TRY(check_finite(in.compressor_kv, n * pw, "compressor_kv"));
    KVC_TRY(check_finite(in.compressor_score, n * pw, "compressor_score"));
  }
  if (m == 4) {
    const std::size_t ih = plan.model.index_n_heads;
    const std::size_t ipw = 2 * kIndexerHeadDim;
    KVC_TRY(require(w.indexer_ape, "indexer_ape", layer, m));
    KVC_TRY(require(w.indexer_norm, "indexer_norm", layer, m));
    KVC_TRY(require(in.indexer_kv, "indexer_kv", layer, m));
    KVC_TRY(require(in.indexer_score, "indexer_score", layer, m));
    KVC_TRY(require(in.indexer_q, "indexer_q", layer, m));
    KVC_TRY(require(in.indexer_weights, "indexer_weights", layer, m));
    KVC_TRY(check_finite(w.indexer_ape, 4 * ipw, "indexer_ape"));
    KVC_TRY(check_finite(w.indexer_norm, kIndexerHeadDim, "indexer_norm"));
    KVC_TRY(check_finite(in.indexer_kv, n * ipw, "indexer_kv"));
    KVC_TRY(check_finite(in.indexer_score, n * ipw, "indexer_score"));
    KVC_TRY(check_finite(in.indexer_q, n * ih * kIndexerHeadDim, "indexer_q"));
    KVC_TRY(check_finite(in.indexer_weights, n * ih, "indexer_weights"));
  }
  return ok_status();
}

}  // namespace

LayerRunner::LayerRunner(const ModelConfig& model)
    : model_(model),
      rope_plain_(make_rope_frequencies(rope_config_for_layer(model, 0))),
      rope_compressed_(make_rope_frequencies(rope_config_for_layer(model, 4))) {}

Status LayerRunner::score_indexer_blocks(const Deepseek4Cache& cache, std::uint32_t layer, std::size_t visible,
                                         const float* weights, std::size_t ih) {
  const ConstIndexerRows idx = cache.indexer_rows(layer);
  const IndexerStorage is = cache.plan().storage.indexer;
  std::atomic<bool> decode_failed{false};
  const std::size_t blocks = (visible + kIndexerBlockRows - 1) / kIndexerBlockRows;
  math_parallel_for(0, blocks, 4, [&](std::size_t lo, std::size_t hi) {
    float keys[kIndexerBlockRows * kIndexerHeadDim];
    for (std::size_t b = lo; b < hi; ++b) {
      const std::size_t r0 = b * kIndexerBlockRows;
      const std::size_t nr = std::min(kIndexerBlockRows, visible - r0);
      for (std::size_t r = 0; r < nr; ++r) {
        if (!decode_indexer_row(idx.row(r0 + r), is, std::span<float>(keys + r * kIndexerHeadDim, kIndexerHeadDim)).ok()) {
          decode_failed = true;
          return;
        }
      }
      indexer_scores_contiguous(index_scores_.data() + r0, index_q_.data(), weights, keys, nr, ih, kIndexerHeadDim);
    }
  });
  if (decode_failed) return make_error(ErrorCode::Internal, "layer {}: an indexer row failed to decode", layer);
  return ok_status();
}

Status LayerRunner::run_span(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t start, std::uint64_t count,
                             const LayerWeights& w, const LayerInputs& in, float* out, bool& wrote) {
  const CachePlan& plan = cache.plan();
  const std::uint32_t m = plan.layers[layer].ratio;
  const std::size_t heads = w.heads;
  const std::uint64_t cap = plan.window_capacity;
  const RowStorage rs = plan.storage.attention;
  const std::size_t row_b = attention_row_bytes(rs);
  const std::uint64_t end = start + count;
  const std::uint64_t first = start >= kSlidingWindow - 1 ? start - (kSlidingWindow - 1) : 0;
  auto hook = [&](std::string_view stage) -> Status { return stage_hook ? stage_hook(stage) : ok_status(); };

  // 1. Window rows before the span, from the ring.
  KVC_ASSERT(first >= cache.window_start_position(), "window rows needed by the span were overwritten");
  window_.resize(static_cast<std::size_t>(end - first) * kD);
  const AttentionRows ring = cache.window_rows(layer);
  for (std::uint64_t q = first; q < start; ++q) {
    KVC_TRY(decode_attention_row(ring.row(q % cap), rs, std::span<float>(window_.data() + (q - first) * kD, kD)));
  }
  KVC_TRY(hook("window"));

  // 2. The span's own window rows: the model's FP8 rounding, then exactly what storage gives back.
  encoded_.resize(static_cast<std::size_t>(count) * row_b);
  for (std::uint64_t k = 0; k < count; ++k) {
    float* row = window_.data() + (start + k - first) * kD;
    std::memcpy(row, in.kv + k * kD, kD * sizeof(float));
    simulate_main_row(row);
    const std::span<std::uint8_t> bytes(encoded_.data() + k * row_b, row_b);
    KVC_TRY(encode_attention_row(std::span<const float>(row, kD), rs, bytes));
    KVC_TRY(decode_attention_row(bytes, rs, std::span<float>(row, kD)));
  }
  wrote = true;
  for (std::uint64_t q = std::max(start, end > cap ? end - cap : 0); q < end; ++q) {
    std::memcpy(ring.row(q % cap).data(), encoded_.data() + (q - start) * row_b, row_b);
  }
  KVC_TRY(hook("compressor"));

  // 3. Compressors: state updates in the cache's buffers, emitted rows into the append-only rows.
  if (m != 0) {
    CompressorParams cp;
    cp.ratio = m;
    cp.overlap = m == 4;
    cp.width = kD;
    cp.branch = CompressorBranch::Main;
    cp.ape = w.compressor_ape;
    cp.norm_weight = w.compressor_norm;
    cp.rope = &rope_compressed_;
    const std::size_t n_emit = compressor_rows_emitted(m, static_cast<std::int64_t>(start), count);
    emitted_.resize(std::max<std::size_t>(n_emit, 1) * kD);
    const StateBuffer kv = cache.kv_state(layer);
    const StateBuffer sc = cache.score_state(layer);
    KVC_ASSERT(kv.data.size() == cp.state_floats() && sc.data.size() == cp.state_floats(), "state buffer shape");
    compressor_prefill(cp, kv.data.data(), sc.data.data(), static_cast<std::int64_t>(start), count, in.compressor_kv,
                       in.compressor_score, emitted_.data());
    const AttentionRows comp = cache.compressed_rows(layer);
    for (std::size_t i = 0; i < n_emit; ++i) {
      KVC_TRY(encode_attention_row(std::span<const float>(emitted_.data() + i * kD, kD), rs, comp.row(start / m + i)));
    }
    if (m == 4) {
      CompressorParams ip = cp;
      ip.width = kIndexerHeadDim;
      ip.branch = CompressorBranch::Indexer;
      ip.ape = w.indexer_ape;
      ip.norm_weight = w.indexer_norm;
      const StateBuffer ikv = cache.indexer_kv_state(layer);
      const StateBuffer isc = cache.indexer_score_state(layer);
      KVC_ASSERT(ikv.data.size() == ip.state_floats() && isc.data.size() == ip.state_floats(), "indexer state shape");
      emitted_.resize(std::max<std::size_t>(n_emit, 1) * kIndexerHeadDim);
      compressor_prefill(ip, ikv.data.data(), isc.data.data(), static_cast<std::int64_t>(start), count, in.indexer_kv,
                         in.indexer_score, emitted_.data());
      const IndexerRows idx = cache.indexer_rows(layer);
      for (std::size_t i = 0; i < n_emit; ++i) {
        KVC_TRY(encode_indexer_row(std::span<const float>(emitted_.data() + i * kIndexerHeadDim, kIndexerHeadDim),
                                   plan.storage.indexer, idx.row(start / 4 + i)));
      }
    }
  }
  KVC_TRY(hook("attention"));

  // 4. Attention, token by token.
  const RopeFrequencies& rope = rope_for_ratio(m);
  const AttentionRows comp = cache.compressed_rows(layer);
  if (m == 128) {
    const std::size_t visible = static_cast<std::size_t>(end / m);
    compressed_.resize(std::max<std::size_t>(visible, 1) * kD);
    for (std::size_t i = 0; i < visible; ++i) {
      KVC_TRY(decode_attention_row(comp.row(i), rs, std::span<float>(compressed_.data() + i * kD, kD)));
    }
  }
  const std::size_t ih = plan.model.index_n_heads;
  const std::size_t topk = plan.model.index_topk;
  // For a prefill span of a ratio-4 layer, decode the indexer rows once (within a memory budget) instead of
  // per token; scores are per-row functions of the same decoded values either way.
  bool keys_decoded = false;
  if (m == 4 && count > 1) {
    const std::size_t visible_end = static_cast<std::size_t>(end / 4);
    if (visible_end * kIndexerHeadDim * sizeof(float) <= kIndexerDecodeOnceBytes) {
      index_keys_.resize(std::max<std::size_t>(visible_end, 1) * kIndexerHeadDim);
      const IndexerRows idx = cache.indexer_rows(layer);
      for (std::size_t r = 0; r < visible_end; ++r) {
        KVC_TRY(decode_indexer_row(idx.row(r), plan.storage.indexer,
                                   std::span<float>(index_keys_.data() + r * kIndexerHeadDim, kIndexerHeadDim)));
      }
      keys_decoded = true;
    }
  }
  for (std::uint64_t k = 0; k < count; ++k) {
    const std::uint64_t t = start + k;
    rows_.clear();
    for (std::uint64_t q = t >= kSlidingWindow - 1 ? t - (kSlidingWindow - 1) : 0; q <= t; ++q) {
      rows_.push_back(window_.data() + (q - first) * kD);
    }
    if (m == 128) {
      for (std::size_t i = 0; i < visible_compressed_rows(m, static_cast<std::int64_t>(t)); ++i) {
        rows_.push_back(compressed_.data() + i * kD);
      }
    } else if (m == 4) {
      const std::size_t visible = visible_compressed_rows(4, static_cast<std::int64_t>(t));
      if (visible > 0) {
        index_q_.assign(in.indexer_q + k * ih * kIndexerHeadDim, in.indexer_q + (k + 1) * ih * kIndexerHeadDim);
        if (!in.indexer_q_prepared) prepare_indexer_query(index_q_.data(), ih);
        const float* weights = in.indexer_weights + k * ih;
        index_scores_.resize(visible);
        if (keys_decoded) {
          indexer_scores_contiguous(index_scores_.data(), index_q_.data(), weights, index_keys_.data(), visible, ih,
                                    kIndexerHeadDim);
        } else {
          KVC_TRY(score_indexer_blocks(cache, layer, visible, weights, ih));
        }
        selected_.resize(std::max<std::size_t>(topk, 1));
        const std::size_t n_sel = indexer_topk(selected_.data(), topk, index_scores_.data(), visible, topk_);
        compressed_.resize(std::max<std::size_t>(n_sel, 1) * kD);
        for (std::size_t i = 0; i < n_sel; ++i) {
          KVC_TRY(decode_attention_row(comp.row(static_cast<std::uint64_t>(selected_[i])), rs,
                                       std::span<float>(compressed_.data() + i * kD, kD)));
          rows_.push_back(compressed_.data() + i * kD);
        }
      }
    }
    KVC_ASSERT(rows_.size() == attention_row_count(m, static_cast<std::int64_t>(t), topk), "attention row count");
    RopeCosSin cs;
    rope_cos_sin(cs, rope, static_cast<std::int64_t>(t));
    float* o = out + k * heads * kD;
    sparse_attention(o, in.q + k * heads * kD, heads, rows_.data(), rows_.size(), w.attn_sink, &cs, attention_);
  }
  Status finite = check_finite(out, static_cast<std::size_t>(count) * heads * kD, "the output");
  if (!finite.ok()) return make_error(ErrorCode::NonFinite, "layer {}: {}", layer, finite.error().message);
  return ok_status();
}

namespace {
// The inputs of token `offset` onwards.
LayerInputs advance(const LayerInputs& in, std::uint64_t offset, std::size_t heads, std::uint32_t ratio,
                    std::size_t index_heads) {
  const std::size_t k = static_cast<std::size_t>(offset);
  LayerInputs out = in;
  out.kv += k * kD;
  out.q += k * heads * kD;
  if (ratio != 0) {
    const std::size_t pw = (ratio == 4 ? 2u : 1u) * kD;
    out.compressor_kv += k * pw;
    out.compressor_score += k * pw;
  }
  if (ratio == 4) {
    out.indexer_kv += k * 2 * kIndexerHeadDim;
    out.indexer_score += k * 2 * kIndexerHeadDim;
    out.indexer_q += k * index_heads * kIndexerHeadDim;
    out.indexer_weights += k * index_heads;
  }
  return out;
}
}  // namespace

Status LayerRunner::run_pieces(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t start, std::uint64_t count,
                               const LayerWeights& w, const LayerInputs& in, float* out, bool& wrote) {
  const std::uint64_t piece = std::max<std::uint64_t>(max_span_tokens, 1);
  const std::uint32_t m = cache.plan().layers[layer].ratio;
  const std::size_t ih = cache.plan().model.index_n_heads;
  for (std::uint64_t off = 0; off < count; off += piece) {
    const std::uint64_t n = std::min(piece, count - off);
    KVC_TRY(run_span(cache, layer, start + off, n, w, advance(in, off, w.heads, m, ih),
                     out + static_cast<std::size_t>(off) * w.heads * kD, wrote));
  }
  return ok_status();
}

Status LayerRunner::run_layer(Deepseek4Cache& cache, std::uint32_t layer, std::uint64_t count, const LayerWeights& weights,
                              const LayerInputs& inputs, float* out) {
  if (cache.plan().model_fingerprint != model_.fingerprint()) {
    return make_error(ErrorCode::Mismatch, "the runner was built for another model than the cache's ({})",
                      cache.plan().model.name);
  }
  const std::uint64_t start = cache.position();
  KVC_ASSIGN_OR_RETURN(const PrefillPlan span, cache.plan_prefill(start, count));
  (void)span;
  KVC_TRY(validate_layer(cache.plan(), layer, count, weights, inputs, out));
  bool wrote = false;
  Status st = ok_status();
  try {
    st = run_pieces(cache, layer, start, count, weights, inputs, out, wrote);
  } catch (const std::exception& ex) {
    st = make_error(ErrorCode::Internal, "layer {} threw: {}", layer, ex.what());
  }
  if (!st.ok() && wrote) cache.poison(fmt::format("layer {} failed after writing: {}", layer, st.error().to_string()));
  return st;
}

Status LayerRunner::run_all(Deepseek4Cache& cache, std::uint64_t count, std::span<const LayerWeights> weights,
                            std::span<const LayerInputs> inputs, std::span<float* const> outputs) {
  const std::size_t layers = cache.num_layers();
  if (weights.size() != layers || inputs.size() != layers || outputs.size() != layers) {
    return make_error(ErrorCode::InvalidArgument, "{} layers need as many weights, inputs and outputs; got {}, {}, {}",
                      layers, weights.size(), inputs.size(), outputs.size());
  }
  if (cache.plan().model_fingerprint != model_.fingerprint()) {
    return make_error(ErrorCode::Mismatch, "the runner was built for another model than the cache's ({})",
                      cache.plan().model.name);
  }
  for (std::uint32_t l = 0; l < layers; ++l) {
    KVC_TRY(validate_layer(cache.plan(), l, count, weights[l], inputs[l], outputs[l]));
  }
  const std::uint64_t start = cache.position();
  for (std::uint32_t l = 0; l < layers; ++l) {
    bool wrote = false;
    Status st = ok_status();
    try {
      st = run_pieces(cache, l, start, count, weights[l], inputs[l], outputs[l], wrote);
    } catch (const std::exception& ex) {
      st = make_error(ErrorCode::Internal, "layer {} threw: {}", l, ex.what());
    }
    if (!st.ok()) {
      // Earlier layers (or this one) already changed the cache for a step that will not be committed.
      if (wrote || l > 0) cache.poison(fmt::format("layer {} failed mid-step: {}", l, st.error().to_string()));
      return st;
    }
  }
  return ok_status();
}

Status LayerRunner::decode_step(Deepseek4Cache& cache, std::span<const LayerWeights> weights,
                                std::span<const LayerInputs> inputs, std::span<float* const> outputs) {
  KVC_ASSIGN_OR_RETURN(const StepPlan step, cache.plan_next_step());
  KVC_TRY(run_all(cache, 1, weights, inputs, outputs));
  return cache.commit_step(step.position);
}

Status LayerRunner::prefill_chunk(Deepseek4Cache& cache, std::uint64_t count, std::span<const LayerWeights> weights,
                                  std::span<const LayerInputs> inputs, std::span<float* const> outputs) {
  const std::uint64_t start = cache.position();
  KVC_ASSIGN_OR_RETURN(const PrefillPlan span, cache.plan_prefill(start, count));
  KVC_TRY(run_all(cache, count, weights, inputs, outputs));
  return cache.commit_prefill(span.start, span.count);
}

}  // namespace kvcompact::dsv4
