// Autograd: one boxed kernel per op, the `*_backward` ops included. Calls
// that need no gradient go straight to the kernel below autograd; the others
// also record a graph node. A weight gradient's node calls its `*_backward`
// op through the dispatcher, and a `*_backward` op's node calls the weight
// gradient and the `*_backward` op again, so every order of derivative is
// these ops (and DTensor shards each of them).
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

#include <array>
#include <memory>
#include <tuple>
#include <type_traits>

namespace torch_convgrad {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// Calls `op` on `stack`. With grad mode on (create_graph), through autograd,
// so the call records its own node; otherwise below autograd, so the op
// reaches tensor subclasses (DTensor's sharding strategies) whole.
void call(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  if (at::GradMode::is_enabled()) {
    op.callBoxed(&stack);
  } else {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(&stack);
  }
}

// The weight gradient W(x, dy) is bilinear. Its backward op computes
// B(grad, x, dy) = (B_x(grad, dy), B_dy(grad, x)), defined by
// <grad, W(x, dy)> = <B_x(grad, dy), x> = <B_dy(grad, x), dy>.
struct WeightGradientOps {
  c10::OperatorHandle weight_gradient;  // W
  c10::OperatorHandle backward;         // B
};

// A node that saves `kSaved` tensors and W's attributes (the op's arguments
// after its tensors, without output_mask), and calls W and B with them.
template <size_t kSaved>
struct WeightGradientNode : public Node {
  WeightGradientNode(const char* name, const WeightGradientOps& ops) : name_(name), ops_(ops) {}

  void save(const std::array<at::Tensor, kSaved>& inputs) {
    for (size_t i = 0; i < kSaved; ++i) saved_[i] = torch::autograd::SavedVariable(inputs[i], /*is_output=*/false);
  }

  at::Tensor saved(size_t index) const { return saved_[index].unpack(); }

  at::Tensor weight_gradient(const at::Tensor& x, const at::Tensor& dy) const {
    torch::jit::Stack stack{x, dy};
    stack.insert(stack.end(), attributes_.begin(), attributes_.end());
    call(ops_.weight_gradient, stack);
    return stack[0].toTensor();
  }

  // B's two results; those `mask` leaves out are undefined.
  std::array<at::Tensor, 2> backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& dy,
                                     std::array<bool, 2> mask) const {
    torch::jit::Stack stack{grad, x, dy};
    stack.insert(stack.end(), attributes_.begin(), attributes_.end());
    stack.emplace_back(c10::List<bool>({mask[0], mask[1]}));
    call(ops_.backward, stack);
    return {stack[0].toTensor(), stack[1].toTensor()};
  }

  std::string name() const override { return name_; }

  void release_variables() override {
    for (auto& variable : saved_) variable.reset_data();
  }

  const char* name_;
  WeightGradientOps ops_;
  std::array<torch::autograd::SavedVariable, kSaved> saved_;
  std::vector<c10::IValue> attributes_;
};

// The gradient of W's result with respect to (input_forward, output_delta):
// saves (input_forward, output_delta).
struct WeightGradientBackward : public WeightGradientNode<2> {
  using WeightGradientNode::WeightGradientNode;

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto [d_x, d_dy] =
        backward(grads[0], saved(0), saved(1), {should_compute_output(0), should_compute_output(1)});
    return {d_x, d_dy};
  }
};

// The gradient of B's results (gx, gdy) with respect to (grad, input_forward,
// output_delta), which it saves, from the identities above, in W and B again:
//   d grad = W(ggx, dy) + W(x, ggdy),  d x = B_x(grad, ggdy),  d dy = B_dy(grad, ggx).
// So every order of differentiation runs these two ops, and DTensor shards
// every order with their strategies.
struct WeightGradientDoubleBackward : public WeightGradientNode<3> {
  using WeightGradientNode::WeightGradientNode;

  variable_list apply(variable_list&& grads) override {
    const at::Tensor& ggx = grads[0];
    const at::Tensor& ggdy = grads[1];
    const at::Tensor grad = saved(0), x = saved(1), dy = saved(2);
    at::Tensor d_grad, d_x, d_dy;
    if (should_compute_output(0)) {
      if (ggx.defined()) d_grad = weight_gradient(ggx, dy);
      if (ggdy.defined()) {
        const at::Tensor term = weight_gradient(x, ggdy);
        d_grad = d_grad.defined() ? d_grad.add(term) : term;
      }
    }
    if (should_compute_output(1) && ggdy.defined()) d_x = backward(grad, x, ggdy, {true, false})[0];
    if (should_compute_output(2) && ggx.defined()) d_dy = backward(grad, ggx, dy, {false, true})[1];
    return {d_grad, d_x, d_dy};
  }
};

// Graph nodes are shared_ptr up to torch 2.12 and intrusive_ptr from 2.13.
using NodePointer = decltype(torch::autograd::Edge::function);

template <class NodeType, class... Args>
NodePointer make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<Node>>)
    return std::make_shared<NodeType>(std::forward<Args>(args)...);
  else
    return c10::make_intrusive<NodeType>(std::forward<Args>(args)...);
}

struct OpNames {
  const char* node;             // W's grad_fn name
  const char* backward_node;    // B's grad_fn name
  const char* weight_gradient;  // W
  const char* backward;         // B
};

constexpr OpNames kFilters{"torch_convgrad::ConvBackpropFiltersBackward",
                           "torch_convgrad::ConvBackpropFiltersBackwardBackward",
                           "torch_convgrad::conv_backprop_filters", "torch_convgrad::conv_backprop_filters_backward"};
// The same formula under the oneDNN names.
constexpr OpNames kWeights{"torch_convgrad::ConvBackpropWeightsBackward",
                           "torch_convgrad::ConvBackpropFiltersBackwardBackward",
                           "torch_convgrad::conv_backprop_weights", "torch_convgrad::conv_backprop_filters_backward"};
constexpr OpNames kTranspose{"torch_convgrad::ConvTransposeBackpropFiltersBackward",
                             "torch_convgrad::ConvTransposeBackpropFiltersBackwardBackward",
                             "torch_convgrad::conv_transpose_backprop_filters",
                             "torch_convgrad::conv_transpose_backprop_filters_backward"};

template <const OpNames& names>
const WeightGradientOps& ops() {
  static const WeightGradientOps ops{c10::Dispatcher::singleton().findSchemaOrThrow(names.weight_gradient, ""),
                                     c10::Dispatcher::singleton().findSchemaOrThrow(names.backward, "")};
  return ops;
}

// Runs `op` below autograd; the tensors_with_grad (the op's first arguments)
// that require grad get a node of NodeType recording the other arguments,
// except a trailing output_mask.
template <class NodeType, size_t tensors_with_grad>
void record_and_run(const char* node_name, const WeightGradientOps& graph_ops, const c10::OperatorHandle& op,
                    c10::DispatchKeySet keys, torch::jit::Stack* stack, bool has_output_mask) {
  const auto arguments = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto first = stack->end() - arguments;
  std::array<at::Tensor, tensors_with_grad> inputs;
  for (size_t i = 0; i < tensors_with_grad; ++i) inputs[i] = first[i].toTensor();
  NodePointer node;
  if (std::apply([](const auto&... t) { return torch::autograd::compute_requires_grad(t...); }, inputs)) {
    node = make_node<NodeType>(node_name, graph_ops);
    auto& typed = static_cast<NodeType&>(*node);
    node->set_next_edges(
        std::apply([](const auto&... t) { return torch::autograd::collect_next_edges(t...); }, inputs));
    typed.save(inputs);
    typed.attributes_.assign(first + tensors_with_grad, stack->end() - (has_output_mask ? 1 : 0));
  }
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  if (!node) return;
  const auto outputs = static_cast<std::ptrdiff_t>(op.schema().returns().size());
  std::vector<at::Tensor> results;
  for (auto it = stack->end() - outputs; it != stack->end(); ++it) results.push_back(it->toTensor());
  torch::autograd::set_history(results, node);
}

template <const OpNames& names>
void weight_gradient_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  record_and_run<WeightGradientBackward, 2>(names.node, ops<names>(), op, keys, stack, /*has_output_mask=*/false);
}

template <const OpNames& names>
void backward_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  record_and_run<WeightGradientDoubleBackward, 3>(names.backward_node, ops<names>(), op, keys, stack,
                                                  /*has_output_mask=*/true);
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, Autograd, m) {
  m.impl("conv_backprop_filters", torch::CppFunction::makeFromBoxedFunction<&weight_gradient_autograd<kFilters>>());
  m.impl("conv_backprop_weights", torch::CppFunction::makeFromBoxedFunction<&weight_gradient_autograd<kWeights>>());
  m.impl("conv_transpose_backprop_filters",
         torch::CppFunction::makeFromBoxedFunction<&weight_gradient_autograd<kTranspose>>());
  m.impl("conv_backprop_filters_backward",
         torch::CppFunction::makeFromBoxedFunction<&backward_autograd<kFilters>>());
  m.impl("conv_transpose_backprop_filters_backward",
         torch::CppFunction::makeFromBoxedFunction<&backward_autograd<kTranspose>>());
}

}  // namespace torch_convgrad
