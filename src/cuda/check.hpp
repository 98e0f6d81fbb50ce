// Internal: every CUDA runtime call of the backend goes through KVC_CUDA_TRY, which turns a failure into a
// kvcompact::Error carrying the statement text and CUDA's own error name and message.
#pragma once

#include <cuda_runtime.h>

#include "kvcompact/core/error.hpp"

namespace kvcompact::cuda::detail {

inline Error cuda_error(cudaError_t err, const char* statement, const char* file, int line) {
  return make_error(ErrorCode::Internal, "CUDA call `{}` failed at {}:{}: {} ({})", statement, file, line,
                    cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace kvcompact::cuda::detail

#define KVC_CUDA_TRY(stmt)                                                                  \
  do {                                                                                      \
    const cudaError_t kvc_cuda_err_ = (stmt);                                               \
    if (kvc_cuda_err_ != cudaSuccess) {                                                     \
      (void)cudaGetLastError(); /* clear a non-sticky error so later launches do not report it */ \
      return ::kvcompact::cuda::detail::cuda_error(kvc_cuda_err_, #stmt, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

// After a kernel launch: the launch configuration error, if any.
#define KVC_CUDA_CHECK_LAUNCH(name) KVC_CUDA_TRY(cudaGetLastError())
