"""Autograd of the torch_convgrad ops: gradcheck / gradgradcheck in float64, one-sided
gradients, batch 0, and that the registered ``*_backward`` ops compute the backward.

The ops are bilinear in (input_forward, output_delta); their gradients come from
``torch.ops.torch_convgrad.conv_backprop_filters_backward`` /
``conv_transpose_backprop_filters_backward`` (see torch_convgrad/_registrations.py).

The broad matrix runs gradcheck/gradgradcheck in ``fast_mode`` (random projections of the
Jacobians, with batched-grad checks through vmap); a smaller set of tiny problems runs the
full (slow-mode) Jacobian comparison. Every test with tensors runs on each device.
"""
from dataclasses import replace

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.profiler import ProfilerActivity, profile

import torch_convgrad  # noqa: F401  (registers the ops)
from problems import OP_NAMES, FORMATS, op_packet, Problem



# ---------------------------------------------------------------------------
# the gradcheck matrix
# ---------------------------------------------------------------------------

# Format-independent configurations; every op runs each of them in every filter format of the op.
# Together: 1-D/2-D/3-D, asymmetric explicit pads, same_upper/same_lower/valid, groups 1/2 and
# depthwise, NXC and NCX, strides and dilations > 1 (also mixed per axis).
CONFIGS = {
    "1d-asym-g2-s2": dict(size=(7,), n=2, c=4, o=2, g=2, k=(3,), s=(2,), pads=((1,), (0,)), data_format="NCX"),
    "1d-valid-d3": dict(size=(8,), n=1, c=2, o=3, k=(2,), d=(3,), pads="valid", data_format="NXC"),
    "2d-same_upper-g2": dict(size=(5, 6), n=1, c=2, o=4, g=2, k=(2, 3), s=(2, 1), d=(1, 2),
                             pads="same_upper", data_format="NXC"),
    "2d-same_lower": dict(size=(6, 5), n=2, c=3, o=2, k=(3, 2), s=(2, 2), pads="same_lower", data_format="NCX"),
    "2d-asym-depthwise": dict(size=(5, 5), n=1, c=2, o=4, g=2, k=(2, 2), s=(1, 2), d=(2, 1),
                              pads=((0, 2), (1, 0)), data_format="NXC"),
    "3d-asym-g2": dict(size=(3, 4, 5), n=1, c=2, o=2, g=2, k=(2, 2, 2), s=(1, 2, 1), d=(1, 1, 2),
                       pads=((1, 0, 0), (0, 1, 1)), data_format="NCX"),
    "3d-same_upper": dict(size=(4, 3, 3), n=1, c=2, o=2, k=(1, 2, 3), s=(2, 1, 1), pads="same_upper",
                          data_format="NXC"),
}

MATRIX = [Problem(op=op, fmt=fmt, **cfg) for op in OP_NAMES for cfg in CONFIGS.values() for fmt in FORMATS[op]]


def as_function(problem):
    shape, kw = problem.shape(), problem.kwargs()
    op = op_packet(problem.op)
    return lambda x, dy: op(x, dy, shape, **kw)


def test_matrix_covers_the_brief():
    """Every op x every filter format x both layouts, groups > 1, 1/2/3-D, all pad kinds."""
    seen = {(p.op, p.fmt, p.data_format) for p in MATRIX}
    assert seen == {(op, fmt, df) for op in OP_NAMES for fmt in FORMATS[op] for df in ("NXC", "NCX")}
    for op in OP_NAMES:
        mine = [p for p in MATRIX if p.op == op]
        assert {p.r for p in mine} == {1, 2, 3}
        assert {p.pads for p in mine if isinstance(p.pads, str)} >= {"same_upper", "same_lower", "valid"}
        assert any(not isinstance(p.pads, str) and p.pads[0] != p.pads[1] for p in mine)
        assert any(p.g > 1 for p in mine)
        assert any(max(p._axis(p.s, 1)) > 1 for p in mine) and any(max(p._axis(p.d, 1)) > 1 for p in mine)


@pytest.mark.parametrize("problem", MATRIX, ids=Problem.id)
def test_gradcheck_fast(problem, device):
    x, dy = problem.tensors(requires_grad=True, seed=1, device=device)
    f = as_function(problem)
    assert gradcheck(f, (x, dy), fast_mode=True, check_batched_grad=True)
    assert gradgradcheck(f, (x, dy), fast_mode=True, check_batched_grad=True)


# Full Jacobians on the tiniest problems: one per op and filter format, all three ranks.
SLOW = [
    Problem(op="filters", fmt="XIO", size=(5,), n=1, c=2, o=2, g=2, k=(2,), s=(2,), pads=((1,), (0,)),
            data_format="NXC"),
    Problem(op="filters", fmt="OIX", size=(4, 3), n=1, c=1, o=2, k=(2, 2), d=(2, 1), pads="same_lower",
            data_format="NCX"),
    Problem(op="weights", fmt="XIO", size=(3, 3), n=1, c=2, o=2, g=2, k=(2, 1), s=(2, 1), pads="same_upper",
            data_format="NCX"),
    Problem(op="weights", fmt="OIX", size=(2, 3, 2), n=1, c=1, o=1, k=(1, 2, 2), s=(1, 2, 1),
            pads=((0, 1, 0), (1, 0, 1)), data_format="NXC"),
    Problem(op="transpose", fmt="XIO", size=(5,), n=1, c=2, o=2, g=2, k=(2,), s=(2,), pads=((0,), (1,)),
            data_format="NCX", output_padding=True),
    Problem(op="transpose", fmt="OIX", size=(4, 3), n=1, c=1, o=2, k=(2, 2), s=(2, 1), pads="same_upper",
            data_format="NXC"),
    Problem(op="transpose", fmt="IOX", size=(3, 4), n=1, c=2, o=2, g=2, k=(2, 2), d=(1, 2),
            pads="same_lower", data_format="NCX"),
    Problem(op="transpose", fmt="XOI", size=(2, 2, 3), n=1, c=1, o=2, k=(2, 1, 2), s=(1, 1, 2),
            pads=((1, 0, 0), (0, 0, 1)), data_format="NXC"),
]


@pytest.mark.parametrize("problem", SLOW, ids=Problem.id)
def test_gradcheck_full(problem, device):
    x, dy = problem.tensors(requires_grad=True, seed=2, device=device)
    f = as_function(problem)
    assert gradcheck(f, (x, dy))
    assert gradgradcheck(f, (x, dy))


# ---------------------------------------------------------------------------
# one-sided gradients, batch 0, and which ops compute the backward
# ---------------------------------------------------------------------------

ONE_SIDED = [
    Problem(op="filters", fmt="XIO", size=(6, 5), n=2, c=4, o=2, g=2, k=(3, 2), s=(2, 1), pads="same_upper",
            data_format="NXC"),
    Problem(op="weights", fmt="OIX", size=(7,), n=2, c=3, o=2, k=(3,), s=(2,), d=(1,), pads=((2,), (0,)),
            data_format="NCX"),
    Problem(op="transpose", fmt="IOX", size=(6, 5), n=2, c=2, o=4, g=2, k=(2, 3), s=(2, 1),
            pads="same_lower", data_format="NCX"),
    Problem(op="transpose", fmt="XOI", size=(3, 4, 3), n=1, c=2, o=2, k=(2, 2, 1), s=(1, 2, 1),
            pads=((1, 0, 0), (0, 1, 0)), data_format="NXC"),
]

BACKWARD_OP = {
    "filters": "torch_convgrad::conv_backprop_filters_backward",
    "weights": "torch_convgrad::conv_backprop_filters_backward",
    "transpose": "torch_convgrad::conv_transpose_backprop_filters_backward",
}


def random_weight(problem, seed, device):
    """A float64 weighting of the result, drawn on the CPU (the same on every device)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(problem.shape(), dtype=torch.float64, generator=generator).to(device)


def _profiled_backward(out, weight, inputs):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        grads = torch.autograd.grad((out * weight).sum(), inputs)
    return grads, list(prof.events())


@pytest.mark.parametrize("side", [0, 1], ids=["input_forward_only", "output_delta_only"])
@pytest.mark.parametrize("problem", ONE_SIDED, ids=Problem.id)
def test_gradient_of_one_input(problem, side, device):
    f = as_function(problem)
    x, dy = problem.tensors(seed=3, device=device)
    weight = random_weight(problem, seed=4, device=device)

    # The gradient with both inputs requiring grad is the oracle for the one-sided one.
    both = [x.clone().requires_grad_(), dy.clone().requires_grad_()]
    want = torch.autograd.grad((f(*both) * weight).sum(), both)[side]

    inputs = [x.clone(), dy.clone()]
    inputs[side].requires_grad_()
    out = f(*inputs)
    assert out.requires_grad and out.grad_fn is not None
    (got,), events = _profiled_backward(out, weight, [inputs[side]])
    assert got.shape == inputs[side].shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert inputs[1 - side].grad is None

    # One call of the registered backward op, asked only for the needed side.
    calls = [e for e in events if e.name == BACKWARD_OP[problem.op]]
    assert len(calls) == 1, [e.name for e in events]
    mask = [v for v in calls[0].concrete_inputs if isinstance(v, list) and len(v) == 2
            and all(isinstance(b, bool) for b in v)]
    assert mask == [[side == 0, side == 1]], calls[0].concrete_inputs

    # gradcheck with the other input a constant.
    inputs = [x.clone(), dy.clone()]
    inputs[side].requires_grad_()
    assert gradcheck(f, tuple(inputs), fast_mode=True)
    assert gradgradcheck(f, tuple(inputs), fast_mode=True)


@pytest.mark.parametrize("problem", ONE_SIDED, ids=Problem.id)
def test_backward_uses_backward_op_not_raw_kernel(problem, device):
    """The backward is the registered ``*_backward`` op (ATen convolutions inside), never
    the forward weight-gradient kernel itself."""
    x, dy = problem.tensors(seed=5, requires_grad=True, device=device)
    out = as_function(problem)(x, dy)
    node = out.grad_fn.name()
    assert "torch_convgrad::" in node and OP_NAMES[problem.op].replace("_", "") in node.lower(), node
    weight = torch.randn_like(out)
    _, events = _profiled_backward(out, weight, [x, dy])
    names = [e.name for e in events]
    assert names.count(BACKWARD_OP[problem.op]) == 1, names
    forward_kernel = f"torch_convgrad::{OP_NAMES[problem.op]}"
    assert forward_kernel not in names, names
    assert "aten::convolution" in names, names


@pytest.mark.parametrize("problem", ONE_SIDED, ids=Problem.id)
def test_double_backward_graph(problem, device):
    """create_graph=True gives differentiable gradients whose own backward runs (no raw kernel
    error, finite values), and the second-order gradient matches the bilinear identity
    d/dx <grad_dy(x, dy; w), v> = grad_x(x, v; w)."""
    f = as_function(problem)
    x, dy = problem.tensors(seed=6, requires_grad=True, device=device)
    weight = random_weight(problem, seed=7, device=device)
    gx, gdy = torch.autograd.grad((f(x, dy) * weight).sum(), (x, dy), create_graph=True)
    assert gx.requires_grad and gdy.requires_grad
    v = torch.randn_like(dy)
    (second,) = torch.autograd.grad((gdy * v).sum(), x)
    # <gdy(x), v> = sum(f(x, v) * w), so its gradient w.r.t. x is the x-gradient at (x, v).
    x2 = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad((f(x2, v) * weight).sum(), x2)
    torch.testing.assert_close(second, want, rtol=1e-12, atol=1e-12)


BATCH0 = [replace(p, n=0) for p in ONE_SIDED] + [
    Problem(op="filters", fmt="OIX", size=(5,), n=0, c=2, o=4, g=2, k=(2,), s=(2,), pads="same_lower",
            data_format="NXC"),
    Problem(op="transpose", fmt="OIX", size=(5, 4), n=0, c=2, o=2, k=(2, 2), pads="valid", data_format="NXC"),
]


@pytest.mark.parametrize("problem", BATCH0, ids=Problem.id)
def test_batch_zero_backward(problem, device):
    x, dy = problem.tensors(requires_grad=True, device=device)
    assert x.shape[0] == 0 and dy.shape[0] == 0
    out = as_function(problem)(x, dy)
    assert list(out.shape) == problem.shape()
    assert torch.equal(out, torch.zeros_like(out))
    weight = torch.randn_like(out)
    gx, gdy = torch.autograd.grad((out * weight).sum(), (x, dy))
    for grad, ref in ((gx, x), (gdy, dy)):
        assert grad.shape == ref.shape and grad.dtype == ref.dtype
        assert torch.equal(grad, torch.zeros_like(ref))
    # and through .backward() into .grad
    out = as_function(problem)(x, dy)
    (out * weight).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape and dy.grad.shape == dy.shape
    assert not x.grad.any() and not dy.grad.any()


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_python_api_is_differentiable(op, device):
    """The Python wrappers (int attributes broadcast per axis) carry the same autograd."""
    api = {"filters": torch_convgrad.conv_backprop_filters, "weights": torch_convgrad.conv_backprop_weights,
           "transpose": torch_convgrad.conv_transpose_backprop_filters}[op]
    problem = Problem(op=op, fmt="XIO", size=(5, 5), n=1, c=2, o=2, k=(3, 3), s=(2, 2), d=(1, 1),
                      pads=((1, 1), (1, 1)), data_format="NXC")
    x, dy = problem.tensors(seed=8, requires_grad=True, device=device)
    assert gradcheck(lambda a, b: api(a, b, problem.shape(), strides=2, pads_begin=1, pads_end=1), (x, dy),
                     fast_mode=True)
    got = torch.autograd.grad(api(x, dy, problem.shape(), strides=2, pads_begin=1, pads_end=1).sum(), (x, dy))
    want = torch.autograd.grad(as_function(problem)(x, dy).sum(), (x, dy))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
