// CPU parallelism for the host fast paths: one lazily created, process-wide pool of std::threads and a
// chunked parallel_for on it. Nested calls run inline (never deadlock); the first exception a body throws
// reaches the caller once every started chunk has finished.
#pragma once

#include <cstddef>
#include <functional>

namespace kvcompact {

// Run body(lo, hi) over disjoint chunks that together cover [begin, end) exactly once. Every chunk holds at
// least `grain` indices (grain 0 counts as 1), except that a range shorter than 2 * grain runs as one chunk.
// The calling thread works on chunks too. Runs inline on the calling thread, as one call body(begin, end),
// when the range is that small, when the pool has one thread, or when called from inside a parallel_for
// body (on any thread). An empty range calls nothing.
// If a body throws, chunks not yet started are skipped, chunks in flight finish, and the first exception
// is rethrown here. Safe to call from several threads at once (their chunks share the pool's workers).
void parallel_for(std::size_t begin, std::size_t end, std::size_t grain,
                  const std::function<void(std::size_t, std::size_t)>& body);

// Total threads a parallel_for may use, the caller included. Resolved on first use, in this order:
// the last set_num_threads(n) with n > 0; else KVCOMPACT_NUM_THREADS (a decimal in [1, 1024], otherwise
// ignored); else std::thread::hardware_concurrency() (1 if unknown).
std::size_t num_threads();

// Set the pool size (capped at 1024); 0 returns to the environment / hardware default. A pool of another
// size is replaced: calls already running keep the old one, which is joined when the last of them returns.
void set_num_threads(std::size_t n);

namespace detail {
// KVCOMPACT_NUM_THREADS parsing, exposed for tests: a plain decimal in [1, 1024] (surrounding spaces
// allowed), else 0 meaning "ignore".
std::size_t parse_thread_count(const char* text);
}  // namespace detail

}  // namespace kvcompact
