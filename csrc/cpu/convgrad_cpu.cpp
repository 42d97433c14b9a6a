// CPU kernels.
#include "../entry_points.h"
#include "../weight_gradient.h"

namespace torch_convgrad {
namespace {

struct CpuBackend {
  static at::Tensor run(const Problem& problem) { return weight_gradient(problem); }
};

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CPU, m) { EntryPoints<CpuBackend>::register_all(m); }

}  // namespace torch_convgrad
