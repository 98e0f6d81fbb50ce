// A small synthetic DeepSeek-V4 model for the layer-runner tests: real widths (512 / 128, RoPE 64) and
// ratios (0, 4, 128), few heads and a small index_topk so long runs stay fast; random learned constants,
// a random token stream per layer, and a byte-level dump of a cache's valid contents for comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvcompact/dsv4/cache.hpp"
#include "kvcompact/dsv4/layer_runner.hpp"
#include "math_test_util.hpp"

namespace kvcompact::dsv4::testutil {

inline ModelConfig synthetic_config(std::vector<std::uint32_t> ratios, std::uint32_t index_heads, std::uint32_t topk) {
  ModelConfig c;
  c.name = "synthetic";
  c.num_hidden_layers = static_cast<std::uint32_t>(ratios.size());
  c.compress_ratios = std::move(ratios);
  c.index_n_heads = index_heads;
  c.index_topk = topk;
  c.rope_scaling = YarnScaling{};
  c.num_attention_heads = 0;
  return c;
}

struct SyntheticModel {
  ModelConfig config;
  std::uint32_t heads = 0;
  struct Layer {
    std::vector<float> sink, comp_ape, comp_norm, idx_ape, idx_norm;
  };
  std::vector<Layer> layers;
  std::vector<LayerWeights> weights;

  SyntheticModel(Rng& rng, ModelConfig cfg, std::uint32_t h) : config(std::move(cfg)), heads(h) {
    layers.resize(config.num_hidden_layers);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const std::uint32_t m = config.compress_ratios[l];
      Layer& L = layers[l];
      L.sink = rng.normals(heads, 1.0f);
      if (m != 0) {
        const std::size_t coff = m == 4 ? 2 : 1;
        L.comp_ape = rng.normals(m * coff * 512, 0.3f);
        L.comp_norm.resize(512);
        for (float& x : L.comp_norm) x = rng.uniform(0.5f, 1.5f);
      }
      if (m == 4) {
        L.idx_ape = rng.normals(4 * 256, 0.3f);
        L.idx_norm.resize(128);
        for (float& x : L.idx_norm) x = rng.uniform(0.5f, 1.5f);
      }
    }
    for (Layer& L : layers) {
      LayerWeights w;
      w.heads = heads;
      w.attn_sink = L.sink.data();
      w.compressor_ape = L.comp_ape.empty() ? nullptr : L.comp_ape.data();
      w.compressor_norm = L.comp_norm.empty() ? nullptr : L.comp_norm.data();
      w.indexer_ape = L.idx_ape.empty() ? nullptr : L.idx_ape.data();
      w.indexer_norm = L.idx_norm.empty() ? nullptr : L.idx_norm.data();
      weights.push_back(w);
    }
  }
};

// Inputs for tokens [0, n) of every layer.
struct TokenStream {
  struct Layer {
    std::vector<float> kv, q, a, z, ia, iz, iq, iw;
    std::size_t pw = 0;
  };
  std::vector<Layer> layers;
  std::uint32_t heads = 0, index_heads = 0;
  std::size_t tokens = 0;

  TokenStream(Rng& rng, const SyntheticModel& model, std::size_t n) : heads(model.heads), tokens(n) {
    index_heads = model.config.index_n_heads;
    for (std::uint32_t m : model.config.compress_ratios) {
      Layer L;
      L.kv = rng.normals(n * 512);
      L.q = rng.normals(n * heads * 512);
      if (m != 0) {
        L.pw = (m == 4 ? 2 : 1) * 512;
        L.a = rng.normals(n * L.pw);
        L.z = rng.normals(n * L.pw, 2.0f);
      }
      if (m == 4) {
        L.ia = rng.normals(n * 256);
        L.iz = rng.normals(n * 256, 2.0f);
        L.iq = rng.normals(n * index_heads * 128);
        L.iw = rng.normals(n * index_heads, 0.2f);
      }
      layers.push_back(std::move(L));
    }
  }

  LayerInputs slice(std::size_t layer, std::size_t start) const {
    const Layer& L = layers[layer];
    LayerInputs in;
    in.kv = L.kv.data() + start * 512;
    in.q = L.q.data() + start * heads * 512;
    if (!L.a.empty()) {
      in.compressor_kv = L.a.data() + start * L.pw;
      in.compressor_score = L.z.data() + start * L.pw;
    }
    if (!L.ia.empty()) {
      in.indexer_kv = L.ia.data() + start * 256;
      in.indexer_score = L.iz.data() + start * 256;
      in.indexer_q = L.iq.data() + start * index_heads * 128;
      in.indexer_weights = L.iw.data() + start * index_heads;
    }
    return in;
  }
};

// Outputs per layer for tokens [0, n): [n, H, 512].
struct Outputs {
  std::vector<std::vector<float>> layers;
  std::uint32_t heads = 0;
  Outputs(std::size_t n_layers, std::size_t n_tokens, std::uint32_t h) : heads(h) {
    layers.assign(n_layers, std::vector<float>(n_tokens * h * 512, -7.0f));
  }
  std::vector<float*> at(std::size_t start) {
    std::vector<float*> p;
    for (auto& l : layers) p.push_back(l.data() + start * heads * 512);
    return p;
  }
};

// Runs tokens [start, start + count) as one span: decode when `as_decode` (count must be 1), else prefill.
inline Status run_span(LayerRunner& runner, Deepseek4Cache& cache, const SyntheticModel& model,
                       const TokenStream& stream, Outputs& out, std::size_t start, std::size_t count, bool as_decode) {
  std::vector<LayerInputs> in;
  for (std::size_t l = 0; l < model.layers.size(); ++l) in.push_back(stream.slice(l, start));
  std::vector<float*> o = out.at(start);
  if (as_decode) return runner.decode_step(cache, model.weights, in, o);
  return runner.prefill_chunk(cache, count, model.weights, in, o);
}

inline Status run_decode(LayerRunner& runner, Deepseek4Cache& cache, const SyntheticModel& model,
                         const TokenStream& stream, Outputs& out, std::size_t start, std::size_t end) {
  for (std::size_t t = start; t < end; ++t) KVC_TRY(run_span(runner, cache, model, stream, out, t, 1, true));
  return ok_status();
}

// Prefill [start, end) in chunks whose sizes cycle through `sizes`.
inline Status run_chunks(LayerRunner& runner, Deepseek4Cache& cache, const SyntheticModel& model,
                         const TokenStream& stream, Outputs& out, std::size_t start, std::size_t end,
                         const std::vector<std::size_t>& sizes) {
  std::size_t t = start;
  for (std::size_t c = 0; t < end; ++c) {
    const std::size_t n = std::min(sizes[c % sizes.size()], end - t);
    KVC_TRY(run_span(runner, cache, model, stream, out, t, n, false));
    t += n;
  }
  return ok_status();
}

// Everything a reader may touch: position, valid window rows (oldest first), valid compressed / indexer
// rows and the four state buffers of every layer, as bytes.
inline std::vector<std::uint8_t> dump_valid(const Deepseek4Cache& cache) {
  std::vector<std::uint8_t> out;
  auto put = [&](std::span<const std::uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); };
  auto put_f = [&](std::span<const float> f) {
    put(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(f.data()), f.size() * sizeof(float)));
  };
  const std::uint64_t pos = cache.position();
  put(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&pos), sizeof(pos)));
  for (std::uint32_t l = 0; l < cache.num_layers(); ++l) {
    const ConstAttentionRows win = cache.window_rows(l);
    for (std::uint64_t q = cache.window_start_position(); q < pos; ++q) put(win.row(cache.window_slot(q)));
    const ConstAttentionRows comp = cache.compressed_rows(l);
    for (std::uint64_t i = 0; i < cache.compressed_valid(l); ++i) put(comp.row(i));
    const ConstIndexerRows idx = cache.indexer_rows(l);
    for (std::uint64_t i = 0; i < cache.indexer_valid(l); ++i) put(idx.row(i));
    put_f(cache.kv_state(l).data);
    put_f(cache.score_state(l).data);
    put_f(cache.indexer_kv_state(l).data);
    put_f(cache.indexer_score_state(l).data);
  }
  return out;
}

}  // namespace kvcompact::dsv4::testutil
