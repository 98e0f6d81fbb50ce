// Internal to the CPU attention (attention.cpp, included there only): the kernel over dense f32 rows (the exact
// baseline the packed path is timed against).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "tq/attention_math.hpp"
#include "tq/attention_schedule.hpp"
#include "tq/attention_sources.hpp"

namespace kvcompact::tq {

namespace {

// Dense rows: each token's key / value row is scored against / added to every row and head of the block
// that sees it while it is hot in L1.
void run_item(const DenseSource& src, const KernelContext& ctx, std::span<const RequestShape> requests,
              const Schedule& schedule, const Item& item, float* partials) {
  const Group& g = schedule.groups[item.group];
  const RequestShape& req = requests[g.request];
  const std::uint32_t d = ctx.d;
  const std::uint32_t gs = ctx.group_size;

  const std::uint32_t key_end_all = req.first_position + g.row_end;
  const std::uint32_t c0 = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(item.chunk) * schedule.chunk_tokens, key_end_all));
  const std::uint32_t c1 = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(c0) + schedule.chunk_tokens, key_end_all));
  // Rows whose causal range reaches this chunk: first_position + i ≥ c0.
  const std::uint32_t row_first =
      std::max(g.row_begin, c0 > req.first_position ? c0 - req.first_position : 0u);
  const std::uint32_t n_rows = g.row_end - g.row_begin;
  const std::uint32_t exact_begin = src.exact_begin(req.key_id);

  // Per (row, group head): prepared query and softmax state.
  const std::uint32_t states = n_rows * gs;
  std::vector<float> prepared(static_cast<std::size_t>(states) * src.query_floats());
  std::vector<float> state(static_cast<std::size_t>(states) * ctx.acc_floats, 0.0f);
  std::vector<float> scores(static_cast<std::size_t>(states) * kBlockTokens);
  std::vector<float> token_buf(2 * static_cast<std::size_t>(d));
  DenseSource::Token tok;

  for (std::uint32_t i = row_first; i < g.row_end; ++i) {
    for (std::uint32_t k = 0; k < gs; ++k) {
      const std::uint32_t sidx = (i - g.row_begin) * gs + k;
      const std::uint32_t q_head = g.head * gs + k;
      src.prepare(req.queries + (static_cast<std::size_t>(i) * ctx.q_heads + q_head) * d,
                  prepared.data() + static_cast<std::size_t>(sidx) * src.query_floats());
      state[static_cast<std::size_t>(sidx) * ctx.acc_floats] = kNegInf;
    }
  }

  for (std::uint32_t b0 = c0; b0 < c1; b0 += kBlockTokens) {
    const std::uint32_t b1 = std::min(c1, b0 + kBlockTokens);
    const std::uint32_t nb = b1 - b0;
    // Scores: each token's key is unpacked once and scored against every row / head that sees it.
    for (std::uint32_t t = b0; t < b1; ++t) {
      src.load_key(req.key_id, g.head, t, exact_begin, tok, token_buf.data());
      const std::uint32_t first_seeing = std::max(row_first, t > req.first_position ? t - req.first_position : 0u);
      for (std::uint32_t i = row_first; i < first_seeing; ++i) {
        for (std::uint32_t k = 0; k < gs; ++k) scores[((i - g.row_begin) * gs + k) * kBlockTokens + (t - b0)] = kNegInf;
      }
      for (std::uint32_t i = first_seeing; i < g.row_end; ++i) {
        for (std::uint32_t k = 0; k < gs; ++k) {
          const std::uint32_t sidx = (i - g.row_begin) * gs + k;
          scores[sidx * kBlockTokens + (t - b0)] =
              ctx.scale * src.score(tok, token_buf.data(), prepared.data() + static_cast<std::size_t>(sidx) * src.query_floats());
        }
      }
    }
    // Online softmax update per (row, head); probabilities overwrite the scores.
    for (std::uint32_t i = row_first; i < g.row_end; ++i) {
      if (req.first_position + i < b0) continue;  // sees nothing of this block
      for (std::uint32_t k = 0; k < gs; ++k) {
        const std::uint32_t sidx = (i - g.row_begin) * gs + k;
        float* st = state.data() + static_cast<std::size_t>(sidx) * ctx.acc_floats;
        float* sc = scores.data() + static_cast<std::size_t>(sidx) * kBlockTokens;
        float block_max = kNegInf;
        for (std::uint32_t j = 0; j < nb; ++j) block_max = std::max(block_max, sc[j]);
        const float new_max = std::max(st[0], block_max);
        if (new_max > st[0] && st[0] != kNegInf) {
          const float rescale = std::exp(st[0] - new_max);
          st[1] *= rescale;
          scale_in_place(rescale, st + 2, ctx.acc_floats - 2);
        }
        st[0] = new_max;
        float sum = 0.0f;
        for (std::uint32_t j = 0; j < nb; ++j) {
          sc[j] = std::exp(sc[j] - new_max);  // exp(−inf) = 0 for positions the row cannot see
          sum += sc[j];
        }
        st[1] += sum;
      }
    }
    // Values: unpacked once per token, added to every row / head that sees it.
    for (std::uint32_t t = b0; t < b1; ++t) {
      src.load_value(req.key_id, g.head, t, exact_begin, tok, token_buf.data());
      const std::uint32_t first_seeing = std::max(row_first, t > req.first_position ? t - req.first_position : 0u);
      for (std::uint32_t i = first_seeing; i < g.row_end; ++i) {
        for (std::uint32_t k = 0; k < gs; ++k) {
          const std::uint32_t sidx = (i - g.row_begin) * gs + k;
          float* st = state.data() + static_cast<std::size_t>(sidx) * ctx.acc_floats;
          src.accumulate(tok, token_buf.data(), scores[sidx * kBlockTokens + (t - b0)], st + 2,
                         src.has_exact() ? st + 2 + d : nullptr);
        }
      }
    }
  }

  if (g.chunks == 1) {
    for (std::uint32_t i = row_first; i < g.row_end; ++i) {
      for (std::uint32_t k = 0; k < gs; ++k) {
        const std::uint32_t sidx = (i - g.row_begin) * gs + k;
        const std::uint32_t q_head = g.head * gs + k;
        float* st = state.data() + static_cast<std::size_t>(sidx) * ctx.acc_floats;
        finish_row(src, ctx, q_head, st[0], st[1], st + 2, src.has_exact() ? st + 2 + d : nullptr,
                   req.output + (static_cast<std::size_t>(i) * ctx.q_heads + q_head) * d);
      }
    }
    return;
  }
  // Partial for the merge: rows this chunk does not reach keep max = −inf and contribute nothing.
  float* dst = partials + g.partial_offset + static_cast<std::uint64_t>(item.chunk) * states * ctx.acc_floats;
  for (std::uint32_t sidx = 0; sidx < states; ++sidx) {
    const std::uint32_t i = g.row_begin + sidx / gs;
    float* out = dst + static_cast<std::size_t>(sidx) * ctx.acc_floats;
    if (i < row_first) {
      out[0] = kNegInf;
      out[1] = 0.0f;
      continue;
    }
    std::memcpy(out, state.data() + static_cast<std::size_t>(sidx) * ctx.acc_floats, ctx.acc_floats * sizeof(float));
  }
}

}  // namespace
}  // namespace kvcompact::tq
