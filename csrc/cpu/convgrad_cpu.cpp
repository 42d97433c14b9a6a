// CPU kernels.
#include "../entry_points.h"
#include "../weight_gradient.h"

#include <ATen/ops/empty.h>

namespace torch_convgrad {
namespace {

struct CpuBackend {
  static at::Tensor run(const Problem& problem) { return weight_gradient(problem); }
};

at::Tensor batched_transpose(const at::Tensor& matrices) {
  return at::empty_symint(batched_transpose_shape(matrices), matrices.options()).copy_(matrices.transpose(1, 2));
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CPU, m) {
  EntryPoints<CpuBackend>::register_all(m);
  m.impl("_batched_transpose", &batched_transpose);
}

}  // namespace torch_convgrad
