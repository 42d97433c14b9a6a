// The depthwise kernel for any CPU (ATEN_CPU_CAPABILITY=default, or no AVX2):
// at::vec::Vectorized is its portable fallback here.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "depthwise_kernel.h"  // defines this capability's entry points
