// Autocast: inside a torch.autocast region, floating inputs other than
// float64 are cast to the region's dtype (CPU: bfloat16 by default, CUDA:
// float16) and the op runs, and returns, in that dtype -- the policy ATen uses
// for convolutions. One boxed kernel serves every op.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_convgrad {
namespace {

template <c10::DeviceType device, c10::DispatchKey key>
void run_in_autocast_dtype(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
  const auto num_arguments = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  for (auto it = stack->end() - num_arguments; it != stack->end(); ++it)
    if (it->isTensor()) *it = at::autocast::cached_cast(dtype, it->toTensor(), device);
  op.callBoxed(stack);
}

template <c10::DeviceType device, c10::DispatchKey key>
void register_autocast(torch::Library& m) {
  for (const char* name : {"conv_backprop_filters", "conv_backprop_weights", "conv_transpose_backprop_filters"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&run_in_autocast_dtype<device, key>>());
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, AutocastCPU, m) {
  register_autocast<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>(m);
}

TORCH_LIBRARY_IMPL(torch_convgrad, AutocastCUDA, m) {
  register_autocast<c10::DeviceType::CUDA, c10::DispatchKey::AutocastCUDA>(m);
}

}  // namespace torch_convgrad
