// CPU kernels.
#include "../entry_points.h"
#include "../weight_gradient.h"

namespace torch_convgrad {
namespace {

struct CpuBackend {
  // ATen's CPU paths for f16/bf16 do not all accumulate in float32: compute
  // those in float32 and round once.
  static at::Tensor run(const Problem& problem) { return weight_gradient(problem, Accumulation::Float32); }
};

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CPU, m) { EntryPoints<CpuBackend>::register_all(m); }

}  // namespace torch_convgrad
