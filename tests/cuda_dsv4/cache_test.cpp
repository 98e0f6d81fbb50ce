// DeviceDeepseek4Cache against the CPU Deepseek4Cache: allocations equal to the plan (bf16, FP8, MXFP4 indexer;
// the V4-Flash preset and a synthetic model), the same protocol errors for the same misuse, snapshots with the
// same contents and restores that check everything first, anchor images that move a cache between the backends
// byte for byte (and the kernels continue from a hydrated cache exactly as the CPU does). Skips without a device.
#include <gtest/gtest.h>

#include <numeric>

#include "cache_test_util.hpp"
#include "kvcompact/dsv4/anchor_image.hpp"
#include "kvcompact/dsv4/snapshot.hpp"

namespace kvcompact::cuda::dsv4::testing {
namespace {

std::string describe(const Status& st) {
  if (st.ok()) return "ok";
  const Error& e = st.error();
  return e.to_string() + " [expected " + std::to_string(e.expected) + " actual " + std::to_string(e.actual) + "]";
}

template <typename T>
std::string describe(const Result<T>& r) {
  if (r.ok()) return "ok";
  const Error& e = r.error();
  return e.to_string() + " [expected " + std::to_string(e.expected) + " actual " + std::to_string(e.actual) + "]";
}

std::string describe_step(const Result<kd::StepPlan>& r) {
  if (!r.ok()) return describe(r);
  std::string s = "step p=" + std::to_string(r->position) + " slot=" + std::to_string(r->window_write_slot) +
                  " valid=" + std::to_string(r->window_valid_after);
  for (const auto& l : r->layers) {
    s += " [" + std::to_string(l.compressed_valid_after) + "," +
         (l.compressed_write_slot ? std::to_string(*l.compressed_write_slot) : "-") + "," +
         std::to_string(l.state_write_row) + "]";
  }
  return s;
}

// The same misuse sequence on either backend; the log holds every result and the poison state after it.
template <typename Cache, typename Reset>
std::vector<std::string> misuse(Cache& c, Reset reset) {
  std::vector<std::string> log;
  const std::uint64_t ctx = c.plan().context;
  auto state = [&] { log.push_back(c.poisoned() ? "poisoned: " + c.poison_reason() : "healthy"); };
  log.push_back(describe(c.commit_step(5)));
  state();
  log.push_back(describe_step(c.plan_next_step()));
  log.push_back(describe(c.plan_prefill(0, 4)));
  log.push_back(describe(c.commit_prefill(0, 4)));
  reset(c);
  state();
  log.push_back(describe(c.plan_prefill(0, 0)));
  log.push_back(describe(c.commit_prefill(0, 0)));
  state();
  reset(c);
  log.push_back(describe(c.plan_prefill(3, ctx)));
  log.push_back(describe(c.commit_prefill(0, ctx + 1)));
  state();
  reset(c);
  log.push_back(describe(c.commit_prefill(1, 2)));
  state();
  reset(c);
  log.push_back(describe(c.commit_prefill(0, ctx - 1)));
  log.push_back(describe_step(c.plan_next_step()));
  log.push_back(describe(c.commit_step(ctx - 1)));
  log.push_back(describe_step(c.plan_next_step()));
  log.push_back(describe(c.commit_step(ctx)));
  state();
  reset(c);
  log.push_back(describe_step(c.plan_next_step()));
  log.push_back(describe(c.commit_step(0)));
  log.push_back(describe(c.commit_step(std::numeric_limits<std::uint64_t>::max())));
  state();
  return log;
}

TEST(CudaDsv4Cache, AllocationsEqualThePlan) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const kd::ModelConfig flash = take(kd::preset_config("deepseek-v4-flash"), "preset");
  const kd::ModelConfig synthetic = tu::synthetic_config({0, 4, 128, 4, 128, 0}, 8, 16);
  const kd::StorageConfig storages[] = {kd::StorageConfig::bf16(), kd::StorageConfig::fp8(),
                                        kd::StorageConfig{kd::RowStorage::Fp8, kd::IndexerStorage::Mxfp4}};
  for (const kd::ModelConfig* model : {&flash, &synthetic}) {
    for (std::uint64_t context : {std::uint64_t{4096}, std::uint64_t{1000}, std::uint64_t{100}}) {
      for (const kd::StorageConfig& storage : storages) {
        SCOPED_TRACE(::testing::Message() << model->name << " context " << context << " storage "
                                          << kd::row_storage_name(storage.attention) << "/"
                                          << kd::indexer_storage_name(storage.indexer));
        const kd::CachePlan plan = take(kd::plan_cache(*model, context, storage), "plan");
        const DeviceDeepseek4Cache gpu = take(DeviceDeepseek4Cache::create(plan), "gpu cache");
        const kd::Deepseek4Cache cpu = take(kd::Deepseek4Cache::create(plan), "cpu cache");
        EXPECT_EQ(gpu.allocated_bytes(), plan.total_bytes);
        EXPECT_EQ(gpu.allocated_bytes(), cpu.allocated_bytes());
        for (std::uint32_t l = 0; l < gpu.num_layers(); ++l) {
          const kd::LayerPlan& lp = plan.layers[l];
          const DeviceLayerView v = gpu.layer_view(l);
          EXPECT_EQ(v.ratio, lp.ratio);
          EXPECT_EQ(v.attention_rows, lp.attention_rows);
          EXPECT_EQ(v.attention_row_bytes, lp.attention_row_bytes);
          EXPECT_EQ(v.window, v.attention);
          EXPECT_EQ(v.window_rows, cpu.window_rows(l).rows);
          EXPECT_EQ(v.compressed_rows, cpu.compressed_rows(l).rows);
          if (lp.compressed_rows > 0) {
            EXPECT_EQ(v.compressed - v.attention, static_cast<std::ptrdiff_t>(lp.compressed_offset));
          }
          EXPECT_EQ(v.indexer_rows, cpu.indexer_rows(l).rows);
          EXPECT_EQ(v.indexer_row_bytes, cpu.indexer_rows(l).row_stride);
          EXPECT_EQ(v.state_rows, cpu.kv_state(l).rows);
          EXPECT_EQ(v.state_cols, cpu.kv_state(l).cols);
          EXPECT_EQ(v.indexer_state_rows, cpu.indexer_kv_state(l).rows);
          EXPECT_EQ(v.indexer_state_cols, cpu.indexer_kv_state(l).cols);
          EXPECT_EQ(take(gpu.download_attention(l), "download").size(), lp.attention_bytes);
        }
        if (model == &synthetic) {  // initial states equal the CPU's (kv 0, score -inf)
          for (std::uint32_t l = 0; l < gpu.num_layers(); ++l) {
            const CacheDiff d = compare_caches(cpu, gpu);
            EXPECT_TRUE(acceptable(d, storage)) << "layer " << l;
          }
        }
      }
    }
  }
  // A hand-edited plan: both backends refuse it with the same Accounting error.
  kd::CachePlan edited = take(kd::plan_cache(synthetic, 512, kd::StorageConfig::fp8()), "plan");
  edited.layers[2].resident_bytes += 4;
  auto g = DeviceDeepseek4Cache::create(edited);
  auto c = kd::Deepseek4Cache::create(edited);
  ASSERT_FALSE(g.ok());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(describe(g), describe(c));
  EXPECT_EQ(g.error().code, ErrorCode::Accounting);
  std::printf("[dsv4-cache] edited plan: gpu \"%s\" / cpu \"%s\"\n", describe(g).c_str(), describe(c).c_str());
  edited = take(kd::plan_cache(synthetic, 512, kd::StorageConfig::fp8()), "plan");
  edited.total_bytes += 1;
  EXPECT_EQ(describe(DeviceDeepseek4Cache::create(edited)), describe(kd::Deepseek4Cache::create(edited)));
  // The plan's own errors.
  EXPECT_EQ(describe(DeviceDeepseek4Cache::create(synthetic, 0)), describe(kd::Deepseek4Cache::create(synthetic, 0)));
}

TEST(CudaDsv4CacheSmall, ProtocolErrorsMatchTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const kd::ModelConfig model = tu::synthetic_config({0, 4, 128}, 4, 8);
  kd::Deepseek4Cache cpu = take(kd::Deepseek4Cache::create(model, 300), "cpu");
  DeviceDeepseek4Cache gpu = take(DeviceDeepseek4Cache::create(model, 300), "gpu");
  const auto cpu_log = misuse(cpu, [](kd::Deepseek4Cache& c) { c.reset(); });
  const auto gpu_log = misuse(gpu, [](DeviceDeepseek4Cache& c) { ASSERT_TRUE(c.reset().ok()); });
  ASSERT_EQ(cpu_log.size(), gpu_log.size());
  for (std::size_t i = 0; i < cpu_log.size(); ++i) {
    EXPECT_EQ(gpu_log[i], cpu_log[i]) << "entry " << i;
    std::printf("[dsv4-cache] protocol %zu: %s\n", i, gpu_log[i].c_str());
  }
  // Cohorts: null, repeated, and one member out of order (every member is poisoned, none advances).
  kd::Deepseek4Cache cpu2 = take(kd::Deepseek4Cache::create(model, 300), "cpu");
  DeviceDeepseek4Cache gpu2 = take(DeviceDeepseek4Cache::create(model, 300), "gpu");
  cpu.reset();
  ASSERT_TRUE(gpu.reset().ok());
  ASSERT_TRUE(cpu2.commit_step(0).ok());
  ASSERT_TRUE(gpu2.commit_step(0).ok());
  std::vector<kd::Deepseek4Cache*> cc{&cpu, nullptr};
  std::vector<DeviceDeepseek4Cache*> gc{&gpu, nullptr};
  EXPECT_EQ(describe(commit_cohort(std::span<DeviceDeepseek4Cache* const>(gc), 0)),
            describe(kd::commit_cohort(std::span<kd::Deepseek4Cache* const>(cc), 0)));
  cc = {&cpu, &cpu};
  gc = {&gpu, &gpu};
  EXPECT_EQ(describe(commit_cohort(std::span<DeviceDeepseek4Cache* const>(gc), 0)),
            describe(kd::commit_cohort(std::span<kd::Deepseek4Cache* const>(cc), 0)));
  cc = {&cpu, &cpu2};
  gc = {&gpu, &gpu2};
  const std::string g = describe(commit_cohort(std::span<DeviceDeepseek4Cache* const>(gc), 0));
  EXPECT_EQ(g, describe(kd::commit_cohort(std::span<kd::Deepseek4Cache* const>(cc), 0)));
  std::printf("[dsv4-cache] cohort: %s\n", g.c_str());
  EXPECT_TRUE(gpu.poisoned() && gpu2.poisoned());
  EXPECT_EQ(gpu.position(), 0u);
  EXPECT_EQ(gpu2.position(), 1u);
  EXPECT_EQ(gpu.poison_reason(), cpu.poison_reason());
  // A healthy cohort advances together.
  ASSERT_TRUE(gpu.reset().ok());
  ASSERT_TRUE(gpu2.reset().ok());
  EXPECT_TRUE(commit_cohort(std::span<DeviceDeepseek4Cache* const>(gc), 0).ok());
  EXPECT_EQ(gpu.position(), 1u);
  EXPECT_EQ(gpu2.position(), 1u);
}

// Host-side argument errors of the GPU cache that the CPU cache has no counterpart of: typed errors, nothing
// written (the downloads of a layer out of range used to abort the process).
TEST(CudaDsv4CacheSmall, HostArgumentErrorsAreTyped) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const kd::ModelConfig model = tu::synthetic_config({0, 4, 128}, 4, 8);
  DeviceDeepseek4Cache gpu = take(DeviceDeepseek4Cache::create(model, 300), "gpu");
  const std::uint32_t layers = gpu.num_layers();
  EXPECT_EQ(gpu.download_attention(layers).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(gpu.download_indexer(layers + 7).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(gpu.download_state(layers, 0).error().code, ErrorCode::InvalidArgument);
  EXPECT_TRUE(gpu.download_state(0, 0).ok());
  // LayerSpan::chunk_rows at an odd address: InvalidArgument before any launch, the window unchanged.
  const std::vector<std::uint8_t> window_before = take(gpu.download_attention(0), "window");
  DeviceBuffer kv = take(DeviceBuffer::allocate(512 * sizeof(float)), "kv");
  DeviceBuffer rows = take(DeviceBuffer::allocate(2 * 1024), "chunk rows");
  ASSERT_TRUE(kv.fill(0).ok());
  LayerSpan span;
  span.cache = &gpu;
  span.count = 1;
  span.kv = static_cast<const float*>(kv.data());
  span.chunk_rows = static_cast<std::uint8_t*>(rows.data()) + 1;
  const Status odd = write_window({&span, 1}, 0);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(odd.error().message.find("chunk_rows"), std::string::npos);
  EXPECT_EQ(take(gpu.download_attention(0), "window"), window_before);
  span.chunk_rows = static_cast<std::uint8_t*>(rows.data());
  EXPECT_TRUE(write_window({&span, 1}, 0).ok());
}

// Runs `n` tokens on both backends of `s` in chunks of up to `chunk` (1 = decode).
void advance(Sequence& s, const DeviceWeights& w, std::uint64_t n, std::uint64_t chunk) {
  std::vector<Sequence*> batch{&s};
  for (std::uint64_t done = 0; done < n;) {
    const std::uint64_t k = std::min(chunk, n - done);
    const Status c = run_cpu(s, k);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    const Status g = run_gpu(batch, {k}, w);
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    done += k;
  }
}

::testing::AssertionResult same_snapshot(const kd::Snapshot& g, const kd::Snapshot& c) {
  if (g.position != c.position || !g.plan.same_as(c.plan) || g.layers.size() != c.layers.size()) {
    return ::testing::AssertionFailure() << "position / plan / layer count differ";
  }
  for (std::size_t i = 0; i < g.layers.size(); ++i) {
    const kd::LayerSnapshot& a = g.layers[i];
    const kd::LayerSnapshot& b = c.layers[i];
    if (a.window != b.window) return ::testing::AssertionFailure() << "layer " << i << " window rows differ";
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    if (!same(a.kv_state, b.kv_state) || !same(a.score_state, b.score_state) ||
        !same(a.indexer_kv_state, b.indexer_kv_state) || !same(a.indexer_score_state, b.indexer_score_state)) {
      CacheDiff d;
      compare_states(d, a.kv_state, b.kv_state, "kv");
      compare_states(d, a.score_state, b.score_state, "score");
      compare_states(d, a.indexer_kv_state, b.indexer_kv_state, "indexer kv");
      compare_states(d, a.indexer_score_state, b.indexer_score_state, "indexer score");
      return ::testing::AssertionFailure() << "layer " << i << " states differ (max rel " << d.state_max_rel
                                           << "): " << d.first_problem;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaDsv4Cache, SnapshotsMatchTheCpuAndRestore) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed);
  const tu::SyntheticModel model(rng, tu::synthetic_config({0, 4, 128}, 4, 8), 1);
  DeviceWeights w(model);
  for (const kd::StorageConfig storage : {kd::StorageConfig::bf16(), kd::StorageConfig::fp8()}) {
    Sequence s(rng, model, 512, storage, 400);
    advance(s, w, 150, 64);
    advance(s, w, 9, 1);
    if (HasFatalFailure()) return;
    const kd::Snapshot sc = take(kd::take_snapshot(s.cpu), "cpu snapshot");
    const kd::Snapshot sg = take(take_snapshot(s.gpu), "gpu snapshot");
    EXPECT_EQ(sg.cache_id, s.gpu.id());
    EXPECT_NE(sg.cache_id, sc.cache_id);
    EXPECT_TRUE(same_snapshot(sg, sc)) << "snapshots after the same trace";
    // Speculative rollback across a pooling boundary, twice.
    for (int round = 0; round < 2; ++round) {
      advance(s, w, 7, round == 0 ? 1 : 7);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(restore_snapshot(s.gpu, sg).ok());
      ASSERT_TRUE(kd::restore_snapshot(s.cpu, sc).ok());
      EXPECT_TRUE(same_snapshot(take(take_snapshot(s.gpu), "gpu"), sc)) << "after restore " << round;
    }
    advance(s, w, 70, 1);
    if (HasFatalFailure()) return;
    const CacheDiff d = compare_caches(s.cpu, s.gpu);
    print_diff("snapshot rollback + continue", seed, d);
    EXPECT_TRUE(acceptable(d, storage));
    // A snapshot restores only into its own cache, on either backend; the errors name the same check.
    const Status cross_g = restore_snapshot(s.gpu, sc);
    const Status cross_c = kd::restore_snapshot(s.cpu, sg);
    ASSERT_FALSE(cross_g.ok());
    ASSERT_FALSE(cross_c.ok());
    EXPECT_EQ(cross_g.error().code, ErrorCode::Mismatch);
    EXPECT_EQ(cross_c.error().code, ErrorCode::Mismatch);
    std::printf("[dsv4-cache] cross-backend snapshot restore: %s\n", cross_g.error().to_string().c_str());
    // Every check precedes the first upload: a damaged snapshot leaves the device memory untouched.
    kd::Snapshot bad = sg;
    bad.layers[1].kv_state.pop_back();
    const std::vector<float> before = take(s.gpu.download_state(1, 1), "state");
    const std::uint64_t pos = s.gpu.position();
    const Status st = restore_snapshot(s.gpu, bad);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::Mismatch);
    EXPECT_EQ(describe(st), describe(kd::restore_snapshot(s.cpu, [&] {
                kd::Snapshot b = sc;
                b.layers[1].kv_state.pop_back();
                return b;
              }())));
    EXPECT_EQ(s.gpu.position(), pos);
    EXPECT_TRUE(take(s.gpu.download_state(1, 1), "state") == before);
    // Poisoned caches refuse snapshots; a restore clears the poison.
    s.gpu.poison("test");
    EXPECT_EQ(take_snapshot(s.gpu).error().code, ErrorCode::Poisoned);
    ASSERT_TRUE(restore_snapshot(s.gpu, sg).ok());
    EXPECT_FALSE(s.gpu.poisoned());
    // After a reset (a rewind below the snapshot) the snapshot no longer restores, as on the CPU.
    ASSERT_TRUE(s.gpu.reset().ok());
    s.cpu.reset();
    EXPECT_EQ(describe(restore_snapshot(s.gpu, sg)).substr(0, 40), describe(kd::restore_snapshot(s.cpu, sc)).substr(0, 40));
    EXPECT_EQ(restore_snapshot(s.gpu, sg).error().code, ErrorCode::Mismatch);
  }
}

TEST(CudaDsv4Cache, AnchorImagesMoveCachesBetweenBackends) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = tu::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  tu::Rng rng(seed);
  const tu::SyntheticModel model(rng, tu::synthetic_config({0, 4, 128, 4}, 4, 8), 1);
  DeviceWeights w(model);
  for (const kd::StorageConfig storage :
       {kd::StorageConfig::bf16(), kd::StorageConfig::fp8(), kd::StorageConfig{kd::RowStorage::Fp8, kd::IndexerStorage::Mxfp4}}) {
    const std::uint64_t context = 640;
    Sequence s(rng, model, context, storage, 520);
    advance(s, w, 300, 97);
    advance(s, w, 5, 1);
    if (HasFatalFailure()) return;
    const std::uint64_t p = s.cpu.position();
    std::vector<std::uint32_t> tokens(p);
    std::iota(tokens.begin(), tokens.end(), 1000u);
    const auto img_c = take(kd::encode_anchor_image(s.cpu, tokens), "cpu image");
    const auto img_g = take(encode_anchor_image(s.gpu, tokens), "gpu image");
    ASSERT_EQ(img_c.size(), img_g.size());
    std::uint64_t differ = 0;
    for (std::size_t i = 0; i < img_c.size(); ++i) differ += img_c[i] != img_g[i];
    std::printf("[dsv4-cache] anchor images after the same trace (%s/%s, position %llu): %zu bytes, %llu differ "
                "(emitted-row rounding flips and the checksum only)\n",
                std::string(kd::row_storage_name(storage.attention)).c_str(),
                std::string(kd::indexer_storage_name(storage.indexer)).c_str(), static_cast<unsigned long long>(p),
                img_c.size(), static_cast<unsigned long long>(differ));
    EXPECT_LE(differ * 1000, img_c.size()) << "images differ in more than 1 byte in 1000";
    ASSERT_TRUE(kd::decode_anchor_image(img_g).ok()) << "the GPU image must decode";
    // CPU image -> GPU cache: re-encoded byte for byte; GPU image -> CPU cache likewise.
    DeviceDeepseek4Cache g2 = take(DeviceDeepseek4Cache::create(model.config, context, storage), "gpu");
    std::vector<std::uint32_t> ledger;
    ASSERT_TRUE(hydrate_from_anchor_image(g2, img_c, &ledger).ok());
    EXPECT_EQ(ledger, tokens);
    EXPECT_EQ(g2.position(), p);
    EXPECT_TRUE(take(encode_anchor_image(g2, tokens), "gpu image") == img_c);
    kd::Deepseek4Cache c2 = take(kd::Deepseek4Cache::create(model.config, context, storage), "cpu");
    ASSERT_TRUE(kd::hydrate_from_anchor_image(c2, img_g).ok());
    EXPECT_TRUE(take(kd::encode_anchor_image(c2, tokens), "cpu image") == img_g);
    // The kernels continue from the hydrated GPU cache exactly as the CPU continues its own cache.
    s.gpu = std::move(g2);
    advance(s, w, 40, 13);
    advance(s, w, 30, 1);
    if (HasFatalFailure()) return;
    const CacheDiff d = compare_caches(s.cpu, s.gpu);
    print_diff("continued after hydrating a CPU image", seed, d);
    EXPECT_TRUE(acceptable(d, storage));
    // A damaged image is refused before any upload; a larger context takes it; wrong targets are refused as on
    // the CPU.
    DeviceDeepseek4Cache g3 = take(DeviceDeepseek4Cache::create(model.config, context, storage), "gpu");
    std::vector<std::uint8_t> damaged = img_c;
    damaged[damaged.size() / 2] ^= 0x10;
    const Status bad = hydrate_from_anchor_image(g3, damaged);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::Corrupt) << bad.error().to_string();
    EXPECT_EQ(g3.position(), 0u);
    EXPECT_FALSE(g3.poisoned());
    DeviceDeepseek4Cache bigger = take(DeviceDeepseek4Cache::create(model.config, 2 * context, storage), "gpu");
    ASSERT_TRUE(hydrate_from_anchor_image(bigger, img_c).ok());
    EXPECT_EQ(bigger.position(), p);
    DeviceDeepseek4Cache small = take(DeviceDeepseek4Cache::create(model.config, p - 1, storage), "gpu");
    kd::Deepseek4Cache small_c = take(kd::Deepseek4Cache::create(model.config, p - 1, storage), "cpu");
    EXPECT_EQ(describe(hydrate_from_anchor_image(small, img_c)), describe(kd::hydrate_from_anchor_image(small_c, img_c)));
    const kd::StorageConfig other = storage == kd::StorageConfig::bf16() ? kd::StorageConfig::fp8() : kd::StorageConfig::bf16();
    DeviceDeepseek4Cache wrong = take(DeviceDeepseek4Cache::create(model.config, context, other), "gpu");
    kd::Deepseek4Cache wrong_c = take(kd::Deepseek4Cache::create(model.config, context, other), "cpu");
    const Status ws = hydrate_from_anchor_image(wrong, img_c);
    EXPECT_EQ(describe(ws), describe(kd::hydrate_from_anchor_image(wrong_c, img_c)));
    EXPECT_EQ(ws.error().code, ErrorCode::Mismatch);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4::testing
