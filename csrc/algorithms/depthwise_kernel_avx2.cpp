// The depthwise kernel for AVX2 + FMA + F16C machines, compiled the way ATen
// compiles its per-capability kernels: at::vec::Vectorized is 256-bit here.
#include "avx2_target.h"

#include "depthwise_kernel.h"  // defines this capability's entry points
