"""torch_convgrad against the float64 reference (SPEC.md sections 1-6)."""

import functools
import random
from dataclasses import dataclass

import pytest
import torch

import torch_convgrad
from conftest import (DTYPES, LAYOUTS, REF, assert_matches_ref, check_result, data_shape, rand,
                      requires_cuda, short, with_layout)

OPS = torch.ops.torch_convgrad

FORMATS = {
    "filters": ["XIO", "OIX"],
    "weights": ["XIO", "OIX"],
    "transpose": ["XIO", "OIX", "IOX", "XOI"],
}
API = {
    "filters": torch_convgrad.conv_backprop_filters,
    "weights": torch_convgrad.conv_backprop_weights,
    "transpose": torch_convgrad.conv_transpose_backprop_filters,
}
REF_FN = {
    "filters": REF.conv_backprop_filters,
    "weights": REF.conv_backprop_weights,
    "transpose": REF.conv_transpose_backprop_filters,
}
FMT_KW = {"filters": "filter_format", "weights": "weights_format", "transpose": "filter_format"}
PADDINGS = ["sym", "asym", "same_upper", "same_lower", "valid"]
GROUPINGS = ["1", "2", "dw"]


def filter_shape(op, fmt, c, o, g, ks):
    """Full filter shape.  Conv: c = input channels, o = output_delta channels.
    ConvTranspose: c = IC (input_forward channels), o = OC (output_delta channels)."""
    ks = list(ks)
    if op != "transpose":
        return {"OIX": [o, c // g] + ks, "XIO": ks + [c // g, o]}[fmt]
    return {"OIX": [o // g, c] + ks, "XIO": ks + [c, o // g],
            "IOX": [c, o // g] + ks, "XOI": ks + [o // g, c]}[fmt]


def small_sizes(big, ks, s, d, pb, pe):
    """SPEC section 3: floor((big + pb + pe - eff_k) / s) + 1 per axis, where big is the conv
    input size (-> output_delta size) or the ConvTranspose output_delta size (-> input size)."""
    return [(big[a] + pb[a] + pe[a] - (ks[a] - 1) * d[a] - 1) // s[a] + 1 for a in range(len(big))]


def consistent_output_padding(big, small, ks, s, d, pb, pe):
    """The ConvTranspose output_padding with O == s*(I-1) + eff_k - pb - pe + op per axis."""
    return [big[a] - (s[a] * (small[a] - 1) + (ks[a] - 1) * d[a] + 1 - pb[a] - pe[a])
            for a in range(len(big))]


def call(op, x, dy, shape, fmt, **kw):
    kw[FMT_KW[op]] = fmt
    return API[op](x, dy, shape, **kw)


def call_ref(op, x, dy, shape, fmt, **kw):
    """The float64 reference, computed on the CPU whatever the data's device."""
    kw[FMT_KW[op]] = fmt
    return REF_FN[op](x.cpu(), dy.cpu(), shape, **kw)


# ---------------------------------------------------------------------------
# SPEC section 4 hand vectors through the real API (f32, exact)
# ---------------------------------------------------------------------------

def f32(values, device):
    return torch.tensor(values, dtype=torch.float32, device=device)


def _nxc(t):
    return t.movedim(1, -1).contiguous()


@pytest.mark.parametrize("op", ["filters", "weights"])
def test_hand_conv_1d(op, device):
    x, dy = f32([[[1, 2, 3, 4, 5]]], device), f32([[[1, 1]]], device)
    out = call(op, x, dy, [1, 1, 2], "OIX", strides=2, data_format="NCX")
    assert out.dtype == torch.float32 and torch.equal(out, f32([[[4, 6]]], device))
    out = call(op, _nxc(x), _nxc(dy), [2, 1, 1], "XIO", strides=[2])
    assert torch.equal(out, f32([[[4]], [[6]]], device))


@pytest.mark.parametrize("op", ["filters", "weights"])
def test_hand_conv_1d_groups(op, device):
    x = f32([[[1, 2, 3, 4], [5, 6, 7, 8]]], device)
    dy = f32([[[1, 0, 0, 1], [0, 1, 1, 0]]], device)
    want = f32([[[3, 5]], [[11, 13]]], device)
    out = call(op, x, dy, [2, 1, 2], "OIX", strides=1, pads_begin=1, pads_end=0, groups=2,
               data_format="NCX")
    assert torch.equal(out, want)
    out = call(op, _nxc(x), _nxc(dy), [2, 1, 2], "XIO", pads_begin=[1], pads_end=[0], groups=2)
    assert torch.equal(out, want.permute(2, 1, 0))


def test_hand_convT_1d(device):
    x, dy = f32([[[1, 2]]], device), f32([[[1, 0, 0, 0, 1]]], device)
    out = torch_convgrad.conv_transpose_backprop_filters(x, dy, [1, 1, 3], strides=2,
                                                         data_format="NCX", filter_format="IOX")
    assert out.dtype == torch.float32 and torch.equal(out, f32([[[1, 0, 2]]], device))
    out = torch_convgrad.conv_transpose_backprop_filters(_nxc(x), _nxc(dy), [3, 1, 1], strides=2)
    assert torch.equal(out, f32([[[1]], [[0]], [[2]]], device))


@pytest.mark.parametrize("fmt,perm", [("IOX", (0, 1, 2)), ("OIX", (1, 0, 2)),
                                      ("XIO", (2, 0, 1)), ("XOI", (2, 1, 0))])
def test_hand_convT_1d_groups(fmt, perm, device):
    x = f32([[[1, 2], [3, 4]]], device)
    dy = f32([[[1, 2, 3, 4], [5, 6, 7, 8]]], device)
    want = f32([[[7, 10]], [[43, 50]]], device).permute(*perm)
    for data_format, xx, dd in (("NCX", x, dy), ("NXC", _nxc(x), _nxc(dy))):
        out = torch_convgrad.conv_transpose_backprop_filters(
            xx, dd, list(want.shape), strides=2, pads_begin=0, pads_end=1, output_padding=1,
            groups=2, data_format=data_format, filter_format=fmt)
        assert torch.equal(out, want), (data_format, out)


def test_hand_v1(device):
    x = f32([[[1, 2, 3, 4], [5, 6, 7, 8]]], device)
    dy = f32([[[1, 0, 0, 1], [0, 1, 1, 0]]], device)
    out = torch_convgrad.conv_backprop_filters_v1(x, [2], dy, pads_begin=1, pads_end=0, groups=2)
    assert torch.equal(out, f32([[[3, 5]], [[11, 13]]], device))


# ---------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    index: int
    op: str
    rank: int
    padding: str
    grouping: str
    data_format: str
    fmt: str
    dtype: torch.dtype
    layout: str
    stride_mode: str
    dilation_mode: str
    give_output_padding: bool

    @property
    def id(self):
        return (f"{self.op}-r{self.rank}-{self.padding}-g{self.grouping}-{self.data_format}-"
                f"{self.fmt}-{short(self.dtype)}-{self.layout}-s{self.stride_mode}"
                f"-d{self.dilation_mode}{'-op' if self.give_output_padding else ''}")


def _build_cases():
    combos = [(op, rank, padding, grouping, data_format, fmt)
              for op in FORMATS
              for rank in (1, 2, 3)
              for padding in PADDINGS
              for grouping in GROUPINGS
              for data_format in ("NXC", "NCX")
              for fmt in FORMATS[op]]
    n = len(combos)
    master = random.Random(20240611)

    def cycle(values):
        # every value equally often, in a fixed shuffled order uncorrelated with the combos
        seq = [values[i % len(values)] for i in range(n)]
        master.shuffle(seq)
        return seq

    dtypes, layouts = cycle(DTYPES), cycle(LAYOUTS)
    smodes, dmodes = cycle(["1", "2", "mixed"]), cycle(["1", "2", "mixed"])
    opads = cycle([False, True])
    return [Case(i, *combo, dtypes[i], layouts[i], smodes[i], dmodes[i], opads[i])
            for i, combo in enumerate(combos)]


CASES = _build_cases()


def _per_axis(mode, rng, r, choices):
    if mode == "1":
        return [1] * r
    if mode == "2":
        return [2] * r
    return [rng.choice(choices) for _ in range(r)]


def _attr(rng, values):
    """An attribute as an int (when uniform, sometimes), a list or a tuple."""
    form = rng.choice(["int", "list", "tuple"])
    if form == "int" and len(set(values)) == 1:
        return values[0]
    return tuple(values) if form == "tuple" else list(values)


def build_problem(case):
    """Sizes and attributes of one sweep case, consistent with SPEC section 3."""
    rng = random.Random(case.index)
    r = case.rank
    ks = [rng.choice([1, 2, 3]) for _ in range(r)]
    s = _per_axis(case.stride_mode, rng, r, [1, 2, 3])
    d = _per_axis(case.dilation_mode, rng, r, [1, 2, 3])
    eff = [(ks[a] - 1) * d[a] + 1 for a in range(r)]
    extra = {1: 6, 2: 3, 3: 2}[r]
    n = rng.choice([1, 2, 3])
    if case.grouping == "1":
        g, c, o = 1, rng.choice([2, 3]), rng.choice([2, 3])
    elif case.grouping == "2":
        g, c, o = 2, 2 * rng.choice([1, 2]), 2 * rng.choice([1, 2])
    else:  # depthwise: groups == input channels (IC for ConvTranspose)
        c = rng.choice([2, 3, 4])
        g, o = c, c * rng.choice([1, 2])

    # "big" = the size the pads are defined on: conv input X, ConvTranspose output_delta O
    if case.padding == "sym":
        pb = [rng.choice([1, 2]) for _ in range(r)]
        pe = list(pb)
    elif case.padding == "asym":
        pairs = [rng.choice([(0, 1), (1, 0), (0, 2), (2, 1), (1, 2), (3, 0)]) for _ in range(r)]
        pb, pe = [p[0] for p in pairs], [p[1] for p in pairs]
    if case.padding in ("sym", "asym"):
        big = [max(1, eff[a] - pb[a] - pe[a] + rng.randint(0, extra)) for a in range(r)]
        auto_pad = rng.choice([None, "explicit", "none"])
        attrs = dict(pads_begin=_attr(rng, pb), pads_end=_attr(rng, pe))
        if auto_pad is not None or rng.random() < 0.3:
            attrs["auto_pad"] = auto_pad
    elif case.padding == "valid":
        big = [eff[a] + rng.randint(0, extra) for a in range(r)]
        pb, pe = [0] * r, [0] * r
        attrs = dict(auto_pad="valid")
    else:
        big = [rng.randint(1, eff[a] + extra) for a in range(r)]
        lower = case.padding == "same_lower"
        pads = [REF.same_pads(big[a], ks[a], s[a], d[a], lower) for a in range(r)]
        pb, pe = [p[0] for p in pads], [p[1] for p in pads]
        attrs = dict(auto_pad=case.padding)
    small = small_sizes(big, ks, s, d, pb, pe)
    assert all(v >= 1 for v in small)

    if s != [1] * r or rng.random() < 0.5:
        attrs["strides"] = _attr(rng, s)
    if d != [1] * r or rng.random() < 0.5:
        attrs["dilations"] = _attr(rng, d)
    attrs["groups"] = g
    attrs["data_format"] = case.data_format

    if case.op == "transpose":
        x_sp, dy_sp = small, big
        if case.give_output_padding:
            op_pad = consistent_output_padding(big, small, ks, s, d, pb, pe)
            assert all(0 <= v < max(s[a], d[a]) for a, v in enumerate(op_pad))
            attrs["output_padding"] = _attr(rng, op_pad)
    else:
        x_sp, dy_sp = big, small
    shape = filter_shape(case.op, case.fmt, c, o, g, ks)
    x_shape = data_shape(n, c, x_sp, case.data_format)
    dy_shape = data_shape(n, o, dy_sp, case.data_format)
    return x_shape, dy_shape, shape, attrs


# Algorithms that support every problem: forcing one must run it. The others
# run where they apply (test_algorithms.py checks where) and leave the rest to
# the selector.
UNIVERSAL = ("aten", "gemm")


def call_with(algorithm, op, x, dy, shape, fmt, **attrs):
    """``call`` with ``algorithm`` forced (None: the selector's choice); checks it ran where it must."""
    with torch_convgrad.use_algorithm(algorithm):
        out = call(op, x, dy, shape, fmt, **attrs)
        ran = torch_convgrad.last_algorithm()
    if algorithm in UNIVERSAL:
        assert ran in (algorithm, None), ran  # None: zeros without any algorithm
    return out


@functools.lru_cache(maxsize=None)
def sweep_data(case, device):
    """(x, dy, shape, attrs, float64 reference) of a sweep case on ``device``, computed once for
    every algorithm."""
    x_shape, dy_shape, shape, attrs = build_problem(case)
    x = rand(x_shape, case.dtype, seed=2 * case.index, layout=case.layout, device=device)
    dy = rand(dy_shape, case.dtype, seed=2 * case.index + 1, layout=case.layout, device=device)
    return x, dy, shape, attrs, call_ref(case.op, x, dy, shape, case.fmt, **attrs)


# The algorithms whose supports() accepts CUDA tensors (csrc/algorithms/): ATen in any layout,
# gemm and matmul (ATen matrix products, on any device). The others are CPU kernels: forced on
# CUDA they would only rerun the selector's choice.
CUDA_ALGORITHMS = ("aten", "aten_channels_last", "aten_channels_first", "gemm", "matmul")


def on_devices(algorithms):
    """Parameters ``device,algorithm`` (``device`` goes through the device fixture): each of
    ``algorithms`` on CPU, and those of them that run on CUDA there (None, the selector's
    choice, runs everywhere)."""
    return pytest.mark.parametrize(
        "device,algorithm",
        [pytest.param("cpu", name, id=f"cpu-{name}") for name in algorithms]
        + [pytest.param("cuda", name, id=f"cuda-{name}", marks=requires_cuda)
           for name in algorithms if name is None or name in CUDA_ALGORITHMS],
        indirect=["device"])


# The sweep runs through every algorithm forced (the selector's own choice is
# one of them); CASES come first so each case's data is built once.
@on_devices(torch_convgrad.algorithm_names())
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sweep(case, device, algorithm):
    x, dy, shape, attrs, ref = sweep_data(case, device)
    out = call_with(algorithm, case.op, x, dy, shape, case.fmt, **attrs)
    check_result(out, x, shape)
    assert_matches_ref(out, ref, case.dtype)


LARGER = [
    # (op, data_format, fmt, dtype, layout, N, C (IC), O (OC), groups, big, ks, attrs)
    ("filters", "NXC", "XIO", torch.float32, "contiguous", 4, 32, 48, 1, [28, 28], [3, 3],
     dict(pads_begin=1, pads_end=1)),
    ("filters", "NCX", "OIX", torch.bfloat16, "channels_last", 2, 32, 32, 4, [24, 20], [3, 3],
     dict(strides=2, auto_pad="same_upper")),
    ("weights", "NCX", "XIO", torch.float16, "contiguous", 2, 24, 24, 24, [33, 31], [5, 5],
     dict(dilations=2, auto_pad="same_lower")),
    ("weights", "NXC", "OIX", torch.float64, "sliced", 3, 16, 40, 2, [18, 17], [1, 3],
     dict(strides=[1, 2], pads_begin=[0, 2], pads_end=[0, 1])),
    ("filters", "NXC", "XIO", torch.float32, "transposed", 2, 8, 16, 1, [10, 9, 11], [3, 2, 3],
     dict(strides=[2, 1, 2], auto_pad="valid")),
    ("filters", "NCX", "OIX", torch.float32, "contiguous", 3, 16, 16, 16, [500], [7],
     dict(strides=3, dilations=2, pads_begin=4, pads_end=0)),
    ("transpose", "NXC", "XOI", torch.float32, "contiguous", 2, 32, 48, 1, [29, 27], [4, 4],
     dict(strides=2, pads_begin=1, pads_end=2)),
    ("transpose", "NCX", "IOX", torch.bfloat16, "channels_last", 2, 24, 48, 24, [32, 30], [3, 3],
     dict(strides=2, auto_pad="same_upper")),
    ("transpose", "NXC", "OIX", torch.float16, "sliced", 2, 16, 32, 2, [12, 11, 10], [3, 3, 2],
     dict(dilations=[1, 2, 1], auto_pad="same_lower")),
    ("transpose", "NCX", "XIO", torch.float64, "contiguous", 4, 12, 18, 3, [300], [5],
     dict(strides=4, pads_begin=2, pads_end=3)),
]


# None: the selector's choice; then each algorithm forced.
@on_devices([None, *torch_convgrad.algorithm_names()])
@pytest.mark.parametrize("op,data_format,fmt,dtype,layout,n,c,o,g,big,ks,attrs", LARGER,
                         ids=[f"{v[0]}-{v[1]}-{v[2]}-{short(v[3])}-{v[4]}-r{len(v[9])}"
                              for v in LARGER])
def test_larger_problems(op, data_format, fmt, dtype, layout, n, c, o, g, big, ks, attrs, device,
                         algorithm):
    # Sizes big enough for ATen/oneDNN's blocked and vectorised paths.
    r = len(big)
    s = REF._ints(attrs.get("strides"), r, 1)
    d = REF._ints(attrs.get("dilations"), r, 1)
    pb, pe = REF._resolve_pads(attrs.get("auto_pad"), big, ks, s, d, attrs.get("pads_begin"),
                               attrs.get("pads_end"))
    small = small_sizes(big, ks, s, d, pb, pe)
    x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
    x = rand(data_shape(n, c, x_sp, data_format), dtype, seed=71, layout=layout, device=device)
    dy = rand(data_shape(n, o, dy_sp, data_format), dtype, seed=72, layout=layout, device=device)
    shape = filter_shape(op, fmt, c, o, g, ks)
    attrs = dict(attrs, groups=g, data_format=data_format)
    out = call_with(algorithm, op, x, dy, shape, fmt, **attrs)
    check_result(out, x, shape)
    assert_matches_ref(out, call_ref(op, x, dy, shape, fmt, **attrs), dtype)


def test_sweep_covers_every_value_many_times():
    from collections import Counter
    for field, values in (("dtype", DTYPES), ("layout", LAYOUTS), ("op", list(FORMATS)),
                          ("rank", [1, 2, 3]), ("padding", PADDINGS), ("grouping", GROUPINGS),
                          ("data_format", ["NXC", "NCX"]), ("fmt", ["XIO", "OIX", "IOX", "XOI"])):
        counts = Counter(getattr(c, field) for c in CASES)
        assert set(counts) == set(values), field
        assert min(counts.values()) >= 50, (field, counts)
    for op in FORMATS:
        for dtype in DTYPES:
            for layout in LAYOUTS:
                assert any(c.op == op and c.dtype == dtype and c.layout == layout for c in CASES)
    strided = sum(1 for c in CASES if c.stride_mode != "1")
    dilated = sum(1 for c in CASES if c.dilation_mode != "1")
    assert strided > len(CASES) // 2 and dilated > len(CASES) // 2


# ---------------------------------------------------------------------------
# draft ConvolutionBackpropFilters-1
# ---------------------------------------------------------------------------

V1_CASES = [
    # (N, C, O, g, spatial X, ks, attrs)
    (2, 3, 4, 1, [9], [3], dict()),
    (2, 4, 6, 2, [7, 6], [2, 3], dict(strides=[2, 1], dilations=[1, 2], pads_begin=[1, 0],
                                      pads_end=[2, 1])),
    (1, 4, 4, 4, [6, 5, 4], [3, 2, 2], dict(strides=2, auto_pad="same_upper")),
    (3, 2, 4, 2, [8, 7], [3, 3], dict(dilations=2, auto_pad="SAME_LOWER")),
    (2, 3, 3, 1, [6, 6], [2, 2], dict(strides=(2, 2), auto_pad="valid", pads_begin=[5, 5])),
]


def _conv_out(xs, ks, attrs):
    r = len(xs)
    s = REF._ints(attrs.get("strides"), r, 1)
    d = REF._ints(attrs.get("dilations"), r, 1)
    pb, pe = REF._resolve_pads(attrs.get("auto_pad"), xs, ks, s, d, attrs.get("pads_begin"),
                               attrs.get("pads_end"))
    return small_sizes(xs, ks, s, d, pb, pe)


@pytest.mark.parametrize("n,c,o,g,xs,ks,attrs", V1_CASES)
def test_v1_matches_conv_backprop_filters(n, c, o, g, xs, ks, attrs, device):
    ys = _conv_out(xs, ks, attrs)
    x = rand([n, c] + xs, torch.float32, seed=11, device=device)
    dy = rand([n, o] + ys, torch.float32, seed=12, device=device)
    out = torch_convgrad.conv_backprop_filters_v1(x, ks, dy, groups=g, **attrs)
    full = [o, c // g] + ks
    check_result(out, x, full)
    same = torch_convgrad.conv_backprop_filters(x, dy, full, groups=g, data_format="NCX",
                                                filter_format="OIX", **attrs)
    torch.testing.assert_close(out, same, rtol=1e-6, atol=1e-6)
    ref = REF.conv_backprop_filters_v1(x.cpu(), ks, dy.cpu(), groups=g, **attrs)
    assert_matches_ref(out, ref, torch.float32)
    # filters_shape as an integer tensor too
    out_t = torch_convgrad.conv_backprop_filters_v1(x, torch.tensor(ks, dtype=torch.int32), dy,
                                                    groups=g, **attrs)
    assert torch.equal(out_t, out)


# ---------------------------------------------------------------------------
# argument forms
# ---------------------------------------------------------------------------

def _problem(op, device, dtype=torch.float32, data_format="NXC", n=2):
    """An explicit-pad 2-D problem: C (IC) = 4, O (OC) = 6, groups 2, strided, dilated,
    asymmetric pads; (9, 8) is the conv input / ConvTranspose output_delta size."""
    ks, s, d, pb, pe = [3, 2], [2, 3], [1, 2], [1, 0], [0, 2]
    big = [9, 8]
    small = small_sizes(big, ks, s, d, pb, pe)
    x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
    x = rand(data_shape(n, 4, x_sp, data_format), dtype, seed=21, device=device)
    dy = rand(data_shape(n, 6, dy_sp, data_format), dtype, seed=22, device=device)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=2,
                 data_format=data_format)
    return x, dy, ks, attrs


@pytest.mark.parametrize("op", list(FORMATS))
def test_shape_argument_forms(op, device):
    x, dy, ks, attrs = _problem(op, device)
    for fmt in FORMATS[op]:
        shape = filter_shape(op, fmt, 4, 6, 2, ks)
        base = call(op, x, dy, shape, fmt, **attrs)
        check_result(base, x, shape)
        forms = [tuple(shape)] + [torch.tensor(shape, dtype=dt)
                                  for dt in (torch.int32, torch.int64, torch.int16)]
        for form in forms:
            assert torch.equal(call(op, x, dy, form, fmt, **attrs), base), (fmt, form)
        assert_matches_ref(base, call_ref(op, x, dy, shape, fmt, **attrs), torch.float32)


def _auto_problem(op, auto_pad, device, data_format="NXC"):
    """A problem (C/IC=4, O/OC=6, groups 2) whose sizes are consistent for ``auto_pad``."""
    rank, c, o, g = 2, 4, 6, 2
    ks, s, d = [3, 2], [2, 1], [1, 2]
    big = [9, 8]
    if auto_pad == "valid":
        pb, pe = [0, 0], [0, 0]
    else:
        pads = [REF.same_pads(big[a], ks[a], s[a], d[a], auto_pad == "same_lower")
                for a in range(rank)]
        pb, pe = [p[0] for p in pads], [p[1] for p in pads]
    small = small_sizes(big, ks, s, d, pb, pe)
    x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
    x = rand(data_shape(2, c, x_sp, data_format), torch.float32, seed=31, device=device)
    dy = rand(data_shape(2, o, dy_sp, data_format), torch.float32, seed=32, device=device)
    attrs = dict(strides=s, dilations=d, groups=g, auto_pad=auto_pad, data_format=data_format)
    return x, dy, ks, attrs, (pb, pe)


@pytest.mark.parametrize("op", list(FORMATS))
def test_strings_are_case_insensitive(op, device):
    x, dy, ks, attrs = _problem(op, device, data_format="NCX")
    for fmt in FORMATS[op]:
        shape = filter_shape(op, fmt, 4, 6, 2, ks)
        base = call(op, x, dy, shape, fmt, **attrs)
        mixed = dict(attrs, data_format="nCx")
        assert torch.equal(call(op, x, dy, shape, fmt.lower(), **mixed), base)
        assert torch.equal(call(op, x, dy, shape, fmt[0] + fmt[1:].lower(), **mixed), base)
    x, dy, ks, attrs = _problem(op, device, data_format="NXC")
    shape = filter_shape(op, "XIO", 4, 6, 2, ks)
    assert torch.equal(call(op, x, dy, shape, "xio", **dict(attrs, data_format="nxc")),
                       call(op, x, dy, shape, "XIO", **attrs))
    for a, b in (("same_upper", "Same_Upper"), ("same_lower", "SAME_LOWER"), ("valid", "VaLiD")):
        x, dy, ks, attrs, _ = _auto_problem(op, a, device, "NCX")
        shape = filter_shape(op, "OIX", 4, 6, 2, ks)
        base = call(op, x, dy, shape, "OIX", **attrs)
        assert torch.equal(call(op, x, dy, shape, "oix", **dict(attrs, auto_pad=b,
                                                                 data_format="Ncx")), base)
        assert_matches_ref(base, call_ref(op, x, dy, shape, "OIX", **attrs), torch.float32)


@pytest.mark.parametrize("op", list(FORMATS))
def test_auto_pad_explicit_none_equivalent(op, device):
    x, dy, ks, attrs = _problem(op, device)
    shape = filter_shape(op, "XIO", 4, 6, 2, ks)
    base = call(op, x, dy, shape, "XIO", **attrs)
    for auto_pad in ("explicit", "none", "EXPLICIT", "None"):
        assert torch.equal(call(op, x, dy, shape, "XIO", **dict(attrs, auto_pad=auto_pad)), base)
    assert_matches_ref(base, call_ref(op, x, dy, shape, "XIO", **attrs), torch.float32)


@pytest.mark.parametrize("op", list(FORMATS))
@pytest.mark.parametrize("auto_pad", ["same_upper", "same_lower", "valid"])
def test_auto_pad_ignores_explicit_pads(op, auto_pad, device):
    x, dy, ks, attrs, (pb, pe) = _auto_problem(op, auto_pad, device)
    shape = filter_shape(op, "XIO", 4, 6, 2, ks)
    base = call(op, x, dy, shape, "XIO", **attrs)
    for junk in (dict(pads_begin=3, pads_end=[0, 4]), dict(pads_begin=[7, 1]),
                 dict(pads_end=(2, 2))):
        assert torch.equal(call(op, x, dy, shape, "XIO", **attrs, **junk), base), junk
    explicit = call(op, x, dy, shape, "XIO", **dict(attrs, auto_pad=None), pads_begin=pb,
                    pads_end=pe)
    assert torch.equal(explicit, base)
    assert_matches_ref(base, call_ref(op, x, dy, shape, "XIO", **attrs), torch.float32)


def test_consistent_output_padding_changes_nothing(device):
    # (O, k, s, d, pb, pe) -> consistent output_padding values, incl. 0 and > 0
    for big, ks, s, d, pb, pe in (([9, 8], [3, 2], [2, 3], [1, 2], [1, 0], [0, 2]),
                                  ([10, 7], [2, 3], [3, 2], [1, 1], [0, 0], [0, 0]),
                                  ([6, 7], [3, 3], [1, 1], [2, 3], [1, 2], [2, 1])):
        small = small_sizes(big, ks, s, d, pb, pe)
        op_pad = consistent_output_padding(big, small, ks, s, d, pb, pe)
        x = rand(data_shape(2, 2, small, "NCX"), torch.float64, seed=41, device=device)
        dy = rand(data_shape(2, 4, big, "NCX"), torch.float64, seed=42, device=device)
        shape = filter_shape("transpose", "IOX", 2, 4, 2, ks)
        attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=2,
                     data_format="NCX", filter_format="IOX")
        base = torch_convgrad.conv_transpose_backprop_filters(x, dy, shape, **attrs)
        with_op = torch_convgrad.conv_transpose_backprop_filters(x, dy, shape,
                                                                 output_padding=op_pad, **attrs)
        assert torch.equal(with_op, base)
        if len(set(op_pad)) == 1:
            assert torch.equal(torch_convgrad.conv_transpose_backprop_filters(
                x, dy, shape, output_padding=op_pad[0], **attrs), base)
        ref = REF.conv_transpose_backprop_filters(x.cpu(), dy.cpu(), shape, **attrs)
        assert_matches_ref(base, ref, torch.float64)


@pytest.mark.parametrize("op", list(FORMATS))
@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_batch_zero_gives_zeros(op, dtype, device):
    for data_format in ("NXC", "NCX"):
        x, dy, ks, attrs = _problem(op, device, dtype=dtype, data_format=data_format, n=0)
        assert x.shape[0] == 0 and dy.shape[0] == 0
        for fmt in FORMATS[op]:
            shape = filter_shape(op, fmt, 4, 6, 2, ks)
            out = call(op, x, dy, shape, fmt, **attrs)
            check_result(out, x, shape)
            assert torch.count_nonzero(out).item() == 0


@pytest.mark.parametrize("op", list(FORMATS))
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_layouts_give_same_result(op, data_format, rank, device):
    rng = random.Random(rank)
    ks = [rng.choice([2, 3]) for _ in range(rank)]
    s = [rng.choice([1, 2]) for _ in range(rank)]
    big = [6 + a for a in range(rank)]
    small = small_sizes(big, ks, s, [1] * rank, [0] * rank, [0] * rank)
    x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
    c, o, g = 4, 6, 2
    x0 = rand(data_shape(3, c, x_sp, data_format), torch.float32, seed=51, device=device)
    dy0 = rand(data_shape(3, o, dy_sp, data_format), torch.float32, seed=52, device=device)
    fmt = FORMATS[op][-1]
    shape = filter_shape(op, fmt, c, o, g, ks)
    attrs = dict(strides=s, groups=g, data_format=data_format)
    base = call(op, x0, dy0, shape, fmt, **attrs)
    assert_matches_ref(base, call_ref(op, x0, dy0, shape, fmt, **attrs), torch.float32)
    for lx, ldy in [(lay, lay) for lay in LAYOUTS[1:]] + [("contiguous", "sliced"),
                                                        ("channels_last", "contiguous"),
                                                        ("transposed", "channels_last")]:
        x, dy = with_layout(x0, lx), with_layout(dy0, ldy)
        assert torch.equal(x, x0) and torch.equal(dy, dy0)
        out = call(op, x, dy, shape, fmt, **attrs)
        check_result(out, x, shape)
        torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-5, msg=f"{lx}/{ldy}")
    # a contiguous view with a storage offset
    xs = torch.cat([x0[2:], x0], dim=0)[1:]
    assert torch.equal(xs, x0) and xs.storage_offset() > 0
    out = call(op, xs, dy0, shape, fmt, **attrs)
    torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-5)
    # stride-0 batch (expanded) data
    xe, dye = with_layout(x0, "expanded"), with_layout(dy0, "expanded")
    out = call(op, xe, dye, shape, fmt, **attrs)
    check_result(out, xe, shape)
    assert_matches_ref(out, call_ref(op, xe, dye, shape, fmt, **attrs), torch.float32)


@pytest.mark.parametrize("op", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=short)
def test_edge_paddings(op, dtype, device):
    # (big, ks, s, d, pb, pe): windows entirely in the begin padding on one axis (all-zero
    # result), pads larger than the kernel, trailing input that no window reaches, k = 1.
    for big, ks, s, d, pb, pe in (([1, 5], [1, 2], [3, 1], [1, 1], [2, 0], [0, 0]),
                                  ([4, 6], [2, 2], [1, 2], [1, 1], [5, 0], [4, 6]),
                                  ([11, 9], [2, 3], [4, 3], [2, 1], [0, 0], [0, 0]),
                                  ([7, 5], [1, 1], [2, 3], [3, 2], [1, 0], [0, 2])):
        small = small_sizes(big, ks, s, d, pb, pe)
        x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
        x = rand(data_shape(2, 4, x_sp, "NCX"), dtype, seed=81, device=device)
        dy = rand(data_shape(2, 6, dy_sp, "NCX"), dtype, seed=82, device=device)
        fmt = FORMATS[op][0]
        shape = filter_shape(op, fmt, 4, 6, 2, ks)
        attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=2,
                     data_format="NCX")
        out = call(op, x, dy, shape, fmt, **attrs)
        check_result(out, x, shape)
        ref = call_ref(op, x, dy, shape, fmt, **attrs)
        assert_matches_ref(out, ref, dtype)
        if big[0] == 1:
            assert torch.count_nonzero(ref).item() == 0


# ---------------------------------------------------------------------------
# op-level entry points
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(FORMATS))
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_torch_ops_entry_points(op, data_format, device):
    x, dy, ks, attrs = _problem(op, device, data_format=data_format)
    s, d, pb, pe, g = (attrs["strides"], attrs["dilations"], attrs["pads_begin"],
                       attrs["pads_end"], attrs["groups"])
    op_fn = {"filters": OPS.conv_backprop_filters, "weights": OPS.conv_backprop_weights,
             "transpose": OPS.conv_transpose_backprop_filters}[op]
    for fmt in FORMATS[op]:
        shape = filter_shape(op, fmt, 4, 6, 2, ks)
        want = call(op, x, dy, shape, fmt, **attrs)
        if op == "transpose":
            spatial = (lambda t: list(t.shape[2:])) if data_format == "NCX" else \
                (lambda t: list(t.shape[1:-1]))
            op_pad = consistent_output_padding(spatial(dy), spatial(x), ks, s, d, pb, pe)
            assert any(op_pad)
            got = op_fn(x, dy, shape, s, pb, pe, d, "none", op_pad, g, data_format, fmt)
            got_kw = op_fn(x, dy, shape, strides=s, pads_begin=pb, pads_end=pe, dilations=d,
                           auto_pad="explicit", output_padding=None, groups=g,
                           data_format=data_format, filter_format=fmt)
        else:
            got = op_fn(x, dy, shape, s, pb, pe, d, "none", g, data_format, fmt)
            got_kw = op_fn(x, dy, shape, strides=s, pads_begin=pb, pads_end=pe, dilations=d,
                           auto_pad="explicit", groups=g, data_format=data_format,
                           **{FMT_KW[op]: fmt})
        check_result(got, x, shape)
        assert torch.equal(got, want)
        assert torch.equal(got_kw, want)


@pytest.mark.parametrize("op", list(FORMATS))
def test_torch_ops_defaults(op, device):
    # only the required arguments: strides/dilations 1, pads 0, NXC, XIO, groups 1
    ks = [3, 2]
    big, small = [6, 5], [4, 4]
    x_sp, dy_sp = (small, big) if op == "transpose" else (big, small)
    x = rand(data_shape(2, 3, x_sp, "NXC"), torch.float64, seed=61, device=device)
    dy = rand(data_shape(2, 5, dy_sp, "NXC"), torch.float64, seed=62, device=device)
    shape = filter_shape(op, "XIO", 3, 5, 1, ks)
    op_fn = {"filters": OPS.conv_backprop_filters, "weights": OPS.conv_backprop_weights,
             "transpose": OPS.conv_transpose_backprop_filters}[op]
    got = op_fn(x, dy, shape)
    check_result(got, x, shape)
    assert torch.equal(got, API[op](x, dy, shape))
    assert_matches_ref(got, call_ref(op, x, dy, shape, "XIO"), torch.float64)
    # auto_pad at op level with pads left as None
    got = op_fn(x, dy, shape, [1, 1], None, None, [1, 1], "valid")
    assert torch.equal(got, API[op](x, dy, shape, auto_pad="valid"))
