// CUDA chunked-prefill attention against the float64 oracle (tq::attention_oracle over the CPU cache's bytes,
// uploaded to the device so attention is tested independently of encode): chunk rows 1, 7, 64, 129, 300,
// first positions 0 and unaligned, lengths that are no multiple of the tile, GQA 1 / 4 / 8 / 16 / 72, head_dim
// 64 / 128 / 256, key modes prod2..5 / mse2..5, sinks and the exact window on and off, ragged batches of three
// sequences in one launch (entry → sequence through `seqs`), both precisions; plus graph capture and the
// host-side argument checks. Each config prints one `[prefill]` line with its worst relative error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_prefill.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"
#include "cuda/cuda_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::take;

using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

// One batch entry: the cache sequence holds `length` tokens; the chunk's rows sit at [first, first + rows).
struct Entry {
  std::uint32_t length, first, rows;
};

struct PrefillCase {
  std::string mode;
  std::uint32_t d;
  std::uint32_t group;  // query heads per KV head
  bool sinks;
  std::uint32_t window;
  std::vector<Entry> entries;
  PrefillPrecision precision = kDefaultPrefillPrecision;
  std::uint32_t kv_heads = 2;
  float query_sigma = 1.0f;  // larger: sharper softmax
  PrefillKernel kernel = PrefillKernel::Auto;
  // Multiprocessors the plan assumes (0: the device's). The warpgroup kernel splits the keys to fill them, so 1
  // means no split and a large count the most splits the keys allow (up to kMaxPrefillKeySplits).
  int multiprocessors = 0;
};

// The warpgroup kernel's cases run twice: without a key split and with as many splits as the keys allow.
constexpr int kNoSplit = 1, kMostSplits = 1 << 20;

// Per query row (all heads of one token): max |out − ref| / max |ref| (issue 4's measure), and the L2 form.
struct RowError {
  double max_abs = 0.0, l2 = 0.0;
};
RowError row_errors(const float* out, const double* ref, std::size_t n) {
  double diff = 0.0, top = 0.0, e2 = 0.0, n2 = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double dlt = static_cast<double>(out[j]) - ref[j];
    if (std::isnan(dlt)) return {dlt, dlt};
    diff = std::max(diff, std::fabs(dlt));
    top = std::max(top, std::fabs(ref[j]));
    e2 += dlt * dlt;
    n2 += ref[j] * ref[j];
  }
  RowError e;
  e.max_abs = top > 0.0 ? diff / top : diff;
  e.l2 = n2 > 0.0 ? std::sqrt(e2 / n2) : std::sqrt(e2);
  return e;
}

std::string entries_text(const std::vector<Entry>& entries) {
  std::string s;
  for (const Entry& e : entries) {
    if (!s.empty()) s += " ";
    s += std::to_string(e.length) + "/" + std::to_string(e.first) + "+" + std::to_string(e.rows);
  }
  return s;
}

// Builds the CPU cache (appends in two pieces so window starts come from real appends), uploads its bytes,
// runs prefill_attention on the GPU and compares every row with the oracle. Returns the worst max-abs error.
double check_prefill(const PrefillCase& c, std::uint64_t seed) {
  SCOPED_TRACE("mode " + c.mode + " head_dim " + std::to_string(c.d) + " group " + std::to_string(c.group) +
               " sinks " + std::to_string(c.sinks) + " window " + std::to_string(c.window) + " entries " +
               entries_text(c.entries) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto parsed = QuantConfig::parse(c.mode, seed);
  EXPECT_TRUE(parsed.ok()) << c.mode;
  if (!parsed.ok()) return 1.0;
  QuantConfig config = *parsed;
  config.exact_window = c.window;
  const std::uint32_t kv_heads = c.kv_heads, q_heads = kv_heads * c.group, d = c.d;
  const auto batch = static_cast<std::uint32_t>(c.entries.size());
  std::uint32_t max_length = 0, max_rows = 0, total_rows = 0;
  for (const Entry& e : c.entries) {
    max_length = std::max(max_length, e.length);
    max_rows = std::max(max_rows, e.rows);
    total_rows += e.rows;
  }
  CacheShape shape;
  shape.head_dim = d;
  shape.kv_heads = {kv_heads};
  shape.sequences = batch;
  shape.capacity = max_length + 3;  // deliberately not a multiple of 8 or 16
  auto cache = take(TurboQuantCache::create(shape, config));
  // Entry i reads sequence batch − 1 − i (exercises the seqs mapping).
  std::vector<std::uint32_t> seqs(batch);
  for (std::uint32_t i = 0; i < batch; ++i) seqs[i] = batch - 1 - i;
  std::uniform_real_distribution<float> decade(-1.5f, 1.5f);
  for (std::uint32_t i = 0; i < batch; ++i) {
    const std::uint32_t n = c.entries[i].length;
    const std::uint32_t split = std::min(n, c.entries[i].first);
    std::uint32_t done = 0;
    for (std::uint32_t piece : {split, n - split}) {
      if (piece == 0) continue;
      const auto keys = random_rows(rng, std::size_t{piece} * kv_heads, d, 1.0f, true);
      auto values = random_rows(rng, std::size_t{piece} * kv_heads, d, 1.0f, false);
      // Value norms over three decades exercise the running value-norm scale of P.
      for (std::size_t r = 0; r < std::size_t{piece} * kv_heads; ++r) {
        const float f = std::pow(10.0f, decade(rng));
        for (std::uint32_t j = 0; j < d; ++j) values[r * d + j] *= f;
      }
      EXPECT_TRUE(cache.append(0, seqs[i], done, piece, DType::F32, keys.data(), values.data()).ok());
      done += piece;
    }
  }
  const auto view = cache.view(0);
  const auto& layout = *view.layout;
  auto codec = take(DeviceCodec::create(*view.codec));
  auto layer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  EXPECT_TRUE(layer.upload(view.data, layout.total_bytes).ok());
  std::vector<std::uint32_t> lengths(view.lengths, view.lengths + batch);
  std::vector<std::uint32_t> begins(view.window_begins, view.window_begins + batch);
  std::vector<std::uint32_t> firsts(batch), rows(batch);
  for (std::uint32_t i = 0; i < batch; ++i) {
    firsts[i] = c.entries[i].first;
    rows[i] = c.entries[i].rows;
  }
  auto upload_u32 = [](const std::vector<std::uint32_t>& v) {
    auto b = take(DeviceBuffer::allocate(4ull * v.size()));
    EXPECT_TRUE(b.upload(v.data(), 4ull * v.size()).ok());
    return b;
  };
  auto dlen = upload_u32(lengths), dbeg = upload_u32(begins), dseq = upload_u32(seqs), dfirst = upload_u32(firsts),
       drows = upload_u32(rows);
  const auto queries = random_rows(rng, std::size_t{total_rows} * q_heads, d, c.query_sigma, false);
  auto dq = take(DeviceBuffer::allocate(queries.size() * 4));
  EXPECT_TRUE(dq.upload(queries.data(), queries.size() * 4).ok());
  std::vector<float> sinks(q_heads);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& s : sinks) s = normal(rng);
  auto dsinks = take(DeviceBuffer::allocate(4ull * q_heads));
  EXPECT_TRUE(dsinks.upload(sinks.data(), 4ull * q_heads).ok());
  auto dout = take(DeviceBuffer::allocate(queries.size() * 4));
  EXPECT_TRUE(dout.fill(0xFF).ok());  // NaN poison: every element must be written

  auto props = take(device_properties(0));
  const int sms = c.multiprocessors > 0 ? c.multiprocessors : props.multiprocessors;
  auto planned = plan_prefill(layout, config, q_heads, max_rows, shape.capacity, sms, c.precision, c.kernel, batch);
  EXPECT_TRUE(planned.ok()) << (planned.ok() ? "" : planned.error().to_string());
  if (!planned.ok()) return 1.0;
  const PrefillPlan plan = *planned;
  auto workspace = take(DeviceBuffer::allocate(std::max<std::uint64_t>(plan.workspace_bytes, 16)));
  EXPECT_TRUE(workspace.fill(0xFF).ok());  // the counters must be zeroed by prefill_attention itself
  PrefillArgs args;
  args.batch = batch;
  args.seqs = static_cast<const std::uint32_t*>(dseq.data());
  args.first_positions = static_cast<const std::uint32_t*>(dfirst.data());
  args.rows = static_cast<const std::uint32_t*>(drows.data());
  args.lengths = static_cast<const std::uint32_t*>(dlen.data());
  args.window_begins = static_cast<const std::uint32_t*>(dbeg.data());
  args.queries = static_cast<const float*>(dq.data());
  args.sinks = c.sinks ? static_cast<const float*>(dsinks.data()) : nullptr;
  args.output = static_cast<float*>(dout.data());
  const Status run =
      prefill_attention(plan, codec, layer.data(), args, plan.workspace_bytes > 0 ? workspace.data() : nullptr);
  EXPECT_TRUE(run.ok()) << (run.ok() ? "" : run.error().to_string());
  const Status sync = synchronize();
  EXPECT_TRUE(sync.ok()) << (sync.ok() ? "" : sync.error().to_string());
  if (!run.ok() || !sync.ok()) return 1.0;
  std::vector<float> out(queries.size());
  EXPECT_TRUE(dout.download(out.data(), out.size() * 4).ok());

  std::vector<AttentionRequest> requests;
  std::size_t offset = 0;
  const std::size_t row_floats = std::size_t{q_heads} * d;
  std::vector<std::size_t> offsets;
  for (std::uint32_t i = 0; i < batch; ++i) {
    AttentionRequest req;
    req.seq = seqs[i];
    req.first_position = firsts[i];
    req.rows = rows[i];
    req.queries = queries.data() + offset * row_floats;
    req.output = out.data();  // ignored by the oracle
    requests.push_back(req);
    offsets.push_back(offset);
    offset += rows[i];
  }
  AttentionOptions options;
  options.q_heads = q_heads;
  options.sinks = c.sinks ? sinks.data() : nullptr;
  auto ref = take(kvcompact::tq::attention_oracle(view, requests, options));
  RowError worst;
  std::uint32_t worst_entry = 0, worst_row = 0;
  for (std::uint32_t i = 0; i < batch && i < ref.size(); ++i) {
    for (std::uint32_t r = 0; r < rows[i]; ++r) {
      const RowError e = row_errors(out.data() + (offsets[i] + r) * row_floats, ref[i].data() + r * row_floats,
                                    row_floats);
      if (std::isnan(e.max_abs) || e.max_abs > worst.max_abs) {
        worst_entry = i;
        worst_row = r;
      }
      worst.max_abs = std::isnan(e.max_abs) || std::isnan(worst.max_abs) ? NAN : std::max(worst.max_abs, e.max_abs);
      worst.l2 = std::isnan(e.l2) || std::isnan(worst.l2) ? NAN : std::max(worst.l2, e.l2);
    }
  }
  std::printf(
      "[prefill] %s d=%u kv=%u group=%u sinks=%d window=%u %s %s entries(len/first+rows)=%s block_rows=%u "
      "tokens_per_block=%u occupancy=%d key_splits=%u: worst max-abs rel error %.3g (entry %u row %u), worst L2 %.3g\n",
      c.mode.c_str(), d, kv_heads, c.group, c.sinks ? 1 : 0, c.window,
      c.precision == PrefillPrecision::HiLo ? "hilo" : "fast",
      plan.kernel == PrefillKernel::Warpgroup ? "warpgroup" : "portable", entries_text(c.entries).c_str(), plan.block_rows,
      plan.tokens_per_block, plan.blocks_per_sm, plan.key_splits, worst.max_abs, worst_entry, worst_row, worst.l2);
  if (c.multiprocessors == kNoSplit) {
    EXPECT_EQ(plan.key_splits, 1u);
  }
  if (c.multiprocessors == kMostSplits && plan.kernel == PrefillKernel::Warpgroup && shape.capacity > 64) {
    EXPECT_GT(plan.key_splits, 1u);  // more than one key tile: the split path ran
  }
  EXPECT_LE(worst.max_abs, 1e-3) << "worst at entry " << worst_entry << " row " << worst_row;
  EXPECT_FALSE(std::isnan(worst.max_abs));
  return worst.max_abs;
}

TEST(CudaPrefill, MatchesTheFloat64OracleAcrossModesAndShapes) {
  SKIP_WITHOUT_GPU();
  using P = PrefillPrecision;
  const std::vector<PrefillCase> cases = {
      // The seed mode and the recommended mode, chunk sizes 1 / 7 / 64 / 129 / 300, unaligned first positions.
      {"k=prod3,v=mse2", 128, 4, false, 0, {{1, 0, 1}, {7, 0, 7}, {1000, 936, 64}}},
      {"k=prod3,v=mse2", 128, 4, true, 32, {{129, 0, 129}, {700, 400, 300}, {50, 43, 7}}},
      {"k=mse4,v=mse3,nc", 128, 4, false, 0, {{300, 0, 300}, {1333, 1204, 129}, {65, 1, 64}}},
      {"k=mse4,v=mse3,nc", 128, 8, true, 64, {{1, 0, 1}, {517, 453, 64}, {420, 291, 129}}},
      // Chunks that end before the stored length (first + rows < length): the rows see only their past.
      {"k=mse4,v=mse3,nc", 128, 4, true, 16, {{900, 100, 129}, {77, 0, 7}, {333, 300, 1}}},
      {"k=prod3,v=mse2", 64, 1, false, 16, {{129, 0, 129}, {300, 0, 300}, {77, 70, 7}}},
      {"k=prod3,v=mse2", 256, 8, true, 0, {{64, 0, 64}, {400, 271, 129}, {7, 0, 7}}},
      {"k=prod2,v=mse3", 64, 4, true, 0, {{200, 71, 129}, {33, 0, 33}}},
      {"k=prod4,v=mse4", 128, 1, false, 0, {{600, 300, 300}, {1, 0, 1}}},
      {"k=prod5,v=mse4", 256, 4, false, 128, {{700, 571, 129}, {129, 0, 129}}},
      {"k=mse5,v=mse2", 128, 16, true, 0, {{333, 269, 64}, {7, 0, 7}}},
      // Every key code width at head_dim 128 (the warpgroup producer compiles one dequantisation per width):
      // 1 bit (prod2) and 2-bit MSE keys, beside prod3 (2), prod4 (3), mse4 (4) and mse5 (5) above.
      {"k=prod2,v=mse4", 128, 4, true, 0, {{300, 171, 129}, {64, 0, 64}}},
      {"k=mse2,v=mse3,nc", 128, 8, false, 16, {{200, 100, 100}, {9, 0, 9}}},
      {"k=mse3,v=mse3,nc", 256, 1, false, 7, {{300, 0, 300}, {150, 21, 129}}},
      {"k=mse2,v=mse4", 64, 8, false, 0, {{129, 0, 129}, {1000, 871, 129}}},
      {"k=prod3,v=mse4", 64, 4, true, 40, {{2000, 1936, 64}}, P::HiLo, 2, 3.0f},  // sharper softmax
      // A GQA group wider than one block's rows (72 heads of one KV head: 2 head groups at head_dim 256).
      {"k=prod3,v=mse2", 256, 72, true, 0, {{40, 30, 10}, {5, 0, 5}}, P::HiLo, 1},
      {"k=prod3,v=mse2", 128, 4, true, 0, {{1000, 936, 64}, {129, 0, 129}}},
      {"k=mse4,v=mse3,nc", 128, 4, false, 32, {{700, 400, 300}, {7, 0, 7}}},
      // A long sequence: many key tiles, the running value-norm scale over many tiles.
      {"k=mse4,v=mse3,nc", 128, 4, false, 0, {{5000, 4936, 64}}},
  };
  std::uint32_t warpgroup_cases = 0;
  for (const PrefillCase& shape : cases) {
    // Every case in both P precisions (Fast, the default, and HiLo; a case's own precision field is overridden).
    for (P precision : {P::Fast, P::HiLo}) {
      PrefillCase c = shape;
      c.precision = precision;
      // head_dim 128 runs the warpgroup kernel by default (three consumers for MSE keys, two for QJL keys): with
      // and without a key split, and the portable kernel on it too.
      if (c.d == 128) {
        for (int sms : {kNoSplit, kMostSplits}) {
          PrefillCase variant = c;
          variant.multiprocessors = sms;
          check_prefill(variant, fresh_seed());
        }
        PrefillCase portable = c;
        portable.kernel = PrefillKernel::Portable;
        check_prefill(portable, fresh_seed());
        ++warpgroup_cases;
      } else {
        check_prefill(c, fresh_seed());
      }
    }
  }
  EXPECT_GE(warpgroup_cases, 24u);
}

// plan / run: prefill_attention allocates and synchronises nothing, so it can be captured in a CUDA graph; the
// replayed graph must give the same bytes as a direct call (with a key split too: the counters are zeroed by a
// memset node of the graph, and the merge's order does not depend on which split finished last).
void check_graph_replay(const std::string& mode, int multiprocessors, PrefillKernel kernel = PrefillKernel::Auto,
                        PrefillPrecision precision = PrefillPrecision::HiLo) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("mode " + mode + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  QuantConfig config = *QuantConfig::parse(mode, seed);
  config.exact_window = 16;
  const std::uint32_t d = 128, kv_heads = 2, q_heads = 8, seqs = 2;
  const std::vector<std::uint32_t> lengths = {700, 130};
  const std::vector<std::uint32_t> firsts = {600, 0}, rows = {100, 130};
  auto cache = testing::random_cpu_cache(rng, config, d, kv_heads, lengths, 700);
  const auto view = cache.view(0);
  auto codec = take(DeviceCodec::create(*view.codec));
  auto layer = testing::upload_layer(view);
  std::vector<std::uint32_t> begins(view.window_begins, view.window_begins + seqs);
  auto dlen = take(DeviceBuffer::allocate(8));
  auto dbeg = take(DeviceBuffer::allocate(8));
  auto dfirst = take(DeviceBuffer::allocate(8));
  auto drows = take(DeviceBuffer::allocate(8));
  ASSERT_OK(dlen.upload(lengths.data(), 8));
  ASSERT_OK(dbeg.upload(begins.data(), 8));
  ASSERT_OK(dfirst.upload(firsts.data(), 8));
  ASSERT_OK(drows.upload(rows.data(), 8));
  const auto q = random_rows(rng, std::size_t{230} * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_OK(dq.upload(q.data(), q.size() * 4));
  auto direct = take(DeviceBuffer::allocate(q.size() * 4));
  auto graphed = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_OK(graphed.fill(0xFF));
  auto plan = take(plan_prefill(*view.layout, config, q_heads, 130, 700, multiprocessors, precision, kernel, seqs));
  std::printf("[prefill-graph] %s: %s kernel%s, %u key splits\n", mode.c_str(),
              plan.kernel == PrefillKernel::Warpgroup ? "warpgroup" : "portable",
              plan.folded_keys ? " (folded keys)" : "", plan.key_splits);
  auto workspace = take(DeviceBuffer::allocate(std::max<std::uint64_t>(plan.workspace_bytes, 16)));
  void* const ws = plan.workspace_bytes > 0 ? workspace.data() : nullptr;
  PrefillArgs args;
  args.batch = seqs;
  args.first_positions = static_cast<const std::uint32_t*>(dfirst.data());
  args.rows = static_cast<const std::uint32_t*>(drows.data());
  args.lengths = static_cast<const std::uint32_t*>(dlen.data());
  args.window_begins = static_cast<const std::uint32_t*>(dbeg.data());
  args.queries = static_cast<const float*>(dq.data());
  args.output = static_cast<float*>(direct.data());
  ASSERT_OK(prefill_attention(plan, codec, layer.data(), args, ws));
  ASSERT_OK(synchronize());

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  args.output = static_cast<float*>(graphed.data());
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = prefill_attention(plan, codec, layer.data(), args, ws, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_OK(captured);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> a(q.size()), b(q.size());
  ASSERT_OK(direct.download(a.data(), a.size() * 4));
  ASSERT_OK(graphed.download(b.data(), b.size() * 4));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  for (float x : b) ASSERT_FALSE(std::isnan(x));
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

TEST(CudaPrefill, RunIsCapturableInACudaGraph) {
  SKIP_WITHOUT_GPU();
  check_graph_replay("seed", take(device_properties(0)).multiprocessors, PrefillKernel::Portable);
  check_graph_replay("k=mse4,v=mse3,nc", kMostSplits);  // the warpgroup kernel, keys split
  check_graph_replay("seed", kMostSplits);              // the warpgroup kernel with QJL keys, keys split
  // Folded QJL keys (Fast precision): the fold pass and the kernel in one graph, with and without a key split.
  check_graph_replay("seed", kMostSplits, PrefillKernel::Auto, PrefillPrecision::Fast);
  check_graph_replay("seed", 1, PrefillKernel::Auto, PrefillPrecision::Fast);
}

// Host-side checks come before any CUDA call, so the plan checks run without a device too.
TEST(CudaPrefill, BadArgumentsAreTypedErrors) {
  const QuantConfig config = QuantConfig::seed_system();
  auto layout80 = take(kvcompact::tq::plan_layer_layout(80, 2, 1, 64, config));
  EXPECT_EQ(plan_prefill(layout80, config, 4, 8, 64, 132).error().code, ErrorCode::Unsupported);
  auto layout = take(kvcompact::tq::plan_layer_layout(128, 2, 1, 64, config));
  EXPECT_EQ(plan_prefill(layout, config, 3, 8, 64, 132).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_prefill(layout, config, 0, 8, 64, 132).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_prefill(layout, config, 4, 0, 64, 132).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_prefill(layout, config, 4, 8, 65, 132).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(plan_prefill(layout, config, 4, 33, 32, 132).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(plan_prefill(layout, config, 4, 8, 64, 0).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_prefill(layout, config, 4, 8, 64, 132, PrefillPrecision::HiLo, PrefillKernel::Auto, 0).error().code,
            ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_prefill(layout, config, 4, 8, 64, 132, PrefillPrecision::HiLo, PrefillKernel::Auto, 70000).error().code,
            ErrorCode::InvalidArgument);
  // The warpgroup kernel: head_dim 128 only (MSE and QJL keys); an unknown kernel value.
  const QuantConfig mse = *QuantConfig::parse("k=mse4,v=mse3,nc");
  auto mse128 = take(kvcompact::tq::plan_layer_layout(128, 2, 1, 64, mse));
  auto mse64 = take(kvcompact::tq::plan_layer_layout(64, 2, 1, 64, mse));
  auto seed64 = take(kvcompact::tq::plan_layer_layout(64, 2, 1, 64, config));
  EXPECT_EQ(plan_prefill(seed64, config, 4, 8, 64, 132, PrefillPrecision::HiLo, PrefillKernel::Warpgroup).error().code,
            ErrorCode::Unsupported);
  EXPECT_EQ(plan_prefill(mse64, mse, 4, 8, 64, 132, PrefillPrecision::HiLo, PrefillKernel::Warpgroup).error().code,
            ErrorCode::Unsupported);
  EXPECT_EQ(plan_prefill(mse128, mse, 4, 8, 64, 132, PrefillPrecision::HiLo, static_cast<PrefillKernel>(9)).error().code,
            ErrorCode::InvalidArgument);
  EXPECT_FALSE(prefill_supported(80, config));
  EXPECT_TRUE(prefill_supported(64, config));
  if (device_count() == 0) return;
  // QJL keys at head_dim 128 plan the warpgroup kernel: in Fast precision (the default) with folded keys on the
  // MSE block (192 rows; the folded tiles in the workspace: 32 KiB per 64 tokens of max_length, KV head and
  // entry), in HiLo from their codes and signs (128 rows per block: two consumer warpgroups; no workspace
  // without a key split).
  auto seed_plan = take(plan_prefill(layout, config, 4, 8, 64, 132));
  EXPECT_EQ(seed_plan.kernel, PrefillKernel::Warpgroup);
  EXPECT_TRUE(seed_plan.folded_keys);
  EXPECT_EQ(seed_plan.block_rows, 192u);
  EXPECT_EQ(seed_plan.key_splits, 1u);
  EXPECT_EQ(seed_plan.workspace_bytes, std::uint64_t{2} * 1 * 32768);  // kv_heads 2, one 64-token tile, one entry
  auto seed_two = take(plan_prefill(layout, config, 4, 8, 64, 132, PrefillPrecision::Fast, PrefillKernel::Auto, 3));
  EXPECT_EQ(seed_two.workspace_bytes, std::uint64_t{3} * 2 * 32768);
  auto seed_hilo = take(plan_prefill(layout, config, 4, 8, 64, 132, PrefillPrecision::HiLo));
  EXPECT_FALSE(seed_hilo.folded_keys);
  EXPECT_EQ(seed_hilo.block_rows, 128u);
  EXPECT_EQ(seed_hilo.workspace_bytes, 0u);
  auto seed_portable = take(plan_prefill(layout, config, 4, 8, 64, 132, PrefillPrecision::Fast, PrefillKernel::Portable));
  EXPECT_FALSE(seed_portable.folded_keys);
  // Run-time checks need a codec (device tables).
  auto cache = take(TurboQuantCache::create(CacheShape{128, {2}, 1, 64}, config));
  auto codec = take(DeviceCodec::create(*cache.codec(0)));
  auto plan = take(plan_prefill(layout, config, 4, 8, 64, 132));
  auto buffer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout) + 64));
  auto small = take(DeviceBuffer::allocate(64));
  PrefillArgs args;
  args.batch = 1;
  args.first_positions = static_cast<const std::uint32_t*>(small.data());
  args.rows = static_cast<const std::uint32_t*>(small.data());
  args.lengths = static_cast<const std::uint32_t*>(small.data());
  args.queries = static_cast<const float*>(small.data());
  args.output = static_cast<float*>(small.data());
  EXPECT_EQ(prefill_attention(plan, codec, nullptr, args, nullptr).error().code, ErrorCode::InvalidArgument);
  const auto* misaligned = static_cast<const std::uint8_t*>(buffer.data()) + 4;
  EXPECT_EQ(prefill_attention(plan, codec, misaligned, args, nullptr).error().code, ErrorCode::InvalidArgument);
  PrefillArgs bad = args;
  bad.scale = NAN;
  EXPECT_EQ(prefill_attention(plan, codec, buffer.data(), bad, nullptr).error().code, ErrorCode::InvalidArgument);
  bad = args;
  bad.rows = nullptr;
  EXPECT_EQ(prefill_attention(plan, codec, buffer.data(), bad, nullptr).error().code, ErrorCode::InvalidArgument);
  bad = args;
  bad.batch = 2;  // beyond the plan's max_batch (1)
  EXPECT_EQ(prefill_attention(plan, codec, buffer.data(), bad, nullptr).error().code, ErrorCode::OutOfRange);
  // A plan that splits the keys needs its workspace.
  auto mse_cache = take(TurboQuantCache::create(CacheShape{128, {2}, 1, 4096}, mse));
  auto mse_codec = take(DeviceCodec::create(*mse_cache.codec(0)));
  auto big = take(kvcompact::tq::plan_layer_layout(128, 2, 1, 4096, mse));
  auto split_plan = take(plan_prefill(big, mse, 4, 8, 4096, kMostSplits));
  EXPECT_GT(split_plan.key_splits, 1u);
  EXPECT_GT(split_plan.workspace_bytes, 0u);
  auto big_buffer = take(DeviceBuffer::allocate(layer_buffer_bytes(big)));
  EXPECT_EQ(prefill_attention(split_plan, mse_codec, big_buffer.data(), args, nullptr).error().code,
            ErrorCode::InvalidArgument);
  // with_key_splits: counts outside [1, kMaxPrefillKeySplits], more splits than key tiles, the portable kernel,
  // a plan not from plan_prefill; a valid count sizes the workspace for itself.
  EXPECT_EQ(with_key_splits(split_plan, 0).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(with_key_splits(split_plan, kMaxPrefillKeySplits + 1).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(with_key_splits(PrefillPlan{}, 2).error().code, ErrorCode::InvalidArgument);
  auto two_tiles = take(plan_prefill(big, mse, 4, 8, 128, 132));
  EXPECT_EQ(with_key_splits(two_tiles, 3).error().code, ErrorCode::OutOfRange);
  auto portable_plan = take(plan_prefill(big, mse, 4, 8, 4096, 132, PrefillPrecision::HiLo, PrefillKernel::Portable));
  EXPECT_EQ(with_key_splits(portable_plan, 2).error().code, ErrorCode::Unsupported);
  EXPECT_EQ(take(with_key_splits(portable_plan, 1)).workspace_bytes, 0u);
  auto unsplit = take(with_key_splits(split_plan, 1));
  EXPECT_EQ(unsplit.key_splits, 1u);
  // MSE keys are folded on the warpgroup kernel in Fast precision (the default): 24 KiB per 64-token tile of
  // max_length and KV head (the fp16 and the e4m3 key tile), nothing more without a key split; HiLo reads codes.
  EXPECT_TRUE(unsplit.folded_keys);
  EXPECT_EQ(unsplit.workspace_bytes, std::uint64_t{2} * (4096 / 64) * 24576);
  const PrefillPlan hilo_plan = take(plan_prefill(big, mse, 4, 8, 4096, 1, PrefillPrecision::HiLo));
  EXPECT_FALSE(hilo_plan.folded_keys);
  EXPECT_EQ(hilo_plan.workspace_bytes, 0u);
  auto five = take(with_key_splits(split_plan, 5));
  EXPECT_EQ(five.key_splits, 5u);
  auto three = take(with_key_splits(split_plan, 3));
  EXPECT_GT(five.workspace_bytes, three.workspace_bytes);
  five.key_splits = kMaxPrefillKeySplits + 1;  // edited by hand: refused at run time
  EXPECT_EQ(prefill_attention(five, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  // Other fields edited by hand, refused at run time as well: folding switched off or on against the kernel and
  // precision (no instance would serve it; a fold without its tiles in the workspace would write past it), and a
  // workspace_bytes below what the plan's fields need.
  auto unfolded = three;
  unfolded.folded_keys = false;
  EXPECT_EQ(prefill_attention(unfolded, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  auto folded_hilo = take(plan_prefill(big, mse, 4, 8, 4096, 132, PrefillPrecision::HiLo));
  folded_hilo.folded_keys = true;
  EXPECT_EQ(prefill_attention(folded_hilo, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  auto short_workspace = three;
  short_workspace.workspace_bytes -= 1;
  EXPECT_EQ(prefill_attention(short_workspace, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  // Shape fields edited by hand (prefill_plan_check.hpp; PrefillPlanCheck.* edits each of them on the CPU): more
  // tokens per block than the block holds, a max_length past the capacity, a kernel other than the one that runs.
  auto more_tokens = three;
  more_tokens.tokens_per_block *= 2;
  EXPECT_EQ(prefill_attention(more_tokens, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  auto past_capacity = three;
  past_capacity.max_length = past_capacity.layout.capacity + 1;
  EXPECT_EQ(prefill_attention(past_capacity, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  auto auto_kernel = three;
  auto_kernel.kernel = PrefillKernel::Auto;
  EXPECT_EQ(prefill_attention(auto_kernel, mse_codec, big_buffer.data(), args, big_buffer.data()).error().code,
            ErrorCode::InvalidArgument);
  // A codec of another mode.
  const QuantConfig other = *QuantConfig::parse("k=mse4,v=mse3,nc");
  auto other_cache = take(TurboQuantCache::create(CacheShape{128, {2}, 1, 64}, other));
  auto other_codec = take(DeviceCodec::create(*other_cache.codec(0)));
  EXPECT_EQ(prefill_attention(plan, other_codec, buffer.data(), args, nullptr).error().code, ErrorCode::Mismatch);
  // Window layouts need window starts.
  QuantConfig windowed = config;
  windowed.exact_window = 8;
  auto wlayout = take(kvcompact::tq::plan_layer_layout(128, 2, 1, 64, windowed));
  auto wplan = take(plan_prefill(wlayout, windowed, 4, 8, 64, 132));
  EXPECT_EQ(prefill_attention(wplan, codec, buffer.data(), args, nullptr).error().code, ErrorCode::InvalidArgument);
}

// A tiny set for compute-sanitizer (memcheck / racecheck), run by scripts/gpu/run_all.sh.
TEST(CudaPrefillSmall, TinyChunksForSanitizers) {
  SKIP_WITHOUT_GPU();
  // The seed mode at head_dim 128 in both precisions: Fast folds its keys (the fold pass and the MSE block),
  // HiLo reads codes and signs (the two-consumer QJL block).
  check_prefill({"k=prod3,v=mse2", 128, 4, true, 16, {{1, 0, 1}, {40, 20, 20}, {70, 33, 37}}}, fresh_seed());
  check_prefill({"k=prod3,v=mse2", 128, 4, false, 0, {{130, 0, 130}, {9, 2, 7}}, PrefillPrecision::HiLo},
                fresh_seed());
  check_prefill({"k=mse4,v=mse3,nc", 64, 8, false, 0, {{45, 0, 45}, {9, 2, 7}}}, fresh_seed());
  // The warpgroup kernel (head_dim 128; the first case above with QJL keys): three 64-token tiles, both
  // precisions, the second with the keys split (three splits of one tile: partials, the counter and the merge).
  check_prefill({"k=mse4,v=mse3,nc", 128, 4, true, 16, {{150, 90, 60}, {9, 2, 7}}, PrefillPrecision::HiLo, 2, 1.0f,
                 PrefillKernel::Auto, kNoSplit},
                fresh_seed());
  check_prefill({"k=mse3,v=mse2", 128, 4, false, 0, {{150, 0, 150}}, PrefillPrecision::Fast, 2, 1.0f,
                 PrefillKernel::Auto, kMostSplits},
                fresh_seed());
}

}  // namespace
}  // namespace kvcompact::cuda::tq
