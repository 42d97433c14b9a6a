#include "algorithm.h"

#include <ATen/Version.h>

#include <string>

namespace torch_convgrad {

Geometry geometry_of(const Problem& problem) {
  Geometry g{};
  g.batch = problem.input.size(0);
  g.in_channels = problem.input.size(1);
  g.out_channels = problem.grad_output.size(1);
  g.groups = problem.groups;
  const int64_t rank = problem.spatial_rank();
  const int64_t lead = 3 - rank;
  for (int64_t axis = 0; axis < 3; ++axis) {
    const bool lifted = axis < lead;
    const int64_t source = axis - lead;
    g.in[axis] = lifted ? 1 : problem.input.size(2 + source);
    g.out[axis] = lifted ? 1 : problem.grad_output.size(2 + source);
    g.kernel[axis] = lifted ? 1 : problem.kernel_size[source].expect_int();
    g.stride[axis] = lifted ? 1 : problem.stride[source];
    g.dilation[axis] = lifted ? 1 : problem.dilation[source];
    g.pad_begin[axis] = lifted ? 0 : problem.pad_begin[source].expect_int();
  }
  for (int64_t dim = 0; dim < 5; ++dim) {
    const bool lifted = dim >= 2 && dim - 2 < lead;
    const int64_t source = dim < 2 ? dim : dim - lead;
    g.input_strides[dim] = lifted ? 0 : problem.input.stride(source);
    g.grad_output_strides[dim] = lifted ? 0 : problem.grad_output.stride(source);
  }
  return g;
}

at::Tensor canonical_from_taps(const at::Tensor& taps, const Geometry& g, int64_t spatial_rank) {
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  at::Tensor canonical = taps.view({g.groups, g.kernel[0], g.kernel[1], g.kernel[2], in_per_group, out_per_group})
                             .permute({0, 5, 4, 1, 2, 3})
                             .reshape({g.out_channels, in_per_group, g.kernel[0], g.kernel[1], g.kernel[2]});
  for (int64_t lifted = 0; lifted < 3 - spatial_rank; ++lifted) canonical = canonical.squeeze(2);
  return canonical;
}

double Geometry::macs() const {
  return static_cast<double>(batch) * out[0] * out[1] * out[2] * out_channels * (in_channels / groups) * taps();
}

double Geometry::data_bytes(int64_t element_size) const {
  const double input = static_cast<double>(batch) * in_channels * in[0] * in[1] * in[2];
  const double grad_output = static_cast<double>(batch) * out_channels * out[0] * out[1] * out[2];
  return (input + grad_output) * static_cast<double>(element_size);
}

bool cpu_runs_avx2_kernels() {
  static const bool avx2 = [] {
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX2" || capability == "AVX512";
  }();
  return avx2;
}

}  // namespace torch_convgrad
