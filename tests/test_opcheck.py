"""``torch.library.opcheck`` on every op over a sample set, plus direct checks that the fake
(Meta) kernels agree with the CPU kernels on shape, strides and errors.

opcheck runs test_schema, test_autograd_registration, test_faketensor and
test_aot_dispatch_dynamic (all of its default test_utils).
"""
from dataclasses import dataclass, replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_convgrad  # noqa: F401  (registers the ops)
from problems import OPS, OP_NAMES, FORMATS, op_packet, Problem



DTYPE_IDS = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16"}
ALL_TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def relayout(t, layout):
    """Same values, other strides: channels_last-like (dim 1 fastest) or all strides reversed."""
    if layout == "contiguous":
        return t
    if layout == "channels_last":
        return t.movedim(1, -1).contiguous().movedim(-1, 1)
    if layout == "transposed":
        rev = tuple(range(t.dim() - 1, -1, -1))
        return t.permute(rev).contiguous().permute(rev)
    raise ValueError(layout)


@dataclass(frozen=True)
class Sample:
    problem: Problem
    dtype: torch.dtype = torch.float32
    requires_grad: bool = False
    layout: str = "contiguous"
    pads_with_auto: bool = False  # pass explicit pads next to an auto_pad mode (they are ignored)
    auto_pad_spelling: str = None  # e.g. "explicit" for explicit pads, or upper case

    def build(self):
        x, dy = self.problem.tensors(dtype=self.dtype, seed=11)
        x, dy = relayout(x, self.layout), relayout(dy, self.layout)
        x.requires_grad_(self.requires_grad)
        dy.requires_grad_(self.requires_grad)
        kw = self.problem.kwargs(explicit_pads_with_auto=self.pads_with_auto)
        if self.auto_pad_spelling is not None:
            kw["auto_pad"] = self.auto_pad_spelling
        return (x, dy, self.problem.shape()), kw

    def id(self):
        extra = [DTYPE_IDS[self.dtype], "grad" if self.requires_grad else "nograd"]
        if self.problem.n == 0:
            extra.append("batch0")
        if self.layout != "contiguous":
            extra.append(self.layout)
        if self.pads_with_auto:
            extra.append("ignored_pads")
        if self.auto_pad_spelling:
            extra.append(f"auto_pad={self.auto_pad_spelling}")
        if self.problem.output_padding:
            extra.append("output_padding")
        return self.problem.id() + "-" + "-".join(extra)


def samples_for(op):
    fmts = FORMATS[op]
    base = Problem(op=op, fmt=fmts[0], size=(6, 7), n=2, c=4, o=6, g=2, k=(3, 2), s=(2, 1), d=(1, 2),
                   pads=((1, 0), (0, 1)), data_format="NXC")
    out = [
        Sample(base),
        Sample(base, requires_grad=True),
        Sample(replace(base, n=0)),
        Sample(replace(base, n=0), requires_grad=True),
        Sample(replace(base, data_format="NCX")),
        Sample(replace(base, data_format="NCX"), requires_grad=True),
        Sample(base, layout="channels_last", requires_grad=True),
        Sample(replace(base, data_format="NCX"), layout="transposed"),
        Sample(base, auto_pad_spelling="explicit"),
        Sample(replace(base, pads="same_upper")),
        Sample(replace(base, pads="same_upper", data_format="NCX"), requires_grad=True, pads_with_auto=True),
        Sample(replace(base, pads="same_lower", size=(7, 6)), requires_grad=True),
        Sample(replace(base, pads="same_lower"), auto_pad_spelling="SAME_LOWER"),
        Sample(replace(base, pads="valid", g=1)),
        Sample(replace(base, c=4, o=4, g=4), requires_grad=True),  # depthwise
        # 1-D and 3-D
        Sample(Problem(op=op, fmt=fmts[-1], size=(9,), n=3, c=2, o=4, g=2, k=(3,), s=(2,), d=(2,),
                       pads=((2,), (1,)), data_format="NCX"), requires_grad=True),
        Sample(Problem(op=op, fmt=fmts[-1], size=(4, 5, 3), n=1, c=3, o=2, k=(2, 3, 1), s=(1, 2, 1),
                       d=(2, 1, 1), pads="same_upper", data_format="NXC"), requires_grad=True),
    ]
    # every filter format
    out += [Sample(replace(base, fmt=fmt), requires_grad=True) for fmt in fmts[1:]]
    if op == "transpose":
        out.append(Sample(replace(base, output_padding=True), requires_grad=True))
        out.append(Sample(replace(base, output_padding=True, size=(7, 8), pads="same_lower")))
    # every dtype, with and without requires_grad.  f16/bf16 with requires_grad pass the
    # aot_dispatch_dynamic gradient comparison at opcheck's default tolerances on these sizes
    # (if that ever bites, requires_grad=False is the documented fallback for those dtypes).
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        out.append(Sample(base, dtype=dtype))
        out.append(Sample(replace(base, data_format="NCX", pads="same_upper"), dtype=dtype, requires_grad=True))
    return out


SAMPLES = [sample for op in OP_NAMES for sample in samples_for(op)]


@pytest.mark.parametrize("sample", SAMPLES, ids=Sample.id)
def test_opcheck(sample):
    args, kwargs = sample.build()
    op = op_packet(sample.problem.op).default
    # The sample itself is valid: the eager op runs and has the shape argument's shape.
    out = op(*args, **kwargs)
    assert list(out.shape) == sample.problem.shape() and out.dtype == sample.dtype
    result = torch.library.opcheck(op, args, kwargs)
    assert set(ALL_TEST_UTILS) <= set(result), result
    assert all(result[name] == "SUCCESS" for name in ALL_TEST_UTILS), result


def test_sample_set_covers_the_brief():
    for op in OP_NAMES:
        mine = [s for s in SAMPLES if s.problem.op == op]
        assert {s.dtype for s in mine} == set(DTYPE_IDS)
        assert {s.requires_grad for s in mine} == {True, False}
        assert any(s.problem.n == 0 for s in mine)
        assert {s.problem.data_format for s in mine} == {"NXC", "NCX"}
        assert {s.problem.fmt for s in mine} == set(FORMATS[op])
        assert {s.problem.pads for s in mine if isinstance(s.problem.pads, str)} == {"same_upper", "same_lower",
                                                                                   "valid"}
        assert any(not isinstance(s.problem.pads, str) and s.problem.pads[0] != s.problem.pads[1] for s in mine)
        assert {s.problem.g for s in mine} >= {1, 2, 4}
        assert {s.problem.r for s in mine} == {1, 2, 3}


# ---------------------------------------------------------------------------
# fake / meta kernel against the real one
# ---------------------------------------------------------------------------

META_SAMPLES = [s for s in SAMPLES if s.dtype in (torch.float32, torch.bfloat16)]


def _meta_copy(t):
    return t.detach().to("meta").requires_grad_(t.requires_grad)


@pytest.mark.parametrize("sample", META_SAMPLES, ids=Sample.id)
def test_fake_and_meta_match_real_layout(sample):
    (x, dy, shape), kwargs = sample.build()
    op = op_packet(sample.problem.op)
    real = op(x, dy, shape, **kwargs)

    with FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), mode.from_tensor(dy), shape, **kwargs)
    meta = op(_meta_copy(x), _meta_copy(dy), shape, **kwargs)

    for other, device in ((fake, "cpu"), (meta, "meta")):
        assert other.shape == real.shape
        assert other.stride() == real.stride()
        assert other.dtype == real.dtype
        assert other.device.type == device
        assert other.requires_grad == real.requires_grad
    assert real.is_contiguous()


# Bad inputs: (description, problem, how to break the valid arguments)
def _bad_spatial(args, kwargs):
    x, dy, shape = args
    # two more elements on the first spatial axis (stride 2) of output_delta: inconsistent
    # for the convolutions and for ConvTranspose alike
    axis = 2 if kwargs["data_format"] == "NCX" else 1
    pad = torch.zeros_like(dy.narrow(axis, 0, 2))
    return (x, torch.cat([dy, pad], axis), shape), kwargs


def _bad_input_spatial(args, kwargs):
    x, dy, shape = args
    axis = 2 if kwargs["data_format"] == "NCX" else 1
    return (x.narrow(axis, 0, 1), dy, shape), kwargs


def _bad_channels(args, kwargs):
    x, dy, shape = args
    fmt = kwargs.get("filter_format", kwargs.get("weights_format"))
    shape = list(shape)
    index = 0 if fmt in ("OIX", "IOX") else -1
    shape[index] += 1
    return (x, dy, shape), kwargs


def _bad_groups(args, kwargs):
    return args, dict(kwargs, groups=3)


def _bad_auto_pad(args, kwargs):
    return args, dict(kwargs, auto_pad="same_middle")


def _bad_output_padding(args, kwargs):
    return args, dict(kwargs, output_padding=[5] * len(kwargs["strides"]))


def _bad_pads(args, kwargs):
    return args, dict(kwargs, pads_begin=[-1] * len(kwargs["strides"]), auto_pad="none")


BREAKERS = {
    "spatial_output_delta": _bad_spatial,
    "spatial_input": _bad_input_spatial,
    "shape_channels": _bad_channels,
    "groups": _bad_groups,
    "auto_pad": _bad_auto_pad,
    "negative_pads": _bad_pads,
    "output_padding": _bad_output_padding,
}

ERROR_CASES = [
    (op, name, data_format)
    for op in OP_NAMES
    for name in BREAKERS
    if name != "output_padding" or op == "transpose"
    for data_format in ("NXC", "NCX")
]


@pytest.mark.parametrize("op,breaker,data_format", ERROR_CASES, ids=lambda v: str(v))
def test_fake_raises_like_real(op, breaker, data_format):
    problem = Problem(op=op, fmt=FORMATS[op][0], size=(6, 7), n=2, c=4, o=6, g=2, k=(3, 2), s=(2, 1),
                      pads=((1, 0), (0, 1)), data_format=data_format)
    (x, dy, shape), kwargs = BREAKERS[breaker](*Sample(problem).build())
    packet = op_packet(op)

    with pytest.raises(ValueError) as real:
        packet(x, dy, shape, **kwargs)
    message = str(real.value)
    assert message  # names the argument; test_errors.py checks the wording

    with pytest.raises(ValueError) as meta:
        packet(x.to("meta"), dy.to("meta"), shape, **kwargs)
    assert str(meta.value) == message

    with FakeTensorMode() as mode:
        fx, fdy = mode.from_tensor(x), mode.from_tensor(dy)
        with pytest.raises(ValueError) as fake:
            packet(fx, fdy, shape, **kwargs)
    assert str(fake.value) == message


def test_meta_spatial_mismatch_message_names_sizes():
    """The brief's example: mismatched spatial sizes on meta tensors, op level."""
    x = torch.empty(2, 8, 8, 4, device="meta")
    dy = torch.empty(2, 5, 4, 6, device="meta")
    args = (x, dy, [3, 3, 4, 6], [2, 2], None, None, [1, 1], "same_upper", 1, "NXC", "XIO")
    with pytest.raises(ValueError, match="output_delta") as meta:
        OPS.conv_backprop_filters(*args)
    with pytest.raises(ValueError) as real:
        OPS.conv_backprop_filters(torch.zeros(x.shape), torch.zeros(dy.shape), *args[2:])
    assert str(meta.value) == str(real.value)
    assert "5" in str(meta.value) and "4" in str(meta.value)


# ---------------------------------------------------------------------------
# the backward ops (CompositeImplicitAutograd formulas) under opcheck
# ---------------------------------------------------------------------------

BACKWARD_OPS = {"filters": "conv_backprop_filters_backward", "weights": "conv_backprop_filters_backward",
                "transpose": "conv_transpose_backprop_filters_backward"}


def _backward_args(sample, mask):
    (x, dy, shape), kwargs = sample.build()
    if sample.problem.op == "weights":  # same backward op, conv_backprop_filters' argument names
        kwargs["filter_format"] = kwargs.pop("weights_format")
    grad = torch.randn(shape, dtype=sample.dtype, generator=torch.Generator().manual_seed(12))
    grad.requires_grad_(sample.requires_grad)
    return (grad, x, dy, shape), dict(kwargs, output_mask=mask)


BACKWARD_SAMPLES = [
    (s, mask)
    for op in OP_NAMES
    for i, s in enumerate([s for s in SAMPLES if s.problem.op == op and s.dtype in (torch.float32, torch.float64)
                           and s.problem.n > 0][:4])
    for mask in ([True, True], [[True, False], [False, True]][i % 2])
]


@pytest.mark.parametrize("sample,mask", BACKWARD_SAMPLES, ids=lambda v: v.id() if isinstance(v, Sample) else str(v))
def test_opcheck_backward_ops(sample, mask):
    args, kwargs = _backward_args(sample, mask)
    op = getattr(OPS, BACKWARD_OPS[sample.problem.op]).default
    grad_input, grad_delta = op(*args, **kwargs)
    for out, data, wanted in ((grad_input, args[1], mask[0]), (grad_delta, args[2], mask[1])):
        if wanted:
            assert out.shape == data.shape and out.dtype == data.dtype
        else:
            assert out is None  # an undefined tensor: not computed
    result = torch.library.opcheck(op, args, kwargs)
    assert all(result[name] == "SUCCESS" for name in ALL_TEST_UTILS), result
