"""torch.func.vmap over the torch_convgrad ops.

The vmap rule (torch_convgrad/_registrations.py) folds the vmap batch into the channels
and multiplies ``groups`` by the batch size, so a batch of B problems is one op call.
Checked here: equality with a Python loop for every op / filter format / data layout /
rank, groups, in_dims with a shared (None) side, in_dims != 0, nested vmap, per-sample
gradients against functorch's ``vmap(grad(...))``, and the single op call.
"""
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap
from torch.utils._python_dispatch import TorchDispatchMode

import torch_convgrad  # noqa: F401  (registers the ops)
from problems import OP_NAMES, FORMATS, FORMAT_KW, op_packet, Problem



def op_function(problem):
    shape, kw = problem.shape(), problem.kwargs()
    packet = op_packet(problem.op)
    return lambda x, dy: packet(x, dy, shape, **kw)


def batch_of(problem, count, dtype=torch.float64, seed=0):
    pairs = [problem.tensors(dtype=dtype, seed=seed + i) for i in range(count)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def loop(fn, xs, dys):
    return torch.stack([fn(x, dy) for x, dy in zip(xs, dys)])


class OpCalls(TorchDispatchMode):
    """Records the names of the ops reaching the kernels (below vmap and autograd)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


CONFIGS = {
    "1d-g2": dict(size=(9,), n=2, c=4, o=2, g=2, k=(3,), s=(2,), pads=((1,), (0,))),
    "2d-same_upper": dict(size=(6, 7), n=2, c=3, o=4, k=(3, 2), s=(2, 1), d=(1, 2), pads="same_upper"),
    "2d-depthwise": dict(size=(5, 6), n=1, c=2, o=4, g=2, k=(2, 2), d=(2, 1), pads="same_lower"),
    "3d-g2": dict(size=(4, 5, 3), n=1, c=2, o=4, g=2, k=(2, 2, 1), s=(1, 2, 1), pads=((1, 0, 0), (0, 1, 0))),
}

MATRIX = [Problem(op=op, fmt=fmt, data_format=df, **cfg)
          for op in OP_NAMES for fmt in FORMATS[op] for df in ("NXC", "NCX") for cfg in CONFIGS.values()]


@pytest.mark.parametrize("problem", MATRIX, ids=Problem.id)
def test_vmap_matches_loop(problem):
    fn = op_function(problem)
    xs, dys = batch_of(problem, 3)
    got = vmap(fn)(xs, dys)
    assert got.shape == (3, *problem.shape())
    assert got.is_contiguous()
    torch.testing.assert_close(got, loop(fn, xs, dys), rtol=1e-12, atol=1e-12)
    # and the samples really differ (a rule returning one sample B times would fail above)
    assert not torch.equal(got[0], got[1])


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_float32_and_python_api(op):
    api = {"filters": torch_convgrad.conv_backprop_filters, "weights": torch_convgrad.conv_backprop_weights,
           "transpose": torch_convgrad.conv_transpose_backprop_filters}[op]
    problem = Problem(op=op, fmt="XIO", size=(8, 8), n=2, c=4, o=6, g=2, k=(3, 3), s=(2, 2),
                      pads=((1, 0), (0, 0)), data_format="NXC")
    fn = lambda x, dy: api(x, dy, problem.shape(), strides=2, pads_begin=[1, 0], pads_end=0, groups=2)
    xs, dys = batch_of(problem, 4, dtype=torch.float32)
    got = vmap(fn)(xs, dys)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, loop(fn, xs, dys), rtol=1e-5, atol=1e-5)


SMALL = {op: Problem(op=op, fmt=FORMATS[op][-1], size=(6, 5), n=2, c=4, o=2, g=2, k=(3, 2), s=(2, 1),
                     pads="same_upper", data_format="NCX") for op in OP_NAMES}


@pytest.mark.parametrize("shared", ["input_forward", "output_delta"])
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_one_side_shared(op, shared):
    problem = SMALL[op]
    fn = op_function(problem)
    xs, dys = batch_of(problem, 4)
    if shared == "input_forward":
        x = xs[0]
        got = vmap(fn, in_dims=(None, 0))(x, dys)
        want = torch.stack([fn(x, dy) for dy in dys])
    else:
        dy = dys[0]
        got = vmap(fn, in_dims=(0, None))(xs, dy)
        want = torch.stack([fn(x, dy) for x in xs])
    assert got.shape == (4, *problem.shape())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("in_dims", [(1, 2), (2, 0), (-1, 1)], ids=str)
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_in_dims_not_zero(op, in_dims):
    problem = replace(SMALL[op], data_format="NXC")
    fn = op_function(problem)
    xs, dys = batch_of(problem, 3)
    moved = [t.movedim(0, d) for t, d in zip((xs, dys), in_dims)]
    got = vmap(fn, in_dims=in_dims)(*moved)
    torch.testing.assert_close(got, loop(fn, xs, dys), rtol=1e-12, atol=1e-12)
    # out_dims too
    got = vmap(fn, in_dims=in_dims, out_dims=1)(*moved)
    torch.testing.assert_close(got, loop(fn, xs, dys).movedim(0, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_nested_vmap(op):
    problem = SMALL[op]
    fn = op_function(problem)
    xs, dys = batch_of(problem, 6)
    xs, dys = xs.unflatten(0, (2, 3)), dys.unflatten(0, (2, 3))
    got = vmap(vmap(fn))(xs, dys)
    want = torch.stack([loop(fn, a, b) for a, b in zip(xs, dys)])
    assert got.shape == (2, 3, *problem.shape())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # outer over the shared x, inner over dy
    got = vmap(vmap(fn, in_dims=(None, 0)), in_dims=(0, 0))(xs[:, 0], dys)
    want = torch.stack([torch.stack([fn(xs[i, 0], dy) for dy in dys[i]]) for i in range(2)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_batch_zero_samples(op):
    problem = replace(SMALL[op], n=0)
    fn = op_function(problem)
    xs, dys = batch_of(problem, 3)
    got = vmap(fn)(xs, dys)
    assert got.shape == (3, *problem.shape()) and not got.any()


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_is_one_op_call(op):
    problem = Problem(op=op, fmt=FORMATS[op][-1], size=(8, 8), n=2, c=4, o=6, g=2, k=(3, 3), s=(2, 2),
                      pads="same_upper", data_format="NXC")
    fn = op_function(problem)
    xs, dys = batch_of(problem, 8, dtype=torch.float32)
    name = f"torch_convgrad.{OP_NAMES[op]}.default"
    with OpCalls() as calls:
        got = vmap(fn)(xs, dys)
    assert calls.names.count(name) == 1, calls.names
    assert not any(n.startswith("torch_convgrad.") and n != name for n in calls.names), calls.names
    torch.testing.assert_close(got, loop(fn, xs, dys), rtol=1e-5, atol=1e-5)
    # and the eager loop makes 8 (the counter can count)
    with OpCalls() as calls:
        loop(fn, xs, dys)
    assert calls.names.count(name) == 8


# ---------------------------------------------------------------------------
# per-sample gradients of a ResNet-style 3x3 convolution
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("stride", [1, 2], ids=["s1", "s2_downsample"])
def test_per_sample_weight_gradients(stride):
    """Per-sample weight gradients of ``F.conv2d(x, w, stride, padding=1)`` (3x3, no bias)
    under a squared-error loss: this op vmapped over samples (each a batch of 1) equals the
    loop over samples and functorch's ``vmap(grad(loss))``."""
    torch.manual_seed(0)
    samples, cin, cout, hw = 6, 4, 8, 8
    w = torch.randn(cout, cin, 3, 3, dtype=torch.float64)
    xs = torch.randn(samples, 1, cin, hw, hw, dtype=torch.float64)
    out_hw = (hw + 2 - 3) // stride + 1
    targets = torch.randn(samples, 1, cout, out_hw, out_hw, dtype=torch.float64)

    def loss(weight, x, target):
        return ((F.conv2d(x, weight, stride=stride, padding=1) - target) ** 2).sum()

    functorch_grads = vmap(grad(loss), in_dims=(None, 0, 0))(w, xs, targets)
    assert functorch_grads.shape == (samples, cout, cin, 3, 3)

    # output deltas: dL/d(out) = 2 * (out - target), per sample
    outs = F.conv2d(xs.flatten(0, 1), w, stride=stride, padding=1).unflatten(0, (samples, 1))
    deltas = 2 * (outs - targets)

    def per_sample(x, dy):
        return torch_convgrad.conv_backprop_filters(x, dy, [cout, cin, 3, 3], strides=stride, pads_begin=1,
                                                    pads_end=1, data_format="NCX", filter_format="OIX")

    with OpCalls() as calls:
        ours = vmap(per_sample)(xs, deltas)
    assert calls.names.count("torch_convgrad.conv_backprop_filters.default") == 1
    looped = torch.stack([per_sample(x, dy) for x, dy in zip(xs, deltas)])
    torch.testing.assert_close(ours, looped, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, functorch_grads, rtol=1e-10, atol=1e-10)
    # the per-sample gradients sum to the whole-batch gradient
    whole = torch.func.grad(lambda weight: sum(loss(weight, x, t) for x, t in zip(xs, targets)))(w)
    torch.testing.assert_close(ours.sum(0), whole, rtol=1e-10, atol=1e-10)

    # the TensorFlow layout (NXC data, XIO = HWIO filters) gives the same gradients, permuted
    def per_sample_nxc(x, dy):
        return torch_convgrad.conv_backprop_filters(x, dy, [3, 3, cin, cout], strides=stride, pads_begin=1,
                                                    pads_end=1)

    nxc = vmap(per_sample_nxc)(xs.movedim(2, -1), deltas.movedim(2, -1))
    torch.testing.assert_close(nxc.permute(0, 4, 3, 1, 2), functorch_grads, rtol=1e-10, atol=1e-10)


def test_func_grad_through_the_op():
    """torch.func.grad (and vmap over it) through the op: per-sample gradients w.r.t. the
    inputs of a function that uses the op equal the loop of torch.autograd.grad."""
    problem = SMALL["filters"]
    fn = op_function(problem)
    weight = torch.randn(problem.shape(), dtype=torch.float64)
    xs, dys = batch_of(problem, 3)

    def scalar(x, dy):
        return (fn(x, dy) * weight).sum()

    def autograd_grads(x, dy):
        x, dy = x.clone().requires_grad_(), dy.clone().requires_grad_()
        return torch.autograd.grad(scalar(x, dy), (x, dy))

    want = [torch.stack(g) for g in zip(*[autograd_grads(x, dy) for x, dy in zip(xs, dys)])]
    got = vmap(grad(scalar, argnums=(0, 1)))(xs, dys)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_autograd_through_vmap(op):
    """torch.autograd.grad of a vmapped op call (inputs requiring grad outside vmap) equals the
    gradients of the Python loop."""
    problem = SMALL[op]
    fn = op_function(problem)
    xs, dys = batch_of(problem, 3)
    weight = torch.randn(3, *problem.shape(), dtype=torch.float64)

    def grads(run):
        a, b = xs.clone().requires_grad_(), dys.clone().requires_grad_()
        return torch.autograd.grad((run(a, b) * weight).sum(), (a, b))

    for got, want in zip(grads(vmap(fn)), grads(lambda a, b: loop(fn, a, b))):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_lower_case_strings(op):
    """String attributes are case-insensitive, under vmap too."""
    problem = replace(SMALL[op], fmt=FORMATS[op][1], data_format="NXC")
    shape, kw = problem.shape(), problem.kwargs()
    fn = op_function(problem)
    lower = {k: (v.lower() if isinstance(v, str) else v) for k, v in kw.items()}
    xs, dys = batch_of(problem, 3)
    got = vmap(lambda x, dy: op_packet(op)(x, dy, shape, **lower))(xs, dys)
    torch.testing.assert_close(got, loop(fn, xs, dys), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", ["filter_format", "data_format", "spatial",
                                 "shape_channels", "groups"])
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_raises_like_eager(op, bad):
    problem = SMALL[op]
    shape, kw = problem.shape(), problem.kwargs()
    xs, dys = batch_of(problem, 3)
    if bad == "filter_format":
        kw[FORMAT_KW[op]] = "XYZ"
    elif bad == "data_format":
        kw["data_format"] = "NHWC"
    elif bad == "spatial":
        dys = torch.cat([dys, dys[..., :2]], -1)  # two more columns on the last spatial axis (NCX)
    elif bad == "shape_channels":
        # the grouped channel entry (conv: O, ConvTranspose: IC) off by one
        index = {"OIX": 0, "XIO": -1, "IOX": 0, "XOI": -1}[problem.fmt]
        if op == "transpose" and problem.fmt in ("OIX", "XIO"):
            index = 1 if problem.fmt == "OIX" else -2
        shape = list(shape)
        shape[index] += 1
    else:
        kw["groups"] = 3  # divides neither 4 nor 2 channels
    fn = lambda x, dy: op_packet(op)(x, dy, shape, **kw)
    with pytest.raises(ValueError) as eager:
        fn(xs[0], dys[0])
    with pytest.raises(ValueError) as batched:
        vmap(fn)(xs, dys)
    assert str(batched.value) == str(eager.value)


# ---------------------------------------------------------------------------
# the *_backward ops (reached by vmap over gradients: vmap(grad), jacrev)
# ---------------------------------------------------------------------------

BACKWARD_OPS = {"filters": "conv_backprop_filters_backward", "weights": "conv_backprop_filters_backward",
                "transpose": "conv_transpose_backprop_filters_backward"}


def backward_function(problem, output_mask):
    backward = getattr(torch.ops.torch_convgrad, BACKWARD_OPS[problem.op])
    shape, kw = problem.shape(), problem.kwargs()
    kw["filter_format"] = kw.pop(FORMAT_KW[problem.op])
    return lambda g, x, dy: backward(g, x, dy, shape, **kw, output_mask=output_mask)


@pytest.mark.parametrize("output_mask", [[True, True], [True, False], [False, True]], ids=str)
@pytest.mark.parametrize("problem", [p for p in MATRIX if p.op != "weights"], ids=Problem.id)
def test_vmap_backward_op_is_one_call_and_matches_loop(problem, output_mask):
    fn = backward_function(problem, output_mask)
    xs, dys = batch_of(problem, 3)
    grads = torch.randn(3, *problem.shape(), dtype=torch.float64)
    name = f"torch_convgrad.{BACKWARD_OPS[problem.op]}.default"
    out_dims = tuple(0 if needed else None for needed in output_mask)  # a gradient not asked for is None
    with OpCalls() as calls:
        got = vmap(fn, out_dims=out_dims)(grads, xs, dys)
    assert calls.names.count(name) == 1, calls.names
    for index, needed in enumerate(output_mask):
        want = [fn(g, x, dy)[index] for g, x, dy in zip(grads, xs, dys)]
        if not needed:
            assert got[index] is None and all(w is None for w in want)
            continue
        torch.testing.assert_close(got[index], torch.stack(want), rtol=1e-12, atol=1e-12)
        assert not torch.equal(got[index][0], got[index][1])


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_vmap_backward_op_shared_grad_and_batch_zero(op):
    problem = SMALL[op]
    fn = backward_function(problem, [True, True])
    xs, dys = batch_of(problem, 3)
    g = torch.randn(problem.shape(), dtype=torch.float64)
    got = vmap(fn, in_dims=(None, 0, 0))(g, xs, dys)
    for index in range(2):
        want = torch.stack([fn(g, x, dy)[index] for x, dy in zip(xs, dys)])
        torch.testing.assert_close(got[index], want, rtol=1e-12, atol=1e-12)
    empty = vmap(fn, in_dims=(None, 0, 0))(g, xs[:0], dys[:0])
    assert empty[0].shape == (0, *xs.shape[1:]) and empty[1].shape == (0, *dys.shape[1:])


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_jacrev_matches_autograd(op):
    """jacrev runs vmap over the backward op (no per-sample fallback warning)."""
    problem = SMALL[op]
    fn = op_function(problem)
    x, dy = problem.tensors(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # functorch warns when it falls back to a loop
        jacobian = torch.func.jacrev(fn, argnums=1)(x, dy)
    flat = torch.autograd.functional.jacobian(lambda d: fn(x, d), dy)
    torch.testing.assert_close(jacobian, flat, rtol=1e-12, atol=1e-12)
