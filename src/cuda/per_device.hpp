// Internal, host only: a value worked out once per CUDA device and then reused — kernel attributes set with
// cudaFuncSetAttribute (which belong to the function in one device's context), occupancy answers and
// multiprocessor counts (which size grids for one device). Before this, such values were function-local statics
// computed on whichever device made the first call: a process that used a second device sized that device's
// grids from the first one's answers, launched kernels whose shared-memory attribute was never set there, and
// kept a first call's error for good. Here each device ordinal has its own slot; a failed computation is not
// remembered (the next call tries again). Thread-safe; the fast path is one acquire load. A slot outlives
// cudaDeviceReset, and may: the runtime keeps a function's attributes set through cudaFuncSetAttribute for the
// device's next primary context (measured with CUDA 13.0 and driver 580, lazy and eager module loading alike:
// the maximum dynamic shared memory reads back as set and a launch needing it runs), and occupancy answers and
// multiprocessor counts are properties of the kernel and the device (CudaDsv4KernelsDeviceReset runs every
// launcher before and after a reset).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

namespace kvcompact::cuda::detail {

template <typename T>
class PerDevice {
 public:
  // Devices with a slot; a higher ordinal computes on every call (correct, only slower).
  static constexpr int kDevices = 64;

  // The value for `device`: computed by compute(device, value) → cudaError_t under a per-device lock the first
  // time (and again after a failure, which is returned with `value` untouched), read without a lock afterwards.
  template <typename Compute>
  cudaError_t get(int device, T& value, Compute&& compute) {
    if (device < 0 || device >= kDevices) return compute_into(device, value, compute);
    Slot& slot = slots_[static_cast<std::size_t>(device)];
    if (!slot.ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(slot.mutex);
      if (!slot.ready.load(std::memory_order_relaxed)) {
        const cudaError_t err = compute_into(device, slot.value, compute);
        if (err != cudaSuccess) return err;
        slot.ready.store(true, std::memory_order_release);
      }
    }
    value = slot.value;
    return cudaSuccess;
  }

  // The same for the calling thread's current device (cudaGetDevice's error when there is none).
  template <typename Compute>
  cudaError_t get(T& value, Compute&& compute) {
    int device = 0;
    const cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    return get(device, value, static_cast<Compute&&>(compute));
  }

 private:
  // Computes into a scratch value and stores it only on success, so a failed computation leaves nothing half
  // written behind (in a slot, or in the caller's variable on the slotless path).
  template <typename Compute>
  static cudaError_t compute_into(int device, T& value, Compute& compute) {
    T fresh{};
    const cudaError_t err = compute(device, fresh);
    if (err == cudaSuccess) value = fresh;
    return err;
  }

  struct Slot {
    std::atomic<bool> ready{false};
    std::mutex mutex;
    T value{};
  };
  std::array<Slot, kDevices> slots_{};
};

}  // namespace kvcompact::cuda::detail
