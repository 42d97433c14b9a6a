// The ops' kernel entry points, shared by every dispatch key.
//
// Each key's file supplies a `Backend` with `static at::Tensor run(const
// Problem&)`; the entry points resolve the attributes into the Problem (which
// runs every check of SPEC section 7 before any work) and hand it over.
#pragma once

#include "problem.h"

#include <torch/library.h>

namespace torch_convgrad {

template <typename Backend>
struct EntryPoints {
  static at::Tensor conv_backprop_filters(const at::Tensor& input_forward, const at::Tensor& output_delta,
                                          c10::SymIntArrayRef filter_shape, at::OptionalIntArrayRef strides,
                                          at::OptionalIntArrayRef pads_begin, at::OptionalIntArrayRef pads_end,
                                          at::OptionalIntArrayRef dilations, c10::string_view auto_pad,
                                          int64_t groups, c10::string_view data_format,
                                          c10::string_view filter_format) {
    const Attributes attrs{filter_shape, strides,      pads_begin,  pads_end,     dilations,
                           auto_pad,     std::nullopt, groups,      data_format,  filter_format};
    return Backend::run(resolve_convolution(input_forward, output_delta, attrs, kFiltersArgs));
  }

  static at::Tensor conv_backprop_weights(const at::Tensor& src, const at::Tensor& diff_dst,
                                          c10::SymIntArrayRef weights_shape, at::OptionalIntArrayRef strides,
                                          at::OptionalIntArrayRef pads_begin, at::OptionalIntArrayRef pads_end,
                                          at::OptionalIntArrayRef dilations, c10::string_view auto_pad,
                                          int64_t groups, c10::string_view data_format,
                                          c10::string_view weights_format) {
    const Attributes attrs{weights_shape, strides,      pads_begin, pads_end,    dilations,
                           auto_pad,      std::nullopt, groups,     data_format, weights_format};
    return Backend::run(resolve_convolution(src, diff_dst, attrs, kWeightsArgs));
  }

  static at::Tensor conv_transpose_backprop_filters(
      const at::Tensor& input_forward, const at::Tensor& output_delta, c10::SymIntArrayRef filter_shape,
      at::OptionalIntArrayRef strides, at::OptionalIntArrayRef pads_begin, at::OptionalIntArrayRef pads_end,
      at::OptionalIntArrayRef dilations, c10::string_view auto_pad, at::OptionalIntArrayRef output_padding,
      int64_t groups, c10::string_view data_format, c10::string_view filter_format) {
    const Attributes attrs{filter_shape, strides,        pads_begin, pads_end,    dilations,
                           auto_pad,     output_padding, groups,     data_format, filter_format};
    return Backend::run(resolve_conv_transpose(input_forward, output_delta, attrs));
  }

  static void register_all(torch::Library& m) {
    m.impl("conv_backprop_filters", &conv_backprop_filters);
    m.impl("conv_backprop_weights", &conv_backprop_weights);
    m.impl("conv_transpose_backprop_filters", &conv_transpose_backprop_filters);
  }
};

// _batched_transpose's result shape, (B, S, R) for (B, R, S) matrices.
inline std::vector<c10::SymInt> batched_transpose_shape(const at::Tensor& matrices) {
  TORCH_CHECK_VALUE(matrices.dim() == 3, "_batched_transpose: expected (B, R, S) matrices, got ", matrices.dim(),
                    " dims");
  return {matrices.sym_size(0), matrices.sym_size(2), matrices.sym_size(1)};
}

}  // namespace torch_convgrad
