// The canonical weight-gradient problem.
//
// Every spec attribute (strides, pads, auto_pad, dilations, groups, data and
// filter formats, output_padding) is validated and resolved here, once, into a
// `Problem`. The kernels (CPU, CUDA, Meta, the backward formulas) consume only
// the `Problem`; none of them looks at an attribute again.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/OptionalArrayRef.h>

#include <string_view>
#include <vector>

namespace torch_convgrad {

// Argument names of one public op, so that error messages use the names the
// caller typed (conv_backprop_weights calls its tensors src/diff_dst, ...).
struct ArgNames {
  const char* input;         // data tensor 1 (forward input)
  const char* output_delta;  // data tensor 2 (gradient of the forward output)
  const char* shape;         // the filter/weights shape argument
  const char* format;        // the filter/weights format attribute
};

inline constexpr ArgNames kFiltersArgs{"input_forward", "output_delta", "filter_shape", "filter_format"};
inline constexpr ArgNames kWeightsArgs{"src", "diff_dst", "weights_shape", "weights_format"};

// The spec attributes exactly as the op schemas receive them.
struct Attributes {
  c10::SymIntArrayRef shape;
  at::OptionalIntArrayRef strides;
  at::OptionalIntArrayRef pads_begin;
  at::OptionalIntArrayRef pads_end;
  at::OptionalIntArrayRef dilations;
  std::string_view auto_pad;
  at::OptionalIntArrayRef output_padding;  // ConvTranspose only
  int64_t groups;
  std::string_view data_format;
  std::string_view format;
};

// A convolution weight gradient in NCX/OIX terms. A ConvTranspose problem is
// stored already reduced to this form (SPEC section 4): its output_delta plays
// the convolution input and its input_forward the convolution output gradient.
//
//   dW[o, c, k] = sum_n sum_j input[n, (o // Og)*Cg + c, j*s - pb + k*d] * grad_output[n, o, j]
//
// The canonical result is (A, B, K1..Kr) = (O, C/g, K...): OIX for a
// convolution, IOX for a ConvTranspose.
struct Problem {
  at::Tensor input;        // (N, C, X1..Xr), a view of the caller's tensor
  at::Tensor grad_output;  // (N, O, Y1..Yr), a view of the caller's tensor
  std::vector<c10::SymInt> kernel_size;
  std::vector<int64_t> stride;
  std::vector<int64_t> dilation;
  std::vector<c10::SymInt> pad_begin;  // explicit, auto_pad already applied
  std::vector<c10::SymInt> pad_end;
  int64_t groups = 1;

  // ConvTranspose: `input` is the caller's output_delta and `grad_output` its
  // input_forward.
  bool roles_swapped = false;
  // Caller's data layout -> NCX, applied to both data tensors.
  std::vector<int64_t> data_to_ncx;
  // Canonical (A, B, K...) -> the requested filter format.
  std::vector<int64_t> canonical_to_result;

  int64_t spatial_rank() const { return static_cast<int64_t>(kernel_size.size()); }
  // eff_k = (k - 1) * d + 1 of SPEC section 3.
  c10::SymInt dilated_kernel_size(int64_t axis) const { return (kernel_size[axis] - 1) * dilation[axis] + 1; }
  std::vector<c10::SymInt> canonical_shape() const;
  std::vector<c10::SymInt> result_shape() const;
  // An NCX tensor -> a view in the caller's data layout.
  at::Tensor to_caller_layout(const at::Tensor& ncx) const;
  at::Tensor canonical_from_result(const at::Tensor& result) const;
  at::Tensor result_from_canonical(const at::Tensor& canonical) const;
  // The canonical (A, B, K...) weight gradient, in any dtype and layout, as
  // the op's result: a new contiguous tensor in the requested format and the
  // input's dtype.
  at::Tensor finish(const at::Tensor& canonical) const { return finish_sum(canonical.unsqueeze(0)); }
  // The same from P partial sums (P, A, B, K...) with any strides, added in
  // order (deterministic for a given P). On CPU one pass sums, converts and
  // lays them out, where ATen's sum, conversion and permuted copy take one
  // each, at a few GB/s.
  at::Tensor finish_sum(const at::Tensor& partials) const;
  // Per spatial axis, the windows cover padded positions [0, reach) with
  // reach = (Y - 1) * s + eff_k; input elements past reach - pad_begin are unused.
  std::vector<c10::SymInt> window_reach() const;
};

inline std::vector<c10::SymInt> symint_vector(c10::IntArrayRef values) { return {values.begin(), values.end()}; }

// The permutation that undoes `order`.
inline std::vector<int64_t> inverse_permutation(c10::IntArrayRef order) {
  std::vector<int64_t> inverse(order.size());
  for (size_t dim = 0; dim < order.size(); ++dim) inverse[order[dim]] = static_cast<int64_t>(dim);
  return inverse;
}

// conv_backprop_filters / conv_backprop_weights / the draft signature.
Problem resolve_convolution(const at::Tensor& input_forward, const at::Tensor& output_delta,
                            const Attributes& attrs, const ArgNames& names);

// conv_transpose_backprop_filters.
Problem resolve_conv_transpose(const at::Tensor& input_forward, const at::Tensor& output_delta,
                               const Attributes& attrs);

}  // namespace torch_convgrad
