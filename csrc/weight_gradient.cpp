#include "weight_gradient.h"

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/strides.h>

namespace torch_convgrad {
namespace {

// Per spatial axis, the windows cover padded positions [0, reach) with
// reach = (Y - 1) * s + eff_k; input elements past reach - pad_begin are unused.
std::vector<c10::SymInt> window_reach(const Problem& problem) {
  std::vector<c10::SymInt> reach;
  for (int64_t axis = 0; axis < problem.spatial_rank(); ++axis)
    reach.push_back((problem.grad_output.sym_size(2 + axis) - 1) * problem.stride[axis] +
                    problem.dilated_kernel_size(axis));
  return reach;
}

// True when some axis has no input element under any window (all padding).
bool input_unreached(const Problem& problem, c10::ArrayRef<c10::SymInt> reach) {
  for (int64_t axis = 0; axis < problem.spatial_rank(); ++axis)
    if (reach[axis] <= problem.pad_begin[axis] || problem.input.sym_size(2 + axis) == 0) return true;
  return false;
}

// constant_pad_nd's argument: (begin, end) pairs from the last axis backwards.
std::vector<c10::SymInt> pad_argument(c10::ArrayRef<c10::SymInt> begin, c10::ArrayRef<c10::SymInt> end) {
  std::vector<c10::SymInt> pads;
  for (auto axis = static_cast<int64_t>(begin.size()) - 1; axis >= 0; --axis) {
    pads.push_back(begin[axis]);
    pads.push_back(end[axis]);
  }
  return pads;
}

bool all_zero(c10::ArrayRef<c10::SymInt> values) {
  for (const auto& value : values)
    if (value != 0) return false;
  return true;
}

std::vector<c10::SymInt> symint_vector(c10::IntArrayRef values) { return {values.begin(), values.end()}; }

// `ncx` zero-padded by (begin, end) per spatial axis, laid out in memory like
// the caller's data. One copy and zeroed borders, where constant_pad_nd would
// fill the whole buffer first.
at::Tensor zero_padded(const Problem& problem, const at::Tensor& ncx, c10::ArrayRef<c10::SymInt> begin,
                       c10::ArrayRef<c10::SymInt> end) {
  auto sizes = ncx.sym_sizes().vec();
  for (size_t axis = 0; axis < begin.size(); ++axis) sizes[2 + axis] += begin[axis] + end[axis];
  std::vector<c10::SymInt> caller_sizes(sizes.size());
  for (size_t dim = 0; dim < sizes.size(); ++dim) caller_sizes[problem.data_to_ncx[dim]] = sizes[dim];
  const at::Tensor padded = at::empty_symint(caller_sizes, ncx.options()).permute(problem.data_to_ncx);
  at::Tensor interior = padded;
  for (size_t axis = 0; axis < begin.size(); ++axis) {
    const int64_t dim = 2 + static_cast<int64_t>(axis);
    interior = interior.narrow_symint(dim, begin[axis], ncx.sym_size(dim));
    padded.narrow_symint(dim, 0, begin[axis]).zero_();
    padded.narrow_symint(dim, begin[axis] + ncx.sym_size(dim), end[axis]).zero_();
  }
  interior.copy_(ncx);
  return padded;
}

// Whether some kernel tap on this axis meets only padding in every window.
// ATen's oneDNN bf16 weight gradient leaves such taps' entries uninitialised
// (measured with torch 2.13 on CPU), so problems with one get their padding
// materialised. Kernels too long to scan are treated as having one.
bool has_padding_only_tap(int64_t size, int64_t pad_begin, int64_t windows, int64_t kernel, int64_t stride,
                          int64_t dilation) {
  constexpr int64_t kLongestScanned = 4096;
  if (kernel > kLongestScanned) return true;
  for (int64_t tap = 0; tap < kernel; ++tap) {
    const int64_t first = tap * dilation - pad_begin;  // the tap's input position in window 0
    const int64_t window = first >= 0 ? 0 : (-first + stride - 1) / stride;  // first window inside the input
    if (window >= windows || first + window * stride >= size) return true;
  }
  return false;
}

// Whether ATen's backend for this convolution accumulates f16/bf16 in float32
// (cuDNN, oneDNN, MIOpen and the CUDA depthwise kernels do); its slow paths
// add each sample's product into the low-precision result.
bool accumulates_in_float32(const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef stride,
                            c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, int64_t groups) {
  using at::native::ConvBackend;
  const std::vector<c10::SymInt> no_output_padding(stride.size(), 0);
  switch (at::native::select_conv_backend(input, weight, std::nullopt, stride, padding, dilation,
                                          /*transposed=*/false, no_output_padding, groups, std::nullopt)) {
    case ConvBackend::Cudnn:
    case ConvBackend::Mkldnn:
    case ConvBackend::Miopen:
    case ConvBackend::MiopenDepthwise:
    case ConvBackend::CudaDepthwise2d:
    case ConvBackend::CudaDepthwise3d:
      return true;
    default:
      return false;
  }
}

}  // namespace

at::Tensor weight_gradient(const Problem& problem) {
  const auto reach = window_reach(problem);
  if (problem.input.sym_size(0) == 0 || input_unreached(problem, reach))
    return at::zeros_symint(problem.result_shape(), problem.input.options());

  // Drop the trailing input no window reaches, then pad: the part of the pads
  // that is equal on both sides goes to ATen as `padding` (no copy); only an
  // asymmetric excess is materialised.
  const int64_t rank = problem.spatial_rank();
  at::Tensor input = problem.input;
  at::Tensor grad_output = problem.grad_output;
  std::vector<c10::SymInt> padding(rank), excess_begin(rank), excess_end(rank);
  bool padding_only_tap = false;
  for (int64_t axis = 0; axis < rank; ++axis) {
    const c10::SymInt used = input.sym_size(2 + axis).min(reach[axis] - problem.pad_begin[axis]);
    input = input.narrow_symint(2 + axis, 0, used);
    const c10::SymInt pad_end = reach[axis] - problem.pad_begin[axis] - used;
    padding[axis] = problem.pad_begin[axis].min(pad_end);
    excess_begin[axis] = problem.pad_begin[axis] - padding[axis];
    excess_end[axis] = pad_end - padding[axis];
    padding_only_tap |= has_padding_only_tap(used.expect_int(), problem.pad_begin[axis].expect_int(),
                                             grad_output.sym_size(2 + axis).expect_int(),
                                             problem.kernel_size[axis].expect_int(), problem.stride[axis],
                                             problem.dilation[axis]);
  }
  if (padding_only_tap) {
    for (int64_t axis = 0; axis < rank; ++axis) {
      excess_begin[axis] += padding[axis];
      excess_end[axis] += padding[axis];
      padding[axis] = 0;
    }
  }
  if (!all_zero(excess_begin) || !all_zero(excess_end))
    input = zero_padded(problem, input, excess_begin, excess_end);

  auto stride = symint_vector(problem.stride);
  auto dilation = symint_vector(problem.dilation);
  auto weight_shape = problem.canonical_shape();
  // ATen runs a 1-D convolution as a 2-D one on a contiguous copy of its
  // data; lifting it here as a view keeps channels-last (NXC) data zero-copy.
  const bool lift_to_2d = rank == 1;
  if (lift_to_2d) {
    input = input.unsqueeze(2);
    grad_output = grad_output.unsqueeze(2);
    stride.insert(stride.begin(), 1);
    dilation.insert(dilation.begin(), 1);
    padding.insert(padding.begin(), 0);
    weight_shape.insert(weight_shape.begin() + 2, 1);
  }

  // Only the weight's shape and dtype are read when just its gradient is asked for.
  at::Tensor weight = at::empty_symint(weight_shape, input.options());
  if (at::isReducedFloatingType(input.scalar_type()) &&
      !accumulates_in_float32(input, weight, stride, padding, dilation, problem.groups)) {
    input = input.to(at::kFloat);
    grad_output = grad_output.to(at::kFloat);
    weight = weight.to(at::kFloat);
  }
  at::Tensor canonical = std::get<1>(at::convolution_backward_symint(
      grad_output, input, weight, std::nullopt, stride, padding, dilation, /*transposed=*/false,
      std::vector<c10::SymInt>(stride.size(), 0), problem.groups, {false, true, false}));
  if (lift_to_2d) canonical = canonical.squeeze(2);

  at::Tensor result = problem.result_from_canonical(canonical.to(problem.input.scalar_type()));
  if (result.strides() != c10::IntArrayRef(c10::contiguous_strides(result.sizes())))
    result = at::empty(result.sizes(), result.options()).copy_(result);
  return result;
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
  const auto reach = window_reach(problem);

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
  const auto caller = [&](const at::Tensor& ncx) { return ncx.defined() ? problem.to_caller_layout(ncx) : ncx; };
  if (swapped) return {caller(d_grad_output), caller(d_input)};
  return {caller(d_input), caller(d_grad_output)};
}

}  // namespace torch_convgrad
