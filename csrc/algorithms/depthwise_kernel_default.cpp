// The depthwise kernel for any CPU (ATEN_CPU_CAPABILITY=default, or no AVX2):
// at::vec::Vectorized is its portable fallback here.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "depthwise_kernel.h"

namespace torch_convgrad::depthwise_kernel::DEFAULT {

void channels_last(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                   int64_t channel_end, void* result) {
  dispatch<ChannelsLast>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                    int64_t channel_end, void* result) {
  dispatch<ChannelsFirst>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

}  // namespace torch_convgrad::depthwise_kernel::DEFAULT
