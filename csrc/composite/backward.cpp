// The backward formulas, registered as CompositeExplicitAutograd: built from
// ATen ops called through the dispatcher, they serve every backend and the
// Meta key (fake tensors, symbolic sizes). Their own derivatives are in
// autograd/, in terms of these ops and the weight gradients.
#include "../problem.h"
#include "../weight_gradient.h"

#include <torch/library.h>

namespace torch_convgrad {
namespace {

std::tuple<at::Tensor, at::Tensor> conv_backprop_filters_backward(
    const at::Tensor& grad, const at::Tensor& input_forward, const at::Tensor& output_delta,
    c10::SymIntArrayRef filter_shape, at::OptionalIntArrayRef strides, at::OptionalIntArrayRef pads_begin,
    at::OptionalIntArrayRef pads_end, at::OptionalIntArrayRef dilations, c10::string_view auto_pad, int64_t groups,
    c10::string_view data_format, c10::string_view filter_format, std::array<bool, 2> output_mask) {
  const Attributes attrs{filter_shape, strides,      pads_begin, pads_end,    dilations,
                         auto_pad,     std::nullopt, groups,     data_format, filter_format};
  return weight_gradient_backward(resolve_convolution(input_forward, output_delta, attrs, kFiltersArgs), grad,
                                  output_mask);
}

std::tuple<at::Tensor, at::Tensor> conv_transpose_backprop_filters_backward(
    const at::Tensor& grad, const at::Tensor& input_forward, const at::Tensor& output_delta,
    c10::SymIntArrayRef filter_shape, at::OptionalIntArrayRef strides, at::OptionalIntArrayRef pads_begin,
    at::OptionalIntArrayRef pads_end, at::OptionalIntArrayRef dilations, c10::string_view auto_pad,
    at::OptionalIntArrayRef output_padding, int64_t groups, c10::string_view data_format,
    c10::string_view filter_format, std::array<bool, 2> output_mask) {
  const Attributes attrs{filter_shape, strides,        pads_begin, pads_end,    dilations,
                         auto_pad,     output_padding, groups,     data_format, filter_format};
  return weight_gradient_backward(resolve_conv_transpose(input_forward, output_delta, attrs), grad, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CompositeExplicitAutograd, m) {
  m.impl("conv_backprop_filters_backward", &conv_backprop_filters_backward);
  m.impl("conv_transpose_backprop_filters_backward", &conv_transpose_backprop_filters_backward);
}

}  // namespace torch_convgrad
