// CUDA runtime helpers: device discovery, DeviceBuffer (checked cudaMalloc / copies) and synchronisation.
// Every call is checked through KVC_CUDA_TRY (check.hpp).
#include "kvcompact/cuda/runtime.hpp"

#include <utility>

#include "check.hpp"

namespace kvcompact::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

Result<DeviceProperties> device_properties(int device) {
  cudaDeviceProp prop{};
  KVC_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  DeviceProperties out;
  out.name = prop.name;
  out.multiprocessors = prop.multiProcessorCount;
  out.compute_major = prop.major;
  out.compute_minor = prop.minor;
  out.global_memory = prop.totalGlobalMem;
  out.l2_bytes = static_cast<std::uint64_t>(prop.l2CacheSize);
  out.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  return out;
}

Result<DeviceBuffer> DeviceBuffer::allocate(std::uint64_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  KVC_CUDA_TRY(cudaMalloc(&buffer.ptr_, bytes));
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

Result<PinnedBuffer> PinnedBuffer::allocate(std::uint64_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  KVC_CUDA_TRY(cudaMallocHost(&buffer.ptr_, bytes));
  buffer.bytes_ = bytes;
  return buffer;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
}

Status DeviceBuffer::upload(const void* src, std::uint64_t bytes, std::uint64_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return make_error(ErrorCode::OutOfRange, "upload of {} bytes at offset {} exceeds the {}-byte buffer", bytes,
                      offset, bytes_);
  }
  if (bytes == 0) return ok_status();
  KVC_CUDA_TRY(cudaMemcpy(static_cast<std::uint8_t*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy returns once the bytes are staged, before the DMA into the buffer has
  // landed; only work on the default stream is ordered after it. Waiting for the default stream makes the new
  // bytes visible to kernels on any stream, non-blocking ones included (DeviceCache's device lengths).
  KVC_CUDA_TRY(cudaStreamSynchronize(nullptr));
  return ok_status();
}

Status DeviceBuffer::upload_async(const void* src, std::uint64_t bytes, std::uint64_t offset, void* stream) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return make_error(ErrorCode::OutOfRange, "upload of {} bytes at offset {} exceeds the {}-byte buffer", bytes,
                      offset, bytes_);
  }
  if (bytes == 0) return ok_status();
  KVC_CUDA_TRY(cudaMemcpyAsync(static_cast<std::uint8_t*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice,
                               static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status DeviceBuffer::download(void* dst, std::uint64_t bytes, std::uint64_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return make_error(ErrorCode::OutOfRange, "download of {} bytes at offset {} exceeds the {}-byte buffer", bytes,
                      offset, bytes_);
  }
  if (bytes == 0) return ok_status();
  KVC_CUDA_TRY(cudaMemcpy(dst, static_cast<const std::uint8_t*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
  return ok_status();
}

Status DeviceBuffer::fill(std::uint8_t byte) {
  if (bytes_ == 0) return ok_status();
  KVC_CUDA_TRY(cudaMemset(ptr_, byte, bytes_));
  // cudaMemset of device memory returns before it runs (ordered on the default stream only): wait, as upload.
  KVC_CUDA_TRY(cudaStreamSynchronize(nullptr));
  return ok_status();
}

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Status DeviceEvent::record(void* stream) {
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    KVC_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
  }
  KVC_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status DeviceEvent::synchronize() const {
  if (event_ == nullptr) return ok_status();
  KVC_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  return ok_status();
}

Status synchronize() {
  KVC_CUDA_TRY(cudaDeviceSynchronize());
  return ok_status();
}

Status synchronize(void* stream) {
  KVC_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return ok_status();
}

}  // namespace kvcompact::cuda
