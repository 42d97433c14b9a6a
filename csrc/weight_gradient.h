// Device-generic algorithms on a resolved `Problem`.
#pragma once

#include "problem.h"

#include <array>
#include <tuple>

namespace torch_convgrad {

// The weight gradient as a new contiguous tensor in the requested format.
//
// Problems whose windows meet no input give zeros; every other problem runs
// the algorithm that csrc/algorithms/select.cpp picks for it.
at::Tensor weight_gradient(const Problem& problem);

// Gradients of <grad, weight_gradient(problem)> with respect to the caller's
// (input_forward, output_delta), in the caller's layout. Built from ATen ops
// called through the dispatcher, without branching on sizes, so it is
// differentiable again and traceable with symbolic (even unbacked) sizes.
// Entries whose `output_mask` is false are undefined.
std::tuple<at::Tensor, at::Tensor> weight_gradient_backward(const Problem& problem, const at::Tensor& grad,
                                                            std::array<bool, 2> output_mask);

}  // namespace torch_convgrad
