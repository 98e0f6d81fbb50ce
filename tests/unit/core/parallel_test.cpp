// parallel_for: every index covered exactly once with chunks of at least `grain`, nested calls run inline,
// the first exception reaches the caller after in-flight chunks end, concurrent callers, pool resizing,
// and the KVCOMPACT_NUM_THREADS parser.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kvcompact/core/parallel.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

// Restores the thread count a test changed.
class ThreadCountGuard {
 public:
  ThreadCountGuard() = default;
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;
  ~ThreadCountGuard() { set_num_threads(0); }
};

// Runs parallel_for and checks the chunking contract; returns the number of body calls.
std::size_t check_cover(std::size_t begin, std::size_t end, std::size_t grain, const std::string& context) {
  const std::size_t n = end > begin ? end - begin : 0;
  std::vector<std::atomic<int>> hits(n);
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  parallel_for(begin, end, grain, [&](std::size_t lo, std::size_t hi) {
    {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(lo, hi);
    }
    for (std::size_t i = lo; i < hi; ++i) {
      if (i >= begin && i < end) hits[i - begin].fetch_add(1, std::memory_order_relaxed);
    }
  });
  const std::size_t g = grain == 0 ? 1 : grain;
  for (const auto& [lo, hi] : chunks) {
    EXPECT_TRUE(begin <= lo && lo < hi && hi <= end) << context << " chunk [" << lo << ", " << hi << ")";
    // Every chunk holds >= grain indices unless the whole range is one chunk.
    if (chunks.size() > 1) {
      EXPECT_GE(hi - lo, g) << context << " chunk [" << lo << ", " << hi << ")";
    }
  }
  if (n < 2 * g) {
    EXPECT_EQ(chunks.size(), n == 0 ? 0u : 1u) << context << ": a small range runs as one call";
  }
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(hits[i].load(), 1) << context << " index " << begin + i;
    if (hits[i].load() != 1) break;
  }
  return chunks.size();
}

TEST(Parallel, CoversEveryIndexExactlyOnce) {
  ThreadCountGuard guard;
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937 rng(seed);
  for (std::size_t threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    const std::size_t fixed[][3] = {{0, 0, 1}, {5, 5, 1}, {7, 3, 1}, {0, 1, 1}, {0, 1000, 0}, {0, 1000, 1},
                                    {3, 1000, 7}, {0, 127, 64}, {0, 128, 64}, {0, 129, 64}, {10, 600, 1000},
                                    {0, 100000, 1}};
    for (const auto& c : fixed) {
      check_cover(c[0], c[1], c[2], fmt::format("threads {} range [{}, {}) grain {}", threads, c[0], c[1], c[2]));
    }
    for (int r = 0; r < 20; ++r) {
      const std::size_t begin = rng() % 1000;
      const std::size_t end = begin + rng() % 5000;
      const std::size_t grain = rng() % 300;
      check_cover(begin, end, grain,
                  fmt::format("threads {} range [{}, {}) grain {} seed {}", threads, begin, end, grain, seed));
    }
  }
}

TEST(Parallel, SplitsWorkAcrossThreads) {
  ThreadCountGuard guard;
  set_num_threads(4);
  std::atomic<int> started{0};
  std::atomic<bool> saw_company{false};
  // Each chunk waits (up to 5 s) for a second chunk to start. A thread is busy inside its chunk meanwhile,
  // so the second one can only have started on another thread.
  parallel_for(0, 64, 1, [&](std::size_t, std::size_t) {
    started++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    if (started.load() >= 2) saw_company = true;
  });
  EXPECT_TRUE(saw_company.load()) << "4 threads but no two chunks ever ran at the same time";
}

TEST(Parallel, NestedCallsRunInlineWithoutDeadlock) {
  ThreadCountGuard guard;
  set_num_threads(3);
  std::atomic<std::size_t> total{0};
  std::atomic<int> inner_calls_not_inline{0};
  parallel_for(0, 12, 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      const auto outer_thread = std::this_thread::get_id();
      std::size_t inner_calls = 0;
      parallel_for(0, 1000, 1, [&](std::size_t a, std::size_t b) {
        ++inner_calls;
        if (std::this_thread::get_id() != outer_thread || a != 0 || b != 1000) inner_calls_not_inline++;
        total += b - a;
      });
      if (inner_calls != 1) inner_calls_not_inline++;
    }
  });
  EXPECT_EQ(total.load(), 12u * 1000u);
  EXPECT_EQ(inner_calls_not_inline.load(), 0);
}

TEST(Parallel, FirstExceptionReachesCallerAfterChunksFinish) {
  ThreadCountGuard guard;
  set_num_threads(4);
  std::atomic<int> running{0};
  std::atomic<int> running_at_return{-1};
  try {
    parallel_for(0, 400, 1, [&](std::size_t lo, std::size_t) {
      running++;
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      running--;
      if (lo == 0) throw std::runtime_error("chunk zero failed");
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    running_at_return = running.load();
    EXPECT_STREQ(e.what(), "chunk zero failed");
  }
  EXPECT_EQ(running_at_return.load(), 0) << "parallel_for returned while chunks were still running";
  // The pool still works afterwards.
  check_cover(0, 5000, 3, "after an exception");
}

TEST(Parallel, ManyThrowersYieldOneOfTheirExceptions) {
  ThreadCountGuard guard;
  set_num_threads(4);
  for (int round = 0; round < 20; ++round) {
    try {
      parallel_for(0, 64, 1, [&](std::size_t lo, std::size_t) { throw std::out_of_range(std::to_string(lo)); });
      ADD_FAILURE() << "no exception";
    } catch (const std::out_of_range& e) {
      const int chunk = std::stoi(e.what());
      EXPECT_TRUE(chunk >= 0 && chunk < 64) << e.what();
    }
  }
}

TEST(Parallel, InlineExceptionPropagates) {
  ThreadCountGuard guard;
  set_num_threads(1);
  EXPECT_THROW(parallel_for(0, 10, 1, [](std::size_t, std::size_t) { throw std::logic_error("x"); }),
               std::logic_error);
}

TEST(Parallel, ConcurrentCallersShareThePool) {
  ThreadCountGuard guard;
  set_num_threads(3);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int r = 0; r < 30; ++r) {
        const std::size_t n = 1000 + static_cast<std::size_t>(t * 37 + r);
        std::vector<std::atomic<int>> hits(n);
        parallel_for(0, n, 5, [&](std::size_t lo, std::size_t hi) {
          for (std::size_t i = lo; i < hi; ++i) hits[i]++;
        });
        for (auto& h : hits) {
          if (h.load() != 1) bad++;
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Parallel, ResizeWhileAnotherThreadRuns) {
  ThreadCountGuard guard;
  set_num_threads(4);
  std::atomic<bool> started{false};
  std::atomic<std::size_t> sum{0};
  std::thread runner([&] {
    parallel_for(0, 200, 1, [&](std::size_t lo, std::size_t hi) {
      started = true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      sum += hi - lo;
    });
  });
  while (!started) std::this_thread::yield();
  set_num_threads(2);  // the running call keeps the old pool
  EXPECT_EQ(num_threads(), 2u);
  check_cover(0, 3000, 1, "on the resized pool");
  runner.join();
  EXPECT_EQ(sum.load(), 200u);
}

TEST(Parallel, SetNumThreadsZeroRestoresDefaultAndCaps) {
  ThreadCountGuard guard;
  set_num_threads(0);
  const std::size_t def = num_threads();
  EXPECT_GE(def, 1u);
  set_num_threads(5);
  EXPECT_EQ(num_threads(), 5u);
  set_num_threads(100000);
  EXPECT_EQ(num_threads(), 1024u);
  set_num_threads(0);
  EXPECT_EQ(num_threads(), def);
}

// The environment is read once per process, so each case runs in a fresh child process.
TEST(Parallel, EnvironmentSetsTheDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  ASSERT_EQ(setenv("KVCOMPACT_NUM_THREADS", "7", 1), 0);
  EXPECT_EXIT(std::exit(num_threads() == 7 ? 0 : 1), testing::ExitedWithCode(0), "");
  // An explicit set_num_threads wins over the environment.
  EXPECT_EXIT({ set_num_threads(3); std::exit(num_threads() == 3 ? 0 : 1); }, testing::ExitedWithCode(0), "");
  ASSERT_EQ(setenv("KVCOMPACT_NUM_THREADS", "lots", 1), 0);
  EXPECT_EXIT(std::exit(num_threads() == std::min(hw, 1024u) ? 0 : 1), testing::ExitedWithCode(0), "");
  ASSERT_EQ(unsetenv("KVCOMPACT_NUM_THREADS"), 0);
}

TEST(Parallel, ParseThreadCount) {
  EXPECT_EQ(detail::parse_thread_count(nullptr), 0u);
  EXPECT_EQ(detail::parse_thread_count(""), 0u);
  EXPECT_EQ(detail::parse_thread_count("0"), 0u);
  EXPECT_EQ(detail::parse_thread_count("1"), 1u);
  EXPECT_EQ(detail::parse_thread_count(" 16 "), 16u);
  EXPECT_EQ(detail::parse_thread_count("1024"), 1024u);
  EXPECT_EQ(detail::parse_thread_count("1025"), 0u);
  EXPECT_EQ(detail::parse_thread_count("99999999999999999999999"), 0u);
  EXPECT_EQ(detail::parse_thread_count("-3"), 0u);
  EXPECT_EQ(detail::parse_thread_count("4x"), 0u);
  EXPECT_EQ(detail::parse_thread_count("four"), 0u);
  EXPECT_EQ(detail::parse_thread_count("2 3"), 0u);
}

}  // namespace
}  // namespace kvcompact
