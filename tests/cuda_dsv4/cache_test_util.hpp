// Shared helpers of the DeviceDeepseek4Cache tests: sequences that run the same random token stream through a
// CPU Deepseek4Cache (driven by the CPU LayerRunner, the oracle) and a GPU cache (driven by the window-write
// and compressor kernels), batched chunked-prefill + decode traces, and comparisons of the two caches that print
// `[dsv4-cache]` lines with the measured differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvcompact/cuda/dsv4_cache.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/layer_runner.hpp"
#include "kvcompact/dsv4/storage.hpp"
#include "unit/dsv4/math_layer_fixture.hpp"

namespace kvcompact::cuda::dsv4::testing {

namespace kd = kvcompact::dsv4;
namespace tu = kvcompact::dsv4::testutil;

template <typename T>
T take(Result<T>&& r, const char* what) {
  if (!r.ok()) ADD_FAILURE() << what << ": " << r.error().to_string();
  KVC_ASSERT(r.ok(), "test setup failed (see the failure above)");
  return std::move(r).value();
}

inline DeviceBuffer upload_floats(const std::vector<float>& host) {
  DeviceBuffer b = take(DeviceBuffer::allocate(host.size() * sizeof(float)), "allocate");
  const Status st = b.upload(host.data(), host.size() * sizeof(float));
  if (!st.ok()) ADD_FAILURE() << "upload: " << st.error().to_string();
  return b;
}

inline const float* fptr(const DeviceBuffer& b, std::size_t offset_floats) {
  return b.size() == 0 ? nullptr : static_cast<const float*>(b.data()) + offset_floats;
}

// The synthetic model's learned constants on the device, per layer.
struct DeviceWeights {
  struct Layer {
    DeviceBuffer ape, norm, idx_ape, idx_norm;
  };
  std::vector<Layer> layers;
  explicit DeviceWeights(const tu::SyntheticModel& model) {
    for (const auto& L : model.layers) {
      Layer d;
      if (!L.comp_ape.empty()) d.ape = upload_floats(L.comp_ape);
      if (!L.comp_norm.empty()) d.norm = upload_floats(L.comp_norm);
      if (!L.idx_ape.empty()) d.idx_ape = upload_floats(L.idx_ape);
      if (!L.idx_norm.empty()) d.idx_norm = upload_floats(L.idx_norm);
      layers.push_back(std::move(d));
    }
  }
  CompressorWeights at(std::size_t layer) const {
    const Layer& d = layers[layer];
    CompressorWeights w;
    w.ape = fptr(d.ape, 0);
    w.norm = fptr(d.norm, 0);
    w.indexer_ape = fptr(d.idx_ape, 0);
    w.indexer_norm = fptr(d.idx_norm, 0);
    return w;
  }
};

// One sequence: its token stream (host and device), its CPU cache + runner and its GPU cache.
struct Sequence {
  const tu::SyntheticModel* model = nullptr;
  tu::TokenStream stream;
  tu::Outputs out;
  kd::Deepseek4Cache cpu;
  DeviceDeepseek4Cache gpu;
  kd::LayerRunner runner;
  struct DeviceLayer {
    DeviceBuffer kv, a, z, ia, iz;
    std::size_t pw = 0;
  };
  std::vector<DeviceLayer> device;
  std::uint64_t gpu_steps = 0;  // run_gpu calls with this sequence first (which of them ask for chunk rows)

  Sequence(tu::Rng& rng, const tu::SyntheticModel& m, std::uint64_t context, kd::StorageConfig storage,
           std::size_t tokens)
      : model(&m),
        stream(rng, m, tokens),
        out(m.layers.size(), tokens, m.heads),
        cpu(take(kd::Deepseek4Cache::create(m.config, context, storage), "cpu cache")),
        gpu(take(DeviceDeepseek4Cache::create(m.config, context, storage), "gpu cache")),
        runner(m.config) {
    for (const auto& L : stream.layers) {
      DeviceLayer d;
      d.kv = upload_floats(L.kv);
      d.pw = L.pw;
      if (!L.a.empty()) {
        d.a = upload_floats(L.a);
        d.z = upload_floats(L.z);
      }
      if (!L.ia.empty()) {
        d.ia = upload_floats(L.ia);
        d.iz = upload_floats(L.iz);
      }
      device.push_back(std::move(d));
    }
  }

  LayerSpan span(std::size_t layer, std::uint64_t count) const {
    const DeviceLayer& d = device[layer];
    const std::size_t t = static_cast<std::size_t>(gpu.position());
    LayerSpan s;
    s.cache = const_cast<DeviceDeepseek4Cache*>(&gpu);
    s.count = count;
    s.kv = fptr(d.kv, t * 512);
    s.compressor_kv = fptr(d.a, t * d.pw);
    s.compressor_score = fptr(d.z, t * d.pw);
    s.indexer_kv = fptr(d.ia, t * 256);
    s.indexer_score = fptr(d.iz, t * 256);
    return s;
  }
};

// The CPU oracle: the LayerRunner runs `count` tokens (decode for 1, a prefill chunk otherwise) and commits.
inline Status run_cpu(Sequence& s, std::uint64_t count) {
  const std::size_t start = static_cast<std::size_t>(s.cpu.position());
  return tu::run_span(s.runner, s.cpu, *s.model, s.stream, s.out, start, static_cast<std::size_t>(count), count == 1);
}

// The rows write_window must put into LayerSpan::chunk_rows: the CPU LayerRunner's span rows (the model's FP8
// rounding, then the storage encoding).
inline std::vector<std::uint8_t> expected_chunk_rows(const Sequence& s, std::size_t layer, std::uint64_t start,
                                                     std::uint64_t count) {
  const kd::RowStorage rs = s.cpu.plan().storage.attention;
  const std::size_t rb = kd::attention_row_bytes(rs);
  std::vector<std::uint8_t> out(count * rb);
  std::vector<float> row(512);
  for (std::uint64_t k = 0; k < count; ++k) {
    std::memcpy(row.data(), s.stream.layers[layer].kv.data() + (start + k) * 512, 512 * sizeof(float));
    kd::simulate_main_row(row.data());
    const Status st = kd::encode_attention_row(row, rs, std::span<std::uint8_t>(out.data() + k * rb, rb));
    if (!st.ok()) ADD_FAILURE() << st.error().to_string();
  }
  return out;
}

// The GPU side of one batch step: every layer's window write and compressors over all sequences (each with its
// own count), then each cache's commit (commit_step for a 1-token span, commit_prefill otherwise). Every other
// call (counted per batch's first sequence, so the same calls of a test do whatever ran before) also asks
// write_window for the chunk rows of multi-token spans and checks them against the CPU's; the others run the
// path without chunk rows.
inline Status run_gpu(std::vector<Sequence*>& seqs, const std::vector<std::uint64_t>& counts, const DeviceWeights& w,
                      const KernelOptions& options = {}) {
  const bool chunk_rows = (seqs[0]->gpu_steps++ % 2) == 0;
  const std::uint32_t layers = seqs[0]->gpu.num_layers();
  const std::size_t rb = kd::attention_row_bytes(seqs[0]->gpu.plan().storage.attention);
  std::vector<DeviceBuffer> rows(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    if (chunk_rows && counts[i] > 1) {
      KVC_ASSIGN_OR_RETURN(rows[i], DeviceBuffer::allocate(counts[i] * rb));
    }
  }
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::vector<LayerSpan> spans;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      spans.push_back(seqs[i]->span(l, counts[i]));
      spans.back().chunk_rows = static_cast<std::uint8_t*>(rows[i].data());
    }
    KVC_TRY(write_window(spans, l, options));
    KVC_TRY(run_compressors(spans, l, w.at(l), options));
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (rows[i].size() == 0) continue;
      std::vector<std::uint8_t> got(rows[i].size());
      KVC_TRY(rows[i].download(got.data(), got.size()));
      const auto want = expected_chunk_rows(*seqs[i], l, seqs[i]->gpu.position(), counts[i]);
      if (got != want) {
        std::size_t first = 0;
        while (first < got.size() && got[first] == want[first]) ++first;
        ADD_FAILURE() << "chunk rows of layer " << l << " sequence " << i << " (positions " << seqs[i]->gpu.position()
                      << " + " << counts[i] << ") differ from the CPU's, first at byte " << first << " (row "
                      << first / rb << ")";
      }
    }
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    DeviceDeepseek4Cache& c = seqs[i]->gpu;
    if (counts[i] == 1) {
      KVC_ASSIGN_OR_RETURN(const kd::StepPlan step, c.plan_next_step());
      KVC_TRY(c.commit_step(step.position));
    } else {
      KVC_TRY(c.commit_prefill(c.position(), counts[i]));
    }
  }
  return ok_status();
}

// Measured differences between a CPU and a GPU cache at the same position.
struct CacheDiff {
  double state_max_rel = 0.0;         // max |g - c| / max(|c|, 1e-30) over finite state entries
  std::uint64_t state_mismatch = 0;   // entries that differ in their infinity / NaN pattern
  std::uint64_t window_bytes_differ = 0;
  std::uint64_t row_bytes = 0;        // compared compressed + indexer bytes
  std::uint64_t row_bytes_differ = 0;
  std::uint64_t row_values = 0;       // compared decoded values
  std::uint64_t row_values_differ = 0;
  double row_max_rel = 0.0;           // max |g - c| / max(|c|, row block scale) over decoded values
  double attention_row_max_rel = 0.0;  // the same over the compressed attention rows
  double indexer_row_max_rel = 0.0;    // ... over the indexer rows (each kind against its own format's step)
  std::string first_problem;
};

inline void note(CacheDiff& d, const std::string& what) {
  if (d.first_problem.empty()) d.first_problem = what;
}

// Decoded comparison of two encoded rows; relative to max(|c|, the row's amax * floor_frac) so that tiny
// values next to large ones do not dominate (2^-10; 1/4 for e2m1, whose smallest step is 1/12 of a block's
// largest value).
template <typename Decode>
void compare_rows(CacheDiff& d, const std::uint8_t* g, const std::uint8_t* c, std::size_t bytes, std::size_t dims,
                  Decode decode, double floor_frac, const std::string& where, double& kind_max_rel) {
  d.row_bytes += bytes;
  std::uint64_t differ = 0;
  for (std::size_t i = 0; i < bytes; ++i) differ += g[i] != c[i];
  d.row_bytes_differ += differ;
  std::vector<float> gv(dims), cv(dims);
  decode(std::span<const std::uint8_t>(g, bytes), std::span<float>(gv));
  decode(std::span<const std::uint8_t>(c, bytes), std::span<float>(cv));
  float amax = 0.0f;
  for (float v : cv) amax = std::max(amax, std::fabs(v));
  d.row_values += dims;
  for (std::size_t i = 0; i < dims; ++i) {
    if (std::memcmp(&gv[i], &cv[i], sizeof(float)) == 0) continue;
    ++d.row_values_differ;
    const double denom = std::max<double>(std::fabs(cv[i]), amax * floor_frac);
    const double rel = denom > 0 ? std::fabs(static_cast<double>(gv[i]) - cv[i]) / denom : 1.0;
    if (!(rel <= d.row_max_rel)) d.row_max_rel = std::isnan(rel) ? 1e300 : rel;
    if (!(rel <= kind_max_rel)) kind_max_rel = std::isnan(rel) ? 1e300 : rel;
    note(d, where + " dim " + std::to_string(i) + ": gpu " + std::to_string(gv[i]) + " cpu " + std::to_string(cv[i]));
  }
}

inline void compare_states(CacheDiff& d, const std::vector<float>& g, std::span<const float> c,
                           const std::string& where) {
  if (g.size() != c.size()) {
    ++d.state_mismatch;
    note(d, where + ": state sizes differ");
    return;
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isfinite(c[i]) != std::isfinite(g[i]) || (!std::isfinite(c[i]) && std::memcmp(&g[i], &c[i], 4) != 0)) {
      ++d.state_mismatch;
      note(d, where + " entry " + std::to_string(i) + ": gpu " + std::to_string(g[i]) + " cpu " + std::to_string(c[i]));
      continue;
    }
    if (!std::isfinite(c[i])) continue;
    const double rel = std::fabs(static_cast<double>(g[i]) - c[i]) / std::max(std::fabs(static_cast<double>(c[i])), 1e-30);
    if (rel > d.state_max_rel) {
      d.state_max_rel = rel;
      if (rel > 1e-6) note(d, where + " entry " + std::to_string(i) + ": gpu " + std::to_string(g[i]) + " cpu " +
                                  std::to_string(c[i]));
    }
  }
}

// Everything a reader may touch: the valid window rows (bytes), the valid compressed / indexer rows (bytes and
// decoded values) and the four states of every layer.
inline CacheDiff compare_caches(const kd::Deepseek4Cache& cpu, const DeviceDeepseek4Cache& gpu) {
  CacheDiff d;
  if (cpu.position() != gpu.position()) {
    note(d, "positions differ: cpu " + std::to_string(cpu.position()) + " gpu " + std::to_string(gpu.position()));
    ++d.state_mismatch;
    return d;
  }
  const kd::CachePlan& plan = cpu.plan();
  for (std::uint32_t l = 0; l < cpu.num_layers(); ++l) {
    const kd::LayerPlan& lp = plan.layers[l];
    const std::string L = "layer " + std::to_string(l) + " (m=" + std::to_string(lp.ratio) + ")";
    const std::vector<std::uint8_t> att = take(gpu.download_attention(l), "download attention");
    const kd::ConstAttentionRows win = cpu.window_rows(l);
    for (std::uint64_t q = cpu.window_start_position(); q < cpu.position(); ++q) {
      const auto row = win.row(cpu.window_slot(q));
      const std::uint8_t* g = att.data() + lp.window_offset + cpu.window_slot(q) * lp.attention_row_bytes;
      if (std::memcmp(g, row.data(), row.size()) != 0) {
        for (std::size_t i = 0; i < row.size(); ++i) d.window_bytes_differ += g[i] != row[i];
        note(d, L + " window row of position " + std::to_string(q) + " differs");
      }
    }
    const kd::ConstAttentionRows comp = cpu.compressed_rows(l);
    const kd::RowStorage rs = plan.storage.attention;
    for (std::uint64_t i = 0; i < cpu.compressed_valid(l); ++i) {
      compare_rows(
          d, att.data() + lp.compressed_offset + i * lp.attention_row_bytes, comp.row(i).data(), lp.attention_row_bytes,
          kd::kHeadDim,
          [rs](std::span<const std::uint8_t> b, std::span<float> v) { (void)kd::decode_attention_row(b, rs, v); },
          0x1p-10, L + " compressed row " + std::to_string(i), d.attention_row_max_rel);
    }
    if (lp.ratio == 4) {
      const std::vector<std::uint8_t> idx = take(gpu.download_indexer(l), "download indexer");
      const kd::ConstIndexerRows crow = cpu.indexer_rows(l);
      const kd::IndexerStorage is = plan.storage.indexer;
      for (std::uint64_t i = 0; i < cpu.indexer_valid(l); ++i) {
        compare_rows(
            d, idx.data() + i * lp.indexer_row_bytes, crow.row(i).data(), lp.indexer_row_bytes, kd::kIndexerHeadDim,
            [is](std::span<const std::uint8_t> b, std::span<float> v) { (void)kd::decode_indexer_row(b, is, v); },
            is == kd::IndexerStorage::Mxfp4 ? 0.25 : 0x1p-10, L + " indexer row " + std::to_string(i),
            d.indexer_row_max_rel);
      }
    }
    compare_states(d, take(gpu.download_state(l, 0), "state"), cpu.kv_state(l).data, L + " kv state");
    compare_states(d, take(gpu.download_state(l, 1), "state"), cpu.score_state(l).data, L + " score state");
    compare_states(d, take(gpu.download_state(l, 2), "state"), cpu.indexer_kv_state(l).data, L + " indexer kv state");
    compare_states(d, take(gpu.download_state(l, 3), "state"), cpu.indexer_score_state(l).data,
                   L + " indexer score state");
  }
  return d;
}

inline void print_diff(const char* label, std::uint64_t seed, const CacheDiff& d) {
  std::printf(
      "[dsv4-cache] %s seed %llu: states max rel %.3g (%llu pattern mismatches), window bytes differ %llu, "
      "rows: %llu of %llu bytes differ, %llu of %llu values differ (max rel %.3g)%s%s\n",
      label, static_cast<unsigned long long>(seed), d.state_max_rel, static_cast<unsigned long long>(d.state_mismatch),
      static_cast<unsigned long long>(d.window_bytes_differ), static_cast<unsigned long long>(d.row_bytes_differ),
      static_cast<unsigned long long>(d.row_bytes), static_cast<unsigned long long>(d.row_values_differ),
      static_cast<unsigned long long>(d.row_values), d.row_max_rel, d.first_problem.empty() ? "" : "; first: ",
      d.first_problem.c_str());
  std::fflush(stdout);
}

// The acceptance rule: states within 1e-6 relative and with the same infinities, window rows bit-identical, and
// emitted rows bit-identical except for rare single rounding-step flips: the GPU's exp differs from the host
// libm's expf by at most one float ulp in rare cases, which can move a pooled value across a bf16 / e4m3 / e2m1
// rounding boundary. At most 1 value in 1000 may differ, each by at most one code step of its format (< 50%
// of the value for e2m1, 12.5% for e4m3, 0.8% for bf16, relative to max(|v|, amax * floor), see compare_rows;
// 0.7 for e2m1 rows, where a flip between 0 and half the scale is 2/3 of amax / 4).
inline ::testing::AssertionResult acceptable(const CacheDiff& d, kd::StorageConfig storage) {
  if (d.state_mismatch != 0 || !(d.state_max_rel <= 1e-6)) {
    return ::testing::AssertionFailure() << "states differ: max rel " << d.state_max_rel << ", " << d.state_mismatch
                                         << " pattern mismatches; first: " << d.first_problem;
  }
  if (d.window_bytes_differ != 0) {
    return ::testing::AssertionFailure() << d.window_bytes_differ << " window bytes differ; first: " << d.first_problem;
  }
  if (d.row_values_differ * 1000 > d.row_values) {
    return ::testing::AssertionFailure() << d.row_values_differ << " of " << d.row_values
                                         << " emitted row values differ; first: " << d.first_problem;
  }
  // One rounding step of each row kind's own format (an MXFP4 indexer no longer widens the attention rows'
  // bound to 0.7).
  const double attention_step = storage.attention == kd::RowStorage::Fp8 ? 0.125 : 1.0 / 128;
  const double indexer_step = storage.indexer == kd::IndexerStorage::Mxfp4 ? 0.7
                              : storage.indexer == kd::IndexerStorage::Fp8 ? 0.125
                                                                           : 1.0 / 128;
  if (!(d.attention_row_max_rel <= attention_step * 1.0001)) {
    return ::testing::AssertionFailure() << "a compressed attention row value differs by " << d.attention_row_max_rel
                                         << " relative (more than one rounding step " << attention_step
                                         << "); first: " << d.first_problem;
  }
  if (!(d.indexer_row_max_rel <= indexer_step * 1.0001)) {
    return ::testing::AssertionFailure() << "an indexer row value differs by " << d.indexer_row_max_rel
                                         << " relative (more than one rounding step " << indexer_step
                                         << "); first: " << d.first_problem;
  }
  return ::testing::AssertionSuccess();
}

inline bool have_device() { return device_count() > 0; }

}  // namespace kvcompact::cuda::dsv4::testing
