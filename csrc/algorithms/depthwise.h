// What the depthwise algorithms (depthwise.cpp, amx_depthwise.cpp) share:
// the kernels' arguments and the split of the work into parallel tasks.
#pragma once

#include "algorithm.h"
#include "depthwise_kernel.h"

namespace torch_convgrad {

// A kernel entry point (depthwise_kernel.h): samples [begin, end) of channels
// [begin, end) into `result`.
using DepthwiseKernel = void (*)(const depthwise_kernel::Args&, int64_t, int64_t, int64_t, int64_t, void*);

// Channels a group, input and output alike, that the kernels take: depthwise
// (1), or groups of 2, 4 or 8 channels (as in ResNeXt and RegNet) that divide
// the narrowest build's vector of lanes; 0 otherwise.
int64_t depthwise_group_channels(const Problem& problem);

depthwise_kernel::Args depthwise_args(const Problem& problem, const Geometry& geometry);

// Runs `kernel` with `args` over tasks of (group of samples, block of channels) in
// parallel and adds the groups' partial sums in a fixed order (deterministic
// for a thread count); the finished weight gradient. Blocks of
// `block_channels`, or with 0 as many blocks as the threads need, each a
// multiple of `line_channels`.
at::Tensor run_depthwise_tasks(const Problem& problem, const Geometry& geometry, const depthwise_kernel::Args& args,
                               DepthwiseKernel kernel, int64_t block_channels, int64_t line_channels);

}  // namespace torch_convgrad
