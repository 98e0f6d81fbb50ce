// The window-write and compressor kernels against the CPU oracle (LayerRunner over a CPU Deepseek4Cache): random
// batched chunked-prefill + decode traces of several sequences (each with its own chunk sizes), per-step decode
// comparisons, NaN / inf inputs and the launchers' argument checks. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "cache_test_util.hpp"

namespace kvcompact::cuda::dsv4::testing {
namespace {

struct StorageCase {
  const char* name;
  kd::StorageConfig storage;
};

const StorageCase kStorages[] = {
    {"bf16", kd::StorageConfig::bf16()},
    {"fp8", kd::StorageConfig::fp8()},
    {"bf16+mxfp4", kd::StorageConfig{kd::RowStorage::Bf16, kd::IndexerStorage::Mxfp4}},
};

// Runs `sequences` sequences of `tokens` tokens through both backends in batch steps: a prefill phase with
// random chunk sizes in [1, max_chunk] (different per sequence in the same step), then one-token decode steps.
// Compares the caches every `compare_every` steps and at the end.
void run_trace(const char* label, std::uint64_t seed, const tu::SyntheticModel& model, kd::StorageConfig storage,
               std::uint64_t context, std::size_t sequences, std::size_t tokens, std::size_t prefill_tokens,
               std::size_t max_chunk, std::size_t compare_every, const KernelOptions& options = {}) {
  tu::Rng rng(seed);
  DeviceWeights weights(model);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (std::size_t i = 0; i < sequences; ++i) {
    seqs.push_back(std::make_unique<Sequence>(rng, model, context, storage, tokens));
  }
  std::size_t step = 0;
  for (;;) {
    std::vector<Sequence*> batch;
    std::vector<std::uint64_t> counts;
    for (auto& s : seqs) {
      const std::uint64_t pos = s->cpu.position();
      if (pos >= tokens) continue;
      std::uint64_t n = 1;
      if (pos < prefill_tokens) {
        n = static_cast<std::uint64_t>(rng.integer(1, static_cast<std::int64_t>(max_chunk)));
        n = std::min<std::uint64_t>(n, prefill_tokens - pos);
      }
      batch.push_back(s.get());
      counts.push_back(n);
    }
    if (batch.empty()) break;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Status st = run_cpu(*batch[i], counts[i]);
      ASSERT_TRUE(st.ok()) << "cpu oracle: " << st.error().to_string();
    }
    const Status st = run_gpu(batch, counts, weights, options);
    ASSERT_TRUE(st.ok()) << "gpu step " << step << ": " << st.error().to_string();
    ++step;
    const bool last = std::all_of(seqs.begin(), seqs.end(), [&](const auto& s) { return s->cpu.position() >= tokens; });
    if (step % compare_every == 0 || last) {
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        const CacheDiff d = compare_caches(seqs[i]->cpu, seqs[i]->gpu);
        if (last || !acceptable(d, storage)) {
          const std::string what = std::string(label) + " seq " + std::to_string(i) + " step " + std::to_string(step) +
                                   " position " + std::to_string(seqs[i]->cpu.position());
          print_diff(what.c_str(), seed, d);
        }
        ASSERT_TRUE(acceptable(d, storage)) << label << " seq " << i << " after step " << step << " (position "
                                            << seqs[i]->cpu.position() << ")";
      }
    }
  }
}

TEST(CudaDsv4Compressor, BatchedChunkedPrefillAndDecodeMatchTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (const StorageCase& sc : kStorages) {
    const std::uint64_t seed = tu::fresh_seed();
    SCOPED_TRACE(::testing::Message() << sc.name << " seed " << seed);
    tu::Rng rng(seed ^ 0x5A5A);
    const tu::SyntheticModel model(rng, tu::synthetic_config({0, 4, 128, 4, 128}, 4, 8), 1);
    // 3 sequences, 560 tokens: ~300 prefilled in chunks up to 200 (> the 128-row window), the rest decoded.
    run_trace(sc.name, seed, model, sc.storage, 1024, 3, 560, 300, 200, 16);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaDsv4Compressor, TokenByTokenPrefillMatchesTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed ^ 0x7777);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4, 128, 0}, 4, 8), 1);
  KernelOptions sequential;
  sequential.sequential_compressor = true;  // prefill chunks through the decode path (one block walks the chunk)
  run_trace("sequential", seed, model, kd::StorageConfig::bf16(), 1024, 2, 400, 380, 150, 8, sequential);
}

TEST(CudaDsv4Compressor, LongPrefillChunksMatchTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed ^ 0x9999);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4, 128}, 4, 8), 1);
  // One sequence, chunks of up to 1500 tokens (hundreds of rows emitted in parallel per chunk), then decode.
  run_trace("long", seed, model, kd::StorageConfig::fp8(), 4096, 1, 2600, 2590, 1500, 1);
}

TEST(CudaDsv4Compressor, DecodeStepsMatchTheCpuAtEveryStep) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed ^ 0xA5A5);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4, 128}, 4, 8), 1);
  // Every token decoded alone; compared after every step (each ratio-4 emission, the first ratio-128 one).
  run_trace("decode", seed, model, kd::StorageConfig::bf16(), 300, 1, 264, 0, 1, 1);
}

TEST(CudaDsv4CacheSmall, TinyBatchedTraceMatchesTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed ^ 0x1234);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4, 128}, 2, 4), 1);
  // Two sequences of 136 tokens: chunks up to 60 for the first 129 (one ratio-128 emission), then decode.
  run_trace("small", seed, model, kd::StorageConfig::fp8(), 160, 2, 136, 129, 60, 4);
}

TEST(CudaDsv4Compressor, NonFiniteInputIsReportedAndPoisons) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4}, 2, 4), 1);
  DeviceWeights weights(model);
  for (int which = 0; which < 2; ++which) {  // 0: a window row, 1: a compressor score
    Sequence s(rng, model, 64, kd::StorageConfig::bf16(), 8);
    auto& L = s.stream.layers[0];
    std::vector<float>& host = which == 0 ? L.kv : L.z;
    host[3 * (which == 0 ? 512 : L.pw) + 17] = std::numeric_limits<float>::quiet_NaN();
    DeviceBuffer& dev = which == 0 ? s.device[0].kv : s.device[0].z;
    ASSERT_TRUE(dev.upload(host.data(), host.size() * sizeof(float)).ok());
    std::vector<LayerSpan> spans{s.span(0, 8)};
    const Status st = which == 0 ? write_window(spans, 0) : run_compressors(spans, 0, weights.at(0));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::NonFinite) << st.error().to_string();
    EXPECT_TRUE(s.gpu.poisoned());
    std::printf("[dsv4-cache] non-finite %s input: %s\n", which == 0 ? "window" : "compressor",
                st.error().to_string().c_str());
    // The status word was cleared when it was read: after a reset, clean inputs work again.
    ASSERT_TRUE(s.gpu.reset().ok());
    host[3 * (which == 0 ? 512 : L.pw) + 17] = 0.25f;
    ASSERT_TRUE(dev.upload(host.data(), host.size() * sizeof(float)).ok());
    spans = {s.span(0, 8)};
    const Status again = which == 0 ? write_window(spans, 0) : run_compressors(spans, 0, weights.at(0));
    EXPECT_TRUE(again.ok()) << again.error().to_string();
  }
}

TEST(CudaDsv4Compressor, LauncherChecksFailBeforeAnyWork) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed);
  const tu::SyntheticModel model(rng, tu::synthetic_config({4, 0}, 2, 4), 1);
  DeviceWeights weights(model);
  Sequence a(rng, model, 16, kd::StorageConfig::bf16(), 16);
  Sequence b(rng, model, 16, kd::StorageConfig::bf16(), 16);
  auto code = [](const Status& st) { return st.ok() ? ErrorCode::Internal : st.error().code; };
  auto expect = [&](const Status& st, ErrorCode want, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(code(st), want) << what << ": " << st.error().to_string();
  };
  std::vector<LayerSpan> spans{a.span(0, 4), a.span(0, 4)};
  expect(write_window(spans, 0), ErrorCode::InvalidArgument, "repeated cache");
  spans = {a.span(0, 4)};
  spans[0].cache = nullptr;
  expect(write_window(spans, 0), ErrorCode::InvalidArgument, "null cache");
  spans = {a.span(0, 0)};
  expect(write_window(spans, 0), ErrorCode::EmptyPrefill, "0 tokens");
  spans = {a.span(0, 17)};
  expect(run_compressors(spans, 0, weights.at(0)), ErrorCode::ContextBound, "beyond the context");
  spans = {a.span(0, 4)};
  expect(write_window(spans, 2), ErrorCode::InvalidArgument, "layer out of range");
  spans[0].indexer_score = nullptr;
  expect(run_compressors(spans, 0, weights.at(0)), ErrorCode::InvalidArgument, "missing indexer input");
  spans = {a.span(0, 4)};
  CompressorWeights w = weights.at(0);
  w.indexer_norm = nullptr;
  expect(run_compressors(spans, 0, w), ErrorCode::InvalidArgument, "missing indexer weight");
  b.gpu.poison("test");
  spans = {a.span(0, 4), b.span(0, 4)};
  expect(write_window(spans, 0), ErrorCode::Poisoned, "poisoned member");
  EXPECT_FALSE(a.gpu.poisoned()) << "a failed check must not poison the healthy members";
  // Nothing was written: the healthy cache still matches a fresh CPU cache.
  const CacheDiff d = compare_caches(a.cpu, a.gpu);
  EXPECT_TRUE(acceptable(d, kd::StorageConfig::bf16()));
  // A layer without compressors: run_compressors does nothing.
  spans = {a.span(1, 4)};
  EXPECT_TRUE(run_compressors(spans, 1, weights.at(1)).ok());
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4::testing

namespace kvcompact::cuda::dsv4::testing {
namespace {

// Not a benchmark (bench/cuda has those): prints how long the window + compressor kernels take for a 32-sequence
// decode step and a 4096-token prefill chunk, so the lead sees their scale in the GPU logs. Fails only on errors.
TEST(CudaDsv4Compressor, ReportsKernelTimes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed);
  const tu::SyntheticModel model(rng, tu::synthetic_config({0, 4, 128}, 4, 8), 1);
  DeviceWeights weights(model);
  const std::uint64_t chunk = 4096;
  const std::vector<float> host = rng.normals(chunk * 1024 + 64);  // the spans below start up to 13 floats in
  DeviceBuffer inputs = upload_floats(host);
  const float* in = static_cast<const float*>(inputs.data());
  KernelOptions fast;
  fast.check_finite = false;
  auto span_for = [&](DeviceDeepseek4Cache* c, std::uint64_t count) {
    LayerSpan s;
    s.cache = c;
    s.count = count;
    s.kv = in;
    s.compressor_kv = in;
    s.compressor_score = in + 7;
    s.indexer_kv = in + 11;
    s.indexer_score = in + 13;
    return s;
  };
  auto seconds = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  // Decode: 32 sequences, one token each, 3 layers per step; 64 timed steps after 8 warm-up steps.
  std::vector<DeviceDeepseek4Cache> caches;
  for (int i = 0; i < 32; ++i) caches.push_back(take(DeviceDeepseek4Cache::create(model.config, 8192), "cache"));
  double t0 = 0.0;
  for (int step = 0; step < 72; ++step) {
    if (step == 8) {
      ASSERT_TRUE(synchronize().ok());
      t0 = seconds();
    }
    for (std::uint32_t l = 0; l < 3; ++l) {
      std::vector<LayerSpan> spans;
      for (auto& c : caches) spans.push_back(span_for(&c, 1));
      ASSERT_TRUE(write_window(spans, l, fast).ok());
      ASSERT_TRUE(run_compressors(spans, l, weights.at(l), fast).ok());
    }
    for (auto& c : caches) ASSERT_TRUE(c.commit_step(c.position()).ok());
  }
  ASSERT_TRUE(synchronize().ok());
  const double decode_us = (seconds() - t0) / 64 * 1e6;
  // Prefill: one 4096-token chunk per layer kind (parallel emission), and the token-by-token walk for comparison.
  double prefill_us[2][3] = {};
  for (int mode = 0; mode < 2; ++mode) {
    KernelOptions o = fast;
    o.sequential_compressor = mode == 1;
    DeviceDeepseek4Cache c = take(DeviceDeepseek4Cache::create(model.config, 8192), "cache");
    for (std::uint32_t l = 0; l < 3; ++l) {
      std::vector<LayerSpan> spans{span_for(&c, chunk)};
      ASSERT_TRUE(write_window(spans, l, o).ok());  // warm-up
      ASSERT_TRUE(run_compressors(spans, l, weights.at(l), o).ok());
      ASSERT_TRUE(synchronize().ok());
      const double s0 = seconds();
      ASSERT_TRUE(write_window(spans, l, o).ok());
      ASSERT_TRUE(run_compressors(spans, l, weights.at(l), o).ok());
      ASSERT_TRUE(synchronize().ok());
      prefill_us[mode][l] = (seconds() - s0) * 1e6;
    }
  }
  std::printf("[dsv4-cache] timing: decode step of 32 sequences x 3 layers (m = 0, 4, 128), window + compressors: "
              "%.1f us (host launch overhead included)\n", decode_us);
  std::printf("[dsv4-cache] timing: 4096-token prefill chunk, window + compressors per layer m = 0 / 4 / 128: "
              "parallel %.0f / %.0f / %.0f us, token-by-token %.0f / %.0f / %.0f us\n",
              prefill_us[0][0], prefill_us[0][1], prefill_us[0][2], prefill_us[1][0], prefill_us[1][1],
              prefill_us[1][2]);
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4::testing
