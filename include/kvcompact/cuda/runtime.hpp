// CUDA runtime helpers of the kvcompact CUDA backend: device discovery, an owning device buffer with
// checked allocation, and explicit synchronisation. No CUDA header is included here, so CPU-only code can
// include it; streams are passed as opaque `void*` (a cudaStream_t, null = the default stream).
#pragma once

#include <cstdint>
#include <string>

#include "kvcompact/core/error.hpp"

namespace kvcompact::cuda {

// Number of CUDA devices; 0 when there is no device or no driver (never an error, so tests can skip).
int device_count();

struct DeviceProperties {
  std::string name;
  int multiprocessors = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::uint64_t global_memory = 0;
  std::uint64_t l2_bytes = 0;
  std::uint64_t shared_memory_per_block_optin = 0;
};
Result<DeviceProperties> device_properties(int device = 0);

// Owning, move-only device allocation (cudaMalloc). Allocation failures and every copy are checked and
// returned as errors naming the CUDA call.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(std::uint64_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  std::uint64_t size() const { return bytes_; }

  // Synchronous host <-> device copies of `bytes` at byte `offset` (range-checked). upload and fill have
  // finished on the device when they return, so kernels on any stream (non-blocking ones too) see the new
  // bytes; download copies what the device holds once the default stream's earlier work is done (work on a
  // non-blocking stream is the caller's to wait for).
  Status upload(const void* src, std::uint64_t bytes, std::uint64_t offset = 0);
  // The copy ordered on `stream` (null = default stream), without a wait: kernels on that stream, and work
  // ordered after it, see the bytes. From pageable memory `src` may be reused on return (the call stages it);
  // from page-locked memory only once the copy has run.
  Status upload_async(const void* src, std::uint64_t bytes, std::uint64_t offset, void* stream);
  Status download(void* dst, std::uint64_t bytes, std::uint64_t offset = 0) const;
  // Sets every byte (synchronous, as upload).
  Status fill(std::uint8_t byte);

 private:
  void* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

// Owning, move-only page-locked host allocation (cudaMallocHost): device-to-host copies into it are
// asynchronous and skip the driver's staging copy (DeviceCache::sync_lengths reads its lengths through one).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(std::uint64_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  std::uint64_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

// Owning, move-only CUDA event (timing disabled), created at its first record: marks a point in a stream's
// work, e.g. the last kernels that read a buffer which the host is about to rewrite.
class DeviceEvent {
 public:
  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  ~DeviceEvent();

  // Records the event after the work enqueued so far on `stream` (null = default stream).
  Status record(void* stream);
  // Waits on the host until the work before the last record has run (at once when never recorded).
  Status synchronize() const;

 private:
  void* event_ = nullptr;
};

// cudaDeviceSynchronize, with any asynchronous kernel error mapped to an Error.
Status synchronize();
// cudaStreamSynchronize on an opaque stream (null = default stream).
Status synchronize(void* stream);

}  // namespace kvcompact::cuda
