// CPU attention over packed TurboQuant records (fast float32 path) and over dense f32 rows (the exact
// baseline). One schedule serves both: work items are (request, kv head, block of query rows, key chunk);
// each item runs an online softmax over its chunk and either finishes its rows directly or leaves a
// partial (max, sum, accumulators) that a log-sum-exp merge combines — flash-decoding on the CPU, so one
// long sequence still keeps every core busy. Packed records are scored through per-item lookup tables
// that fold the queries of up to 8 (row, head) states of one KV head — its GQA group — into one vector add
// per code nibble, so a token's record is read once for all of them.
//
// Pieces (included here only): attention_math.hpp (block sizes, vector helpers), attention_sources.hpp (packed and
// dense sources), attention_schedule.hpp (work items, kernel context), attention_lut_kernel.hpp (the packed kernel),
// attention_dense_kernel.hpp (the dense kernel); this file: the merge, the driver and the public entry points.
#include "kvcompact/tq/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/parallel.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "tq/attention_dense_kernel.hpp"
#include "tq/attention_lut_kernel.hpp"
#include "tq/attention_math.hpp"
#include "tq/attention_schedule.hpp"
#include "tq/attention_sources.hpp"

namespace kvcompact::tq {

namespace {

// Log-sum-exp merge of a group's chunk partials, then finish.
template <class Source>
void merge_group(const Source& src, const KernelContext& ctx, std::span<const RequestShape> requests,
                 const Group& g, const float* partials) {
  const RequestShape& req = requests[g.request];
  const std::uint32_t gs = ctx.group_size;
  const std::uint32_t states = (g.row_end - g.row_begin) * gs;
  const std::size_t stride = static_cast<std::size_t>(states) * ctx.acc_floats;
  std::vector<float> merged(ctx.acc_floats);
  for (std::uint32_t sidx = 0; sidx < states; ++sidx) {
    float m = kNegInf;
    for (std::uint32_t c = 0; c < g.chunks; ++c) {
      m = std::max(m, partials[g.partial_offset + c * stride + static_cast<std::size_t>(sidx) * ctx.acc_floats]);
    }
    std::fill(merged.begin(), merged.end(), 0.0f);
    float l = 0.0f;
    for (std::uint32_t c = 0; c < g.chunks; ++c) {
      const float* p = partials + g.partial_offset + c * stride + static_cast<std::size_t>(sidx) * ctx.acc_floats;
      if (p[0] == kNegInf) continue;
      const float w = std::exp(p[0] - m);
      l += w * p[1];
      axpy(w, p + 2, merged.data() + 2, ctx.acc_floats - 2);
    }
    const std::uint32_t i = g.row_begin + sidx / gs;
    const std::uint32_t q_head = g.head * gs + sidx % gs;
    finish_row(src, ctx, q_head, m, l, merged.data() + 2, src.has_exact() ? merged.data() + 2 + ctx.d : nullptr,
               req.output + (static_cast<std::size_t>(i) * ctx.q_heads + q_head) * ctx.d);
  }
}

template <class Source>
void run_attention(const Source& src, KernelContext ctx, std::span<const RequestShape> requests,
                   std::uint32_t requested_threads, std::uint32_t forced_chunk) {
  const std::size_t pool = num_threads();
  const std::size_t threads = requested_threads == 0 ? pool : std::min<std::size_t>(requested_threads, pool);
  ctx.acc_floats = 2 + ctx.d * (src.has_exact() ? 2 : 1);
  const Schedule schedule =
      plan_schedule(requests, ctx.kv_heads, ctx.group_size, ctx.acc_floats, threads, forced_chunk);
  std::vector<float> partials(schedule.partial_floats);
  // With fewer threads than the pool, a grain of items / threads caps the chunks parallel_for makes.
  const std::size_t items = schedule.items.size();
  const std::size_t grain = threads >= pool ? 1 : (items + threads - 1) / std::max<std::size_t>(threads, 1);
  parallel_for(0, items, grain, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t it = lo; it < hi; ++it) run_item(src, ctx, requests, schedule, schedule.items[it], partials.data());
  });
  std::vector<std::uint32_t> merges;
  for (std::uint32_t gi = 0; gi < schedule.groups.size(); ++gi) {
    if (schedule.groups[gi].chunks > 1) merges.push_back(gi);
  }
  const std::size_t merge_grain = threads >= pool ? 1 : (merges.size() + threads - 1) / std::max<std::size_t>(threads, 1);
  parallel_for(0, merges.size(), merge_grain, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t m = lo; m < hi; ++m) merge_group(src, ctx, requests, schedule.groups[merges[m]], partials.data());
  });
}

Status validate_common(std::uint32_t head_dim, std::uint32_t kv_heads, const AttentionOptions& options) {
  if (options.q_heads == 0 || kv_heads == 0 || options.q_heads % kv_heads != 0) {
    return make_error(ErrorCode::InvalidArgument, "q_heads {} must be a positive multiple of kv_heads {}",
                      options.q_heads, kv_heads);
  }
  if (!std::isfinite(options.scale)) {
    return make_error(ErrorCode::InvalidArgument, "softmax scale {} is not finite", options.scale);
  }
  if (options.sinks != nullptr) {
    for (std::uint32_t h = 0; h < options.q_heads; ++h) {
      if (std::isnan(options.sinks[h]) || options.sinks[h] == std::numeric_limits<float>::infinity()) {
        return make_error(ErrorCode::NonFinite, "sink logit of query head {} is {} (NaN or +inf)", h,
                          options.sinks[h]);
      }
    }
  }
  (void)head_dim;
  return ok_status();
}

float resolve_scale(const AttentionOptions& options, std::uint32_t head_dim) {
  return options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace

std::uint32_t exact_window_begin(std::uint32_t length, std::uint32_t window_begin, std::uint32_t exact_window) {
  if (exact_window == 0) return length;
  const std::uint32_t recent = length > exact_window ? length - exact_window : 0u;
  return std::min(length, std::max(window_begin, recent));
}

std::uint32_t window_begin_after_truncate(std::uint32_t length, std::uint32_t window_begin, std::uint32_t exact_window,
                                          std::uint32_t position) {
  const std::uint32_t recent = length > exact_window ? length - exact_window : 0u;
  return std::min(position, std::max(window_begin, recent));
}

Status validate_requests(std::uint32_t sequences, const std::uint32_t* lengths,
                         std::span<const AttentionRequest> requests) {
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const AttentionRequest& req = requests[r];
    if (req.seq >= sequences) {
      return make_error(ErrorCode::OutOfRange, "request {}: sequence {} is outside the cache's {} sequences", r,
                        req.seq, sequences);
    }
    const std::uint64_t end = static_cast<std::uint64_t>(req.first_position) + req.rows;
    if (end > lengths[req.seq]) {
      Error e = make_error(ErrorCode::OutOfRange,
                           "request {}: query positions [{}, {}) of sequence {} go past its length {} (append the "
                           "keys before attending)",
                           r, req.first_position, end, req.seq, lengths[req.seq]);
      e.expected = lengths[req.seq];
      e.actual = static_cast<std::int64_t>(end);
      return e;
    }
    if (req.rows > 0 && (req.queries == nullptr || req.output == nullptr)) {
      return make_error(ErrorCode::InvalidArgument, "request {}: null queries or output with {} rows", r, req.rows);
    }
  }
  return ok_status();
}

Status validate_attention(const LayerView& layer, std::span<const AttentionRequest> requests,
                          const AttentionOptions& options) {
  if (layer.layout == nullptr || layer.codec == nullptr || layer.data == nullptr || layer.lengths == nullptr ||
      layer.window_begins == nullptr) {
    return make_error(ErrorCode::InvalidArgument, "attention needs an attention layer (the layer view is empty)");
  }
  const LayerLayout& layout = *layer.layout;
  KVC_TRY(validate_common(layout.head_dim, layout.kv_heads, options));
  KVC_TRY(validate_requests(layout.sequences, layer.lengths, requests));
  // A cache keeps its lengths within the capacity; a view a tool builds need not (the keys past it are not
  // in the buffer).
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const std::uint32_t length = layer.lengths[requests[r].seq];
    if (length > layout.capacity) {
      Error e = make_error(ErrorCode::OutOfRange,
                           "request {}: sequence {} has length {} beyond the layout's capacity {}", r,
                           requests[r].seq, length, layout.capacity);
      e.expected = layout.capacity;
      e.actual = length;
      return e;
    }
  }
  return ok_status();
}

Status attention_cpu(const LayerView& layer, std::span<const AttentionRequest> requests,
                     const AttentionOptions& options) {
  KVC_TRY(validate_attention(layer, requests, options));
  const LayerLayout& layout = *layer.layout;
  std::vector<RequestShape> shapes;
  shapes.reserve(requests.size());
  for (const AttentionRequest& req : requests) {
    if (req.rows == 0) continue;
    shapes.push_back({req.seq, req.first_position, req.rows, req.queries, req.output});
  }
  KernelContext ctx;
  ctx.d = layout.head_dim;
  ctx.kv_heads = layout.kv_heads;
  ctx.q_heads = options.q_heads;
  ctx.group_size = options.q_heads / layout.kv_heads;
  ctx.scale = resolve_scale(options, layout.head_dim);
  ctx.sinks = options.sinks;
  PackedSource source(layer);
  run_attention(source, ctx, shapes, options.threads, options.chunk_tokens);
  return ok_status();
}

Status dense_attention_f32(std::uint32_t head_dim, std::uint32_t kv_heads,
                           std::span<const DenseAttentionRequest> requests, const AttentionOptions& options) {
  if (head_dim == 0 || head_dim % 8 != 0) {
    return make_error(ErrorCode::InvalidArgument, "dense attention head_dim {} must be a positive multiple of 8",
                      head_dim);
  }
  KVC_TRY(validate_common(head_dim, kv_heads, options));
  std::vector<RequestShape> shapes;
  for (std::uint32_t r = 0; r < requests.size(); ++r) {
    const DenseAttentionRequest& req = requests[r];
    const std::uint64_t end = static_cast<std::uint64_t>(req.first_position) + req.rows;
    if (end > req.length) {
      return make_error(ErrorCode::OutOfRange, "dense request {}: query positions [{}, {}) go past its length {}", r,
                        req.first_position, end, req.length);
    }
    if (req.rows == 0) continue;
    if (req.keys == nullptr || req.values == nullptr || req.queries == nullptr || req.output == nullptr) {
      return make_error(ErrorCode::InvalidArgument, "dense request {}: null pointer", r);
    }
    shapes.push_back({r, req.first_position, req.rows, req.queries, req.output});
  }
  KernelContext ctx;
  ctx.d = head_dim;
  ctx.kv_heads = kv_heads;
  ctx.q_heads = options.q_heads;
  ctx.group_size = options.q_heads / kv_heads;
  ctx.scale = resolve_scale(options, head_dim);
  ctx.sinks = options.sinks;
  DenseSource source(head_dim, kv_heads, requests);
  run_attention(source, ctx, shapes, options.threads, options.chunk_tokens);
  return ok_status();
}

}  // namespace kvcompact::tq
