// The DeepSeek-V4 kernels' names for the shared programmatic-dependent-launch helpers (src/cuda/pdl.cuh).
#pragma once

#include "cuda/pdl.cuh"

namespace kvcompact::cuda::dsv4::detail {

using kvcompact::cuda::detail::launch_after_previous;
using kvcompact::cuda::detail::overlap_with_previous_attribute;
using kvcompact::cuda::detail::wait_for_previous_grid;

}  // namespace kvcompact::cuda::dsv4::detail
