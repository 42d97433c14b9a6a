// The depthwise kernel for AVX-512 machines: 16 float32 lanes and twice the
// AVX2 build's registers, compiled the way ATen compiles its per-capability
// kernels.
#include "avx512_target.h"

#include "depthwise_kernel.h"  // defines this capability's entry points
