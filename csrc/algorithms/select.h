// Choosing the algorithm for a problem.
#pragma once

#include "algorithm.h"

namespace torch_convgrad {

// The forced algorithm (TORCH_CONVGRAD_ALGORITHM or torch_convgrad.use_algorithm)
// where it supports the problem; otherwise the supporting algorithm of least
// estimated cost.
const Algorithm& select_algorithm(const Problem& problem);

// Remembers, per thread, which algorithm ran last; nullptr when the result
// needed none (zeros for an empty batch or windows that meet only padding).
void record_algorithm(const Algorithm* algorithm);

}  // namespace torch_convgrad
