// The evaluation behind `kvcompact eval`: synthetic KV with realistic structure (outlier channels, RoPE,
// an attention sink, planted relevant tokens), per-mode codec statistics against theory, attention
// fidelity against exact attention on the original KV, and timing of the packed fast path against exact
// fp32 attention in the same process. Formatting lives in eval_report.cpp.
#include "kvcompact/tq/eval.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <random>
#include <set>
#include <ctime>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvcompact/core/parallel.hpp"
#include "kvcompact/core/sample_mean.hpp"
#include "kvcompact/tq/attention.hpp"
#include "kvcompact/tq/cache.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/codec.hpp"

namespace kvcompact::tq {

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kRopeBase = 500000.0;  // Llama-3-style base: low-frequency pairs barely turn over 32K tokens
constexpr std::uint32_t kTopK = 8;

// ---- synthetic KV -------------------------------------------------------------------------------------
// Keys: Gaussian channels with log-normal scales, a few large outlier channels of fixed sign placed in
// low-frequency RoPE pairs (as observed in real models), RoPE (NeoX pairing j, j + d/2) at each position.
// Position 0 is an attention sink: a large component along a per-head direction that every query shares.
// Each context's queries also share a "topic" direction planted into a few earlier keys, so attention
// has a sink, a few sharp matches and a long flat tail. Values: Gaussian with log-normal channel scales
// plus a per-head mean; the sink's value is small.
struct SyntheticData {
  std::uint32_t length = 0;
  std::vector<float> keys;    // [length, kv_heads, d]
  std::vector<float> values;  // [length, kv_heads, d]
  std::vector<std::vector<float>> queries;  // per context: [query_rows, q_heads, d]
};

void apply_rope(float* x, std::uint32_t d, std::uint32_t position) {
  const std::uint32_t half = d / 2;
  for (std::uint32_t j = 0; j < half; ++j) {
    const double theta = static_cast<double>(position) * std::pow(kRopeBase, -2.0 * j / d);
    const double c = std::cos(theta), s = std::sin(theta);
    const double a = x[j], b = x[j + half];
    x[j] = static_cast<float>(a * c - b * s);
    x[j + half] = static_cast<float>(a * s + b * c);
  }
}

std::vector<float> unit_vector(std::mt19937_64& rng, std::uint32_t d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(d);
  double n = 0.0;
  for (float& x : v) {
    x = normal(rng);
    n += static_cast<double>(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
  return v;
}

SyntheticData make_synthetic(std::uint64_t seed, std::uint32_t d, std::uint32_t kv_heads, std::uint32_t q_heads,
                             std::uint32_t query_rows, const std::vector<std::uint32_t>& contexts) {
  std::mt19937_64 rng(seed ^ 0x5eed'da7aull);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::lognormal_distribution<float> key_scale(0.0f, 0.3f), value_scale(0.0f, 0.5f);
  SyntheticData data;
  data.length = *std::max_element(contexts.begin(), contexts.end());
  const std::uint32_t half = d / 2;
  const std::uint32_t outliers = std::max(2u, d / 32);
  struct HeadParams {
    std::vector<float> key_scales, value_scales, value_mean, sink_dir;
    std::vector<std::uint32_t> outlier_channels;
    std::vector<float> outlier_sign;
  };
  std::vector<HeadParams> heads(kv_heads);
  for (HeadParams& h : heads) {
    for (std::uint32_t j = 0; j < d; ++j) {
      h.key_scales.push_back(key_scale(rng));
      h.value_scales.push_back(value_scale(rng));
      h.value_mean.push_back(0.5f * normal(rng));
    }
    for (std::uint32_t k = 0; k < outliers; ++k) {
      h.outlier_channels.push_back(half - 1 - 2 * k);  // low-frequency first halves of RoPE pairs
      h.outlier_sign.push_back(rng() % 2 ? 1.0f : -1.0f);
    }
    // Sink direction on the low-frequency quarter (channels [d/4, d/2) and partners) so RoPE barely moves it.
    h.sink_dir.assign(d, 0.0f);
    double n = 0.0;
    for (std::uint32_t j = d / 4; j < half; ++j) {
      h.sink_dir[j] = normal(rng);
      n += static_cast<double>(h.sink_dir[j]) * h.sink_dir[j];
    }
    for (float& x : h.sink_dir) x = static_cast<float>(x / std::sqrt(n));
  }

  const std::size_t row = static_cast<std::size_t>(kv_heads) * d;
  data.keys.resize(static_cast<std::size_t>(data.length) * row);
  data.values.resize(data.keys.size());
  for (std::uint32_t t = 0; t < data.length; ++t) {
    for (std::uint32_t h = 0; h < kv_heads; ++h) {
      const HeadParams& p = heads[h];
      float* k = data.keys.data() + t * row + static_cast<std::size_t>(h) * d;
      float* v = data.values.data() + t * row + static_cast<std::size_t>(h) * d;
      for (std::uint32_t j = 0; j < d; ++j) {
        k[j] = p.key_scales[j] * normal(rng);
        v[j] = p.value_mean[j] + p.value_scales[j] * normal(rng);
      }
      for (std::uint32_t o = 0; o < outliers; ++o) {
        k[p.outlier_channels[o]] = p.outlier_sign[o] * (6.0f + 1.5f * normal(rng));
      }
      if (t == 0) {
        for (std::uint32_t j = 0; j < d; ++j) {
          k[j] += 15.0f * p.sink_dir[j];
          v[j] *= 0.1f;
        }
      }
      apply_rope(k, d, t);
    }
  }

  // Queries per context at its last query_rows positions, and the planted matches of their topic.
  const std::uint32_t group = q_heads / kv_heads;
  for (std::uint32_t context : contexts) {
    const std::uint32_t rows = std::min(query_rows, context);
    const std::uint32_t first = context - rows;
    std::vector<float> q(static_cast<std::size_t>(rows) * q_heads * d);
    for (std::uint32_t h = 0; h < kv_heads; ++h) {
      const HeadParams& p = heads[h];
      const std::vector<float> topic = unit_vector(rng, d);
      for (std::uint32_t i = 0; i < rows; ++i) {
        for (std::uint32_t g = 0; g < group; ++g) {
          float* x = q.data() + (static_cast<std::size_t>(i) * q_heads + h * group + g) * d;
          for (std::uint32_t j = 0; j < d; ++j) x[j] = normal(rng) + 6.0f * p.sink_dir[j];
          for (std::uint32_t o = 0; o < outliers; ++o) x[p.outlier_channels[o]] += 2.0f * p.outlier_sign[o];
          apply_rope(x, d, first + i);
          for (std::uint32_t j = 0; j < d; ++j) x[j] += 4.0f * topic[j];
        }
      }
      // A few earlier keys carry the topic (after RoPE, so the match does not depend on distance).
      const std::uint32_t matches = std::min<std::uint32_t>(6, first > 1 ? first - 1 : 0);
      for (std::uint32_t m = 0; m < matches; ++m) {
        const std::uint32_t t = 1 + static_cast<std::uint32_t>(rng() % (first - 1));
        float* k = data.keys.data() + t * row + static_cast<std::size_t>(h) * d;
        for (std::uint32_t j = 0; j < d; ++j) k[j] += 16.0f * topic[j];
      }
    }
    data.queries.push_back(std::move(q));
  }
  return data;
}

// ---- codec statistics ---------------------------------------------------------------------------------

// Each statistic with its standard error, so a reader (and eval_test) can tell sampling noise from a
// departure from theory.
struct CodecStats {
  double key_dmse = 0, key_dmse_se = 0, value_dmse = 0, value_dmse_se = 0;
  double slope = 0, slope_se = 0, var_d = 0, var_d_se = 0;
};

// Least-squares slope through the origin of estimates e on truths t, Σ e·t / Σ t², with its
// heteroskedasticity-robust (sandwich) standard error √(Σ t²·(e − slope·t)²) / Σ t²: the estimator's
// error variance depends on the pair, so the textbook constant-variance formula would not hold.
std::pair<double, double> slope_through_origin(const std::vector<double>& truth, const std::vector<double>& estimate) {
  double cross = 0, truth_sq = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    cross += estimate[i] * truth[i];
    truth_sq += truth[i] * truth[i];
  }
  const double slope = cross / truth_sq;
  double spread = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    const double residual = estimate[i] - slope * truth[i];
    spread += truth[i] * truth[i] * residual * residual;
  }
  return {slope, std::sqrt(spread) / truth_sq};
}

CodecStats measure_codec(const LayerCodec& codec, std::uint64_t seed, std::uint32_t vectors, std::uint32_t pairs) {
  const std::uint32_t d = codec.head_dim();
  const TokenBytes tb = codec.token_bytes();
  std::mt19937_64 rng(seed ^ 0xc0de'c5a7ull);
  std::vector<std::uint8_t> kc(tb.key_codes), ks(tb.key_signs), vc(tb.value_codes);
  float kn = 0, vn = 0;
  std::uint16_t rho = 0;
  const bool qjl = codec.config().has_qjl();
  KeyRecord key{kc.data(), qjl ? ks.data() : nullptr, &kn, qjl ? &rho : nullptr};
  ConstKeyRecord ckey{kc.data(), qjl ? ks.data() : nullptr, &kn, qjl ? &rho : nullptr};
  std::vector<float> scratch(2 * d), q_rot(d), q_jl(d);
  std::vector<double> decoded(d);
  auto squared_error = [&](const std::vector<float>& x) {
    double sum = 0;
    for (std::uint32_t j = 0; j < d; ++j) sum += (decoded[j] - x[j]) * (decoded[j] - x[j]);
    return sum;
  };
  SampleMean key_err, value_err;
  for (std::uint32_t i = 0; i < vectors; ++i) {
    const std::vector<float> x = unit_vector(rng, d);
    (void)codec.encode_key(x, key, scratch);
    codec.decode_key(ckey, decoded);
    key_err.add(squared_error(x));
    (void)codec.encode_value(x, {vc.data(), &vn}, scratch);
    codec.decode_value({vc.data(), &vn}, decoded);
    value_err.add(squared_error(x));
  }
  SampleMean ip_err_d;  // d · (estimate − truth)² per pair
  std::vector<double> truths(pairs), estimates(pairs);
  for (std::uint32_t i = 0; i < pairs; ++i) {
    const std::vector<float> x = unit_vector(rng, d);
    const std::vector<float> y = unit_vector(rng, d);
    (void)codec.encode_key(x, key, scratch);
    codec.prepare_query(y, q_rot, q_jl);
    const double estimate = codec.score_key(q_rot, q_jl, ckey);
    double truth = 0;
    for (std::uint32_t j = 0; j < d; ++j) truth += static_cast<double>(x[j]) * y[j];
    truths[i] = truth;
    estimates[i] = estimate;
    ip_err_d.add((estimate - truth) * (estimate - truth) * d);
  }
  CodecStats stats;
  stats.key_dmse = key_err.mean();
  stats.key_dmse_se = key_err.standard_error();
  stats.value_dmse = value_err.mean();
  stats.value_dmse_se = value_err.standard_error();
  std::tie(stats.slope, stats.slope_se) = slope_through_origin(truths, estimates);
  stats.var_d = ip_err_d.mean();
  stats.var_d_se = ip_err_d.standard_error();
  return stats;
}

// Theory for unit vectors, from the Lloyd–Max distortion D_b (docs/tq-cache.md derives each line):
//   mse keys/values:  E‖x − x̂‖² = D_b, slope 1 − D_b;  with norm correction 2 − 2√(1 − D_b), slope √(1 − D_b)
//   prod keys:        E‖x − x̂‖² = (π/2 − 1)·D_{b−1} (orthogonal QJL), slope 1
// and d·E[(est − ⟨y,x⟩)²] = E‖x − x̂‖² for a random unit y.
double mse_theory(double distortion, bool norm_correction) {
  return norm_correction ? 2.0 - 2.0 * std::sqrt(1.0 - distortion) : distortion;
}

// ---- fidelity and timing ------------------------------------------------------------------------------

// CPU time of the whole process (all threads): the work a call did, which a busy shared machine
// disturbs far less than wall time (a preempted worker thread stretches wall time, not CPU time).
double process_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct PairTiming {
  double wall_a = 1e300, wall_b = 1e300, cpu_a = 1e300, cpu_b = 1e300;
};

// Best wall and CPU times of two calls measured alternately (a, b, a, b, ...) until min_ms has passed and
// each ran at least 5 times, so a change in machine load hits both sides alike; the minimum is the
// run least disturbed by other processes.
template <class A, class B>
PairTiming time_pair_us(A&& a, B&& b, double min_ms) {
  PairTiming t;
  const auto start = Clock::now();
  for (std::uint32_t runs = 0;
       runs < 5 || std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms; ++runs) {
    auto t0 = Clock::now();
    double c0 = process_cpu_us();
    a();
    t.cpu_a = std::min(t.cpu_a, process_cpu_us() - c0);
    t.wall_a = std::min(t.wall_a, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    t0 = Clock::now();
    c0 = process_cpu_us();
    b();
    t.cpu_b = std::min(t.cpu_b, process_cpu_us() - c0);
    t.wall_b = std::min(t.wall_b, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (runs >= 1000) break;
  }
  return t;
}

std::vector<std::uint32_t> top_positions(const std::vector<double>& logits, std::uint32_t k) {
  std::vector<std::uint32_t> idx(logits.size());
  for (std::uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
  const std::uint32_t n = std::min<std::uint32_t>(k, static_cast<std::uint32_t>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
  idx.resize(n);
  return idx;
}

struct ExactReference {
  std::vector<float> output;                 // [rows, q_heads, d] exact fp32 attention
  std::vector<std::vector<std::uint32_t>> top;  // per (row, q head): top-8 positions by exact logits
};

}  // namespace

std::vector<std::string> default_eval_modes() {
  return {"seed",           "k=prod3,v=mse3",    "k=prod4,v=mse4",      "k=mse3,v=mse3",
          "k=mse3,v=mse3,nc", "k=mse4,v=mse3,nc", "k=mse4,v=mse4,nc",    "k=prod5,v=mse4",
          "k=mse5,v=mse4,nc", "k=prod3,v=mse3,w=128", "recommended"};
}

Result<EvalReport> run_eval(const EvalOptions& in) {
  const auto start = Clock::now();
  auto progress = [&](std::string_view line) {
    if (in.progress) in.progress(line);
  };
  EvalReport report;
  report.head_dim = in.head_dim;
  report.kv_heads = in.kv_heads;
  report.q_heads = in.q_heads;
  report.query_rows = in.query_rows;
  report.ip_pairs = in.quick ? std::min(in.ip_pairs, 4000u) : in.ip_pairs;
  report.mse_vectors = in.quick ? std::min(in.mse_vectors, 1000u) : in.mse_vectors;
  report.seed = in.seed;
  report.contexts = in.contexts;
  if (report.contexts.empty()) {
    report.contexts = in.quick ? std::vector<std::uint32_t>{1024, 4096} : std::vector<std::uint32_t>{1024, 8192, 32768};
  }
  std::sort(report.contexts.begin(), report.contexts.end());
  report.contexts.erase(std::unique(report.contexts.begin(), report.contexts.end()), report.contexts.end());
  if (report.contexts.front() == 0) {
    return make_error(ErrorCode::InvalidArgument, "eval contexts must be positive (got 0)");
  }
  if (report.contexts.back() > (1u << 24)) {
    return make_error(ErrorCode::InvalidArgument, "eval context {} is above the supported 16M tokens",
                      report.contexts.back());
  }
  KVC_TRY(validate_head_dim(in.head_dim));
  if (in.kv_heads == 0 || in.q_heads == 0 || in.q_heads % in.kv_heads != 0 || in.query_rows == 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "eval needs kv_heads > 0, q_heads a positive multiple of it and query_rows > 0 (got {}, {}, {})",
                      in.kv_heads, in.q_heads, in.query_rows);
  }
  if (report.ip_pairs < 2 || report.mse_vectors < 2) {  // a standard error needs two samples
    return make_error(ErrorCode::InvalidArgument, "eval needs ip_pairs and mse_vectors ≥ 2 (got {} and {})",
                      report.ip_pairs, report.mse_vectors);
  }
  std::vector<QuantConfig> configs;
  {
    std::set<std::string> seen;
    for (const std::string& text : in.modes.empty() ? default_eval_modes() : in.modes) {
      KVC_ASSIGN_OR_RETURN(QuantConfig config, QuantConfig::parse(text, in.seed));
      if (seen.insert(config.name()).second) configs.push_back(config);
    }
  }
  for (const QuantConfig& config : configs) {
    if (config.exact_window > report.contexts.back()) {
      return make_error(ErrorCode::InvalidArgument,
                        "mode {} keeps an exact window of {} tokens, more than the largest context {} (raise the "
                        "contexts or choose other modes)",
                        config.name(), config.exact_window, report.contexts.back());
    }
  }
  const std::size_t pool = num_threads();
  report.threads = static_cast<std::uint32_t>(in.threads == 0 ? pool : std::min<std::size_t>(in.threads, pool));

  const std::uint32_t d = in.head_dim, kv_heads = in.kv_heads, q_heads = in.q_heads;
  const std::uint32_t max_context = report.contexts.back();
  progress(fmt::format("generating synthetic KV: {} tokens × {} KV heads × d {}", max_context, kv_heads, d));
  const SyntheticData data = make_synthetic(in.seed, d, kv_heads, q_heads, in.query_rows, report.contexts);
  const std::size_t row = static_cast<std::size_t>(kv_heads) * d;
  const double min_ms = in.quick ? std::min(in.min_timing_ms, 5.0) : in.min_timing_ms;

  AttentionOptions attn;
  attn.q_heads = q_heads;
  attn.threads = in.threads;

  // Exact references per context: fp32 attention over the original KV, exact top-8 positions (double
  // logits), and the baseline's decode time.
  std::vector<ExactReference> exact(report.contexts.size());
  const std::uint32_t group = q_heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::size_t c = 0; c < report.contexts.size(); ++c) {
    const std::uint32_t context = report.contexts[c];
    const std::uint32_t rows = std::min(in.query_rows, context);
    const std::uint32_t first = context - rows;
    progress(fmt::format("exact fp32 reference at context {}", context));
    ExactReference& ref = exact[c];
    ref.output.resize(static_cast<std::size_t>(rows) * q_heads * d);
    DenseAttentionRequest dense{context, first, rows, data.keys.data(), data.values.data(),
                                data.queries[c].data(), ref.output.data()};
    KVC_TRY(dense_attention_f32(d, kv_heads, {&dense, 1}, attn));
    ref.top.resize(static_cast<std::size_t>(rows) * q_heads);
    parallel_for(0, ref.top.size(), 1, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t rh = lo; rh < hi; ++rh) {
        const std::uint32_t i = static_cast<std::uint32_t>(rh / q_heads), h = static_cast<std::uint32_t>(rh % q_heads);
        const float* q = data.queries[c].data() + rh * d;
        std::vector<double> logits(first + i + 1);
        for (std::uint32_t t = 0; t < logits.size(); ++t) {
          const float* k = data.keys.data() + t * row + static_cast<std::size_t>(h / group) * d;
          double s = 0;
          for (std::uint32_t j = 0; j < d; ++j) s += static_cast<double>(q[j]) * k[j];
          logits[t] = s * scale;
        }
        ref.top[rh] = top_positions(logits, kTopK);
      }
    });
  }

  for (std::size_t m = 0; m < configs.size(); ++m) {
    const QuantConfig& config = configs[m];
    EvalModeResult result;
    result.mode = config.name();
    result.config = config;
    progress(fmt::format("[{}/{}] {}: codec statistics", m + 1, configs.size(), result.mode));
    const TokenBytes tb = token_bytes(d, config);
    result.key_bits = 8.0 * tb.key_total() / d;
    result.value_bits = 8.0 * tb.value_total() / d;
    result.bytes_per_token_head = tb.total();
    result.bf16_bytes_per_token_head = 4 * d;
    result.compression = static_cast<double>(result.bf16_bytes_per_token_head) / tb.total();
    result.window_bytes_per_head = static_cast<std::uint64_t>(config.exact_window) * 2 * d * sizeof(float);

    KVC_ASSIGN_OR_RETURN(LayerCodec codec, LayerCodec::create(d, config, 0));
    const CodecStats stats = measure_codec(codec, in.seed + m, report.mse_vectors, report.ip_pairs);
    const double key_d = codec.key_codebook().distortion();
    const double value_d = codec.value_codebook().distortion();
    result.key_dmse = stats.key_dmse;
    result.key_dmse_se = stats.key_dmse_se;
    result.value_dmse = stats.value_dmse;
    result.value_dmse_se = stats.value_dmse_se;
    result.value_dmse_theory = mse_theory(value_d, config.norm_correction);
    if (config.has_qjl()) {
      result.key_dmse_theory = (std::numbers::pi / 2.0 - 1.0) * key_d;
      result.ip_slope_theory = 1.0;
      result.ip_var_d_table = std::numbers::pi / 2.0 * key_d;
    } else {
      result.key_dmse_theory = mse_theory(key_d, config.norm_correction);
      result.ip_slope_theory = config.norm_correction ? std::sqrt(1.0 - key_d) : 1.0 - key_d;
    }
    result.ip_slope = stats.slope;
    result.ip_slope_se = stats.slope_se;
    result.ip_var_d = stats.var_d;
    result.ip_var_d_se = stats.var_d_se;
    result.ip_var_d_theory = result.key_dmse_theory;
    // Plain mse codes: every centroid is its cell's conditional mean and y = R·x is uniform on the sphere, so
    // D_b, 1 − D_b and the variance identity are exact expectations. Norm correction and QJL keys use
    // concentration approximations (mse_theory's comment, docs/tq-cache.md).
    result.key_theory_exact = !config.has_qjl() && !config.norm_correction;
    result.value_theory_exact = !config.norm_correction;

    // One cache grows through the contexts (ascending), so each measurement sees exactly its prefix.
    CacheShape shape;
    shape.head_dim = d;
    shape.kv_heads = {kv_heads};
    shape.sequences = 1;
    shape.capacity = max_context;
    KVC_ASSIGN_OR_RETURN(TurboQuantCache cache, TurboQuantCache::create(shape, config));
    const LayerCodec& cache_codec = *cache.codec(0);
    const LayerLayout& layout = *cache.layout(0);
    for (std::size_t c = 0; c < report.contexts.size(); ++c) {
      const std::uint32_t context = report.contexts[c];
      progress(fmt::format("[{}/{}] {}: context {}", m + 1, configs.size(), result.mode, context));
      const std::uint32_t have = cache.length(0, 0);
      KVC_TRY(cache.append(0, 0, have, context - have, DType::F32, data.keys.data() + have * row,
                           data.values.data() + have * row));
      const std::uint32_t rows = std::min(in.query_rows, context);
      const std::uint32_t first = context - rows;
      std::vector<float> out(static_cast<std::size_t>(rows) * q_heads * d);
      AttentionRequest req{0, first, rows, data.queries[c].data(), out.data()};
      KVC_TRY(cache.attention(0, {&req, 1}, attn));
      EvalContextResult cr;
      cr.context = context;
      const ExactReference& ref = exact[c];
      // Quantised logits ⟨q, k̂⟩ of every (query row, head) and visible position: each key is decoded once
      // (float64 explicit dequantisation, or the exact window row) and dotted with the queries of its group.
      const LayerView view = cache.view(0);
      const std::uint32_t exact_begin = exact_window_begin(context, view.window_begins[0], config.exact_window);
      const std::size_t states = static_cast<std::size_t>(rows) * q_heads;
      std::vector<double> logits(states * context);  // [row·q_heads + head][position]
      parallel_for(0, context, 256, [&](std::size_t lo, std::size_t hi) {
        std::vector<double> k(d);
        for (std::size_t t = lo; t < hi; ++t) {
          for (std::uint32_t kv = 0; kv < kv_heads; ++kv) {
            if (t >= exact_begin) {
              const float* row_f = data.keys.data() + t * row + static_cast<std::size_t>(kv) * d;
              for (std::uint32_t j = 0; j < d; ++j) k[j] = row_f[j];
            } else {
              const std::uint64_t slot = layout.slot(0, kv, static_cast<std::uint32_t>(t));
              ConstKeyRecord key;
              key.codes = view.data + layout.key_codes_offset + slot * layout.token.key_codes;
              key.norm = reinterpret_cast<const float*>(view.data + layout.key_norms_offset) + slot;
              if (config.has_qjl()) {
                key.signs = view.data + layout.key_signs_offset + slot * layout.token.key_signs;
                key.residual_norm =
                    reinterpret_cast<const std::uint16_t*>(view.data + layout.key_residual_norms_offset) + slot;
              }
              cache_codec.decode_key(key, k);
            }
            for (std::uint32_t i = 0; i < rows; ++i) {
              if (t > first + i) continue;  // causal: row i sees [0, first + i]
              for (std::uint32_t g = 0; g < group; ++g) {
                const std::size_t rh = static_cast<std::size_t>(i) * q_heads + kv * group + g;
                const float* q = data.queries[c].data() + rh * d;
                double s = 0;
                for (std::uint32_t j = 0; j < d; ++j) s += static_cast<double>(q[j]) * k[j];
                logits[rh * context + t] = s;
              }
            }
          }
        }
      });
      // Output error per (row, head), and top-8 overlap of the quantised logits with the exact ones.
      std::vector<double> errors(states), overlaps(states);
      for (std::size_t rh = 0; rh < states; ++rh) {
        const std::uint32_t i = static_cast<std::uint32_t>(rh / q_heads);
        double err = 0, norm = 0;
        for (std::uint32_t j = 0; j < d; ++j) {
          const double diff = static_cast<double>(out[rh * d + j]) - ref.output[rh * d + j];
          err += diff * diff;
          norm += static_cast<double>(ref.output[rh * d + j]) * ref.output[rh * d + j];
        }
        errors[rh] = std::sqrt(err / norm);
        const std::vector<double> visible(logits.begin() + static_cast<std::ptrdiff_t>(rh * context),
                                          logits.begin() + static_cast<std::ptrdiff_t>(rh * context + first + i + 1));
        const auto top = top_positions(visible, kTopK);
        std::uint32_t hits = 0;
        for (std::uint32_t p : top) hits += std::count(ref.top[rh].begin(), ref.top[rh].end(), p) ? 1u : 0u;
        overlaps[rh] = static_cast<double>(hits) / static_cast<double>(ref.top[rh].size());
      }
      for (std::size_t k = 0; k < errors.size(); ++k) {
        cr.rel_error_mean += errors[k] / static_cast<double>(errors.size());
        cr.top8_overlap += overlaps[k] / static_cast<double>(errors.size());
        cr.rel_error_max = std::max(cr.rel_error_max, errors[k]);
      }
      // Decode timing: one row at the last position, fast path and exact fp32 baseline side by side.
      std::vector<float> decode_out(static_cast<std::size_t>(q_heads) * d);
      AttentionRequest decode{0, context - 1, 1,
                              data.queries[c].data() + static_cast<std::size_t>(rows - 1) * q_heads * d,
                              decode_out.data()};
      std::vector<float> dense_out(decode_out.size());
      DenseAttentionRequest dense_decode{context, context - 1, 1, data.keys.data(), data.values.data(),
                                         decode.queries, dense_out.data()};
      const PairTiming timing =
          time_pair_us([&] { (void)cache.attention(0, {&decode, 1}, attn); },
                       [&] { (void)dense_attention_f32(d, kv_heads, {&dense_decode, 1}, attn); }, min_ms);
      cr.fast_us = timing.wall_a;
      cr.exact_us = timing.wall_b;
      cr.speedup = cr.exact_us / cr.fast_us;
      cr.fast_cpu_us = timing.cpu_a;
      cr.exact_cpu_us = timing.cpu_b;
      cr.cpu_speedup = cr.exact_cpu_us / cr.fast_cpu_us;
      result.contexts.push_back(cr);
    }
    report.modes.push_back(std::move(result));
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace kvcompact::tq
