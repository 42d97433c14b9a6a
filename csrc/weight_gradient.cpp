#include "weight_gradient.h"

#include "algorithms/select.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/zeros.h>

namespace torch_convgrad {
namespace {

// constant_pad_nd's argument: (begin, end) pairs from the last axis backwards.
std::vector<c10::SymInt> pad_argument(c10::ArrayRef<c10::SymInt> begin, c10::ArrayRef<c10::SymInt> end) {
  std::vector<c10::SymInt> pads;
  for (auto axis = static_cast<int64_t>(begin.size()) - 1; axis >= 0; --axis) {
    pads.push_back(begin[axis]);
    pads.push_back(end[axis]);
  }
  return pads;
}

// True when some axis has no input element under any window (all padding).
bool input_unreached(const Problem& problem, c10::ArrayRef<c10::SymInt> reach) {
  for (int64_t axis = 0; axis < problem.spatial_rank(); ++axis)
    if (reach[axis] <= problem.pad_begin[axis] || problem.input.sym_size(2 + axis) == 0) return true;
  return false;
}

}  // namespace

at::Tensor weight_gradient(const Problem& problem) {
  if (problem.input.sym_size(0) == 0 || input_unreached(problem, problem.window_reach())) {
    record_algorithm(nullptr);
    return at::zeros_symint(problem.result_shape(), problem.input.options());
  }
  const Algorithm& algorithm = select_algorithm(problem);
  record_algorithm(&algorithm);
  return algorithm.run(problem);
}

std::tuple<at::Tensor, at::Tensor> weight_gradient_backward(const Problem& problem, const at::Tensor& grad,
                                                            std::array<bool, 2> output_mask) {
  const bool swapped = problem.roles_swapped;
  const bool need_input = swapped ? output_mask[1] : output_mask[0];
  const bool need_grad_output = swapped ? output_mask[0] : output_mask[1];
  const at::Tensor weight = problem.canonical_from_result(grad);
  const int64_t rank = problem.spatial_rank();
  const auto stride = symint_vector(problem.stride);
  const auto dilation = symint_vector(problem.dilation);
  const std::vector<c10::SymInt> no_padding(rank, 0);
  const auto reach = problem.window_reach();

  at::Tensor d_input, d_grad_output;
  if (need_input) {
    // d/d input: the transposed convolution of grad_output with the weight,
    // over the whole padded input (output_padding = (X + pb + pe - eff_k) mod s
    // extends the windows' reach to it), then the input's part of it.
    std::vector<c10::SymInt> output_padding;
    for (int64_t axis = 0; axis < rank; ++axis)
      output_padding.push_back(problem.input.sym_size(2 + axis) + problem.pad_begin[axis] + problem.pad_end[axis] -
                               reach[axis]);
    d_input = at::convolution_symint(problem.grad_output, weight, std::nullopt, stride, no_padding, dilation,
                                     /*transposed=*/true, output_padding, problem.groups);
    for (int64_t axis = 0; axis < rank; ++axis)
      d_input = d_input.narrow_symint(2 + axis, problem.pad_begin[axis], problem.input.sym_size(2 + axis));
  }
  if (need_grad_output) {
    // d/d grad_output: the forward convolution of the padded input.
    const at::Tensor padded =
        at::constant_pad_nd_symint(problem.input, pad_argument(problem.pad_begin, problem.pad_end));
    d_grad_output = at::convolution_symint(padded, weight, std::nullopt, stride, no_padding, dilation,
                                           /*transposed=*/false, no_padding, problem.groups);
  }
  // Fresh contiguous tensors in the caller's layout, whatever layout ATen's
  // convolutions chose, so the fake kernel's strides and offset match (a
  // narrowed result that stays contiguous keeps an offset: copy it too).
  const auto caller = [&](const at::Tensor& ncx) {
    if (!ncx.defined()) return ncx;
    at::Tensor result = problem.to_caller_layout(ncx).contiguous();
    return result.sym_storage_offset() != 0 ? result.clone() : result;
  };
  if (swapped) return {caller(d_grad_output), caller(d_input)};
  return {caller(d_input), caller(d_grad_output)};
}

}  // namespace torch_convgrad
