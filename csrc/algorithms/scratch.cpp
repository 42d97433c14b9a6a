#include "scratch.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/accumulate.h>

#include <array>
#include <memory>

namespace torch_convgrad {
namespace {

// Larger operands are allocated per call: their page faults are small next
// to the arithmetic on them, and a thread should not hold more than
// 32 MiB a slot for good.
constexpr size_t kMaxKeptBytes = size_t{32} << 20;

struct FreeCpu {
  void operator()(void* data) const { c10::free_cpu(data); }
};

struct Buffer {
  std::unique_ptr<void, FreeCpu> data;
  size_t bytes = 0;
};

thread_local std::array<Buffer, static_cast<size_t>(ScratchSlot::Count)> buffers;

}  // namespace

at::Tensor scratch_tensor(ScratchSlot slot, at::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t bytes = c10::multiply_integers(sizes) * c10::elementSize(options.dtype().toScalarType());
  if (options.device().type() != c10::DeviceType::CPU || bytes > kMaxKeptBytes) return at::empty(sizes, options);
  Buffer& buffer = buffers[static_cast<size_t>(slot)];
  if (buffer.bytes < bytes || !buffer.data) {
    buffer.data.reset();  // free before allocating the larger one
    buffer.data.reset(c10::alloc_cpu(std::max<size_t>(bytes, 1)));
    buffer.bytes = bytes;
  }
  return at::from_blob(buffer.data.get(), sizes, options);
}

at::Tensor float32_copy(const at::Tensor& tensor, ScratchSlot slot) {
  if (!tensor.is_cpu()) return tensor.to(at::kFloat);
  const at::Tensor copy = scratch_tensor(slot, {tensor.numel()}, tensor.options().dtype(at::kFloat))
                              .as_strided(tensor.sizes(), at::infer_dense_strides(tensor.sizes(), tensor.strides()));
  copy.copy_(tensor);
  return copy;
}

}  // namespace torch_convgrad
