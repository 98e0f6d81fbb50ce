// CPU attention over packed TurboQuant records (fast float32 path) and over dense f32 rows (the exact
// baseline). One schedule serves both: work items are (request, kv head, block of query rows, key chunk);
// each item runs an online softmax over its chunk and either finishes its rows directly or leaves a
// partial (max, sum, accumulators) that a log-sum-exp merge combines — flash-decoding on the CPU, so one
// long sequence still keeps every core busy. Packed records are scored through per-item lookup tables
// that fold the queries of up to 8 (row, head) states of one KV head — its GQA group — into one vector add
// per code nibble, so a token's record is read once for all of them.
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

namespace kvcompact::tq {

namespace {

constexpr std::uint32_t kBlockTokens = 64;  // tokens scored before one online-softmax update
constexpr std::uint32_t kRowBlock = 16;     // query rows that share one pass over the keys
constexpr std::uint32_t kDefaultMinChunk = 1024;  // shortest key chunk: amortises per-item tables and the merge
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight independent partial sums so the compiler can vectorise without reassociating on its own.
inline float dot(const float* a, const float* b, std::uint32_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::uint32_t j = 0; j < d; j += 8) {
    for (std::uint32_t k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline void axpy(float w, const float* x, float* y, std::uint32_t d) {
  for (std::uint32_t j = 0; j < d; ++j) y[j] += w * x[j];
}

inline void scale_in_place(float s, float* y, std::uint32_t d) {
  for (std::uint32_t j = 0; j < d; ++j) y[j] *= s;
}

// ---- key / value sources --------------------------------------------------------------------------
// PackedSource gives the lookup-table kernel the packed records, the exact window ring and the codec's
// rotations. DenseSource turns dense f32 rows into scores and weighted value sums for the generic kernel
// (the exact baseline). Both finish a (row, head) from its accumulators.
class PackedSource {
 public:
  PackedSource(const LayerView& view) : view_(view), layout_(*view.layout), codec_(*view.codec) {
    d_ = layout_.head_dim;
    qjl_ = codec_.config().has_qjl();
    qjl_scale_ = codec_.qjl_scale();
  }

  std::uint32_t head_dim() const { return d_; }
  bool has_exact() const { return layout_.exact_window > 0; }
  const LayerView& view() const { return view_; }
  const LayerLayout& layout() const { return layout_; }
  const LayerCodec& codec() const { return codec_; }
  bool qjl() const { return qjl_; }
  float qjl_scale() const { return qjl_scale_; }
  const float* window_row_ptr(std::uint64_t region, std::uint32_t seq, std::uint32_t head, std::uint32_t t) const {
    return window_row(region, seq, head, t);
  }
  // Floats of prepared state per query head: q_rot, q_jl, and the original query for exact rows.
  std::uint32_t query_floats() const { return 3 * d_; }
  std::uint32_t exact_begin(std::uint32_t seq) const {
    return exact_window_begin(view_.lengths[seq], view_.window_begins[seq], layout_.exact_window);
  }

  void prepare(const float* query, float* state) const {
    std::memcpy(state + 2 * d_, query, d_ * sizeof(float));
    codec_.prepare_query({query, d_}, {state, d_}, {state + d_, d_});
  }

  // out = (R⁻¹(acc_rot) + acc_exact) · inv_sum. acc_rot is used as scratch.
  void finish(float* acc_rot, const float* acc_exact, float inv_sum, float* out) const {
    codec_.finish_values({acc_rot, d_}, {out, d_});
    if (has_exact()) {
      for (std::uint32_t j = 0; j < d_; ++j) out[j] = (out[j] + acc_exact[j]) * inv_sum;
    } else {
      scale_in_place(inv_sum, out, d_);
    }
  }

 private:
  const float* window_row(std::uint64_t region, std::uint32_t seq, std::uint32_t head, std::uint32_t t) const {
    const std::uint64_t row = layout_.window_row(seq, head, t);
    return reinterpret_cast<const float*>(view_.data + region) + row * d_;
  }

  const LayerView& view_;
  const LayerLayout& layout_;
  const LayerCodec& codec_;
  std::uint32_t d_ = 0;
  bool qjl_ = false;
  float qjl_scale_ = 0.0f;
};

// Dense f32 rows: exact attention with the same schedule, the baseline the packed path is timed against.
class DenseSource {
 public:
  DenseSource(std::uint32_t head_dim, std::uint32_t kv_heads, std::span<const DenseAttentionRequest> requests)
      : d_(head_dim), kv_heads_(kv_heads), requests_(requests) {}

  std::uint32_t head_dim() const { return d_; }
  bool has_exact() const { return false; }
  std::uint32_t query_floats() const { return d_; }
  std::uint32_t exact_begin(std::uint32_t) const { return std::numeric_limits<std::uint32_t>::max(); }
  void prepare(const float* query, float* state) const { std::memcpy(state, query, d_ * sizeof(float)); }

  struct Token {
    const float* row = nullptr;
  };
  void load_key(std::uint32_t req, std::uint32_t head, std::uint32_t t, std::uint32_t, Token& tok, float*) const {
    tok.row = requests_[req].keys + (static_cast<std::size_t>(t) * kv_heads_ + head) * d_;
  }
  float score(const Token& tok, const float*, const float* state) const { return dot(state, tok.row, d_); }
  void load_value(std::uint32_t req, std::uint32_t head, std::uint32_t t, std::uint32_t, Token& tok, float*) const {
    tok.row = requests_[req].values + (static_cast<std::size_t>(t) * kv_heads_ + head) * d_;
  }
  void accumulate(const Token& tok, const float*, float p, float* acc, float*) const { axpy(p, tok.row, acc, d_); }
  void finish(float* acc, const float*, float inv_sum, float* out) const {
    for (std::uint32_t j = 0; j < d_; ++j) out[j] = acc[j] * inv_sum;
  }

 private:
  std::uint32_t d_;
  std::uint32_t kv_heads_;
  std::span<const DenseAttentionRequest> requests_;
};

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
