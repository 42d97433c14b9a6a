// Autograd: one boxed kernel per op. Calls that need no gradient go straight
// to the kernel below autograd; the others also record a graph node whose
// backward calls the op's `*_backward` op through the dispatcher. That op is
// a CompositeImplicitAutograd formula of ATen ops, so it is differentiable
// again (double backward) and traces under torch.compile and torch.export.
//
// The node is written like ATen's generated ones rather than as a
// torch::autograd::Function: functorch transforms (torch.func.grad, jacrev)
// refuse C++ Functions but accept plain nodes. Being C++, it costs no Python
// per call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <memory>
#include <type_traits>

namespace torch_convgrad {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradient of one op's result with respect to (input_forward, output_delta).
struct WeightGradientBackward : public Node {
  WeightGradientBackward(const char* name, const c10::OperatorHandle& backward_op)
      : name_(name), backward_op_(backward_op) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    torch::jit::Stack stack{grads[0], input_forward_.unpack(), output_delta_.unpack()};
    stack.insert(stack.end(), attributes_.begin(), attributes_.end());
    stack.emplace_back(c10::List<bool>({should_compute_output(0), should_compute_output(1)}));
    backward_op_.callBoxed(&stack);
    return {stack[0].toTensor(), stack[1].toTensor()};
  }

  std::string name() const override { return name_; }

  void release_variables() override {
    input_forward_.reset_data();
    output_delta_.reset_data();
  }

  const char* name_;
  c10::OperatorHandle backward_op_;
  torch::autograd::SavedVariable input_forward_, output_delta_;
  std::vector<c10::IValue> attributes_;  // the op's arguments after the two tensors
};

// Graph nodes are shared_ptr up to torch 2.12 and intrusive_ptr from 2.13.
using NodePointer = decltype(torch::autograd::Edge::function);

template <class... Args>
NodePointer make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<Node>>)
    return std::make_shared<WeightGradientBackward>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<WeightGradientBackward>(std::forward<Args>(args)...);
}

struct OpNames {
  const char* node;         // grad_fn's name
  const char* backward_op;  // the op computing the gradients
};

constexpr OpNames kFilters{"torch_convgrad::ConvBackpropFiltersBackward",
                           "torch_convgrad::conv_backprop_filters_backward"};
// The same formula under the oneDNN names.
constexpr OpNames kWeights{"torch_convgrad::ConvBackpropWeightsBackward",
                           "torch_convgrad::conv_backprop_filters_backward"};
constexpr OpNames kTranspose{"torch_convgrad::ConvTransposeBackpropFiltersBackward",
                             "torch_convgrad::conv_transpose_backprop_filters_backward"};

template <const OpNames& names>
void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  static const c10::OperatorHandle backward_op =
      c10::Dispatcher::singleton().findSchemaOrThrow(names.backward_op, "");
  const auto arguments = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto first = stack->end() - arguments;
  const at::Tensor input_forward = first[0].toTensor();
  const at::Tensor output_delta = first[1].toTensor();
  NodePointer node;
  if (torch::autograd::compute_requires_grad(input_forward, output_delta)) {
    node = make_node(names.node, backward_op);
    auto& backward = static_cast<WeightGradientBackward&>(*node);
    node->set_next_edges(torch::autograd::collect_next_edges(input_forward, output_delta));
    backward.input_forward_ = torch::autograd::SavedVariable(input_forward, /*is_output=*/false);
    backward.output_delta_ = torch::autograd::SavedVariable(output_delta, /*is_output=*/false);
    backward.attributes_.assign(first + 2, stack->end());
  }
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  if (node) torch::autograd::set_history(stack->back().toTensor(), node);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, Autograd, m) {
  m.impl("conv_backprop_filters", torch::CppFunction::makeFromBoxedFunction<&autograd_kernel<kFilters>>());
  m.impl("conv_backprop_weights", torch::CppFunction::makeFromBoxedFunction<&autograd_kernel<kWeights>>());
  m.impl("conv_transpose_backprop_filters",
         torch::CppFunction::makeFromBoxedFunction<&autograd_kernel<kTranspose>>());
}

}  // namespace torch_convgrad
