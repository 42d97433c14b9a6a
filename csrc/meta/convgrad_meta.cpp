// Meta kernels: the fake implementations used for shape inference by
// FakeTensor, torch.compile and torch.export. They run the same resolution as
// the real kernels (so they raise the same errors, on symbolic sizes too) and
// return the real kernels' layout: a contiguous tensor of the result shape.
#include "../entry_points.h"

#include <ATen/ops/empty.h>

namespace torch_convgrad {
namespace {

struct MetaBackend {
  static at::Tensor run(const Problem& problem) {
    return at::empty_symint(problem.result_shape(), problem.input.options());
  }
};

at::Tensor batched_transpose(const at::Tensor& matrices) {
  return at::empty_symint(batched_transpose_shape(matrices), matrices.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, Meta, m) {
  EntryPoints<MetaBackend>::register_all(m);
  m.impl("_batched_transpose", &batched_transpose);
}

}  // namespace torch_convgrad
