"""Property test over random attribute sets, valid and invalid (hypothesis).

A valid set returns the float64 reference's values, whatever algorithm is forced;
an invalid one (one attribute broken on purpose) raises ValueError or TypeError,
never another exception or a crash; and the fake (Meta) kernel agrees with the
real one: the same shape and strides, or the same exception type.

Medium-sized valid problems (past the kernels' vectors and tiles) get a fifth of the examples:
oneDNN's CPU bugs that the aten algorithms now steer around (aten.cpp) showed at such sizes.
The suite's profile runs 300 examples (60 medium); ``make fuzz`` runs 20,000 (4,000 medium)
(``--hypothesis-profile=fuzz``; both are registered in conftest.py).
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_convgrad
from conftest import REF, assert_matches_ref, data_shape, with_layout

FORMATS = {"filters": ["XIO", "OIX"], "transpose": ["XIO", "OIX", "IOX", "XOI"]}
# How each mutation breaks a valid problem, and the exception it must raise.
MUTATIONS = {
    "stride_zero": ValueError, "dilation_zero": ValueError, "negative_pad": ValueError,
    "groups_not_dividing": ValueError, "groups_zero": ValueError, "wrong_channel_entry": ValueError,
    "wrong_kernel_count": ValueError, "output_size_off": ValueError, "bad_auto_pad": ValueError,
    "bad_data_format": ValueError, "bad_filter_format": ValueError, "dtype_mismatch": TypeError,
    "integer_dtype": TypeError, "rank_mismatch": ValueError, "batch_mismatch": ValueError,
    "wrong_attribute_count": ValueError,
}


@st.composite
def problems(draw, medium=False):
    """A consistent problem: (op, x NCX shape, dy NCX shape, filter shape, attributes, dtype).

    ``medium``: sizes past the kernels' vector widths and tiles (up to 48 channels a group, maps of
    40x40, kernels of 7, pads of 4), where the small ones stay inside a vector."""
    op = draw(st.sampled_from(["filters", "transpose"]))
    rank = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    per_group = st.integers(1, 48) if medium else st.integers(1, 3)
    if medium and draw(st.booleans()):  # depthwise
        groups = draw(st.integers(2, 40))
        c, o = groups, groups * draw(st.integers(1, 2))
    else:
        c = groups * draw(per_group)
        o = groups * draw(per_group)
    n = draw(st.integers(0, 3))
    ks = draw(st.lists(st.sampled_from([1, 2, 3, 5, 7]) if medium else st.integers(1, 3), min_size=rank,
                       max_size=rank))
    s = draw(st.lists(st.integers(1, 4 if medium else 3), min_size=rank, max_size=rank))
    d = draw(st.lists(st.integers(1, 3 if medium else 2), min_size=rank, max_size=rank))
    auto_pad = draw(st.sampled_from(["explicit", "same_upper", "same_lower", "valid"]))
    eff = [(k - 1) * dil + 1 for k, dil in zip(ks, d)]
    limit = ({1: 200, 2: 40, 3: 12} if medium else {1: 12, 2: 7, 3: 5})[rank]
    big = [draw(st.integers(1, limit)) for _ in range(rank)]
    if auto_pad == "explicit":
        pad = st.integers(0, 4 if medium else 2)
        pb = draw(st.lists(pad, min_size=rank, max_size=rank))
        pe = draw(st.lists(pad, min_size=rank, max_size=rank))
        big = [max(b, e - p - q) for b, e, p, q in zip(big, eff, pb, pe)]
    elif auto_pad == "valid":
        pb = pe = [0] * rank
        big = [max(b, e) for b, e in zip(big, eff)]
    else:
        pads = [REF.same_pads(b, k, st_, dil, auto_pad == "same_lower") for b, k, st_, dil in zip(big, ks, s, d)]
        pb, pe = [p[0] for p in pads], [p[1] for p in pads]
    small = [(b + p + q - e) // st_ + 1 for b, p, q, e, st_ in zip(big, pb, pe, eff, s)]
    attrs = dict(strides=s, dilations=d, auto_pad=auto_pad, groups=groups,
                 data_format=draw(st.sampled_from(["NXC", "NCX"])))
    if auto_pad == "explicit":
        attrs.update(pads_begin=pb, pads_end=pe)
    fmt = draw(st.sampled_from(FORMATS[op]))
    if op == "filters":
        x_shape, dy_shape = [n, c, *big], [n, o, *small]
        channels = {"O": o, "I": c // groups}
        attrs["filter_format"] = fmt
    else:  # ConvTranspose: input_forward is the small side, output_delta the big one (IC = c, OC = o)
        x_shape, dy_shape = [n, c, *small], [n, o, *big]
        channels = {"I": c, "O": o // groups}
        attrs["filter_format"] = fmt
    shape = [size for letter in fmt for size in (ks if letter == "X" else [channels[letter]])]
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16] + ([torch.float16] if medium else [])))
    return op, x_shape, dy_shape, shape, attrs, dtype


def _mutate(mutation, op, x_shape, dy_shape, shape, attrs, dtype):
    """The problem with one thing broken; returns (x_shape, dy_shape, shape, attrs, dtypes)."""
    attrs, shape, x_shape, dy_shape = dict(attrs), list(shape), list(x_shape), list(dy_shape)
    rank = len(x_shape) - 2
    dtypes = (dtype, dtype)
    if mutation == "stride_zero":
        attrs["strides"] = [0] * rank
    elif mutation == "dilation_zero":
        attrs["dilations"] = [0] * rank
    elif mutation == "negative_pad":
        attrs.update(auto_pad="explicit", pads_begin=[-1] * rank, pads_end=[0] * rank)
    elif mutation == "groups_not_dividing":
        attrs["groups"] = x_shape[1] + 1
    elif mutation == "groups_zero":
        attrs["groups"] = 0
    elif mutation == "wrong_channel_entry":
        position = attrs["filter_format"].index("I") + (rank - 1 if attrs["filter_format"][0] == "X" else 0)
        shape[position] += 1
    elif mutation == "wrong_kernel_count":
        shape.append(1)
    elif mutation == "output_size_off":
        small = dy_shape if op == "filters" else x_shape
        small[2] += 1
    elif mutation == "bad_auto_pad":
        attrs["auto_pad"] = "same"
    elif mutation == "bad_data_format":
        attrs["data_format"] = "NHWC"
    elif mutation == "bad_filter_format":
        attrs["filter_format"] = "HWIO"
    elif mutation == "dtype_mismatch":
        dtypes = (dtype, torch.float16)
    elif mutation == "integer_dtype":
        dtypes = (torch.int32, torch.int32)
    elif mutation == "rank_mismatch":
        dy_shape.append(1)
    elif mutation == "batch_mismatch":
        dy_shape[0] += 1
    elif mutation == "wrong_attribute_count":
        attrs["strides"] = [1] * (rank + 1)
    return x_shape, dy_shape, shape, attrs, dtypes


def _data(ncx_shape, data_format, dtype, device, seed):
    shape = data_shape(ncx_shape[0], ncx_shape[1], ncx_shape[2:], data_format)
    if dtype == torch.int32:
        return torch.ones(shape, dtype=dtype, device=device)
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _call(op, x, dy, shape, attrs):
    function = torch_convgrad.conv_backprop_filters if op == "filters" else torch_convgrad.conv_transpose_backprop_filters
    return function(x, dy, shape, **attrs)


def _outcome(op, x_shape, dy_shape, shape, attrs, dtypes, device):
    """The result, or the exception type raised (anything but ValueError/TypeError propagates)."""
    data_format = attrs["data_format"] if attrs["data_format"] in ("NXC", "NCX") else "NCX"
    x = _data(x_shape, data_format, dtypes[0], device, 1)
    dy = _data(dy_shape, data_format, dtypes[1], device, 2)
    try:
        return _call(op, x, dy, shape, attrs), (x, dy)
    except (ValueError, TypeError) as error:
        return type(error), (x, dy)


@given(problem=problems(), algorithm=st.sampled_from([None, *torch_convgrad.algorithm_names()]),
       mutation=st.one_of(st.none(), st.sampled_from(sorted(MUTATIONS))))
def test_random_attribute_sets(problem, algorithm, mutation):
    op, x_shape, dy_shape, shape, attrs, dtype = problem
    dtypes = (dtype, dtype)
    if mutation is not None:
        x_shape, dy_shape, shape, attrs, dtypes = _mutate(mutation, *problem)
    with torch_convgrad.use_algorithm(algorithm):
        real, (x, dy) = _outcome(op, x_shape, dy_shape, shape, attrs, dtypes, "cpu")
    fake, _ = _outcome(op, x_shape, dy_shape, shape, attrs, dtypes, "meta")
    if mutation is not None:
        assert real is MUTATIONS[mutation], (mutation, real)
        assert fake is real
        return
    assert isinstance(real, torch.Tensor), real
    assert isinstance(fake, torch.Tensor), fake
    assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype
    reference_function = REF.conv_backprop_filters if op == "filters" else REF.conv_transpose_backprop_filters
    reference = reference_function(x, dy, shape, **attrs)
    assert_matches_ref(real, reference, dtype)


# A fifth of the profile's examples: each takes longer.
@settings(max_examples=max(1, settings.default.max_examples // 5))
@given(problem=problems(medium=True), algorithm=st.sampled_from([None, *torch_convgrad.algorithm_names()]),
       strided_views=st.booleans())
def test_random_medium_problems(problem, algorithm, strided_views):
    """Valid problems of medium size, in every dtype, through every algorithm, against the
    float64 reference; with ``strided_views``, the data are views of every other element of
    buffers poisoned with NaN."""
    op, x_shape, dy_shape, shape, attrs, dtype = problem
    x = _data(x_shape, attrs["data_format"], dtype, "cpu", 1)
    dy = _data(dy_shape, attrs["data_format"], dtype, "cpu", 2)
    if strided_views:
        x, dy = with_layout(x, "sliced"), with_layout(dy, "sliced")
    with torch_convgrad.use_algorithm(algorithm):
        real = _call(op, x, dy, shape, attrs)
    reference_function = REF.conv_backprop_filters if op == "filters" else REF.conv_transpose_backprop_filters
    assert_matches_ref(real, reference_function(x, dy, shape, **attrs), dtype)
