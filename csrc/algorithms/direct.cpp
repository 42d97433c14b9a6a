// Plain loops over the windows, for tiny problems. Below a few microseconds
// of arithmetic a call's time is its overhead, and ATen's (im2col and a GEMM,
// a dozen tensor operations) is most of it; this one makes one allocation
// and reads the caller's data where it lies, through its strides. The inner
// loop runs along the output-gradient channels, which channels-last data
// holds contiguously, into a (group, tap, C/g, O/g) accumulator: for one
// group that is already the XIO format. f16/bf16 accumulate in float32, f64
// in float64; every element is summed in a fixed order, on one thread.
#include "algorithm.h"

#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

namespace torch_convgrad {
namespace {

template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
void accumulate(const Geometry& g, const T* input, const T* grad_output, acc_type<T>* acc) {
  using A = acc_type<T>;
  const int64_t* xs = g.input_strides;
  const int64_t* dys = g.grad_output_strides;
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const int64_t taps = g.taps();
  std::fill(acc, acc + g.groups * taps * in_per_group * out_per_group, A(0));
  std::vector<A> dy(g.out_channels);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t y0 = 0; y0 < g.out[0]; ++y0)
      for (int64_t y1 = 0; y1 < g.out[1]; ++y1)
        for (int64_t y2 = 0; y2 < g.out[2]; ++y2) {
          const T* dy_at = grad_output + n * dys[0] + y0 * dys[2] + y1 * dys[3] + y2 * dys[4];
          for (int64_t o = 0; o < g.out_channels; ++o) dy[o] = static_cast<A>(dy_at[o * dys[1]]);
          for (int64_t k0 = 0, tap = 0; k0 < g.kernel[0]; ++k0) {
            const int64_t x0 = y0 * g.stride[0] - g.pad_begin[0] + k0 * g.dilation[0];
            for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1) {
              const int64_t x1 = y1 * g.stride[1] - g.pad_begin[1] + k1 * g.dilation[1];
              for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2, ++tap) {
                const int64_t x2 = y2 * g.stride[2] - g.pad_begin[2] + k2 * g.dilation[2];
                if (x0 < 0 || x0 >= g.in[0] || x1 < 0 || x1 >= g.in[1] || x2 < 0 || x2 >= g.in[2]) continue;
                const T* x_at = input + n * xs[0] + x0 * xs[2] + x1 * xs[3] + x2 * xs[4];
                for (int64_t group = 0; group < g.groups; ++group) {
                  A* acc_tap = acc + (group * taps + tap) * in_per_group * out_per_group;
                  const A* dy_group = dy.data() + group * out_per_group;
                  for (int64_t c = 0; c < in_per_group; ++c) {
                    const A x = static_cast<A>(x_at[(group * in_per_group + c) * xs[1]]);
                    A* row = acc_tap + c * out_per_group;
                    for (int64_t o = 0; o < out_per_group; ++o) row[o] += x * dy_group[o];
                  }
                }
              }
            }
          }
        }
}

bool supports(const Problem& problem) {
  const auto dtype = problem.input.scalar_type();
  return problem.input.device().is_cpu() && problem.input.layout() == at::kStrided &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16);
}

// Whether the accumulator, (K..., C, O) for one group, is already the result's
// layout, so that finishing it copies nothing.
bool taps_are_the_result(const Problem& problem) {
  const auto& order = problem.canonical_to_result;
  const int64_t rank = problem.spatial_rank();
  if (problem.groups != 1 || static_cast<int64_t>(order.size()) != rank + 2) return false;
  for (int64_t axis = 0; axis < rank; ++axis)
    if (order[axis] != 2 + axis) return false;
  return order[rank] == 1 && order[rank + 1] == 0;
}

// Measured on an AMD EPYC (Zen 3, AVX2, one thread) against ATen's path over
// 3x3 problems of 37K-9.4M MACs, in aten.cpp's terms (25 us fixed): about 5
// GMAC/s, 12 us fixed where the accumulator is the result (NXC data, XIO:
// then it wins below about 80K MACs) and 24 us where it needs a copy (it
// lost to ATen on NCX data with an OIX result at 37K MACs).
// With fewer than 8 output channels a group the inner loop is short:
// depthwise problems ran at 0.4 GMAC/s.
double cost(const Problem& problem, const Geometry& g) {
  const double macs_per_second = 5e9 * std::min(1.0, static_cast<double>(g.out_channels / g.groups) / 8);
  return (taps_are_the_result(problem) ? 12e-6 : 24e-6) + g.macs() / macs_per_second;
}

at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const auto dtype = problem.input.scalar_type();
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const at::Tensor acc = at::empty({g.groups, g.kernel[0], g.kernel[1], g.kernel[2], in_per_group, out_per_group},
                                   problem.input.options().dtype(accumulation_dtype(dtype)));
  const void* input = problem.input.const_data_ptr();
  const void* grad_output = problem.grad_output.const_data_ptr();
  switch (dtype) {
    case at::kDouble:
      accumulate(g, static_cast<const double*>(input), static_cast<const double*>(grad_output),
                 acc.mutable_data_ptr<double>());
      break;
    case at::kHalf:
      accumulate(g, static_cast<const c10::Half*>(input), static_cast<const c10::Half*>(grad_output),
                 acc.mutable_data_ptr<float>());
      break;
    case at::kBFloat16:
      accumulate(g, static_cast<const c10::BFloat16*>(input), static_cast<const c10::BFloat16*>(grad_output),
                 acc.mutable_data_ptr<float>());
      break;
    default:
      accumulate(g, static_cast<const float*>(input), static_cast<const float*>(grad_output),
                 acc.mutable_data_ptr<float>());
  }
  return problem.finish_sum(canonical_from_taps(acc.unsqueeze(0), g, problem.spatial_rank()));
}

}  // namespace

const Algorithm kDirectAlgorithm{"direct", supports, cost, run};

}  // namespace torch_convgrad
