// The process-wide thread pool behind parallel_for. A call becomes a Job of numbered chunks that the caller
// and the workers claim with one atomic counter, so concurrent callers share workers without a scheduler;
// the caller always can finish its own job alone, which is why no call can wait on a busy pool forever.
#include "kvcompact/core/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kvcompact {

namespace {

constexpr std::size_t kMaxThreads = 1024;
// More chunks than threads so an uneven body still balances; few enough that dispatch stays cheap.
constexpr std::size_t kChunksPerThread = 4;

// > 0 while this thread runs a parallel_for body; nested calls then run inline.
thread_local int tl_body_depth = 0;

struct BodyScope {
  BodyScope() { ++tl_body_depth; }
  ~BodyScope() { --tl_body_depth; }
  BodyScope(const BodyScope&) = delete;
  BodyScope& operator=(const BodyScope&) = delete;
};

class Job {
 public:
  Job(const std::function<void(std::size_t, std::size_t)>& body, std::size_t begin, std::size_t n,
      std::size_t chunks)
      : body_(body), begin_(begin), base_(n / chunks), extra_(n % chunks), num_chunks_(chunks) {}

  // Claim and run chunks until none are left.
  void work() {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= num_chunks_) return;
      std::exception_ptr error;
      if (!cancelled_.load(std::memory_order_relaxed)) {
        // The first `extra_` chunks are one index longer, so all n indices are covered.
        const std::size_t lo = begin_ + i * base_ + std::min(i, extra_);
        const std::size_t hi = lo + base_ + (i < extra_ ? 1 : 0);
        try {
          BodyScope scope;
          body_(lo, hi);
        } catch (...) {
          error = std::current_exception();
          cancelled_.store(true, std::memory_order_relaxed);
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !first_error_) first_error_ = error;
      if (++done_ == num_chunks_) done_cv_.notify_all();
    }
  }

  bool exhausted() const { return next_.load(std::memory_order_relaxed) >= num_chunks_; }

  // Block until every chunk has run or been skipped; rethrow the first exception.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_ == num_chunks_; });
    // Take the exception out: a worker may drop the last reference to this Job later, and the exception
    // object should live and die with the caller that handles it.
    if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
  }

 private:
  const std::function<void(std::size_t, std::size_t)>& body_;
  const std::size_t begin_, base_, extra_, num_chunks_;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::size_t done_ = 0;
  std::exception_ptr first_error_;
};

class Pool {
 public:
  explicit Pool(std::size_t threads) : size_(threads) {
    try {
      for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
      shut_down();
      throw;
    }
  }
  ~Pool() { shut_down(); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  std::size_t size() const { return size_; }

  void run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
    }
    cv_.notify_all();
    job->work();
    remove(job);
    job->wait();
  }

 private:
  void worker_loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = queue_.front();
      }
      job->work();
      // Every chunk is claimed now; take the job off the queue so no worker spins on it.
      remove(job);
    }
  }

  void remove(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
  }

  void shut_down() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  const std::size_t size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

struct Registry {
  std::mutex mu;
  std::size_t requested = 0;        // from set_num_threads; 0 = use the default
  std::size_t default_threads = 0;  // env / hardware, resolved once
  std::shared_ptr<Pool> pool;
};

// Leaked on purpose: a static destructor elsewhere may still call parallel_for during exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::size_t resolve_locked(Registry& r) {
  if (r.requested != 0) return r.requested;
  if (r.default_threads == 0) {
    std::size_t n = detail::parse_thread_count(std::getenv("KVCOMPACT_NUM_THREADS"));
    if (n == 0) n = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), kMaxThreads);
    r.default_threads = n;
  }
  return r.default_threads;
}

// The pool to use now, or null when it has one thread or its threads could not be started.
std::shared_ptr<Pool> acquire_pool() {
  Registry& r = registry();
  std::shared_ptr<Pool> old;  // released after the lock, so joining its workers never holds it
  std::lock_guard<std::mutex> lock(r.mu);
  const std::size_t n = resolve_locked(r);
  if (n <= 1) return nullptr;
  if (!r.pool || r.pool->size() != n) {
    old = std::move(r.pool);
    try {
      r.pool = std::make_shared<Pool>(n);
    } catch (const std::system_error&) {
      return nullptr;  // no threads available: the caller runs inline
    }
  }
  return r.pool;
}

}  // namespace

namespace detail {
std::size_t parse_thread_count(const char* text) {
  if (text == nullptr) return 0;
  while (*text == ' ' || *text == '\t') ++text;
  std::size_t value = 0;
  bool any = false;
  for (; *text >= '0' && *text <= '9'; ++text) {
    value = value * 10 + static_cast<std::size_t>(*text - '0');
    if (value > kMaxThreads) return 0;
    any = true;
  }
  while (*text == ' ' || *text == '\t') ++text;
  if (!any || *text != '\0' || value == 0) return 0;
  return value;
}
}  // namespace detail

std::size_t num_threads() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return resolve_locked(r);
}

void set_num_threads(std::size_t n) {
  Registry& r = registry();
  std::shared_ptr<Pool> old;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.requested = std::min(n, kMaxThreads);
    if (r.pool && r.pool->size() != resolve_locked(r)) old = std::move(r.pool);
  }
  // `old` is joined here unless a running parallel_for still holds it; then that call joins it.
}

void parallel_for(std::size_t begin, std::size_t end, std::size_t grain,
                  const std::function<void(std::size_t, std::size_t)>& body) {
  if (begin >= end) return;
  const std::size_t n = end - begin;
  const std::size_t g = std::max<std::size_t>(grain, 1);
  std::shared_ptr<Pool> pool;
  if (n / g >= 2 && tl_body_depth == 0) pool = acquire_pool();
  if (!pool) {
    BodyScope scope;
    body(begin, end);
    return;
  }
  const std::size_t chunks = std::min(n / g, pool->size() * kChunksPerThread);
  pool->run(std::make_shared<Job>(body, begin, n, chunks));
}

}  // namespace kvcompact
