// CUDA kernels: the device-generic algorithm on the tensors' device and the
// current stream (ATen launches there), under a device guard.
#include "../entry_points.h"
#include "../weight_gradient.h"

#include <c10/cuda/CUDAGuard.h>

namespace torch_convgrad {
namespace {

struct CudaBackend {
  static at::Tensor run(const Problem& problem) {
    const c10::cuda::CUDAGuard device_guard(problem.input.device());
    return weight_gradient(problem);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CUDA, m) { EntryPoints<CudaBackend>::register_all(m); }

}  // namespace torch_convgrad
