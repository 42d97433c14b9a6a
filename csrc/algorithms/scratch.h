// Scratch memory for the packed operands of the hand-written CPU algorithms,
// kept per thread between calls. A fresh multi-megabyte allocation is paid
// for again on every call: glibc hands large blocks back to the system when
// they are freed, and the next call then takes a page fault per 4 KiB it
// touches. On the benchmark's 3x3 layers that was a quarter of the call.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_convgrad {

// Which buffer: a call may hold one of each at a time.
enum class ScratchSlot { PackedInput, PackedGradOutput, StagedOperand, VnniPanel, Count };

// An uninitialised contiguous tensor of `sizes`. On the CPU, up to a bound,
// it lives in this thread's buffer for `slot` (grown when too small) and is
// valid until the next request for that slot on this thread; so it must not
// be returned or kept. Elsewhere, or larger, it is a plain new tensor.
at::Tensor scratch_tensor(ScratchSlot slot, at::IntArrayRef sizes, const at::TensorOptions& options);

// A float32 copy of `tensor`, its dims in the same memory order, in this
// thread's buffer for `slot` on the CPU (the same lifetime), a new tensor
// elsewhere. For the float32 products of f16/bf16 data.
at::Tensor float32_copy(const at::Tensor& tensor, ScratchSlot slot);

}  // namespace torch_convgrad
