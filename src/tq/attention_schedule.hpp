// Internal to the CPU attention (attention.cpp, included there only): the schedule of work items (request, KV
// head, block of query rows, key chunk) shared by both sources, the kernels' context and the finish of a row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "kvcompact/tq/attention.hpp"
#include "tq/attention_math.hpp"

namespace kvcompact::tq {

namespace {

// ---- schedule -------------------------------------------------------------------------------------

// What the kernel needs to know of a request, independent of the source.
struct RequestShape {
  std::uint32_t key_id = 0;  // seq for the packed source, request index for the dense one
  std::uint32_t first_position = 0;
  std::uint32_t rows = 0;
  const float* queries = nullptr;
  float* output = nullptr;
};

// A (request, kv head, row block): its rows see keys [0, first_position + row_end).
struct Group {
  std::uint32_t request = 0;
  std::uint32_t head = 0;
  std::uint32_t row_begin = 0;
  std::uint32_t row_end = 0;
  std::uint32_t chunks = 1;
  std::uint64_t partial_offset = 0;  // first float of this group's partials (chunks > 1)
};

struct Item {
  std::uint32_t group = 0;
  std::uint32_t chunk = 0;
};

struct Schedule {
  std::vector<Group> groups;
  std::vector<Item> items;
  std::uint32_t chunk_tokens = 0;
  std::uint64_t partial_floats = 0;
};

// Splits every group's key range into chunks only when the groups alone cannot keep the threads busy.
Schedule plan_schedule(std::span<const RequestShape> requests, std::uint32_t kv_heads, std::uint32_t group_size,
                       std::uint32_t acc_floats, std::size_t threads, std::uint32_t forced_chunk) {
  Schedule s;
  std::uint64_t total_keys = 0;
  for (std::uint32_t r = 0; r < requests.size(); ++r) {
    const RequestShape& req = requests[r];
    for (std::uint32_t h = 0; h < kv_heads; ++h) {
      for (std::uint32_t b = 0; b < req.rows; b += kRowBlock) {
        Group g;
        g.request = r;
        g.head = h;
        g.row_begin = b;
        g.row_end = std::min(req.rows, b + kRowBlock);
        s.groups.push_back(g);
        total_keys += req.first_position + g.row_end;
      }
    }
  }
  const std::uint64_t wanted_items = 4 * static_cast<std::uint64_t>(threads);
  if (forced_chunk > 0) {
    s.chunk_tokens = forced_chunk;
  } else if (threads <= 1 || s.groups.size() >= 2 * threads) {
    s.chunk_tokens = std::numeric_limits<std::uint32_t>::max();
  } else {
    std::uint64_t chunk = (total_keys + wanted_items - 1) / wanted_items;
    chunk = std::max<std::uint64_t>(chunk, kDefaultMinChunk);
    chunk = (chunk + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    s.chunk_tokens = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, std::numeric_limits<std::uint32_t>::max()));
  }
  for (std::uint32_t gi = 0; gi < s.groups.size(); ++gi) {
    Group& g = s.groups[gi];
    const std::uint64_t keys = requests[g.request].first_position + g.row_end;
    g.chunks = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (keys + s.chunk_tokens - 1) / s.chunk_tokens));
    if (g.chunks > 1) {
      g.partial_offset = s.partial_floats;
      s.partial_floats += static_cast<std::uint64_t>(g.chunks) * (g.row_end - g.row_begin) * group_size * acc_floats;
    }
    for (std::uint32_t c = 0; c < g.chunks; ++c) s.items.push_back({gi, c});
  }
  return s;
}

// Online-softmax state of one (query row, query head): running max, running sum, accumulators.
// Layout inside a float array: [max, sum, acc_rot[d], acc_exact[d] (only with a window)].
struct KernelContext {
  std::uint32_t d = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t q_heads = 0;
  std::uint32_t group_size = 0;
  std::uint32_t acc_floats = 0;
  float scale = 0.0f;
  const float* sinks = nullptr;
};

// Finishes one (row, head) from a merged state: folds in the sink, normalises, rotates back.
template <class Source>
void finish_row(const Source& src, const KernelContext& ctx, std::uint32_t q_head, float m, float l, float* acc_rot,
                const float* acc_exact, float* out) {
  float scale_acc = 1.0f;
  if (ctx.sinks != nullptr) {
    const float sink = ctx.sinks[q_head];
    const float top = std::max(m, sink);
    const float keep = std::exp(m - top);
    l = l * keep + std::exp(sink - top);
    scale_acc = keep;
  }
  src.finish(acc_rot, acc_exact, scale_acc / l, out);
}

}  // namespace
}  // namespace kvcompact::tq
