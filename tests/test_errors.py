"""Bad input (SPEC.md section 7): every case raises ValueError (bad values) or TypeError (bad
dtypes) whose message names the argument and, where natural, the bad value, with the data on
each device."""

import pytest
import torch

import torch_convgrad
from conftest import data_shape, rand

OPS = ["filters", "weights", "transpose"]

# Python-API parameter names per op
NAMES = {
    "filters": dict(x="input_forward", dy="output_delta", shape="filter_shape",
                    fmt="filter_format"),
    "weights": dict(x="src", dy="diff_dst", shape="weights_shape", fmt="weights_format"),
    "transpose": dict(x="input_forward", dy="output_delta", shape="filter_shape",
                      fmt="filter_format"),
}
API = {
    "filters": torch_convgrad.conv_backprop_filters,
    "weights": torch_convgrad.conv_backprop_weights,
    "transpose": torch_convgrad.conv_transpose_backprop_filters,
}
TORCH_OPS = {
    "filters": "conv_backprop_filters",
    "weights": "conv_backprop_weights",
    "transpose": "conv_transpose_backprop_filters",
}

# A valid 2-D problem, NXC data, XIO filter, groups 1 (see problem()):
#   conv:      C=4 input channels, O=6 output_delta channels, X=(8, 8), k=(3, 3) -> Y=(6, 6)
#   transpose: IC=4 input_forward channels, OC=6 output_delta channels, O=(8, 8) -> I=(6, 6)
N, C, O, K = 2, 4, 6, 3
BIG, SMALL = [8, 8], [6, 6]


def problem(op, device, *, c=C, o=O, x_sp=None, dy_sp=None, n_x=N, n_dy=N, dtype=torch.float32,
            data_format="NXC"):
    """(x, dy, XIO shape) of a valid problem, with overrides."""
    if x_sp is None:
        x_sp = SMALL if op == "transpose" else BIG
    if dy_sp is None:
        dy_sp = BIG if op == "transpose" else SMALL
    x = rand(data_shape(n_x, c, x_sp, data_format), dtype, seed=1, device=device)
    dy = rand(data_shape(n_dy, o, dy_sp, data_format), dtype, seed=2, device=device)
    # groups 1: conv XIO (K, K, C/g, O) and ConvTranspose XIO (K, K, IC, OC/g) coincide
    return x, dy, [K, K, c, o]


def call(op, x, dy, shape, **kw):
    if "fmt" in kw:
        kw[NAMES[op]["fmt"]] = kw.pop("fmt")
    return API[op](x, dy, shape, **kw)


def raises(exc, op, x, dy, shape, *, names, values=(), **kw):
    """Assert the call raises ``exc`` and the message contains one of ``names`` (a str names
    exactly one) and every string in ``values`` (case-insensitively)."""
    with pytest.raises(exc) as info:
        call(op, x, dy, shape, **kw)
    msg = str(info.value)
    names = [names] if isinstance(names, str) else list(names)
    assert any(name in msg for name in names), f"none of {names} in message: {msg!r}"
    for value in values:
        assert str(value).lower() in msg.lower(), f"{value!r} not in message: {msg!r}"
    return msg


def either(op):
    return (NAMES[op]["x"], NAMES[op]["dy"])


# ---------------------------------------------------------------------------
# the valid baseline really is valid
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_baseline_is_valid(op, device):
    x, dy, shape = problem(op, device)
    out = call(op, x, dy, shape)
    assert list(out.shape) == shape


# ---------------------------------------------------------------------------
# data tensors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ndim", [2, 6])
def test_data_rank_out_of_range(op, ndim, device):
    x = rand([N] + [3] * (ndim - 2) + [C], seed=1, device=device)
    dy = rand([N] + [3] * (ndim - 2) + [O], seed=2, device=device)
    shape = [1] * max(ndim - 2, 0) + ([C, O] if op != "transpose" else [C, O])
    raises(ValueError, op, x, dy, shape, names=either(op))


@pytest.mark.parametrize("op", OPS)
def test_data_rank_of_input_not_3_to_5(op, device):
    x, dy, shape = problem(op, device)
    raises(ValueError, op, x[0, 0], dy, shape, names=NAMES[op]["x"])


@pytest.mark.parametrize("op", OPS)
def test_data_ranks_differ(op, device):
    x, dy, shape = problem(op, device)
    raises(ValueError, op, x, dy[:, 0], shape, names=either(op))


@pytest.mark.parametrize("op", OPS)
def test_batch_sizes_differ(op, device):
    x, dy, shape = problem(op, device, n_dy=N + 3)
    raises(ValueError, op, x, dy, shape, names=either(op), values=[N + 3])


# ---------------------------------------------------------------------------
# attribute lists
# ---------------------------------------------------------------------------

LIST_ATTRS = ["strides", "dilations", "pads_begin", "pads_end"]


@pytest.mark.parametrize("op,attr", [(op, attr) for op in OPS for attr in LIST_ATTRS]
                         + [("transpose", "output_padding")])
@pytest.mark.parametrize("count", [1, 3])
def test_wrong_number_of_values(op, attr, count, device):
    x, dy, shape = problem(op, device)
    if count == 1 and attr != "output_padding":
        values = [1]  # a 1-element list is not the int shorthand
    else:
        values = [0] * count if attr in ("pads_begin", "pads_end", "output_padding") else \
            [1] * count
    raises(ValueError, op, x, dy, shape, names=attr, **{attr: values})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [0, -2, [1, 0], [1, -7]], ids=str)
def test_strides_below_one(op, bad, device):
    x, dy, shape = problem(op, device)
    value = bad if isinstance(bad, int) else bad[1]
    raises(ValueError, op, x, dy, shape, names="strides", values=[value] if value else [],
           strides=bad)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [0, -3, [0, 1], [1, -5]], ids=str)
def test_dilations_below_one(op, bad, device):
    x, dy, shape = problem(op, device)
    value = bad if isinstance(bad, int) else min(bad)
    raises(ValueError, op, x, dy, shape, names="dilations", values=[value] if value else [],
           dilations=bad)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("attr", ["pads_begin", "pads_end"])
@pytest.mark.parametrize("bad", [-1, [0, -4]], ids=str)
def test_negative_pads(op, attr, bad, device):
    x, dy, shape = problem(op, device)
    value = bad if isinstance(bad, int) else bad[1]
    raises(ValueError, op, x, dy, shape, names=attr, values=[value], **{attr: bad})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("groups", [0, -5])
def test_groups_below_one(op, groups, device):
    x, dy, shape = problem(op, device)
    raises(ValueError, op, x, dy, shape, names="groups", values=[groups] if groups else [],
           groups=groups)


@pytest.mark.parametrize("op", OPS)
def test_groups_not_dividing_input_channels(op, device):
    # C (IC) = 4, O (OC) = 6, groups = 3 divides O but not C
    x, dy, _ = problem(op, device)
    shape = [K, K, 1, O] if op != "transpose" else [K, K, C, O // 3]
    raises(ValueError, op, x, dy, shape, names="groups", values=[3], groups=3)


@pytest.mark.parametrize("op", OPS)
def test_groups_not_dividing_output_delta_channels(op, device):
    # C (IC) = 4, O (OC) = 6, groups = 4 divides C but not O
    x, dy, _ = problem(op, device)
    shape = [K, K, 1, O] if op != "transpose" else [K, K, C, 1]
    raises(ValueError, op, x, dy, shape, names="groups", values=[4], groups=4)


# ---------------------------------------------------------------------------
# the shape argument
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [[K, K, C], [K, K, C, O, 1], [K]], ids=str)
def test_shape_wrong_length(op, shape, device):
    x, dy, _ = problem(op, device)
    raises(ValueError, op, x, dy, shape, names=NAMES[op]["shape"])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("kernel", [0, -3])
def test_shape_non_positive_entry(op, as_tensor, kernel, device):
    x, dy, shape = problem(op, device)
    shape = [K, kernel] + shape[2:]
    if as_tensor:
        shape = torch.tensor(shape, dtype=torch.int32)
    raises(ValueError, op, x, dy, shape, names=NAMES[op]["shape"],
           values=[kernel] if kernel else [])


CHANNEL_CASES = {
    # (format, good shape, bad shape, bad value) with C/IC=4, O/OC=6, groups=2
    "filters": [("XIO", [K, K, 2, O], [K, K, 5, O], 5),    # C/g entry
                ("XIO", [K, K, 2, O], [K, K, 2, 7], 7),    # O entry
                ("OIX", [O, 2, K, K], [O, 4, K, K], 4),    # C/g entry (C instead of C/g)
                ("OIX", [O, 2, K, K], [9, 2, K, K], 9)],   # O entry
    "transpose": [("XIO", [K, K, C, 3], [K, K, 5, 3], 5),  # IC entry
                  ("XIO", [K, K, C, 3], [K, K, C, 6], 6),  # OC/g entry (OC instead of OC/g)
                  ("OIX", [3, C, K, K], [3, 2, K, K], 2),  # IC entry (IC/g instead of IC)
                  ("OIX", [3, C, K, K], [7, C, K, K], 7),  # OC/g entry
                  ("IOX", [C, 3, K, K], [8, 3, K, K], 8),  # IC entry
                  ("IOX", [C, 3, K, K], [C, 5, K, K], 5),  # OC/g entry
                  ("XOI", [K, K, 3, C], [K, K, 3, 9], 9),  # IC entry
                  ("XOI", [K, K, 3, C], [K, K, 1, C], 1)],  # OC/g entry
}
CHANNEL_CASES["weights"] = CHANNEL_CASES["filters"]


@pytest.mark.parametrize("op,fmt,good,bad,value",
                         [(op, *case) for op in OPS for case in CHANNEL_CASES[op]],
                         ids=lambda v: str(v).replace(" ", ""))
def test_shape_channels_do_not_match_data(op, fmt, good, bad, value, device):
    x, dy, _ = problem(op, device)
    assert list(call(op, x, dy, good, groups=2, fmt=fmt).shape) == good
    raises(ValueError, op, x, dy, bad, names=NAMES[op]["shape"], values=[value], groups=2,
           fmt=fmt)


@pytest.mark.parametrize("op", OPS)
def test_shape_kernel_mismatch_is_spatial_error(op, device):
    # a kernel size inconsistent with the data sizes is a spatial (section 3) error
    x, dy, shape = problem(op, device)
    shape = [K + 1, K] + shape[2:]
    with pytest.raises(ValueError) as info:
        call(op, x, dy, shape)
    assert "axis" in str(info.value)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["float_tensor", "2d_tensor", "none", "float_list",
                                  "bool_tensor"])
def test_shape_bad_type(op, kind, device):
    x, dy, shape = problem(op, device)
    bad = {
        "float_tensor": torch.tensor(shape, dtype=torch.float32),
        "2d_tensor": torch.tensor([shape], dtype=torch.int32),
        "none": None,
        "float_list": [float(v) + 0.5 for v in shape],
        "bool_tensor": torch.ones(4, dtype=torch.bool),
    }[kind]
    raises((TypeError, ValueError), op, x, dy, bad, names=NAMES[op]["shape"])


@pytest.mark.parametrize("op", OPS)
def test_shape_missing(op, device):
    x, dy, _ = problem(op, device)
    with pytest.raises(TypeError):
        API[op](x, dy)


# ---------------------------------------------------------------------------
# string attributes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("attr,bad", [("auto_pad", "bogus_pad"), ("auto_pad", "same"),
                                      ("auto_pad", ""), ("data_format", "NHWC"),
                                      ("data_format", "NCHW"), ("fmt", "HWIO"),
                                      ("fmt", "XXIO")])
def test_unknown_string(op, attr, bad, device):
    x, dy, shape = problem(op, device)
    name = NAMES[op]["fmt"] if attr == "fmt" else attr
    raises(ValueError, op, x, dy, shape, names=name, values=[bad] if bad else [], **{attr: bad})


@pytest.mark.parametrize("op,fmt", [("filters", "IOX"), ("weights", "XOI"), ("filters", "OXI")])
def test_conv_rejects_transpose_only_formats(op, fmt, device):
    # IOX / XOI exist only for ConvTranspose
    x, dy, shape = problem(op, device)
    raises(ValueError, op, x, dy, shape, names=NAMES[op]["fmt"], values=[fmt], fmt=fmt)


@pytest.mark.parametrize("op", OPS)
def test_string_attribute_not_a_string(op, device):
    x, dy, shape = problem(op, device)
    raises((TypeError, ValueError), op, x, dy, shape, names="data_format", data_format=3)


# ---------------------------------------------------------------------------
# dtypes and devices
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dx,ddy", [(torch.float32, torch.float64),
                                    (torch.float16, torch.bfloat16),
                                    (torch.float64, torch.float16)], ids=str)
def test_dtype_mismatch(op, dx, ddy, device):
    x, dy, shape = problem(op, device)
    raises(TypeError, op, x.to(dx), dy.to(ddy), shape, names=either(op))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool,
                                   torch.complex64, torch.complex128], ids=str)
def test_unsupported_dtype(op, dtype, device):
    x, dy, shape = problem(op, device)
    raises(TypeError, op, x.to(dtype), dy.to(dtype), shape, names=either(op))


@pytest.mark.parametrize("op", OPS)
def test_unsupported_dtype_in_one_tensor(op, device):
    x, dy, shape = problem(op, device)
    raises(TypeError, op, x, dy.to(torch.int32), shape, names=either(op))
    raises(TypeError, op, x.to(torch.complex64), dy, shape, names=either(op))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("which", ["x", "dy"])
def test_device_mismatch(op, which, device):
    x, dy, shape = problem(op, device)
    # The other tensor on meta, and on CUDA also on the CPU.
    for other in [d for d in ("meta", "cpu") if d != device]:
        if which == "x":
            raises(ValueError, op, x.to(other), dy, shape, names=either(op))
        else:
            raises(ValueError, op, x, dy.to(other), shape, names=either(op))


# ---------------------------------------------------------------------------
# spatial sizes (SPEC section 3)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["filters", "weights"])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_conv_spatial_mismatch(op, data_format, device):
    # X=(8, 8), k=3, s=1, no pads -> Y must be (6, 6); give (6, 11)
    x, dy, shape = problem(op, device, dy_sp=[6, 11], data_format=data_format)
    msg = raises(ValueError, op, x, dy, shape, names=NAMES[op]["dy"], values=["axis", 11],
                 data_format=data_format)
    assert "6" in msg


@pytest.mark.parametrize("op", ["filters", "weights"])
@pytest.mark.parametrize("attrs,dy_sp", [
    (dict(strides=2), [4, 3]),                        # Y = (3, 3)
    (dict(dilations=[1, 2]), [6, 6]),                 # Y = (6, 4)
    (dict(pads_begin=[0, 1], pads_end=[0, 2]), [6, 8]),  # Y = (6, 9)
    (dict(auto_pad="same_upper", strides=3), [3, 2]),    # Y = (3, 3)
    (dict(auto_pad="valid", pads_begin=1, pads_end=1), [8, 8]),  # Y = (6, 6): pads ignored
], ids=str)
def test_conv_spatial_mismatch_with_attrs(op, attrs, dy_sp, device):
    x, dy, shape = problem(op, device, dy_sp=dy_sp)
    raises(ValueError, op, x, dy, shape, names=NAMES[op]["dy"], values=["axis"], **attrs)


@pytest.mark.parametrize("op", ["filters", "weights"])
def test_conv_empty_output_rejected(op, device):
    # X=(2, 8) with k=3 and no padding has no output position: Y would be <= 0
    x, dy, shape = problem(op, device, x_sp=[2, 8], dy_sp=[1, 6])
    raises(ValueError, op, x, dy, shape, values=["axis"], names=either(op))
    x, dy, shape = problem(op, device, x_sp=[2, 8], dy_sp=[0, 6])
    raises(ValueError, op, x, dy, shape, values=["axis"], names=either(op))


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_convT_spatial_mismatch(data_format, device):
    # O=(8, 8), k=3, s=1, no pads -> I must be (6, 6); give (6, 11)
    x, dy, shape = problem("transpose", device, x_sp=[6, 11], data_format=data_format)
    msg = raises(ValueError, "transpose", x, dy, shape, names="input_forward",
                 values=["axis", 11], data_format=data_format)
    assert "6" in msg


@pytest.mark.parametrize("attrs,x_sp", [
    (dict(strides=2), [3, 4]),                                   # I = (3, 3)
    (dict(auto_pad="same_lower", strides=[2, 3]), [4, 2]),       # I = (4, 3): same on O
    (dict(pads_begin=[2, 0], pads_end=[0, 0]), [6, 6]),          # I = (8, 6)
], ids=str)
def test_convT_spatial_mismatch_with_attrs(attrs, x_sp, device):
    x, dy, shape = problem("transpose", device, x_sp=x_sp)
    raises(ValueError, "transpose", x, dy, shape, names="input_forward", values=["axis"],
           **attrs)


# ---------------------------------------------------------------------------
# output_padding
# ---------------------------------------------------------------------------

def _convT_strided(device):
    # O=(8, 8), k=3, s=2, no pads -> I = floor(5/2)+1 = 3; consistent output_padding = 1
    x, dy, shape = problem("transpose", device, x_sp=[3, 3])
    assert list(call("transpose", x, dy, shape, strides=2, output_padding=1).shape) == shape
    return x, dy, shape


@pytest.mark.parametrize("bad", [2, [1, 2], 5, [1, -1], -1], ids=str)
def test_output_padding_out_of_range(bad, device):
    # s=2, d=1: 0 <= output_padding < max(s, d) = 2
    x, dy, shape = _convT_strided(device)
    value = bad if isinstance(bad, int) else [v for v in bad if v != 1][0]
    raises(ValueError, "transpose", x, dy, shape, names="output_padding", values=[value],
           strides=2, output_padding=bad)


def test_output_padding_out_of_range_with_dilation(device):
    # s=1, d=2: output_padding must be < 2
    x, dy, shape = problem("transpose", device, x_sp=[4, 4])  # O=8, eff_k=5 -> I=4
    assert list(call("transpose", x, dy, shape, dilations=2, output_padding=0).shape) == shape
    raises(ValueError, "transpose", x, dy, shape, names="output_padding", values=[2],
           dilations=2, output_padding=2)


@pytest.mark.parametrize("bad", [0, [1, 0], [0, 1]], ids=str)
def test_output_padding_inconsistent(bad, device):
    x, dy, shape = _convT_strided(device)
    raises(ValueError, "transpose", x, dy, shape, names=["output_padding", "axis"],
           strides=2, output_padding=bad)


def test_output_padding_in_range_but_inconsistent_with_dilation(device):
    # s=1, d=2 allows output_padding 1 by range, but O = s*(I-1) + eff_k - pb - pe + op
    # then needs O = 9, not 8
    x, dy, shape = problem("transpose", device, x_sp=[4, 4])
    raises(ValueError, "transpose", x, dy, shape, names=["output_padding", "axis"],
           dilations=2, output_padding=1)


# ---------------------------------------------------------------------------
# draft ConvolutionBackpropFilters-1
# ---------------------------------------------------------------------------

def _v1_data(device):
    x = rand([N, C, 8, 8], seed=1, device=device)
    dy = rand([N, O, 6, 6], seed=2, device=device)
    assert list(torch_convgrad.conv_backprop_filters_v1(x, [K, K], dy).shape) == [O, C, K, K]
    return x, dy


@pytest.mark.parametrize("filters_shape", [[O, C, K, K], [K], [K, K, K],
                                           torch.tensor([O, C, K, K])], ids=str)
def test_v1_filters_shape_wrong_length(filters_shape, device):
    x, dy = _v1_data(device)
    with pytest.raises(ValueError) as info:
        torch_convgrad.conv_backprop_filters_v1(x, filters_shape, dy)
    assert "filters_shape" in str(info.value)


def test_v1_filters_shape_non_positive(device):
    x, dy = _v1_data(device)
    with pytest.raises(ValueError) as info:
        torch_convgrad.conv_backprop_filters_v1(x, [K, -2], dy)
    assert "filters_shape" in str(info.value) and "-2" in str(info.value)


def test_v1_other_checks(device):
    x, dy = _v1_data(device)
    with pytest.raises(ValueError, match="strides"):
        torch_convgrad.conv_backprop_filters_v1(x, [K, K], dy, strides=[1, 1, 1])
    with pytest.raises(ValueError, match="groups"):
        torch_convgrad.conv_backprop_filters_v1(x, [K, K], dy, groups=4)
    with pytest.raises(ValueError, match="auto_pad"):
        torch_convgrad.conv_backprop_filters_v1(x, [K, K], dy, auto_pad="upper")
    with pytest.raises(ValueError, match="axis"):
        torch_convgrad.conv_backprop_filters_v1(x, [K, K + 1], dy)
    with pytest.raises(TypeError):
        torch_convgrad.conv_backprop_filters_v1(x, [K, K], dy.double())



def test_v1_data_errors_name_input_not_input_forward(device):
    x, dy = _v1_data(device)
    with pytest.raises(TypeError) as info:
        torch_convgrad.conv_backprop_filters_v1(x.int(), [K, K], dy)
    assert str(info.value).startswith("input:") and "input_forward" not in str(info.value)
    with pytest.raises(ValueError) as info:
        torch_convgrad.conv_backprop_filters_v1(x[0, 0], [K, K], dy)
    assert str(info.value).startswith("input:")


def test_v1_rank_mismatch_is_reported_as_such(device):
    x, dy = _v1_data(device)
    with pytest.raises(ValueError) as info:
        torch_convgrad.conv_backprop_filters_v1(x[..., 0], [K, K], dy)
    assert "output_delta" in str(info.value) and "-D" in str(info.value)

# ---------------------------------------------------------------------------
# the same checks through torch.ops.torch_convgrad.*
# ---------------------------------------------------------------------------

def _op(op):
    return getattr(torch.ops.torch_convgrad, TORCH_OPS[op])


def _op_raises(exc, op, *args, names, values=(), **kw):
    with pytest.raises(exc) as info:
        _op(op)(*args, **kw)
    msg = str(info.value)
    names = [names] if isinstance(names, str) else list(names)
    assert any(name in msg for name in names), f"none of {names} in message: {msg!r}"
    for value in values:
        assert str(value).lower() in msg.lower(), f"{value!r} not in message: {msg!r}"


@pytest.mark.parametrize("op", OPS)
def test_op_level_checks(op, device):
    x, dy, shape = problem(op, device)
    fmt_name = "weights_format" if op == "weights" else "filter_format"
    shape_name = NAMES[op]["shape"]
    assert list(_op(op)(x, dy, shape, [1, 1], [0, 0], [0, 0], [1, 1]).shape) == shape
    # attribute lists must have exactly r values at op level
    _op_raises(ValueError, op, x, dy, shape, [1], names="strides")
    _op_raises(ValueError, op, x, dy, shape, [1, 1, 1], names="strides")
    _op_raises(ValueError, op, x, dy, shape, None, [0], names="pads_begin")
    _op_raises(ValueError, op, x, dy, shape, None, None, [0, 0, 0], names="pads_end")
    _op_raises(ValueError, op, x, dy, shape, None, None, None, [2], names="dilations")
    _op_raises(ValueError, op, x, dy, shape, [1, -7], names="strides", values=[-7])
    _op_raises(ValueError, op, x, dy, shape, None, [0, -4], names="pads_begin", values=[-4])
    _op_raises(ValueError, op, x, dy, shape, auto_pad="bogus_pad", names="auto_pad",
               values=["bogus_pad"])
    _op_raises(ValueError, op, x, dy, shape, groups=0, names="groups")
    _op_raises(ValueError, op, x, dy, shape, data_format="NHWC", names="data_format",
               values=["NHWC"])
    _op_raises(ValueError, op, x, dy, shape, **{fmt_name: "HWIO"}, names=fmt_name,
               values=["HWIO"])
    _op_raises(ValueError, op, x, dy, shape[:3], names=shape_name)
    _op_raises(ValueError, op, x, dy, [K, 0] + shape[2:], names=shape_name)
    _op_raises(ValueError, op, x, dy, shape[:2] + [5, O], names=shape_name, values=[5])
    _op_raises(TypeError, op, x, dy.double(), shape, names=either(op))
    _op_raises(TypeError, op, x.int(), dy.int(), shape, names=either(op))
    _op_raises(ValueError, op, x, dy[:1], shape, names=either(op))
    _op_raises(ValueError, op, x, dy.to("meta"), shape, names=either(op))
    bad_x, bad_dy, _ = problem(op, device, x_sp=[6, 11] if op == "transpose" else None,
                               dy_sp=None if op == "transpose" else [6, 11])
    _op_raises(ValueError, op, bad_x, bad_dy, shape, names=NAMES[op]["x" if op == "transpose"
                                                                     else "dy"],
               values=["axis", 11])


def test_op_level_output_padding(device):
    x, dy, shape = _convT_strided(device)
    f = torch.ops.torch_convgrad.conv_transpose_backprop_filters
    assert list(f(x, dy, shape, [2, 2], output_padding=[1, 1]).shape) == shape
    _op_raises(ValueError, "transpose", x, dy, shape, [2, 2], output_padding=[1],
               names="output_padding")
    _op_raises(ValueError, "transpose", x, dy, shape, [2, 2], output_padding=[1, 2],
               names="output_padding", values=[2])
    _op_raises(ValueError, "transpose", x, dy, shape, [2, 2], output_padding=[0, 1],
               names=["output_padding", "axis"])
