// CPU kernels.
#include "../entry_points.h"
#include "../weight_gradient.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace torch_convgrad {
namespace {

bool ask_onednn(const char* query) {
  const auto op = c10::Dispatcher::singleton().findSchema({query, ""});
  return op.has_value() && op->typed<bool()>().call();
}

// ATen sends every f16/bf16 CPU convolution to oneDNN when the processor
// supports that dtype there, and oneDNN accumulates in float32. The other CPU
// paths may sum the batch in the low-precision result.
bool onednn_accumulates_in_float32(at::ScalarType dtype) {
  static const bool bfloat16 = ask_onednn("mkldnn::_is_mkldnn_bf16_supported");
  static const bool float16 = ask_onednn("mkldnn::_is_mkldnn_fp16_supported");
  if (!at::globalContext().userEnabledMkldnn()) return false;
  return (dtype == at::kBFloat16 && bfloat16) || (dtype == at::kHalf && float16);
}

struct CpuBackend {
  static at::Tensor run(const Problem& problem) {
    const bool native = onednn_accumulates_in_float32(problem.input.scalar_type());
    return weight_gradient(problem, native ? Accumulation::Native : Accumulation::Float32);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CPU, m) { EntryPoints<CpuBackend>::register_all(m); }

}  // namespace torch_convgrad
