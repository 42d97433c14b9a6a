// Device-generic algorithms on a resolved `Problem`.
#pragma once

#include "problem.h"

#include <array>
#include <tuple>

namespace torch_convgrad {

// The weight gradient as a new contiguous tensor in the requested format.
//
// This is the one place where the algorithm is chosen; today every problem
// maps onto ATen's convolution weight gradient, fed NCX views of the caller's
// data, only the padding the windows reach, and f16/bf16 in float32 unless
// ATen's backend for the problem accumulates in float32 itself.
at::Tensor weight_gradient(const Problem& problem);

// Gradients of <grad, weight_gradient(problem)> with respect to the caller's
// (input_forward, output_delta), in the caller's layout. Built from ATen ops
// called through the dispatcher, without branching on sizes, so it is
// differentiable again and traceable with symbolic (even unbacked) sizes.
// Entries whose `output_mask` is false are undefined.
std::tuple<at::Tensor, at::Tensor> weight_gradient_backward(const Problem& problem, const at::Tensor& grad,
                                                            std::array<bool, 2> output_mask);

}  // namespace torch_convgrad
