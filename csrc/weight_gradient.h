// Device-generic algorithms on a resolved `Problem`.
#pragma once

#include "problem.h"

#include <array>
#include <tuple>

namespace torch_convgrad {

// How f16/bf16 problems accumulate. `Float32` computes them in float32 and
// rounds the result once; `Native` trusts the backend to accumulate in at
// least float32 (cuDNN and oneDNN do).
enum class Accumulation { Native, Float32 };

// The weight gradient as a new contiguous tensor in the requested format.
//
// This is the one place where the algorithm is chosen; today every problem
// maps onto ATen's convolution weight gradient, fed zero-copy NCX views and
// only the padding the windows actually reach.
at::Tensor weight_gradient(const Problem& problem, Accumulation accumulation);

// Gradients of <grad, weight_gradient(problem)> with respect to the caller's
// (input_forward, output_delta), in the caller's layout. Built from ATen ops
// called through the dispatcher, so it is differentiable again and traceable
// with symbolic sizes. Entries whose `output_mask` is false are undefined.
std::tuple<at::Tensor, at::Tensor> weight_gradient_backward(const Problem& problem, const at::Tensor& grad,
                                                            std::array<bool, 2> output_mask);

}  // namespace torch_convgrad
