// Internal to the CPU attention (attention.cpp, included there only): the lookup-table kernel that scores packed
// records for up to 8 (row, head) states of one KV head at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "kvcompact/core/assert.hpp"
#include "tq/attention_math.hpp"
#include "tq/attention_schedule.hpp"
#include "tq/attention_sources.hpp"

namespace kvcompact::tq {

namespace {

// ---- lookup-table kernel for few query states (decode) ---------------------------------------------
// With at most 8 (row, head) states per item, each state's query is folded into small tables once per
// item: for every 4-bit nibble of a code stream (codes of 1, 2 or 4 bits: 4, 2 or 1 coordinates) or
// every coordinate (3 or 5 bits), the partial dot product of each possible index with the query, stored
// lane-interleaved [position][index][lane]. A token's score for all lanes is then one vector add per
// position instead of head_dim multiply-adds per head. Values go the other way: the softmax weights are
// summed per (position, index, lane) in a histogram, expanded into rotated-space accumulators once at the
// end. Both are exact rearrangements of the same sums; only the float rounding order changes.

// How a packed stream is cut into table positions.
struct CodeCut {
  std::uint32_t bits = 0;
  bool nibble = false;          // bits divides 4: positions are nibbles
  std::uint32_t per_position = 1;  // coordinates per position
  std::uint32_t positions = 0;
  std::uint32_t entries = 0;    // table entries per position
  std::uint32_t mask = 0;

  static CodeCut make(std::uint32_t bits, std::uint32_t d) {
    CodeCut c;
    c.bits = bits;
    c.mask = (1u << bits) - 1u;
    c.nibble = 4 % bits == 0;
    c.per_position = c.nibble ? 4 / bits : 1;
    c.positions = d / c.per_position;
    c.entries = c.nibble ? 16 : (1u << bits);
    return c;
  }
};

// 3 or 5 bits: 8 codes fill exactly BITS bytes; compile-time widths keep loads and shifts inline.
template <std::uint32_t BITS, class Visit>
inline void for_each_code(std::uint32_t positions, const std::uint8_t* codes, Visit&& visit) {
  constexpr std::uint32_t kMask = (1u << BITS) - 1u;
  for (std::uint32_t g = 0; g < positions / 8; ++g) {
    // Assembled in a register from byte loads: a 3- or 5-byte memcpy into a stack word would stall on
    // store-to-load forwarding when the word is read back whole.
    const std::uint8_t* group = codes + static_cast<std::size_t>(g) * BITS;
    std::uint64_t word = 0;
    for (std::uint32_t b = 0; b < BITS; ++b) word |= static_cast<std::uint64_t>(group[b]) << (8 * b);
    for (std::uint32_t k = 0; k < 8; ++k) visit(8 * g + k, static_cast<std::uint32_t>(word >> (k * BITS)) & kMask);
  }
}

// Calls visit(position, index) for every position of one packed record.
template <class Visit>
inline void for_each_index(const CodeCut& cut, const std::uint8_t* codes, Visit&& visit) {
  if (cut.nibble) {
    for (std::uint32_t byte = 0; byte < cut.positions / 2; ++byte) {
      const std::uint32_t b = codes[byte];
      visit(2 * byte, b & 15u);
      visit(2 * byte + 1, b >> 4);
    }
  } else if (cut.bits == 3) {
    for_each_code<3>(cut.positions, codes, visit);
  } else {
    for_each_code<5>(cut.positions, codes, visit);
  }
}

// table[(position · entries + index) · LANES + lane] = Σ over the position's coordinates of q·value(index).
template <std::uint32_t LANES>
void build_table(const CodeCut& cut, const float* centroids_or_null, const float* const* queries, std::uint32_t lanes,
                 float* table) {
  std::fill(table, table + static_cast<std::size_t>(cut.positions) * cut.entries * LANES, 0.0f);
  for (std::uint32_t lane = 0; lane < lanes; ++lane) {
    const float* q = queries[lane];
    for (std::uint32_t p = 0; p < cut.positions; ++p) {
      for (std::uint32_t v = 0; v < cut.entries; ++v) {
        float sum = 0.0f;
        for (std::uint32_t k = 0; k < cut.per_position; ++k) {
          const std::uint32_t index = (v >> (k * cut.bits)) & cut.mask;
          // Sign streams (no centroids): bit 1 ⇔ +1.
          const float value = centroids_or_null != nullptr ? centroids_or_null[index] : (index ? 1.0f : -1.0f);
          sum += q[p * cut.per_position + k] * value;
        }
        table[(static_cast<std::size_t>(p) * cut.entries + v) * LANES + lane] = sum;
      }
    }
  }
}

// GCC / Clang vector of LANES floats: lane-wise adds compile to packed SSE / AVX instructions. Loads and
// stores go through memcpy, so table rows need no particular alignment.
template <std::uint32_t LANES>
struct LaneVec {
  typedef float type __attribute__((vector_size(LANES * sizeof(float))));
};

template <std::uint32_t LANES>
inline void table_sum(const CodeCut& cut, const float* table, const std::uint8_t* codes, float* out) {
  using V = typename LaneVec<LANES>::type;
  V acc = {};
  for_each_index(cut, codes, [&](std::uint32_t p, std::uint32_t v) {
    V row;
    std::memcpy(&row, table + (static_cast<std::size_t>(p) * cut.entries + v) * LANES, sizeof(V));
    acc += row;
  });
  std::memcpy(out, &acc, sizeof(V));
}

template <std::uint32_t LANES>
inline void histogram_add(const CodeCut& cut, float* hist, const std::uint8_t* codes, const float* w) {
  using V = typename LaneVec<LANES>::type;
  V weights;
  std::memcpy(&weights, w, sizeof(V));
  for_each_index(cut, codes, [&](std::uint32_t p, std::uint32_t v) {
    float* h = hist + (static_cast<std::size_t>(p) * cut.entries + v) * LANES;
    V row;
    std::memcpy(&row, h, sizeof(V));
    row += weights;
    std::memcpy(h, &row, sizeof(V));
  });
}

template <std::uint32_t LANES>
void run_item_lut(const PackedSource& src, const KernelContext& ctx, std::span<const RequestShape> requests,
                  const Schedule& schedule, const Item& item, float* partials, std::uint32_t first_state,
                  std::uint32_t lane_count) {
  const Group& g = schedule.groups[item.group];
  const RequestShape& req = requests[g.request];
  const LayerLayout& lay = src.layout();
  const LayerCodec& codec = src.codec();
  const std::uint8_t* data = src.view().data;
  const std::uint32_t d = ctx.d;
  const std::uint32_t gs = ctx.group_size;
  const std::uint32_t key_end_all = req.first_position + g.row_end;
  const std::uint32_t c0 = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(static_cast<std::uint64_t>(item.chunk) * schedule.chunk_tokens, key_end_all));
  const std::uint32_t c1 = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(static_cast<std::uint64_t>(c0) + schedule.chunk_tokens, key_end_all));
  const std::uint32_t states = (g.row_end - g.row_begin) * gs;
  const std::uint32_t exact_begin = src.exact_begin(req.key_id);
  const bool exact = src.has_exact();

  // Prepared queries per lane (dead lanes stay zero) and each lane's last visible position.
  std::vector<float> prepared(static_cast<std::size_t>(LANES) * 3 * d, 0.0f);
  std::uint32_t last_visible[LANES] = {};
  const float* q_rot[LANES];
  const float* q_jl[LANES];
  for (std::uint32_t l = 0; l < LANES; ++l) {
    float* st = prepared.data() + static_cast<std::size_t>(l) * 3 * d;
    q_rot[l] = st;
    q_jl[l] = st + d;
    if (l >= lane_count) continue;
    const std::uint32_t i = g.row_begin + (first_state + l) / gs;
    const std::uint32_t q_head = g.head * gs + (first_state + l) % gs;
    src.prepare(req.queries + (static_cast<std::size_t>(i) * ctx.q_heads + q_head) * d, st);
    last_visible[l] = req.first_position + i;
  }
  const CodeCut key_cut = CodeCut::make(codec.key_codebook().bits(), d);
  const CodeCut sign_cut = CodeCut::make(1, d);
  const CodeCut value_cut = CodeCut::make(codec.value_codebook().bits(), d);
  std::vector<float> key_table(static_cast<std::size_t>(key_cut.positions) * key_cut.entries * LANES);
  build_table<LANES>(key_cut, codec.key_codebook().centroids_f32().data(), q_rot, lane_count, key_table.data());
  std::vector<float> sign_table;
  if (src.qjl()) {
    sign_table.resize(static_cast<std::size_t>(sign_cut.positions) * sign_cut.entries * LANES);
    build_table<LANES>(sign_cut, nullptr, q_jl, lane_count, sign_table.data());
  }
  std::vector<float> hist(static_cast<std::size_t>(value_cut.positions) * value_cut.entries * LANES, 0.0f);
  std::vector<float> acc_exact(exact ? static_cast<std::size_t>(LANES) * d : 0, 0.0f);
  float m[LANES], l_sum[LANES];
  for (std::uint32_t l = 0; l < LANES; ++l) {
    m[l] = kNegInf;
    l_sum[l] = 0.0f;
  }
  float scores[kBlockTokens][LANES];
  float norms[kBlockTokens];
  const float qjl_scale = src.qjl_scale();

  for (std::uint32_t b0 = c0; b0 < c1; b0 += kBlockTokens) {
    const std::uint32_t b1 = std::min(c1, b0 + kBlockTokens);
    const std::uint32_t nb = b1 - b0;
    for (std::uint32_t t = b0; t < b1; ++t) {
      float* sc = scores[t - b0];
      if (t >= exact_begin) {
        const float* k = src.window_row_ptr(lay.window_keys_offset, req.key_id, g.head, t);
        for (std::uint32_t l = 0; l < LANES; ++l) sc[l] = ctx.scale * dot(q_rot[l] + 2 * d, k, d);
      } else {
        const std::uint64_t slot = lay.slot(req.key_id, g.head, t);
        float norm = 0.0f;
        std::memcpy(&norm, data + lay.key_norms_offset + slot * 4, 4);
        float code_sum[LANES];
        table_sum<LANES>(key_cut, key_table.data(), data + lay.key_codes_offset + slot * lay.token.key_codes,
                         code_sum);
        if (src.qjl()) {
          float sign_sum[LANES];
          table_sum<LANES>(sign_cut, sign_table.data(), data + lay.key_signs_offset + slot * lay.token.key_signs,
                           sign_sum);
          std::uint16_t rho_bits = 0;
          std::memcpy(&rho_bits, data + lay.key_residual_norms_offset + slot * 2, 2);
          const float rho = f16_to_f32(rho_bits) * qjl_scale;
          for (std::uint32_t l = 0; l < LANES; ++l) sc[l] = ctx.scale * (norm * (code_sum[l] + rho * sign_sum[l]));
        } else {
          for (std::uint32_t l = 0; l < LANES; ++l) sc[l] = ctx.scale * (norm * code_sum[l]);
        }
      }
      for (std::uint32_t l = 0; l < LANES; ++l) {
        if (l >= lane_count || t > last_visible[l]) sc[l] = kNegInf;
      }
    }
    // Online softmax per lane; rescaling touches the lane's histogram column and exact accumulator.
    for (std::uint32_t l = 0; l < lane_count; ++l) {
      float block_max = kNegInf;
      for (std::uint32_t j = 0; j < nb; ++j) block_max = std::max(block_max, scores[j][l]);
      const float new_max = std::max(m[l], block_max);
      if (new_max == kNegInf) {
        for (std::uint32_t j = 0; j < nb; ++j) scores[j][l] = 0.0f;
        continue;
      }
      if (new_max > m[l] && m[l] != kNegInf) {
        const float rescale = std::exp(m[l] - new_max);
        l_sum[l] *= rescale;
        for (std::size_t e = l; e < hist.size(); e += LANES) hist[e] *= rescale;
        if (exact) scale_in_place(rescale, acc_exact.data() + static_cast<std::size_t>(l) * d, d);
      }
      m[l] = new_max;
      float sum = 0.0f;
      for (std::uint32_t j = 0; j < nb; ++j) {
        scores[j][l] = std::exp(scores[j][l] - new_max);
        sum += scores[j][l];
      }
      l_sum[l] += sum;
    }
    for (std::uint32_t l = lane_count; l < LANES; ++l) {
      for (std::uint32_t j = 0; j < nb; ++j) scores[j][l] = 0.0f;
    }
    for (std::uint32_t t = b0; t < b1; ++t) {
      const float* p = scores[t - b0];
      if (t >= exact_begin) {
        const float* v = src.window_row_ptr(lay.window_values_offset, req.key_id, g.head, t);
        for (std::uint32_t l = 0; l < lane_count; ++l) axpy(p[l], v, acc_exact.data() + static_cast<std::size_t>(l) * d, d);
        continue;
      }
      const std::uint64_t slot = lay.slot(req.key_id, g.head, t);
      std::memcpy(&norms[t - b0], data + lay.value_norms_offset + slot * 4, 4);
      float w[LANES];
      for (std::uint32_t l = 0; l < LANES; ++l) w[l] = p[l] * norms[t - b0];
      histogram_add<LANES>(value_cut, hist.data(), data + lay.value_codes_offset + slot * lay.token.value_codes, w);
    }
  }

  // Expand each lane's histogram into rotated-space accumulators, then finish or leave a partial.
  const float* centroids = codec.value_codebook().centroids_f32().data();
  std::vector<float> st(ctx.acc_floats);
  float* partial_base =
      g.chunks > 1 ? partials + g.partial_offset + static_cast<std::uint64_t>(item.chunk) * states * ctx.acc_floats
                   : nullptr;
  for (std::uint32_t l = 0; l < lane_count; ++l) {
    st[0] = m[l];
    st[1] = l_sum[l];
    float* acc = st.data() + 2;
    std::fill(acc, acc + d, 0.0f);
    for (std::uint32_t p = 0; p < value_cut.positions; ++p) {
      for (std::uint32_t v = 0; v < value_cut.entries; ++v) {
        const float h = hist[(static_cast<std::size_t>(p) * value_cut.entries + v) * LANES + l];
        if (h == 0.0f) continue;
        for (std::uint32_t k = 0; k < value_cut.per_position; ++k) {
          acc[p * value_cut.per_position + k] += h * centroids[(v >> (k * value_cut.bits)) & value_cut.mask];
        }
      }
    }
    if (exact) std::memcpy(acc + d, acc_exact.data() + static_cast<std::size_t>(l) * d, d * sizeof(float));
    const std::uint32_t i = g.row_begin + (first_state + l) / gs;
    const std::uint32_t q_head = g.head * gs + (first_state + l) % gs;
    if (partial_base == nullptr) {
      finish_row(src, ctx, q_head, st[0], st[1], acc, exact ? acc + d : nullptr,
                 req.output + (static_cast<std::size_t>(i) * ctx.q_heads + q_head) * d);
    } else {
      float* out = partial_base + static_cast<std::size_t>(first_state + l) * ctx.acc_floats;
      if (m[l] == kNegInf) {
        out[0] = kNegInf;
        out[1] = 0.0f;
      } else {
        std::memcpy(out, st.data(), ctx.acc_floats * sizeof(float));
      }
    }
  }
}

// Packed records: up to 8 (row, head) states at a time through the lookup-table kernel; more states
// (prefill blocks) take several passes over the chunk's records, which are small and stay in cache.
void run_item(const PackedSource& src, const KernelContext& ctx, std::span<const RequestShape> requests,
              const Schedule& schedule, const Item& item, float* partials) {
  const Group& g = schedule.groups[item.group];
  const std::uint32_t states = (g.row_end - g.row_begin) * ctx.group_size;
  for (std::uint32_t first = 0; first < states; first += 8) {
    const std::uint32_t lanes = std::min(8u, states - first);
    if (lanes <= 4) {
      run_item_lut<4>(src, ctx, requests, schedule, item, partials, first, lanes);
    } else {
      run_item_lut<8>(src, ctx, requests, schedule, item, partials, first, lanes);
    }
  }
}

}  // namespace
}  // namespace kvcompact::tq
