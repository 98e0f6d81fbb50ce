// Shared by the DeepSeek-V4 kernel tests (indexer_test.cpp, attention_test.cpp, kernels_small_test.cpp,
// kernels_args_test.cpp, device_state_test.cpp): device-buffer helpers, a watchdog, and the cases that run a
// kernel on fresh random inputs against the CPU math — run_indexer_case (query preparation and scores bit for bit
// against the CPU fast path, within 1e-5 of the float64 oracle, then the top-k), run_topk_case (top-k alone on
// constructed scores) and run_attention_case (sparse attention within 2e-3 of the float64 oracle); their
// `[dsv4-kernels]` lines report the measured differences. Runners: indexer_cases.cpp, attention_cases.cpp.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/dsv4/attention.hpp"
#include "kvcompact/dsv4/indexer.hpp"
#include "kvcompact/dsv4/storage.hpp"
#include "test_seed.hpp"

#define SKIP_WITHOUT_GPU()                                                                        \
  do {                                                                                            \
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)"; \
  } while (0)

namespace kvcompact::cuda::dsv4::kernel_cases {

namespace kd = kvcompact::dsv4;
using kvcompact::testing_support::fresh_seed;

// A kernel that never returns would stall the whole GPU run: the first kernel test arms a watchdog that ends
// the process after DSV4_KERNELS_WATCHDOG_S seconds (default 600; 0 disables it).
inline void arm_watchdog() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("DSV4_KERNELS_WATCHDOG_S");
    const int secs = env != nullptr ? std::atoi(env) : 600;
    if (secs <= 0) return;
    std::thread([secs] {
      std::this_thread::sleep_for(std::chrono::seconds(secs));
      std::fprintf(stderr, "[dsv4-kernels] watchdog: still running after %d s, ending the process\n", secs);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(3);
    }).detach();
  });
}


template <typename T>
T take(Result<T>&& r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

inline void check(const Status& st, const char* what) {
  ASSERT_TRUE(st.ok()) << what << ": " << st.error().to_string();
  if (std::getenv("DSV4_KERNELS_TRACE") != nullptr) {
    const Status s2 = synchronize();
    std::printf("[dsv4-kernels] trace: %s done (%s)\n", what, s2.ok() ? "ok" : s2.error().to_string().c_str());
    std::fflush(stdout);
  }
}

inline DeviceBuffer alloc(std::uint64_t bytes) {
  auto r = DeviceBuffer::allocate(std::max<std::uint64_t>(bytes, 16));
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b = alloc(v.size() * sizeof(T));
  if (!v.empty()) {
    const Status st = b.upload(v.data(), v.size() * sizeof(T));
    EXPECT_TRUE(st.ok()) << st.error().to_string();
  }
  return b;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& b, std::size_t n) {
  std::vector<T> v(n);
  if (n > 0) {
    const Status st = b.download(v.data(), n * sizeof(T));
    EXPECT_TRUE(st.ok()) << st.error().to_string();
  }
  return v;
}

inline std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- indexer and top-k (indexer_cases.cpp) ---------------------------------------------------------------

struct IndexerCase {
  std::string name;
  kd::IndexerStorage storage = kd::IndexerStorage::Mxfp4;
  std::vector<std::int64_t> positions;  // one token per sequence (own indexer rows each)
  std::uint32_t heads = 64;
  std::uint32_t k = 512;
  bool model_grid = true;       // keys on the FP4 grid (model data); false: arbitrary values (scalar path)
  bool prepared_input = false;  // hand the CPU-prepared query to the GPU
  std::size_t distinct = 0;     // > 0: keys drawn from this many distinct rows (ties)
  int zero_heads = 0;           // heads whose raw query is 0 (ReLU(0), zero integer rows)
  float weight_scale = 1.0f;    // power of two times the head weights (extreme scales reach the scalar path)
  bool special_values = false;  // poison_indexer_rows: NaN, infinities, subnormals and -0 in some rows
  bool wide_span = false;       // wide_span_fp4_values for the rows and the (prepared) query
  // Scalar-path rows expected: by the key grid (none for model rows), none, some, or whole tokens only (0 or more
  // tokens with all their rows: a token whose w_h 2^fq_h is not exact for some head takes the scalar path, which
  // for tiny weights depends on the draw).
  enum class Fallback { ByGrid, None, Some, WholeTokens } fallback = Fallback::ByGrid;
};

void run_indexer_case(const IndexerCase& c);

// run_indexer_case for each indexer storage, named prefix + the storage's name.
void run_indexer_case_per_storage(IndexerCase c, const std::string& prefix);

// The top-k of each token's scores against the CPU's (indices identical, ties included).
void run_topk_case(const std::string& name, const std::vector<std::vector<float>>& per_token, std::uint32_t k);

// ---- attention (attention_cases.cpp) -----------------------------------------------------------------------

struct AttnCase {
  std::string name;
  kd::RowStorage storage = kd::RowStorage::Bf16;
  std::uint32_t ratio = 4;
  std::uint32_t heads = 64;
  std::vector<std::int64_t> positions;  // decode: one token per sequence
  bool prefill = false;                 // prefill: positions are consecutive tokens of one sequence
  std::uint32_t topk = 512;
  bool with_sink = true;
  float q_scale = 1.0f;
  bool q_bf16 = false;     // the query rounded to bf16 values (the model's activations)
  float row_growth = 0.0f;  // compressed row g at 1 + g * row_growth times the model's scale
  std::uint32_t check_every = 1;  // the float64 oracle checks tokens i % check_every == 0 and the last
  // The window ring's capacity, min(context, 128) in the model: a short context has a smaller one (which the
  // kernels index with a remainder, or a mask for powers of two). Positions must stay below it when it is < 128.
  std::uint32_t ring_capacity = 128;
};

void run_attention_case(const AttnCase& c);

}  // namespace kvcompact::cuda::dsv4::kernel_cases
