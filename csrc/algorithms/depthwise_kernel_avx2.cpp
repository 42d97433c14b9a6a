// The depthwise kernel for AVX2 + FMA + F16C machines, compiled the way ATen
// compiles its per-capability kernels: at::vec::Vectorized is 256-bit here.
#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// GCC's target pragma does not define the ISA macros in C++, and sleef.h
// (through vec.h) declares its 256-bit functions only under them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1

#include "depthwise_kernel.h"

namespace torch_convgrad::depthwise_kernel::AVX2 {

void channels_last(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                   int64_t channel_end, void* result) {
  dispatch<ChannelsLast>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                    int64_t channel_end, void* result) {
  dispatch<ChannelsFirst>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

}  // namespace torch_convgrad::depthwise_kernel::AVX2
