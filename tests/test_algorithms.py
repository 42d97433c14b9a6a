"""The algorithm layer: the override, which algorithm runs where, and what every algorithm promises.

Correctness of every algorithm against the float64 reference is in the sweeps
(test_semantics.py, test_precision.py), which run once per forced algorithm.
"""
import contextlib
import os
import subprocess
import sys

import pytest
import torch

import torch_convgrad
from conftest import REF, assert_matches_ref, data_shape, rand, requires_cuda, with_layout

NAMES = torch_convgrad.algorithm_names()


def dense_problem(data_format="NXC", dtype=torch.float32, n=2, c=8, o=6, size=(9, 7)):
    """A 3x3 convolution with asymmetric pads: (x, dy, shape, attributes)."""
    out = [(s + 1 + 2 - 3) // 2 + 1 for s in size]
    x = rand(data_shape(n, c, size, data_format), dtype, seed=1)
    dy = rand(data_shape(n, o, out, data_format), dtype, seed=2)
    return x, dy, [o, c, 3, 3], dict(strides=2, pads_begin=1, pads_end=2, data_format=data_format,
                                     filter_format="OIX")


def output_size(size, kernel, attributes):
    """The output gradient's spatial sizes under explicit strides, dilations and pads (ints or lists)."""
    expand = lambda value: [value] * len(size) if isinstance(value, int) else list(value)
    s, d = expand(attributes.get("strides", 1)), expand(attributes.get("dilations", 1))
    pb, pe = expand(attributes.get("pads_begin", 0)), expand(attributes.get("pads_end", 0))
    return [(x + b + e - (k - 1) * dd - 1) // ss + 1 for x, b, e, k, dd, ss in zip(size, pb, pe, kernel, d, s)]


AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
# AMX tiles, with the OS's leave to use them (torch asks the kernel for it).
AMX = AVX512 and torch.cpu._is_amx_tile_supported()
# The brgemm algorithm's products: ATen's brgemm (oneDNN's ukernel) multiplies bf16 on AMX tiles or
# AVX-512 BF16's dot products, while oneDNN is enabled, whatever ATen's capability.
BRGEMM = torch.backends.mkldnn.is_available() and (
    torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
# AVX-512 BF16's bf16 dot products.
AVX512_BF16 = AVX512 and torch.cpu._is_avx512_bf16_supported()
# The calibration the cost models pick by (torch_convgrad.algorithms.cpu_calibration()).
CALIBRATION = torch_convgrad.algorithms.cpu_calibration()
# Where depthwise channels-first planes of 3 taps along the row run on float row tiles: every
# AVX-512 calibration (AVX2's: avx2_float_rows).
FLOAT_ROWS = AVX512


def runs_here(algorithm):
    """Whether this CPU runs `algorithm` (brgemm: BRGEMM; amx_planes, amx_depthwise: AMX)."""
    return BRGEMM if algorithm == "brgemm" else AMX if algorithm.startswith("amx") else True


def avx2_float_rows(stride, windows, dtype):
    """Whether an AVX2 CPU runs channels-first planes of 3 taps along the row, `windows` a row at
    `stride` along it, on its float row tiles: at stride 1, and at stride 2 on rows of up to 14
    windows (28 in bf16 and f16)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2" and (
        stride == 1 or windows <= 14 or (windows <= 28 and dtype != torch.float32))


def depthwise_problem(data_format="NXC", dtype=torch.float32, c=16, size=(10, 11)):
    x = rand(data_shape(2, c, size, data_format), dtype, seed=3)
    dy = rand(data_shape(2, c, size, data_format), dtype, seed=4)
    return x, dy, [c, 1, 3, 3], dict(pads_begin=1, pads_end=1, groups=c, data_format=data_format,
                                     filter_format="OIX")


def run(algorithm, x, dy, shape, attributes):
    with torch_convgrad.use_algorithm(algorithm):
        out = torch_convgrad.conv_backprop_filters(x, dy, shape, **attributes)
        return out, torch_convgrad.last_algorithm()


@contextlib.contextmanager
def setting(get, set_to, value):
    """A global setting (``get()``, ``set_to(value)``) at ``value`` inside, restored after."""
    before = get()
    set_to(value)
    try:
        yield
    finally:
        set_to(before)


def test_the_algorithms():
    assert set(NAMES) == {"aten", "aten_channels_last", "aten_channels_first", "gemm", "depthwise", "direct", "brgemm",
                          "amx_planes", "amx_depthwise", "matmul"}


def unpadded_problem(data_format="NCX", dtype=torch.float32, n=2, c=8, o=6, size=(9, 7)):
    """A 3x3 stride-2 convolution in 2 groups whose windows read no padding: (x, dy, shape, attributes)."""
    out = [(s - 3) // 2 + 1 for s in size]
    x = rand(data_shape(n, c, size, data_format), dtype, seed=7)
    dy = rand(data_shape(n, o, out, data_format), dtype, seed=8)
    return x, dy, [o, c // 2, 3, 3], dict(strides=2, groups=2, data_format=data_format, filter_format="OIX")


def problem_for(algorithm, data_format="NCX", dtype=torch.float32, **sizes):
    """A problem that ``algorithm`` takes (brgemm, amx_planes: bf16 or f16, bf16 unless ``dtype`` is f16;
    amx_depthwise: bf16 only; matmul: no padding read; aten_channels_first: channels-last data)."""
    if algorithm == "matmul":
        return unpadded_problem(data_format, dtype, **sizes)
    if algorithm == "aten_channels_first":
        return dense_problem("NXC", dtype, **sizes)
    if algorithm == "depthwise":
        return depthwise_problem(data_format, dtype, **sizes)
    if algorithm == "amx_depthwise":
        return depthwise_problem(data_format, torch.bfloat16, **sizes)
    if algorithm in ("brgemm", "amx_planes") and dtype != torch.float16:
        dtype = torch.bfloat16
    return dense_problem(data_format, dtype, **sizes)


@pytest.mark.parametrize("algorithm", NAMES)
def test_forcing_runs_the_algorithm_where_it_applies(algorithm):
    problem = problem_for(algorithm)
    out, ran = run(algorithm, *problem)
    if not runs_here(algorithm):
        assert ran != algorithm  # left to the selector
        return
    assert ran == algorithm
    assert_matches_ref(out, REF.conv_backprop_filters(*problem[:3], **problem[3]), problem[0].dtype)


# The fused kernel copies tiles of 6 (AVX2) or 12 (AVX-512) (tap, channel)
# rows of A, as one block where they are adjacent in memory. With 512 channels
# (float32, copied because of the cache-aliasing stride) a tile that spans two
# taps is; with 2 channels a group on stride-2 phase planes (f16/bf16, always
# copied) a tile's rows lie apart.
@pytest.mark.parametrize("dtype,channels,groups,stride", [
    (torch.float32, 512, 1, 1), (torch.bfloat16, 4, 2, 2), (torch.float16, 4, 2, 2)])
def test_gemm_tiles_that_span_taps(dtype, channels, groups, stride):
    size = (4, 5)
    out = [(s + 1 - 3) // stride + 1 for s in size]
    x = rand(data_shape(2, channels, size, "NXC"), dtype, seed=5)
    dy = rand(data_shape(2, 4, out, "NXC"), dtype, seed=6)
    problem = (x, dy, [4, channels // groups, 3, 3],
               dict(strides=stride, pads_begin=1, pads_end=0, groups=groups, data_format="NXC", filter_format="OIX"))
    out, ran = run("gemm", *problem)
    assert ran == "gemm"
    assert_matches_ref(out, REF.conv_backprop_filters(*problem[:3], **problem[3]), dtype)


# The fused kernel skips the rows of the pitched output gradient between rows
# of windows (window_line_starts): zeros that would multiply the input there.
# An infinity or NaN in the input's last row and column (and 3-D: its last
# slice), which the first tap along each axis never reads, would otherwise put
# NaN into that tap's gradient, over several samples and both layouts.
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("size", [(6, 8), (4, 5, 6)], ids=["2d", "3d"])
def test_gemm_keeps_non_finite_inputs_to_the_taps_that_read_them(value, dtype, data_format, size):
    x = rand(data_shape(3, 5, size, data_format), dtype, seed=51)
    last = tuple(s - 1 for s in size)
    x[(1, *last, 2) if data_format == "NXC" else (1, 2, *last)] = value
    dy = rand(data_shape(3, 4, size, data_format), dtype, seed=52)
    shape = [4, 5] + [3] * len(size)
    attributes = dict(pads_begin=1, pads_end=1, data_format=data_format, filter_format="OIX")
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    expected = REF.conv_backprop_filters(x, dy, shape, **attributes)
    assert expected[:, 2, 0].isfinite().all() and not expected[:, 2, 1:].isfinite().all()
    assert_non_finite_where_expected(result, expected)


# A stem's few channels on interleaved stride-2 phases: each 6-row tile of A
# is two taps' three channels, adjacent in memory, packed a row at a time
# (on AVX2 as a whole vector, whose lanes past the row the next row
# overwrites), over several chunks of rows and a last tile of 3 rows.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kernel,size", [((3, 3), (66, 63)), ((7, 7), (160, 157))])
def test_gemm_packs_the_tiles_of_a_few_channel_stem(dtype, kernel, size):
    pad = kernel[0] // 2
    out = [(s + 2 * pad - kernel[0]) // 2 + 1 for s in size]
    x = rand(data_shape(1, 3, size, "NXC"), dtype, seed=41)
    dy = rand(data_shape(1, 8, out, "NXC"), dtype, seed=42)
    problem = (x, dy, [8, 3, *kernel],
               dict(strides=2, pads_begin=pad, pads_end=pad, data_format="NXC", filter_format="OIX"))
    out, ran = run("gemm", *problem)
    assert ran == "gemm"
    assert_matches_ref(out, REF.conv_backprop_filters(*problem[:3], **problem[3]), dtype)


# The fused kernel converts f16/bf16 channels-last A a region a chunk (each
# row that some tap of the block reads, the block's columns) instead of
# packing it per tile (on AVX-512 only where several taps read it): blocks
# that start or end inside a tap (40 channels: 6-row tiles, blocks of at
# most 192 rows of A), a block of some of a 1x1 layer's
# 400 channels, the 1-D layer's input read in place (taps 32 channels apart in
# rows of 5 pixels, so a tap's channels start mid-row), groups, 3-D, stride-2
# phase planes, and NaN-poisoned strided views (the region converts the NaN
# between the view's elements, which no product may read). The AVX-512 build
# packs the 1x1 layer's, so they cover packing too.
GEMM_REGION_CASES = {
    # name: (n, c, o, size, kernel, attributes)
    "taps-cut-by-blocks": (2, 40, 24, (9, 11), (3, 3), dict(pads_begin=1, pads_end=1)),
    "1x1-400-channels": (2, 400, 20, (5, 6), (1, 1), {}),
    "1-D-in-place": (2, 32, 16, (203,), (10,), dict(strides=5)),
    "groups": (2, 12, 8, (7, 9), (3, 3), dict(pads_begin=(0, 1), pads_end=(2, 1), groups=2)),
    "3-D": (2, 8, 8, (3, 4, 5), (3, 3, 3), dict(pads_begin=1, pads_end=1)),
    "stride-2": (2, 16, 8, (9, 10), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
}


@pytest.mark.parametrize("view", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(GEMM_REGION_CASES))
def test_gemm_converts_low_precision_regions(case, dtype, view):
    n, c, o, size, kernel, attributes = GEMM_REGION_CASES[case]
    x = rand(data_shape(n, c, size, "NXC"), dtype, seed=29)
    dy = rand(data_shape(n, o, output_size(size, kernel, attributes), "NXC"), dtype, seed=30)
    if view == "sliced":
        x, dy = with_layout(x, "sliced"), with_layout(dy, "sliced")
    groups = attributes.get("groups", 1)
    shape = [o, c // groups, *kernel]
    attributes = dict(attributes, data_format="NXC", filter_format="OIX")
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert torch.isfinite(result).all()
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# A strided last axis whose taps read every phase keeps its phases side by
# side in one plane, a tap reading rows of `stride` pixels at a column; the
# input itself serves where no padding is read and (beyond one line a sample)
# its rows hold whole windows' worth of pixels. A sample of one line of 1024
# windows or more multiplies on its own instead of through a pitched copy.
GEMM_INTERLEAVED_CASES = {
    # name: (n, c, o, size, kernel, attributes, layout)
    "1-D-in-place": (2, 6, 5, (103,), (10,), dict(strides=5), "NXC"),
    "1-D-long-line": (2, 3, 4, (5200,), (10,), dict(strides=5), "NXC"),
    "1-D-long-line-packed": (2, 3, 4, (5200,), (10,), dict(strides=5, pads_begin=2), "NCX"),
    "2-D-in-place": (2, 5, 7, (8, 12), (3, 4), dict(strides=(1, 2)), "NXC"),
    "2-D-pads-dilation": (2, 4, 6, (9, 13), (3, 3), dict(strides=(2, 3), dilations=(1, 2), pads_begin=(1, 2),
                                                         pads_end=(0, 1)), "NXC"),
    "2-D-sliced": (2, 4, 6, (9, 26), (3, 3), dict(strides=2), "sliced"),
    "3-D-groups": (1, 8, 6, (4, 5, 9), (2, 2, 3), dict(strides=(1, 2, 3), groups=2), "NCX"),
    "1x1-stride-2": (2, 6, 5, (7, 9), (1, 1), dict(strides=2), "NXC"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(GEMM_INTERLEAVED_CASES))
def test_gemm_interleaves_the_phases_of_a_strided_last_axis(case, dtype):
    n, c, o, size, kernel, attributes, layout = GEMM_INTERLEAVED_CASES[case]
    out = output_size(size, kernel, attributes)
    data_format = "NCX" if layout == "NCX" else "NXC"
    x = rand(data_shape(n, c, size, data_format), dtype, seed=17)
    if layout == "sliced":  # every other pixel of a twice-as-wide row: not read in place
        x = x[..., ::2, :]
        size = (size[0], size[1] // 2)
        out = output_size(size, kernel, attributes)
    dy = rand(data_shape(n, o, out, data_format), dtype, seed=18)
    groups = attributes.get("groups", 1)
    shape = [o, c // groups, *kernel]
    attributes = dict(attributes, data_format=data_format, filter_format="OIX")
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# gemm lays channels-first data out as channels-last rows in register blocks
# (16 x 16 float32, 8 columns x 16 rows of 16-bit elements on AVX-512; 8 x 8 or
# 8 x 16 on AVX2): rows and channel counts that leave blocks cut by the edges
# on either side, or no whole block at all.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("channels,out_channels,width", [(20, 5, 19), (5, 20, 14), (9, 17, 33)])
def test_gemm_transposes_blocks_cut_by_the_edges(channels, out_channels, width, dtype):
    x = rand(data_shape(2, channels, (3, width), "NCX"), dtype, seed=23)
    dy = rand(data_shape(2, out_channels, (3, width), "NCX"), dtype, seed=24)
    shape = [out_channels, channels, 3, 3]
    attributes = dict(pads_begin=1, pads_end=1, data_format="NCX", filter_format="OIX")
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# gemm gathers the phase plane of a strided, channels-first 1x1 layer for BLAS
# channel by channel, a vector of outputs (16 float32 on AVX-512, 8 on AVX2)
# from `stride` vectors of a row: rows that leave a partial vector (AVX2
# gathers a vector only where an output follows it: 17 outputs, 16 and 8), a
# stride along the row longer than a vector (gathered element by element:
# 17, and 9 on AVX2), a stride of a whole vector, and padding, groups and
# strides along both axes. Under ATEN_CPU_CAPABILITY=default the portable
# build gathers, and BLAS takes channels-last output gradients too.
GEMM_GATHER_CASES = [
    # (channels, out_channels, size, attributes)
    (6, 5, (5, 38), dict(strides=2)),
    (4, 6, (3, 50), dict(strides=(1, 3), pads_begin=(1, 0), pads_end=(0, 0))),
    (4, 4, (4, 40), dict(strides=(2, 17), groups=2)),
    (3, 5, (6, 66), dict(strides=(3, 2), pads_begin=(0, 2), pads_end=(1, 0))),
    (3, 4, (3, 129), dict(strides=(1, 8))),
    (2, 3, (4, 80), dict(strides=5, pads_begin=(0, 1), pads_end=(0, 0))),
    (2, 2, (3, 64), dict(strides=(1, 8))),
    (2, 3, (2, 100), dict(strides=(2, 9))),
]


def gemm_gather_problem(channels, out_channels, size, attributes, data_format="NCX"):
    out = output_size(size, (1, 1), attributes)
    x = rand(data_shape(2, channels, size, data_format), torch.float32, seed=27)
    dy = rand(data_shape(2, out_channels, out, data_format), torch.float32, seed=28)
    shape = [out_channels, channels // attributes.get("groups", 1), 1, 1]
    return x, dy, shape, dict(attributes, data_format=data_format, filter_format="OIX")


@pytest.mark.parametrize("case", range(len(GEMM_GATHER_CASES)))
def test_gemm_gathers_strided_channels_first_rows(case):
    x, dy, shape, attributes = gemm_gather_problem(*GEMM_GATHER_CASES[case])
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), x.dtype)


def test_gemm_gathers_in_the_portable_build(tmp_path):
    problems = [gemm_gather_problem(*case, data_format=data_format)
                for case in GEMM_GATHER_CASES for data_format in ("NCX", "NXC")]
    check_under_capability(problems, "DEFAULT", "gemm", tmp_path)


# With one tap and fewer input channels than output ones, the fused kernel
# takes the output gradient as its first operand and the input's plane as the
# second, and the product comes out transposed: groups, strides and padding.
# With a sample or more a thread, each thread multiplies its own run of samples
# into a partial sum (3 samples on 2 threads: runs of 1 and 2), a product of up
# to 8192 rows at a time (60x60 maps: 2 samples a product, so one thread's 3
# make two products); one thread multiplies them all.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("groups,attributes,size", [
    (1, {}, (7, 9)), (2, {}, (7, 9)), (1, dict(strides=2, pads_begin=1, pads_end=0), (7, 9)),
    (2, dict(strides=(1, 3), pads_begin=(0, 2)), (7, 9)), (1, {}, (60, 60))])
def test_gemm_one_tap_with_more_output_channels(groups, attributes, size, dtype, threads):
    c, o = 6, 20
    pads_end = attributes.get("pads_end", attributes.get("pads_begin", 0))
    attributes = dict(attributes, pads_end=pads_end, groups=groups, data_format="NXC", filter_format="OIX")
    out = output_size(size, (1, 1), attributes)
    x = rand(data_shape(3, c, size, "NXC"), dtype, seed=25)
    dy = rand(data_shape(3, o, out, "NXC"), dtype, seed=26)
    shape = [o, c // groups, 1, 1]
    with setting(torch.get_num_threads, torch.set_num_threads, threads):
        result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# Where gemm packs or converts an operand and every thread has a sample, each
# thread packs and multiplies its own run of samples into a partial sum: runs
# of unequal length (5 samples on 2 and 3 threads), groups, a strided axis whose phases
# share a plane (packed from channels-first data), the output gradient packed
# alone (channels-first, no padding), a stride-2 1x1 layer's phase plane
# (channels-first: BLAS multiplies it, and it is packed channels-first), a
# padded 1-D line too long to pitch and a stride-3 axis of two phase planes
# in groups (in float64 their taps read planes packed channels-first), an
# unpadded 1x1 layer's channels-first data, which BLAS reads in place (bf16
# converted a sample at a time by each thread, f32 not copied: a sample's
# product split between the threads; on AVX-512 CPUs the fused kernel reads
# both operands in place instead, each thread its own samples:
# test_gemm_fused_kernel_reads_both_operands_channels_first), float64 (BLAS
# throughout), and one thread, which packs every sample at once. Where BLAS
# multiplies packed planes (float64, and the stride-2 1x1 layer's), threads
# take their own samples only from 1024 rows a thread (the 1x1 layer on a
# 66x64 map); below that they split the products of all samples.
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("case", [
    dict(kernel=(3, 3), attributes=dict(strides=2, pads_begin=1, pads_end=2), groups=1, data_format="NXC"),
    dict(kernel=(3, 3), attributes=dict(pads_begin=1, pads_end=1), groups=2, data_format="NCX"),
    dict(kernel=(1, 4), attributes=dict(strides=(1, 2)), groups=1, data_format="NCX"),
    dict(kernel=(1, 1), attributes=dict(strides=2), groups=1, data_format="NCX"),
    dict(kernel=(1, 1), attributes=dict(strides=2), groups=1, data_format="NCX", size=(66, 64)),
    dict(kernel=(3,), attributes=dict(pads_begin=1, pads_end=1), groups=1, data_format="NCX", size=(1030,)),
    dict(kernel=(2, 1), attributes=dict(strides=(3, 1)), groups=2, data_format="NCX"),
    dict(kernel=(1, 1), attributes=dict(), groups=1, data_format="NCX"),
], ids=["padded-NXC", "groups-NCX", "unpadded-NCX", "1x1-stride-2-NCX", "1x1-stride-2-NCX-1056-rows", "long-line-NCX",
        "two-planes-groups-NCX", "1x1-in-place-NCX"])
def test_gemm_threads_multiply_their_own_samples(case, dtype, threads):
    n, c, o, size = 5, 8, 6, case.get("size", (9, 10))
    kernel, groups, data_format = case["kernel"], case["groups"], case["data_format"]
    attributes = dict(case["attributes"], groups=groups, data_format=data_format, filter_format="OIX")
    out = output_size(size, kernel, attributes)
    x = rand(data_shape(n, c, size, data_format), dtype, seed=27)
    dy = rand(data_shape(n, o, out, data_format), dtype, seed=28)
    shape = [o, c // groups, *kernel]
    with setting(torch.get_num_threads, torch.set_num_threads, threads):
        result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# Channels-first 1-D input goes to gemm's fused kernel in place, whatever the stride, dilation and
# padding: positions in the padding read as zero (the chunks of rows that reach them copied), and
# f16/bf16 converted a chunk at a time. An audio-like stride that the kernel divides, strides that
# leave phases unread, dilation, asymmetric and wide padding (windows wholly in it), 700 positions
# (several chunks of 128 rows, the middle ones read where they lie in f32), groups, views whose
# channels or samples lie further apart than dense data's, one channel, and an output gradient with
# channels-last strides (read as rows as it is); one thread multiplies every sample in turn, two
# their own runs of samples where the output gradient is packed, and split each sample's products
# where nothing is (the channels-last one). (2-D layers are packed, those of height 1 too where a
# kernel or padding reaches beyond the one row: a row of windows above it reads only padding.)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [
    dict(size=(103,), kernel=(10,), strides=(5,)),
    dict(size=(40,), kernel=(3,), strides=(2,), pads=(1, 1)),
    dict(size=(41,), kernel=(2,), strides=(3,)),
    dict(size=(37,), kernel=(3,), strides=(1,), dilations=(4,), pads=(5, 2)),
    dict(size=(9,), kernel=(2,), strides=(2,), pads=(6, 7)),
    dict(size=(700,), kernel=(5,), strides=(2,), pads=(2, 2)),
    dict(size=(700,), kernel=(4,), strides=(1,), pads=(0, 3), c=1),
    dict(size=(40,), kernel=(3,), strides=(2,), pads=(1, 0), groups=2),
    dict(size=(40,), kernel=(4,), strides=(2,), pads=(1, 1), view="channel-slice"),
    dict(size=(40,), kernel=(4,), strides=(2,), view="sample-slice"),
    dict(size=(40,), kernel=(3,), strides=(2,), pads=(1, 1), view="channels-last-dy"),
    dict(size=(6, 12), kernel=(3, 4), strides=(1, 2)),
    dict(size=(1, 12), kernel=(3, 3), strides=(1, 2), pads=(1, 1)),
    dict(size=(1, 12), kernel=(1, 3), strides=(1, 2), pads=((1, 0), (0, 0))),
], ids=["audio", "padded", "unread-phases", "dilated", "all-padding", "chunks", "one-channel", "groups",
        "channel-slice", "sample-slice", "channels-last-dy", "2-D", "height-1", "height-1-padding-read"])
def test_gemm_reads_channels_first_input_in_place(case, threads, dtype):
    n, c, o, size, groups, view = 3, case.get("c", 8), 12, case["size"], case.get("groups", 1), case.get("view")
    pads = case.get("pads", (0, 0))
    attributes = dict(strides=case["strides"], dilations=case.get("dilations", 1), pads_begin=pads[0],
                      pads_end=pads[1], groups=groups, data_format="NCX", filter_format="OIX")
    kernel = case["kernel"]
    out = output_size(size, kernel, attributes)
    x = rand(data_shape(2 * n, 2 * c, size, "NCX"), dtype, seed=61)
    x = x[::2, :c] if view == "sample-slice" else x[:n, ::2] if view == "channel-slice" else x[:n, :c].contiguous()
    dy = rand(data_shape(n, o, out, "NCX"), dtype, seed=62)
    if view == "channels-last-dy":
        dy = dy.movedim(1, -1).contiguous().movedim(-1, 1)
    shape = [o, c // groups, *kernel]
    with setting(torch.get_num_threads, torch.set_num_threads, threads):
        result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# One input and one output channel of channels-last 1-D data (found by test_fuzz): gemm reads the
# input in place and the output gradient as rows where it lies, whose single channel the row view
# gives the row length's stride (any stride serves a single element).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("size,kernel,pads", [((2,), (1,), (0, 0)), ((40,), (3,), (1, 1)), ((40,), (4,), (0, 2))],
                         ids=["two-positions", "padded", "asymmetric"])
def test_gemm_single_channel_channels_last_1d(size, kernel, pads, dtype):
    attributes = dict(pads_begin=pads[0], pads_end=pads[1], data_format="NXC", filter_format="OIX")
    x = rand(data_shape(3, 1, size, "NXC"), dtype, seed=65)
    dy = rand(data_shape(3, 1, output_size(size, kernel, attributes), "NXC"), dtype, seed=66)
    result, ran = run("gemm", x, dy, [1, 1, *kernel], attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [1, 1, *kernel], **attributes), dtype)


# Channels-first data that gemm reads in place does not flatten across samples: BLAS multiplies the
# samples in batches where a sample has 512 rows or more (24x24, 600 in 1-D), and one at a time
# below (22x22): groups, float64, a stride-1 1-D layer, samples read at a stride (a slice of a larger
# batch), 3 taps down the columns (read in place at row offsets), 1024 -> 1024 channels (a batch of
# 2 samples, then 1, accumulated), 1000 -> 1100 (a sample a batch, accumulated into products written
# transposed, as every batch with more output than input channels is), and f16 (converted a sample
# at a time, never batched). An AVX-512 CPU hands its 1x1 f16/f32 problems to the fused kernel
# instead (test_gemm_fused_kernel_reads_both_operands_channels_first), so there they run in a child
# under ATen's AVX2 capability too, where BLAS takes them.
BATCHES_CASES = {
    "24x24": dict(size=(24, 24)), "groups": dict(size=(24, 24), groups=2),
    "f64": dict(size=(24, 24), dtype=torch.float64), "1-D": dict(size=(600,)),
    "sample-stride": dict(size=(24, 24), sample_step=2), "3-taps": dict(size=(26, 24), kernel=(3, 1)),
    "two-batches": dict(size=(24, 24), c=1024, o=1024), "transposed-batches": dict(size=(24, 24), c=1000, o=1100),
    "22x22": dict(size=(22, 22)), "f16": dict(size=(24, 24), dtype=torch.float16),
}


def batches_problem(case):
    n, c, o, size = 3, case.get("c", 8), case.get("o", 12), case["size"]
    dtype, groups, step = case.get("dtype", torch.float32), case.get("groups", 1), case.get("sample_step", 1)
    kernel = case.get("kernel", (1,) * len(size))
    attributes = dict(groups=groups, data_format="NCX", filter_format="OIX")
    x = rand(data_shape(n * step, c, size, "NCX"), dtype, seed=59)[::step]
    dy = rand(data_shape(n * step, o, output_size(size, kernel, attributes), "NCX"), dtype, seed=60)[::step]
    return x, dy, [o, c // groups, *kernel], attributes


@pytest.mark.parametrize("case", BATCHES_CASES.values(), ids=BATCHES_CASES.keys())
def test_gemm_multiplies_channels_first_samples_in_batches(case):
    x, dy, shape, attributes = batches_problem(case)
    result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), x.dtype)


@pytest.mark.skipif(not AVX512, reason="an AVX2 CPU multiplies them through BLAS in the test above")
def test_gemm_multiplies_channels_first_samples_in_batches_under_avx2(tmp_path):
    check_under_capability([batches_problem(case) for case in BATCHES_CASES.values()], "AVX2", "gemm", tmp_path)


# On AVX-512 CPUs gemm's fused kernel reads a 1x1 stride-1 layer's channels-first operands in place,
# each channel's rows contiguous: the one with more channels as A (its channels' runs of rows), the
# other as B, transposed into the kernel's slabs 16 channels by 16 rows at a time. Channel counts
# that leave partial tiles and partial slabs (B of 8, 20 and 40 channels: part of a 16-channel block,
# a block and a bit, a 32-channel slab and a bit), rows that leave a partial block of 16 and span
# several chunks of 128 (260 rows), groups, 1-D and 3-D maps, views whose samples or channels lie
# further apart than dense data's (channels of A, of B as the input, of B as the output gradient),
# and one sample (the products split between threads) against three (each thread its own samples,
# into a partial sum).
@pytest.mark.skipif(not AVX512, reason="the AVX-512 build reads channels-first B")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [
    dict(c=8, o=12, size=(9, 10)),
    dict(c=40, o=20, size=(9, 10)),
    dict(c=20, o=70, size=(5, 7)),
    dict(c=64, o=40, size=(20, 13)),
    dict(c=16, o=24, size=(9, 10), groups=2),
    dict(c=12, o=18, size=(300,)),
    dict(c=12, o=18, size=(3, 4, 5)),
    dict(c=20, o=70, size=(5, 7), view="sample-slice"),
    dict(c=20, o=12, size=(5, 7), view="channel-slice"),
    dict(c=12, o=40, size=(5, 7), view="channel-slice"),
    dict(c=20, o=12, size=(5, 7), view="dy-channel-slice"),
    dict(c=40, o=20, size=(9, 10), n=1),
], ids=["B-8", "B-20", "B-20-of-input", "chunks", "groups", "1-D", "3-D", "sample-slice", "channel-slice-A",
        "channel-slice-B", "dy-channel-slice-B", "one-sample"])
def test_gemm_fused_kernel_reads_both_operands_channels_first(case, threads, dtype):
    n, c, o, size, groups, view = case.get("n", 3), case["c"], case["o"], case["size"], case.get("groups", 1), \
        case.get("view")
    attributes = dict(groups=groups, data_format="NCX", filter_format="OIX")
    x = rand(data_shape(2 * n, 2 * c, size, "NCX"), dtype, seed=67)
    x = x[::2, :c] if view == "sample-slice" else x[:n, ::2] if view == "channel-slice" else x[:n, :c].contiguous()
    dy = rand(data_shape(2 * n, 2 * o, size, "NCX"), dtype, seed=68)
    dy = (dy[::2, :o] if view == "sample-slice" else dy[:n, ::2] if view == "dy-channel-slice"
          else dy[:n, :o].contiguous())
    shape = [o, c // groups, *(1,) * len(size)]
    with setting(torch.get_num_threads, torch.set_num_threads, threads):
        result, ran = run("gemm", x, dy, shape, attributes)
    assert ran == "gemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_gemm_results_outlive_its_scratch_buffers(data_format):
    # gemm packs its operands into per-thread buffers that the next call reuses.
    first = dense_problem(data_format)
    out, _ = run("gemm", *first)
    kept = out.clone()
    second = dense_problem(data_format)
    second[0].mul_(-3.0)
    second[1].add_(1.0)
    run("gemm", *second)
    assert torch.equal(out, kept)
    assert_matches_ref(out, REF.conv_backprop_filters(*first[:3], **first[3]), torch.float32)


# The depthwise kernels also take groups of 2, 4 or 8 channels that divide a
# vector of lanes (8 f32/bf16 lanes, 4 f64). The channels-last one sums up to
# 3 input rows (4 on AVX-512) times up to 8 taps along the row in registers:
# these kernels make it split rows (5, 7, 9 rows) and taps along the row (9 =
# 5 + 4), and stride, dilation and asymmetric pads move the padding both
# kernels stage. Where stride equals dilation it takes 8 windows at a time
# (4 on AVX2) and the rest one by one (21 windows; 10 with stride 2; 6 with
# stride 3, fewer than 8).
# 37 and 36 channels leave a partial vector of lanes; groups of 8 f32
# channels fill one, which the channels-last kernel broadcasts lane by lane.
# Channels-first depthwise data goes through the channels-last kernel, which
# transposes it as it stages it (rows of 6 to 21 pixels: whole, overlapping
# and element-wise transposes), unless it has fewer channels than lanes (4),
# or, on AVX-512 CPUs without bf16 products, 3, 5 or 7 taps along the row at
# stride 1 or 2 without dilation (float row tiles: FLOAT_ROW_CASES below; on
# AMX CPUs 3 taps, or 5 and 7 on short rows). bf16 rows of fewer than 5 taps
# at stride 1 that those tiles do not take (dilated ones here) run on
# AVX512_BF16 dot products where the CPU has them.
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("channels,groups", [(32, 32), (37, 37), (4, 4), (36, 18), (32, 8), (40, 5)])
@pytest.mark.parametrize("kernel,stride,dilation,pads", [
    (3, 1, 1, (1, 1)), (3, 2, 1, (0, 1)), (5, 3, 1, (2, 0)), (7, 1, 2, (5, 3)), (4, 2, 3, (3, 2)), (9, 1, 1, (8, 0)),
    (3, 2, 2, (2, 1)), (3, 3, 3, (1, 1)), (3, 1, 2, (2, 2))])
def test_depthwise_and_grouped_kernels(channels, groups, kernel, stride, dilation, pads, dtype, data_format):
    lanes = 4 if dtype == torch.float64 else 8
    if channels // groups > lanes:
        pytest.skip("groups wider than a vector of lanes run elsewhere")
    size = (5, 21)
    out = [(s + sum(pads) - dilation * (kernel - 1) - 1) // stride + 1 for s in size]
    x = rand(data_shape(1, channels, size, data_format), dtype, seed=7)
    dy = rand(data_shape(1, channels, out, data_format), dtype, seed=8)
    problem = (x, dy, [channels, channels // groups, kernel, kernel],
               dict(strides=stride, dilations=dilation, pads_begin=pads[0], pads_end=pads[1], groups=groups,
                    data_format=data_format, filter_format="OIX"))
    result, ran = run("depthwise", *problem)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(*problem[:3], **problem[3]), dtype)


# On AVX2 CPUs, and on AMX CPUs in bf16 and f16 with 3 taps and 28 windows or more along the row, the
# channels-last kernel reads channels-last input rows of whole vectors of channels
# in place at strides of 2 or more along the row (converted as its tiles load them), staging only the
# pixels that the windows reaching the padding read: odd, even, wide, asymmetric and no padding along
# the row (the last leaves no border windows on the left, and no right border where the last window
# ends inside the row), rows whose windows all reach the padding (which stage whole), stride 3,
# dilation (stride equal to dilation takes the staged rows' shared tile instead), 1-D and 3-D, and rows
# of 30 and 31 windows (odd, right and no padding; with the 1-D case, the ones AMX CPUs take). Each
# contiguous, with pixels further apart than the channels (a slice of a wider tensor's channels) and
# with rows read at a stride; 16 and 24 channels (whole vectors in every dtype) and 20 (a partial
# vector: staged). Elsewhere the same problems stage their rows.
CHANNELS_LAST_IN_PLACE_CASES = {
    # name: (n, size, kernel, attributes)
    "odd-padding": (2, (7, 41), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "even-padding": (2, (7, 45), (3, 3), dict(strides=2, pads_begin=(1, 2), pads_end=(1, 1))),
    "unpadded": (2, (6, 41), (3, 3), dict(strides=2)),
    "unpadded-right-border": (1, (5, 40), (3, 3), dict(strides=2, pads_end=(0, 1))),
    "wide-padding": (2, (6, 40), (3, 3), dict(strides=2, pads_begin=(1, 9), pads_end=(1, 8))),
    "all-windows-padded": (2, (6, 3), (3, 3), dict(strides=2, pads_begin=1, pads_end=2)),
    "stride-3-5x5": (2, (9, 50), (5, 5), dict(strides=3, pads_begin=2, pads_end=(1, 2))),
    "stride-2-dilation-3": (2, (9, 40), (3, 3), dict(strides=2, dilations=(1, 3), pads_begin=(1, 3), pads_end=(1, 2))),
    "stride-2-dilation-2": (2, (9, 40), (3, 3), dict(strides=2, dilations=2, pads_begin=2, pads_end=2)),
    "1-D": (3, (101,), (3,), dict(strides=2, pads_begin=1, pads_end=1)),
    "3-D": (1, (4, 5, 30), (3, 3, 3), dict(strides=(1, 1, 2), pads_begin=1, pads_end=1)),
    "31-windows": (2, (5, 61), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "30-windows-right-border": (1, (4, 60), (3, 3), dict(strides=2, pads_end=(0, 1))),
    "31-windows-unpadded": (2, (4, 64), (3, 3), dict(strides=2)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("channels", [16, 24, 20])
@pytest.mark.parametrize("view", ["contiguous", "channel-slice", "strided-rows"])
@pytest.mark.parametrize("case", list(CHANNELS_LAST_IN_PLACE_CASES))
def test_channels_last_depthwise_rows_read_in_place(case, view, channels, dtype):
    n, size, kernel, attributes = CHANNELS_LAST_IN_PLACE_CASES[case]
    if view == "strided-rows":
        x = rand(data_shape(n, channels, [*size[:-1], 2 * size[-1]], "NXC"), dtype, seed=71)[..., ::2, :]
    else:
        x = rand(data_shape(n, 2 * channels, size, "NXC"), dtype, seed=71)[..., :channels]
        x = x.contiguous() if view == "contiguous" else x
    assert list(x.shape) == data_shape(n, channels, size, "NXC")
    dy = rand(data_shape(n, channels, output_size(size, kernel, attributes), "NXC"), dtype, seed=72)
    attributes = dict(attributes, groups=channels, data_format="NXC", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [channels, 1, *kernel], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [channels, 1, *kernel], **attributes), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("column", [0, 1, 20, -1])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("width", [41, 61])
def test_channels_last_depthwise_rows_read_in_place_keep_non_finite_inputs_to_the_taps_that_read_them(
        width, value, column, dtype):
    """An infinity or NaN in a row's first or last pixel (staged for the border windows) or inside it
    (read in place) reaches only the taps that read it: rows of 21 windows and of 31, which AMX CPUs
    read in place in bf16 and f16."""
    attributes = dict(strides=2, pads_begin=1, pads_end=1)
    x = rand(data_shape(2, 16, (7, width), "NXC"), dtype, seed=73)
    x[1, 3, column, 5] = value
    dy = rand(data_shape(2, 16, output_size((7, width), (3, 3), attributes), "NXC"), dtype, seed=74)
    attributes = dict(attributes, groups=16, data_format="NXC", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [16, 1, 3, 3], attributes)
    assert ran == "depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [16, 1, 3, 3], **attributes))


# On the AVX2 calibration, depthwise 2-D layers with stride 1 and dilation 1 along the row that the
# channels-last kernel takes run on whole planes where their rows are short (up to 14 windows) or,
# channels-first data with 5 taps or more along the row, up to 56 windows: a block of channels'
# input plane staged with padded rows, its grad_output plane with the same row pitch (zeros after
# each row's windows), and one tile call over all its rows (channels_last_planes). Cases: 3x3 to
# 9x9 kernels (9 taps along the row: two tiles of taps), maps of 5x6 to 14x14 and rows of 20 and 28
# windows, no, asymmetric and wide padding, dilation across rows, kernels of one row or one column;
# 16 and 20 channels (a partial vector); channels-last and channels-first data (transposed as it is
# staged), as views too. Elsewhere they run row by row.
WHOLE_PLANE_CASES = {
    # name: (n, size, kernel, attributes)
    "7x7-map-3x3": (2, (7, 7), (3, 3), dict(pads_begin=1, pads_end=1)),
    "14x14-map-7x7": (2, (14, 14), (7, 7), dict(pads_begin=3, pads_end=3)),
    "20-windows-7x7": (1, (9, 20), (7, 7), dict(pads_begin=3, pads_end=3)),
    "28-windows-5x5": (1, (6, 28), (5, 5), dict(pads_begin=2, pads_end=2)),
    "asymmetric-5x5": (2, (10, 11), (5, 5), dict(pads_begin=(2, 1), pads_end=(0, 3))),
    "unpadded": (2, (9, 12), (3, 3), {}),
    "wide-padding": (2, (5, 6), (3, 3), dict(pads_begin=(3, 4), pads_end=(2, 5))),
    "dilated-rows": (2, (12, 10), (3, 3), dict(dilations=(2, 1), pads_begin=(2, 1), pads_end=(2, 1))),
    "one-row-kernel": (2, (6, 13), (1, 5), dict(pads_begin=(0, 2), pads_end=(0, 2))),
    "one-column-kernel": (2, (9, 8), (5, 1), dict(pads_begin=(2, 0), pads_end=(2, 0))),
    "9x9": (1, (11, 11), (9, 9), dict(pads_begin=4, pads_end=4)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("channels", [16, 20])
@pytest.mark.parametrize("data_format,view", [("NXC", "contiguous"), ("NXC", "channel-slice"),
                                              ("NCX", "contiguous"), ("NCX", "strided-rows")])
@pytest.mark.parametrize("case", list(WHOLE_PLANE_CASES))
def test_depthwise_whole_planes(case, data_format, view, channels, dtype):
    n, size, kernel, attributes = WHOLE_PLANE_CASES[case]
    if view == "strided-rows":
        x = rand(data_shape(n, channels, [*size[:-1], 2 * size[-1]], data_format), dtype, seed=77)[..., ::2]
    elif view == "channel-slice":
        x = rand(data_shape(n, 2 * channels, size, data_format), dtype, seed=77)[..., :channels]
    else:
        x = rand(data_shape(n, channels, size, data_format), dtype, seed=77)
    assert list(x.shape) == data_shape(n, channels, size, data_format)
    dy = rand(data_shape(n, channels, output_size(size, kernel, attributes), data_format), dtype, seed=78)
    attributes = dict(attributes, groups=channels, data_format=data_format, filter_format="OIX")
    result, ran = run("depthwise", x, dy, [channels, 1, *kernel], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [channels, 1, *kernel], **attributes), dtype)


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("column", [0, 6])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_depthwise_whole_planes_keep_non_finite_inputs_to_the_taps_that_read_them(
        value, column, data_format):
    """Whole planes multiply input pixels by the zeros after each row's windows, where a tap does not
    read them: an infinity or NaN in a row's first or last column (a 7x7 layer on 7x7 maps) meets
    there taps that never read it, so such calls run row by row, and only the taps that read it
    are infinite or NaN."""
    x = rand(data_shape(2, 16, (7, 7), data_format), torch.float32, seed=79)
    if data_format == "NCX":
        x[1, 3, 4, column] = value
    else:
        x[1, 4, column, 3] = value
    attributes = dict(pads_begin=3, pads_end=3, groups=16, data_format=data_format, filter_format="OIX")
    dy = rand(data_shape(2, 16, (7, 7), data_format), torch.float32, seed=80)
    result, ran = run("depthwise", x, dy, [16, 1, 7, 7], attributes)
    assert ran == "depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [16, 1, 7, 7], **attributes))


# Runs problems (a file) through an algorithm on copies of their tensors that an inaccessible page
# borders: each problem twice, the input's copy just after such a page and the output gradient's
# just before one, then the other way round. A load outside a tensor faults (the child dies).
GUARDED_CHILD = """
import ctypes, mmap, sys, torch, torch_convgrad
problems_file, outputs_file, algorithm = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
buffers = []

def guarded(t, side):
    page = mmap.PAGESIZE
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // page)
    buffer = mmap.mmap(-1, (pages + 2) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    assert libc.mprotect(base, page, 0) == 0 and libc.mprotect(base + (pages + 1) * page, page, 0) == 0
    offset = page if side == "start" else (pages + 1) * page - nbytes
    buffers.append(buffer)
    return torch.frombuffer(buffer, dtype=t.dtype, count=t.numel(), offset=offset).view(t.shape).copy_(t)

outputs = []
with torch_convgrad.use_algorithm(algorithm):
    for x, dy, shape, attributes in torch.load(problems_file):
        for x_side, dy_side in (("start", "end"), ("end", "start")):
            outputs.append(torch_convgrad.conv_backprop_filters(
                guarded(x, x_side), guarded(dy, dy_side), shape, **attributes))
            assert torch_convgrad.last_algorithm() == algorithm, torch_convgrad.last_algorithm()
torch.save(outputs, outputs_file)
"""


# Depthwise layers whose rows the kernels read in place, some reaching past a row's ends and masking
# what they load there (channels-first f32 and f16 rows at stride 1, bf16 at stride 2, a 1-D row;
# channels-last rows at stride 2), each tensor's first and last rows against an inaccessible page.
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guard pages by mprotect")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_depthwise_rows_read_in_place_stay_inside_their_tensors(dtype, tmp_path):
    problems = []
    for data_format, stride, size in [("NCX", 1, (12, 40)), ("NCX", 2, (12, 41)), ("NCX", 1, (401,)),
                                      ("NXC", 1, (7, 20)), ("NXC", 2, (7, 41))]:
        kernel = (3,) * len(size)
        attributes = dict(strides=stride, pads_begin=1, pads_end=1)
        x = rand(data_shape(2, 16, size, data_format), dtype, seed=75)
        dy = rand(data_shape(2, 16, output_size(size, kernel, attributes), data_format), dtype, seed=76)
        problems.append((x, dy, [16, 1, *kernel],
                         dict(attributes, groups=16, data_format=data_format, filter_format="OIX")))
    torch.save(problems, tmp_path / "problems.pt")
    child = subprocess.run([sys.executable, "-c", GUARDED_CHILD, str(tmp_path / "problems.pt"),
                            str(tmp_path / "outputs.pt"), "depthwise"], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    outputs = torch.load(tmp_path / "outputs.pt")
    assert len(outputs) == 2 * len(problems)
    for i, (x, dy, shape, attributes) in enumerate(problems):
        expected = REF.conv_backprop_filters(x, dy, shape, **attributes)
        for out in outputs[2 * i:2 * i + 2]:
            assert_matches_ref(out, expected, dtype)


# Runs problems (a file) through an algorithm under an ATen CPU capability.
CAPABILITY_CHILD = """
import sys, torch, torch_convgrad
problems_file, outputs_file, capability, algorithm = sys.argv[1:]
assert torch.backends.cpu.get_cpu_capability() == capability, torch.backends.cpu.get_cpu_capability()
outputs = []
with torch_convgrad.use_algorithm(algorithm):
    for x, dy, shape, attributes in torch.load(problems_file):
        outputs.append(torch_convgrad.conv_backprop_filters(x, dy, shape, **attributes))
        assert torch_convgrad.last_algorithm() == algorithm, torch_convgrad.last_algorithm()
torch.save(outputs, outputs_file)
"""


def check_under_capability(problems, capability, algorithm, tmp_path):
    """Runs ``problems`` through ``algorithm`` in a child process whose ATen CPU capability is
    ``capability`` (ATEN_CPU_CAPABILITY), and compares each result with the reference."""
    torch.save(problems, tmp_path / "problems.pt")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability.lower())
    child = subprocess.run([sys.executable, "-c", CAPABILITY_CHILD, str(tmp_path / "problems.pt"),
                            str(tmp_path / "outputs.pt"), capability, algorithm],
                           env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    for (x, dy, shape, attributes), out in zip(problems, torch.load(tmp_path / "outputs.pt")):
        assert_matches_ref(out, REF.conv_backprop_filters(x, dy, shape, **attributes), x.dtype)


@pytest.mark.parametrize("capability", [
    "DEFAULT",
    pytest.param("AVX2", marks=pytest.mark.skipif(not AVX512, reason="an AVX2 CPU runs the AVX2 build throughout"))])
def test_depthwise_kernels_of_other_capabilities(capability, tmp_path):
    """The builds this CPU does not run by itself, forced through ATen's capability in a child
    process: the portable one (CPUs without AVX2) and, on an AVX-512 CPU, the AVX2 one (which it
    runs only for groups of 8 channels and the channels-first kernel). Depthwise and groups of 4
    and 8 in both layouts, with a partial vector of lanes, stride 2 and stride 1 (4 windows at a
    time and the rest); bf16 depthwise, whose channels-first planes only the AVX-512 build sums on
    dot products."""
    problems = []
    for data_format in ("NXC", "NCX"):
        for channels, groups, dtype in ((37, 37, torch.float32), (36, 9, torch.bfloat16), (32, 4, torch.float16),
                                        (24, 24, torch.bfloat16)):
            for stride, size, out in ((2, (6, 9), (3, 5)), (1, (6, 11), (6, 11))):
                x = rand(data_shape(2, channels, size, data_format), dtype, seed=9)
                dy = rand(data_shape(2, channels, out, data_format), dtype, seed=10)
                problems.append((x, dy, [channels, channels // groups, 3, 3],
                                 dict(strides=stride, pads_begin=1, pads_end=[stride % 2, 1], groups=groups,
                                      data_format=data_format, filter_format="OIX")))
    check_under_capability(problems, capability, "depthwise", tmp_path)


@pytest.mark.parametrize("capability", [
    "DEFAULT",
    pytest.param("AVX2", marks=pytest.mark.skipif(not AVX512, reason="an AVX2 CPU runs the AVX2 build throughout"))])
def test_gemm_of_other_capabilities(capability, tmp_path):
    """gemm where this CPU would not run it so, forced through ATen's capability in a child process:
    BLAS alone (CPUs without AVX2: f16/bf16 converted as they are packed, or a block of samples at a
    time where BLAS reads them in place, 1x1 in both layouts) and, on an AVX-512 CPU, the fused
    kernel's AVX2 build (f32, f16 and bf16, channel counts that leave partial tiles of both builds),
    channels-first f32 rows long enough for whole blocks of the builds' transpositions, and a
    channels-first 1-D layer the fused kernel reads in place (f32, f16 and bf16)."""
    problems = []
    for data_format, dtype, channels, out_channels in (("NXC", torch.float32, 13, 21), ("NCX", torch.float16, 7, 40),
                                                         ("NXC", torch.bfloat16, 20, 9)):
        x = rand(data_shape(2, channels, (9, 7), data_format), dtype, seed=11)
        dy = rand(data_shape(2, out_channels, (5, 3), data_format), dtype, seed=12)
        problems.append((x, dy, [out_channels, channels, 3, 3],
                         dict(strides=2, pads_begin=1, pads_end=[1, 0], data_format=data_format,
                              filter_format="OIX")))
    for data_format, dtype in (("NXC", torch.float16), ("NCX", torch.bfloat16)):
        x = rand(data_shape(3, 12, (5, 6), data_format), dtype, seed=15)
        dy = rand(data_shape(3, 10, (5, 6), data_format), dtype, seed=16)
        problems.append((x, dy, [10, 12, 1, 1], dict(data_format=data_format, filter_format="OIX")))
    x = rand(data_shape(2, 20, (6, 19), "NCX"), torch.float32, seed=17)
    dy = rand(data_shape(2, 24, (6, 19), "NCX"), torch.float32, seed=18)
    problems.append((x, dy, [24, 20, 3, 3], dict(pads_begin=1, pads_end=1, data_format="NCX", filter_format="OIX")))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = rand(data_shape(2, 9, (43,), "NCX"), dtype, seed=19)
        dy = rand(data_shape(2, 20, (20,), "NCX"), dtype, seed=20)
        problems.append((x, dy, [20, 9, 4], dict(strides=2, data_format="NCX", filter_format="OIX")))
    check_under_capability(problems, capability, "gemm", tmp_path)


def test_an_algorithm_that_does_not_apply_leaves_the_problem_to_the_selector():
    # depthwise needs as many output as input channels (8 and 6 here), in groups of at most
    # 8; channels-last data needs no channels-last copy.
    assert run("depthwise", *dense_problem())[1] != "depthwise"
    assert run("aten_channels_last", *dense_problem("NXC"))[1] != "aten_channels_last"
    assert run("aten_channels_first", *dense_problem("NCX"))[1] != "aten_channels_first"
    # matmul reads windows in place: none may reach into the padding.
    assert run("matmul", *dense_problem())[1] != "matmul"
    assert run(None, *dense_problem())[1] in NAMES


def test_zeros_need_no_algorithm():
    x, dy, shape, attributes = dense_problem()
    out, ran = run("gemm", x[:0], dy[:0], shape, attributes)
    assert ran is None and out.abs().sum() == 0


def test_use_algorithm_nests_and_restores():
    problem = dense_problem()
    with torch_convgrad.use_algorithm("gemm"):
        with torch_convgrad.use_algorithm("aten"):
            assert run("aten", *problem)[1] == "aten"
        torch_convgrad.conv_backprop_filters(*problem[:3], **problem[3])
        assert torch_convgrad.last_algorithm() == "gemm"
        with torch_convgrad.use_algorithm(None):
            torch_convgrad.conv_backprop_filters(*problem[:3], **problem[3])
            chosen = torch_convgrad.last_algorithm()
    torch_convgrad.conv_backprop_filters(*problem[:3], **problem[3])
    assert torch_convgrad.last_algorithm() == chosen


def test_use_algorithm_rejects_unknown_names():
    with pytest.raises(ValueError, match="name: expected one of .*gemm.* got 'winograd'"):
        with torch_convgrad.use_algorithm("winograd"):
            pass


def _in_child(code, algorithm):
    env = dict(os.environ, TORCH_CONVGRAD_ALGORITHM=algorithm)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


CHILD = """
import torch, torch_convgrad
x, dy = torch.randn(2, 9, 9, 4), torch.randn(2, 9, 9, 4)
try:
    torch_convgrad.conv_backprop_filters(x, dy, [3, 3, 4, 4], pads_begin=1, pads_end=1)
    print("ran", torch_convgrad.last_algorithm())
except ValueError as error:
    print("ValueError", error)
"""


def test_environment_variable_forces_an_algorithm():
    assert _in_child(CHILD, "gemm").stdout.split() == ["ran", "gemm"]


def test_environment_variable_with_an_unknown_name_raises_on_first_call():
    out = _in_child(CHILD, "winograd").stdout
    assert out.startswith("ValueError TORCH_CONVGRAD_ALGORITHM: expected one of") and "'winograd'" in out, out


@pytest.mark.parametrize("algorithm", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_algorithm_is_deterministic(algorithm, dtype):
    takes = (torch.bfloat16,) if algorithm == "amx_depthwise" else (torch.bfloat16, torch.float16)
    if algorithm in ("brgemm", "amx_planes", "amx_depthwise") and (dtype not in takes or not runs_here(algorithm)):
        pytest.skip(f"{algorithm} runs {takes} where the CPU has its products")
    depthwise = algorithm.endswith("depthwise")
    sizes = dict(c=32) if depthwise else dict(n=4, c=32, o=32, size=(30, 28))
    problem = problem_for(algorithm, "NXC" if depthwise else "NCX", dtype, **sizes)
    with torch_convgrad.use_algorithm(algorithm):
        first = torch_convgrad.conv_backprop_filters(*problem[:3], **problem[3])
        assert torch_convgrad.last_algorithm() == algorithm
        for _ in range(3):
            assert torch.equal(torch_convgrad.conv_backprop_filters(*problem[:3], **problem[3]), first)


def partial_sums_problem(algorithm, data_format, dtype, filter_format):
    """A problem whose channel counts leave part tiles of finish_sum's 16 (x, dy, shape, attributes)."""
    if algorithm == "brgemm" and data_format == "NXC":  # brgemm's rows, each window's 2 taps along W side by side
        x, dy = rand(data_shape(3, 20, (8, 6), "NXC"), dtype, seed=5), rand(data_shape(3, 35, (4, 3), "NXC"), dtype, seed=6)
        shape, attributes = [35, 20, 2, 2], dict(strides=2, data_format="NXC", filter_format="OIX")
    else:
        sizes = dict(c=37) if algorithm.endswith("depthwise") else dict(n=3, c=20, o=35)
        x, dy, shape, attributes = problem_for(algorithm, data_format, dtype, **sizes)
    o, c, *kernel = shape
    shape = shape if filter_format == "OIX" else kernel + [c, o]
    return x, dy, shape, dict(attributes, filter_format=filter_format)


# Algorithms that keep partial sums (a thread's, a group of samples') add
# them, convert them and lay them out in the requested format in one pass
# (Problem::finish_sum), in tiles of 16 channels: channel counts that leave
# part tiles, both formats, the partials of two threads.
@pytest.mark.parametrize("filter_format", ["OIX", "XIO"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("algorithm,dtype", [
    ("gemm", torch.float32), ("gemm", torch.float64), ("gemm", torch.bfloat16), ("direct", torch.float32),
    ("depthwise", torch.float32), ("depthwise", torch.float64), ("depthwise", torch.float16),
    ("brgemm", torch.bfloat16), ("brgemm", torch.float16), ("amx_planes", torch.bfloat16),
    ("amx_depthwise", torch.bfloat16), ("aten", torch.bfloat16)], ids=str)
def test_partial_sums_are_added_into_every_format(algorithm, dtype, data_format, filter_format):
    if not runs_here(algorithm):
        pytest.skip(f"{algorithm} does not run on this CPU")
    x, dy, shape, attributes = partial_sums_problem(algorithm, data_format, dtype, filter_format)
    with setting(torch.get_num_threads, torch.set_num_threads, 2):
        out, ran = run(algorithm, x, dy, shape, attributes)
    assert ran == algorithm
    assert out.shape == tuple(shape) and out.is_contiguous() and out.dtype == dtype
    assert_matches_ref(out, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


@pytest.mark.parametrize("filter_format", ["OIX", "XIO"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("algorithm", ["gemm", "depthwise", "brgemm", "amx_planes", "amx_depthwise"])
def test_low_precision_partial_sums_round_to_nearest_even(algorithm, dtype, data_format, filter_format):
    """Small integers, whose products and sums float32 holds exactly in any order: the f16 or bf16
    weight gradient must be the exact sums rounded to nearest even, as torch rounds float32, bit for
    bit (sums of up to a few thousand, many of them halfway between two bf16 values). Two threads' partial
    sums are added, converted and laid out in finish_sum's tiles."""
    if not runs_here(algorithm) or (algorithm == "amx_depthwise" and dtype == torch.float16):
        pytest.skip(f"{algorithm} does not run {dtype} on this CPU")
    x, dy, shape, attributes = partial_sums_problem(algorithm, data_format, dtype, filter_format)
    integers = lambda t, seed: torch.randint(-12, 13, t.shape, generator=torch.Generator().manual_seed(seed)).to(t)
    x, dy = integers(x, 11), integers(dy, 12)
    with setting(torch.get_num_threads, torch.set_num_threads, 2):
        out, ran = run(algorithm, x, dy, shape, attributes)
    assert ran == algorithm
    exact = REF.conv_backprop_filters(x.double(), dy.double(), shape, **attributes)
    assert exact.abs().max() < 2 ** 24 and exact.abs().max() > 512
    assert torch.equal(out, exact.float().to(dtype))


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
def test_partial_sums_of_threads_left_without_work():
    """One sample of a 1x1 layer is one unit of brgemm's work: of two threads' partial sums, one is never
    taken, and must add nothing."""
    x, dy = rand((1, 24, 5, 6), torch.bfloat16, seed=9), rand((1, 40, 5, 6), torch.bfloat16, seed=10)
    attributes = dict(data_format="NCX", filter_format="OIX")
    with setting(torch.get_num_threads, torch.set_num_threads, 2):
        for _ in range(3):  # a part's memory may hold an earlier call's sums
            out, ran = run("brgemm", x, dy, [40, 24, 1, 1], attributes)
            assert ran == "brgemm"
            assert_matches_ref(out, REF.conv_backprop_filters(x, dy, [40, 24, 1, 1], **attributes), torch.bfloat16)


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_the_selector_avoids_slow_paths(data_format):
    """Choices measured on the calibrated CPUs: the dedicated kernel for small depthwise problems
    and groups of a few channels (33 us against ATen's 134 on Zen 3, 45 against 77 on Sapphire
    Rapids), and GEMMs for wide 1x1 problems on NCX data (a plain product per sample, which ATen
    computes through its convolution machinery; on NXC data ATen's is a plain product too), but
    on the Zen 5, where MKL's products run AVX2 code and oneDNN's are faster (ZEN5_PICKS). For
    a tiny problem whose accumulator is already the requested XIO layout, the direct loops where
    oneDNN runs AVX2 kernels (28 us against 36), and ATen where it runs AVX-512 ones (22 against
    29 on Sapphire Rapids; on Zen 4 the two tie at 30)."""
    assert run(None, *depthwise_problem(data_format, c=64, size=(32, 32)))[1] == "depthwise"
    assert run(None, *depthwise_problem(data_format, c=8, size=(8, 8)))[1] == "depthwise"
    if data_format == "NXC":
        x, dy = rand([1, 8, 8, 8], seed=5), rand([1, 8, 8, 16], seed=6)
        assert run(None, x, dy, [3, 3, 8, 16], dict(pads_begin=1, pads_end=1, data_format="NXC",
                                                    filter_format="XIO"))[1] == ("aten" if AVX512 else "direct")
    if data_format == "NCX" and CALIBRATION != "avx512_bf16_wide":  # the Zen 5's: ZEN5_PICKS
        x, dy = rand([8, 256, 14, 14], seed=5), rand([8, 256, 14, 14], seed=6)
        assert run(None, x, dy, [256, 256, 1, 1], dict(data_format="NCX", filter_format="OIX"))[1] == "gemm"


@pytest.mark.skipif(not AMX, reason="the calibration of AVX-512 CPUs with AMX")
@pytest.mark.parametrize("c,size,expected", [(64, 56, "aten"), (1024, 14, "gemm")])
def test_f32_1x1_channels_last_picks(c, size, expected):
    """ResNet-50's channels-last 1x1 layers in f32: oneDNN ran the 64 -> 256 one at 140-150
    GMAC/s, faster than gemm, and the 1024 -> 256 one at 118-120, where gemm ran 1.07-1.12 times
    as fast (Sapphire Rapids, 2 threads)."""
    x, dy = rand(data_shape(8, c, (size, size), "NXC"), seed=5), rand(data_shape(8, 256, (size, size), "NXC"), seed=6)
    assert run(None, x, dy, [256, c, 1, 1], dict(data_format="NXC", filter_format="OIX"))[1] == expected


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="the fused kernel runs on AVX2 and AVX-512 CPUs")
def test_gemm_multiplies_f32_channels_last_1x1_where_it_measured_faster():
    """gemm hands f32 channels-last 1x1 products, both operands read in place, to BLAS on the
    Sapphire Rapids calibration (MKL 1.07-1.23x as fast as the fused kernel there) and to the
    fused kernel elsewhere (on Zen 4 MKL ran 64 -> 256 at 0.8-0.85x of it)."""
    x, dy = rand(data_shape(2, 64, (8, 8), "NXC"), seed=5), rand(data_shape(2, 256, (8, 8), "NXC"), seed=6)
    with torch.profiler.profile() as profile:
        ran = run("gemm", x, dy, [256, 64, 1, 1], dict(data_format="NXC", filter_format="OIX"))[1]
    blas = any(event.name in ("aten::mm", "aten::addmm", "aten::addmm_") for event in profile.events())
    assert ran == "gemm" and blas == AMX


@pytest.mark.skipif(not (AMX or AVX512_BF16),
                    reason="needs a CPU with AMX or AVX-512 BF16")
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_bf16_goes_to_onednn_where_the_cpu_multiplies_bf16(data_format):
    """With AMX, oneDNN's bf16 weight gradient ran at 440-920 GMAC/s where the gemm algorithm
    ran at 80 (Sapphire Rapids); with AVX-512 BF16 at 155-205 against gemm's 76-85 (Zen 4)."""
    x = rand(data_shape(8, 64, (28, 28), data_format), torch.bfloat16, seed=5)
    dy = rand(data_shape(8, 64, (28, 28), data_format), torch.bfloat16, seed=6)
    attributes = dict(pads_begin=1, pads_end=1, data_format=data_format, filter_format="OIX")
    assert run(None, x, dy, [64, 64, 3, 3], attributes)[1] == "aten"


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_aten_gets_float32_copies_of_f16_on_cpu(data_format, dtype):
    """oneDNN's f16 weight gradient ran at 0.1-0.4 GMAC/s on a Sapphire Rapids (AVX-512 FP16),
    300 to 1000 times slower than on float32 copies, so ATen is handed those on every CPU; bf16
    too where the CPU has no bf16 products (AVX-512 BF16 or AMX), whose emulation ran at a fifth
    to a half of the float32 rate on a Cascade Lake."""
    x = rand(data_shape(2, 8, (8, 8), data_format), dtype, seed=5)
    dy = rand(data_shape(2, 8, (8, 8), data_format), dtype, seed=6)
    attributes = dict(pads_begin=1, pads_end=1, data_format=data_format, filter_format="OIX")
    with torch.profiler.profile(record_shapes=True) as profile:
        out, ran = run("aten", x, dy, [8, 8, 3, 3], attributes)
    assert ran == "aten" and out.dtype == dtype
    assert_matches_ref(out, REF.conv_backprop_filters(x, dy, [8, 8, 3, 3], **attributes), dtype)
    # The profiler's raw events: FunctionEvent.input_dtypes is newer than torch 2.11.
    calls = [event.dtypes() for event in profile.profiler.kineto_results.events()
             if event.name() == "aten::convolution_backward"]
    native = dtype == torch.bfloat16 and (AVX512_BF16 or AMX)
    assert len(calls) == 1 and calls[0][:3] == ["c10::BFloat16" if native else "float"] * 3, calls


# brgemm reads one operand in place (the output gradient, or the input of a 1x1
# stride-1 layer when it has more channels) and gathers the other per tap. The
# cases cover both roles, B read in place and staged (padding, strides,
# dilation, an odd count of positions, whose last one lies outside the bf16
# pairs), several panels of positions, blocks of channels with edges, one
# sample, and 1-D and 3-D. amx_planes reads the input from phase planes, B
# read in place or staged at wide positions: the same cases make planes with
# and without padding, phases of strides 2 and 3, dilated taps that skip
# phases, a stride of 33 (gathered an element at a time on AVX-512), odd
# wide rows, and taps split into groups for one sample.
BRGEMM_CASES = {
    "dy-A-x-in-place": (3, 8, 24, (8, 8), (1, 1), {}),
    "x-A-dy-in-place": (3, 24, 8, (8, 8), (1, 1), {}),
    "x-A-odd-positions": (2, 130, 70, (33, 31), (1, 1), {}),
    "dy-A-odd-positions": (2, 6, 140, (7, 9), (1, 1), {}),
    "stride-2-1x1": (4, 64, 32, (14, 14), (1, 1), dict(strides=2)),
    "kernel-equals-stride": (2, 16, 8, (12, 14), (2, 2), dict(strides=2)),
    "pads-dilation": (2, 3, 70, (20, 30), (3, 2), dict(strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1),
                                                       dilations=(2, 1))),
    "1-D": (3, 33, 65, (37,), (5,), dict(strides=3, pads_begin=4, pads_end=2, dilations=2)),
    "1-D-stride-33": (2, 5, 7, (200,), (40,), dict(strides=33, pads_begin=3)),
    "3-D-one-sample": (1, 4, 6, (5, 6, 7), (3, 3, 3), dict(pads_begin=1, pads_end=1)),
    "three-panels": (1, 16, 16, (4100,), (1,), {}),
}


@pytest.mark.parametrize("algorithm", ["brgemm", "amx_planes"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(BRGEMM_CASES))
def test_brgemm_algorithms(case, algorithm, dtype):
    if not runs_here(algorithm):
        pytest.skip(f"{algorithm} does not run on this CPU")
    n, c, o, size, kernel, attributes = BRGEMM_CASES[case]
    out = output_size(size, kernel, attributes)
    x = rand(data_shape(n, c, size, "NCX"), dtype, seed=7)
    dy = rand(data_shape(n, o, out, "NCX"), dtype, seed=8)
    attributes = dict(attributes, data_format="NCX", filter_format="OIX")
    result, ran = run(algorithm, x, dy, [o, c, *kernel], attributes)
    assert ran == algorithm
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [o, c, *kernel], **attributes), dtype)


# Channels-last 1x1 layers (stride 1, unpadded) on brgemm: both operands are
# (samples x positions) x channels matrices of rows; the one with fewer
# channels is transposed panel by panel (1024 rows), the other's pairs of rows
# interleaved. Few panels split B's columns between the threads instead.
BRGEMM_ROWS_CASES = {
    # name: (n, c, o, size, slice the input's channels)
    "x-A-one-panel": (3, 8, 24, (8, 8), False),
    "dy-A-one-panel": (3, 24, 8, (8, 8), False),
    "odd-rows": (1, 20, 40, (7, 9), False),
    "panels": (2, 70, 130, (33, 31), False),
    "odd-rows-panels": (1, 16, 48, (4101,), False),
    "wide-columns-split": (2, 300, 40, (20, 30), False),
    "sliced-channels": (2, 24, 40, (9, 10), True),
    "3-D": (2, 12, 20, (3, 4, 5), False),
}


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(BRGEMM_ROWS_CASES))
def test_brgemm_multiplies_channels_last_rows(case, dtype):
    n, c, o, size, sliced = BRGEMM_ROWS_CASES[case]
    x = rand(data_shape(n, c + 6 if sliced else c, size, "NXC"), dtype, seed=19)
    if sliced:  # rows 6 channels longer than they hold
        x = x[..., 3:c + 3]
    dy = rand(data_shape(n, o, size, "NXC"), dtype, seed=20)
    shape = [o, c] + [1] * len(size)
    attributes = dict(data_format="NXC", filter_format="OIX")
    result, ran = run("brgemm", x, dy, shape, attributes)
    assert ran == "brgemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# 1-D layers whose windows read no padding, dilation 1: brgemm folds the taps
# into B's rows (window j reads K * C contiguous channels-last elements; a
# channels-first input is transposed a sample at a time), A is the output
# gradient (in place channels-first, transposed channels-last). An odd count
# of windows, several panels a sample, B's columns in blocks of 512, columns
# split between the threads, and a 1-wide strided kernel.
BRGEMM_FOLDED_CASES = {
    # name: (n, c, o, length, kernel, stride)
    "front-end": (2, 8, 12, 203, 10, 5),
    "odd-windows": (2, 5, 7, 203, 4, 3),
    "panels": (3, 8, 70, 2100, 3, 2),
    "column-blocks": (4, 200, 16, 3000, 3, 1),
    "split-columns": (1, 600, 40, 50, 3, 1),
    "1-wide-strided": (2, 6, 9, 31, 1, 2),
}


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("case", list(BRGEMM_FOLDED_CASES))
def test_brgemm_folds_the_taps_of_1d_windows(case, data_format, dtype):
    n, c, o, length, kernel, stride = BRGEMM_FOLDED_CASES[case]
    windows = (length - kernel) // stride + 1
    x = rand(data_shape(n, c, (length,), data_format), dtype, seed=27)
    dy = rand(data_shape(n, o, (windows,), data_format), dtype, seed=28)
    shape = [o, c, kernel]
    attributes = dict(strides=stride, data_format=data_format, filter_format="OIX")
    result, ran = run("brgemm", x, dy, shape, attributes)
    assert ran == "brgemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, shape, **attributes), dtype)


# Windows over several output rows whose last axis reads no padding, dilation
# 1: brgemm folds that axis's taps into B's rows and multiplies every tap of the
# other axes by the same A, B's rows gathered by address (zeros where a window
# lies in the padding of the first axes). Every pair of layouts: a
# channels-first input is transposed a sample at a time, a channels-last
# output gradient a panel at a time. Rows with an odd count of positions
# (pairs straddle them), several panels a sample, B's columns in blocks of
# 512, columns split between the threads, a strided 1x1 layer, and 3-D.
BRGEMM_WINDOW_CASES = {
    # name: (n, c, o, size, kernel, attributes)
    "kernel-equals-stride": (2, 16, 24, (12, 14), (2, 2), dict(strides=2)),
    "strided-1x1": (3, 40, 24, (13, 14), (1, 1), dict(strides=2)),
    "padded-dilated-outer-axis": (2, 8, 12, (9, 20), (3, 4), dict(strides=(2, 3), pads_begin=(2, 0),
                                                                  pads_end=(1, 0), dilations=(2, 1))),
    "odd-rows": (2, 6, 10, (7, 15), (2, 3), dict(strides=(1, 2))),
    "odd-positions-padded-rows": (2, 6, 10, (7, 15), (3, 3), dict(strides=(1, 2), pads_begin=(1, 0),
                                                                  pads_end=(1, 0))),
    "panels": (1, 8, 16, (40, 60), (2, 2), dict(strides=(1, 2))),
    "column-blocks": (2, 300, 16, (6, 8), (2, 2), dict(strides=2)),
    "split-columns": (1, 300, 40, (4, 6), (1, 3), dict(strides=(1, 3))),
    "3-D": (2, 6, 8, (4, 6, 8), (2, 2, 2), dict(strides=2, pads_begin=(1, 0, 0), pads_end=(1, 0, 0))),
}


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
@pytest.mark.parametrize("layouts", [("channels_last", "channels_last"), ("contiguous", "channels_last"),
                                     ("channels_last", "contiguous"), ("contiguous", "contiguous")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(BRGEMM_WINDOW_CASES))
def test_brgemm_folds_the_last_axis_of_windows(case, layouts, dtype):
    n, c, o, size, kernel, attributes = BRGEMM_WINDOW_CASES[case]
    out = output_size(size, kernel, attributes)
    x = rand(data_shape(n, c, size, "NCX"), dtype, seed=31, layout=layouts[0])
    dy = rand(data_shape(n, o, out, "NCX"), dtype, seed=32, layout=layouts[1])
    attributes = dict(attributes, data_format="NCX", filter_format="OIX")
    result, ran = run("brgemm", x, dy, [o, c, *kernel], attributes)
    assert ran == "brgemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [o, c, *kernel], **attributes), dtype)


# brgemm and amx_planes multiply f16 on bf16 products as high and low bf16
# parts (three exact products). Inputs whose bf16 rounding is biased (1 + j/128 + 3/1024:
# every one rounds down by 3/1024) show a dropped low part as an error of
# about 0.3%, where the float64 reference rounded once to f16 is within 0.05%
# (positive terms, no cancellation). Every path: channels-last 1x1 rows, the
# output gradient in place (channels-first 1x1), a staged gather (padded 3x3),
# folded windows both layouts, and an odd count of positions.
BRGEMM_F16_CASES = {
    # name: (data_format, n, c, o, size, kernel, attributes)
    "rows": ("NXC", 2, 24, 40, (9, 10), (1, 1), {}),
    "in-place": ("NCX", 2, 24, 40, (9, 10), (1, 1), {}),
    "staged": ("NCX", 2, 8, 12, (9, 10), (3, 3), dict(pads_begin=1, pads_end=1)),
    "windows-NXC": ("NXC", 2, 16, 24, (12, 14), (2, 2), dict(strides=2)),
    "windows-NCX": ("NCX", 2, 16, 24, (12, 14), (2, 2), dict(strides=2)),
    "odd-positions": ("NCX", 1, 20, 30, (7, 9), (1, 1), {}),
}


def biased_half(shape, seed):
    j = torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(seed))
    return (1 + j / 128 + 3 / 1024).to(torch.float16)


@pytest.mark.parametrize("algorithm", ["brgemm", "amx_planes"])
@pytest.mark.parametrize("case", list(BRGEMM_F16_CASES))
def test_brgemm_products_multiply_f16_to_its_last_bit(case, algorithm):
    if not runs_here(algorithm):
        pytest.skip(f"{algorithm} does not run on this CPU")
    data_format, n, c, o, size, kernel, attributes = BRGEMM_F16_CASES[case]
    out = output_size(size, kernel, attributes)
    x = biased_half(data_shape(n, c, size, data_format), 35)
    dy = biased_half(data_shape(n, o, out, data_format), 36)
    attributes = dict(attributes, data_format=data_format, filter_format="OIX")
    result, ran = run(algorithm, x, dy, [o, c, *kernel], attributes)
    assert ran == algorithm
    expected = REF.conv_backprop_filters(x, dy, [o, c, *kernel], **attributes)
    error = lambda got: ((got.double() - expected).abs() / expected.abs()).max().item()
    assert error(result) < 6e-4
    # The same inputs rounded to bf16 first miss by far more.
    rounded = REF.conv_backprop_filters(x.bfloat16().double(), dy.bfloat16().double(), [o, c, *kernel], **attributes)
    assert error(rounded) > 2e-3


@pytest.mark.parametrize("algorithm", ["brgemm", "amx_planes"])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("holder", ["x", "dy"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_brgemm_products_keep_non_finite_f16(value, holder, data_format, algorithm):
    """An infinity's or NaN's low part is NaN, so such f16 calls run ATen: infinities and NaN
    where the reference has them (only an infinity tells; a NaN gives NaN either way). In either
    operand: A's rows and B's panels are split on different paths."""
    if not runs_here(algorithm):
        pytest.skip(f"{algorithm} does not run on this CPU")
    x = rand(data_shape(2, 8, (6, 7), data_format), torch.float16, seed=37).abs()
    dy = rand(data_shape(2, 12, (6, 7), data_format), torch.float16, seed=38).abs()
    (x if holder == "x" else dy)[(0, 3) if data_format == "NCX" else (0, 0, 0, 3)] = value
    attributes = dict(data_format=data_format, filter_format="OIX")
    result, ran = run(algorithm, x, dy, [12, 8, 1, 1], attributes)
    assert ran == algorithm
    expected = REF.conv_backprop_filters(x, dy, [12, 8, 1, 1], **attributes)
    assert_non_finite_where_expected(result, expected)


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_f16_1x1_goes_to_brgemm(data_format):
    """ResNet-50's 1x1 64 -> 256 layer in f16 ran 1.4-1.7x faster on brgemm's split products than on
    gemm's float32 conversion (Sapphire Rapids, 2 threads)."""
    x = rand(data_shape(8, 64, (56, 56), data_format), torch.float16, seed=39)
    dy = rand(data_shape(8, 256, (56, 56), data_format), torch.float16, seed=40)
    _, ran = run(None, x, dy, [256, 64, 1, 1], dict(data_format=data_format, filter_format="OIX"))
    assert ran == "brgemm"


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_bf16_transposed_2x2_goes_to_brgemm(data_format):
    """U-Net's transposed 2x2 layer in bf16 ran 1.2x faster on brgemm's windows than in oneDNN
    channels-last (0.48 ms against 0.58) and than on amx_planes channels-first (0.48-0.49 against
    0.56-0.59), Sapphire Rapids, 2 threads. Channels-first, brgemm stages each sample's 0.4 MB of
    input channels-last, which L2 keeps."""
    x = rand(data_shape(8, 128, (28, 28), data_format), torch.bfloat16, seed=33)
    dy = rand(data_shape(8, 64, (56, 56), data_format), torch.bfloat16, seed=34)
    with torch_convgrad.use_algorithm(None):
        torch_convgrad.conv_transpose_backprop_filters(x, dy, [128, 64, 2, 2], strides=2, data_format=data_format,
                                                       filter_format="IOX")
        assert torch_convgrad.last_algorithm() == "brgemm"


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_bf16_1d_front_end_goes_to_brgemm(data_format):
    x = rand(data_shape(4, 32, (16000,), data_format), torch.bfloat16, seed=29)
    dy = rand(data_shape(4, 64, (3199,), data_format), torch.bfloat16, seed=30)
    _, ran = run(None, x, dy, [64, 32, 10], dict(strides=5, data_format=data_format, filter_format="OIX"))
    assert ran == "brgemm"


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("c,o,size", [(64, 256, 56), (1024, 256, 14)])
def test_bf16_1x1_channels_last_goes_to_brgemm(c, o, size):
    """ResNet-50's channels-last 1x1 layers in bf16 ran 1.2-1.5x faster on brgemm's rows path than in
    oneDNN (Sapphire Rapids, 2 threads)."""
    x = rand(data_shape(8, c, (size, size), "NXC"), torch.bfloat16, seed=21)
    dy = rand(data_shape(8, o, (size, size), "NXC"), torch.bfloat16, seed=22)
    _, ran = run(None, x, dy, [o, c, 1, 1], dict(data_format="NXC", filter_format="OIX"))
    assert ran == "brgemm"


def assert_non_finite_where_expected(result, expected):
    """Infinities and NaN exactly where the reference has them (some taps finite), the rest close."""
    assert torch.equal(result.isfinite(), expected.isfinite())
    assert torch.equal(result.isnan(), expected.isnan())
    assert result.isfinite().sum() > 0
    finite = expected.isfinite()
    assert_matches_ref(torch.where(finite, result, 0), torch.where(finite, expected, 0), torch.bfloat16)


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("size, element", [((6, 8), (0, 1, 0, 7)), ((20, 30), (0, 0, 0, 0)),
                                           ((20, 30), (1, 2, 19, 29)), ((20, 30), (1, 1, 0, 17))])
def test_amx_planes_keeps_non_finite_inputs_to_the_taps_that_read_them(value, size, element):
    """amx_planes multiplies input elements by zero at wide positions that are not outputs. An
    infinity there must not put NaN into taps whose windows never read it (an element of the
    first or last row or column is read by some taps only: x[..., 0, 7] of a 6 x 8 input only by
    the last column), so such calls run ATen. The check for them reads every sample's planes in
    vectors: the elements here lie at their start, end and inside, in either sample."""
    x = rand([2, 3, *size], torch.bfloat16, seed=9)
    x[element] = value
    dy = rand([2, 4, *size], torch.bfloat16, seed=10)
    attributes = dict(pads_begin=1, pads_end=1, data_format="NCX", filter_format="OIX")
    result, _ = run("amx_planes", x, dy, [4, 3, 3, 3], attributes)
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [4, 3, 3, 3], **attributes))


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
def test_amx_planes_of_the_portable_build(tmp_path):
    """amx_planes under ATEN_CPU_CAPABILITY=default, where its phase planes are gathered (and f16
    split) by the portable build: strides 2 and 3 with padding."""
    problems = []
    for stride, size, dtype in ((2, (9, 12), torch.bfloat16), (3, (10, 8), torch.bfloat16),
                                (2, (9, 12), torch.float16)):
        out = [(s + 2 - 3) // stride + 1 for s in size]
        x = rand(data_shape(2, 6, size, "NCX"), dtype, seed=11)
        dy = rand(data_shape(2, 5, out, "NCX"), dtype, seed=12)
        problems.append((x, dy, [5, 6, 3, 3], dict(strides=stride, pads_begin=1, pads_end=1, data_format="NCX",
                                                    filter_format="OIX")))
    check_under_capability(problems, "DEFAULT", "amx_planes", tmp_path)


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
def test_brgemm_rows_of_the_portable_build(tmp_path):
    """brgemm's rows path under ATEN_CPU_CAPABILITY=default, where the portable build transposes A's
    panels (and channels-first 1-D inputs), interleaves B's pairs of rows and splits f16: channels-last
    1x1 layers with both operand roles and an odd row, and 1-D layers with folded taps."""
    problems = []
    for c, o in ((10, 36), (36, 10)):
        x = rand(data_shape(3, c, (5, 7), "NXC"), torch.bfloat16, seed=23)
        dy = rand(data_shape(3, o, (5, 7), "NXC"), torch.bfloat16, seed=24)
        problems.append((x, dy, [o, c, 1, 1], dict(data_format="NXC", filter_format="OIX")))
    for data_format in ("NXC", "NCX"):
        for dtype in (torch.bfloat16, torch.float16):
            x = rand(data_shape(2, 9, (60,), data_format), dtype, seed=31)
            dy = rand(data_shape(2, 11, (19,), data_format), dtype, seed=32)
            problems.append((x, dy, [11, 9, 6], dict(strides=3, data_format=data_format, filter_format="OIX")))
    check_under_capability(problems, "DEFAULT", "brgemm", tmp_path)


@pytest.mark.skipif(not BRGEMM, reason="needs ATen's brgemm on AMX tiles or AVX-512 BF16")
@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_brgemm_gathers_an_output_gradient_it_cannot_read_in_place(layout):
    """A 1x1 layer's input read in place as A, the output gradient as B from a layout whose
    positions do not flatten (its channel stride even): B must be gathered, not read as rows."""
    x = rand([2, 8, 6, 6], torch.bfloat16, seed=9)
    dy = rand([2, 4, 6, 6], torch.bfloat16, seed=10, layout=layout)
    attributes = dict(data_format="NCX", filter_format="OIX")
    result, ran = run("brgemm", x, dy, [4, 8, 1, 1], attributes)
    assert ran == "brgemm"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [4, 8, 1, 1], **attributes), torch.bfloat16)


# amx_depthwise multiplies the kernel's rows plus one of the input by 8 taps
# along the row, for each of a pair of output rows, over chunks of 32
# positions of the padded row, B read from each output gradient row written
# as overlapping pairs. The cases cover an odd count of output rows (a pair
# with one of them), odd positions, several chunks of a row (the last one's
# pairs reaching past the row), the largest kernel (15 rows, 8 taps along the
# row), asymmetric, one-sided and more-than-the-kernel padding, 1-D, and 3-D
# with a one-deep kernel (planes of depth). Channels-last data is transposed
# 32 channels and 16 pixels at a time: 40 channels leave a partial block, 36
# channels on rows of 40 pixels whole blocks and partial ones. Output rows of
# about 24 positions or more (two chunks: 40) go straight into their pair rows
# ("chunks", "wide-padding", "whole-blocks", "one-tap-rows", "8-taps-wide",
# "3-D-wide", "2-taps-wide", "long-right-padding"), each pair row from two
# blocks of 16 pixels whose offset depends on the taps along the row (0 for
# one tap, 15 for two: the extremes; 9 for eight), reading only the pixels the
# last pair row takes (a right padding long enough to leave some unread);
# narrower ones through planes.
AMX_DEPTHWISE_CASES = {
    # name: (n, c, size, kernel, attributes)
    "convnext-7x7": (2, 40, (13, 11), (7, 7), dict(pads_begin=3, pads_end=3)),
    "odd-rows-and-positions": (3, 8, (9, 15), (3, 5), dict(pads_begin=(1, 2), pads_end=(1, 2))),
    "chunks": (2, 6, (4, 70), (2, 3), dict(pads_begin=(0, 1), pads_end=(1, 1))),
    "kernel-15x8": (2, 5, (17, 9), (15, 8), dict(pads_begin=(7, 4), pads_end=(7, 3))),
    "wide-padding": (2, 7, (6, 40), (3, 4), dict(pads_begin=(1, 5), pads_end=(0, 6))),
    "whole-blocks": (3, 36, (5, 40), (3, 3), dict(pads_begin=1, pads_end=1)),
    "no-padding": (2, 33, (12, 12), (5, 5), {}),
    "1-D": (3, 12, (37,), (8,), dict(pads_begin=3, pads_end=1)),
    "3-D-one-deep": (2, 9, (3, 6, 7), (1, 3, 3), dict(pads_begin=(0, 1, 1), pads_end=(0, 1, 1))),
    "one-tap-rows": (2, 5, (6, 40), (3, 1), dict(pads_begin=(1, 0), pads_end=(1, 0))),
    "8-taps-wide": (2, 3, (5, 50), (2, 8), dict(pads_begin=(0, 4), pads_end=(1, 3))),
    "3-D-wide": (2, 35, (2, 5, 40), (1, 3, 3), dict(pads_begin=(0, 1, 1), pads_end=(0, 1, 1))),
    "2-taps-wide": (2, 5, (4, 40), (3, 2), dict(pads_begin=(1, 0), pads_end=(1, 1))),
    "long-right-padding": (2, 4, (4, 30), (3, 3), dict(pads_begin=1, pads_end=(1, 40))),
}


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("layout", ["NCX", "NXC", "NCX-sliced", "NXC-sliced"])
@pytest.mark.parametrize("case", list(AMX_DEPTHWISE_CASES))
def test_amx_depthwise(case, layout):
    n, c, size, kernel, attributes = AMX_DEPTHWISE_CASES[case]
    rank = len(size)
    out = output_size(size, kernel, attributes)
    data_format = layout[:3]
    if layout.endswith("sliced"):  # every other row of a twice-as-tall input: rows apart
        tall = (*size[:-2], 2 * size[-2], size[-1]) if rank > 1 else size
        x = rand(data_shape(n, c, tall, data_format), torch.bfloat16, seed=41)
        x = x[..., ::2, :, :] if data_format == "NXC" else x[..., ::2, :]
        if rank == 1:
            x = rand(data_shape(n, 2 * c, size, data_format), torch.bfloat16, seed=41)
            x = x[..., ::2] if data_format == "NXC" else x[:, ::2]
    else:
        x = rand(data_shape(n, c, size, data_format), torch.bfloat16, seed=41)
    dy = rand(data_shape(n, c, out, data_format), torch.bfloat16, seed=42)
    attributes = dict(attributes, groups=c, data_format=data_format, filter_format="OIX")
    result, ran = run("amx_depthwise", x, dy, [c, 1, *kernel], attributes)
    # A channel-sliced channels-last input has neither unit channel nor unit pixel stride.
    assert ran == ("depthwise" if layout == "NXC-sliced" and rank == 1 else "amx_depthwise")
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [c, 1, *kernel], **attributes), torch.bfloat16)


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_amx_depthwise_keeps_non_finite_inputs_to_the_taps_that_read_them(value, data_format):
    """amx_depthwise multiplies the input's rows by zeros of the output gradient outside its plane,
    which turns an infinity or NaN into NaN in taps that never read it; such calls are recomputed
    by ATen. The last pixel of the first row is read only by the last two taps along the row, by
    the first two rows of taps."""
    x = rand(data_shape(2, 3, (6, 9), data_format), torch.bfloat16, seed=43)
    if data_format == "NCX":
        x[0, 1, 0, 8] = value
    else:
        x[0, 0, 8, 1] = value
    dy = rand(data_shape(2, 3, (6, 9), data_format), torch.bfloat16, seed=44)
    attributes = dict(pads_begin=1, pads_end=1, groups=3, data_format=data_format, filter_format="OIX")
    result, ran = run("amx_depthwise", x, dy, [3, 1, 3, 3], attributes)
    assert ran == "amx_depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [3, 1, 3, 3], **attributes))


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_amx_depthwise_spreads_non_finite_gradients_as_the_reference(value, data_format):
    """An infinity or NaN in the output gradient meets the input's zero padding on every side, as
    in the reference: here at a corner, so the taps whose windows reach the padding there turn
    NaN and the others infinite or NaN as they read finite inputs."""
    x = rand(data_shape(2, 3, (6, 9), data_format), torch.bfloat16, seed=43)
    dy = rand(data_shape(2, 3, (6, 9), data_format), torch.bfloat16, seed=44)
    if data_format == "NCX":
        dy[1, 2, 5, 0] = value
    else:
        dy[1, 5, 0, 2] = value
    attributes = dict(pads_begin=1, pads_end=1, groups=3, data_format=data_format, filter_format="OIX")
    result, ran = run("amx_depthwise", x, dy, [3, 1, 3, 3], attributes)
    assert ran == "amx_depthwise"
    expected = REF.conv_backprop_filters(x, dy, [3, 1, 3, 3], **attributes)
    assert torch.equal(result.isnan(), expected.isnan())
    assert_non_finite_where_expected(result, expected)


# Channels-last slices whose planes pass about 1 MB are transposed a band of
# 16 output rows at a time (fewer where those pass it), each band's input rows
# below the next band's first carried over. One sample of 33 channels on two
# threads splits into a task of 32 channels and one of a single channel, whose
# sums stay in one set of tiles across its visits.
AMX_DEPTHWISE_BAND_CASES = {
    # name: (n, c, size, kernel, attributes)
    "odd-last-band": (1, 33, (95, 90), (7, 7), dict(pads_begin=3, pads_end=3)),  # 5 bands of 16, then 15
    "bottom-padding": (1, 33, (90, 93), (5, 7), dict(pads_begin=(0, 4), pads_end=(4, 1))),
    "single-channel-bands": (1, 33, (512, 520), (3, 3), dict(pads_begin=1, pads_end=1)),  # 32 channels: bands of 8
}


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("case", list(AMX_DEPTHWISE_BAND_CASES))
def test_amx_depthwise_transposes_large_planes_in_bands(case):
    n, c, size, kernel, attributes = AMX_DEPTHWISE_BAND_CASES[case]
    x = rand(data_shape(n, c, size, "NXC"), torch.bfloat16, seed=47)
    dy = rand(data_shape(n, c, output_size(size, kernel, attributes), "NXC"), torch.bfloat16, seed=48)
    attributes = dict(attributes, groups=c, data_format="NXC", filter_format="OIX")
    with setting(torch.get_num_threads, torch.set_num_threads, 2):
        result, ran = run("amx_depthwise", x, dy, [c, 1, *kernel], attributes)
    assert ran == "amx_depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [c, 1, *kernel], **attributes), torch.bfloat16)


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
def test_amx_depthwise_leaves_what_it_cannot_take():
    """Strides, dilation (between rows or along them: B's pairs of taps along the row are then not
    neighbours), more than 8 taps along the row or 15 along the column, f32, and groups of several
    channels go elsewhere."""
    for kernel, extra, dtype, groups in (((3, 3), dict(strides=2), torch.bfloat16, 8),
                                         ((3, 3), dict(dilations=(2, 1)), torch.bfloat16, 8),
                                         ((3, 3), dict(dilations=(1, 2)), torch.bfloat16, 8),
                                         ((3, 9), {}, torch.bfloat16, 8), ((16, 3), {}, torch.bfloat16, 8),
                                         ((3, 3), {}, torch.float32, 8), ((3, 3), {}, torch.bfloat16, 4)):
        x = rand([2, 8, 20, 40], dtype, seed=45)
        attributes = dict(extra, groups=groups, data_format="NCX", filter_format="OIX")
        s = extra.get("strides", 1)
        dl = extra.get("dilations", (1, 1))
        out = [(size - (k - 1) * dd - 1) // s + 1 for size, k, dd in zip((20, 40), kernel, dl)]
        dy = rand([2, 8, *out], dtype, seed=46)
        result, ran = run("amx_depthwise", x, dy, [8, 8 // groups, *kernel], attributes)
        assert ran != "amx_depthwise"
        assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [8, 8 // groups, *kernel], **attributes), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [32, 45, 70])
def test_depthwise_stages_long_2_byte_channels_first_rows(width, dtype):
    """The AVX-512 build transposes channels-first f16/bf16 rows of 32 pixels or more 32 at a time
    (a row of 45 ends with an overlapping step); 37 channels leave 5 staged element by element. Two
    taps along the row at stride 2, which neither the float row tiles nor the bf16 planes and pairs
    take on any calibration, so that the transposition runs."""
    attributes = dict(strides=(1, 2), pads_begin=1, pads_end=1, groups=37, data_format="NCX", filter_format="OIX")
    x = rand(data_shape(2, 37, (3, width), "NCX"), dtype, seed=53)
    dy = rand(data_shape(2, 37, output_size((3, width), (3, 2), attributes), "NCX"), dtype, seed=54)
    result, ran = run("depthwise", x, dy, [37, 1, 3, 2], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [37, 1, 3, 2], **attributes), dtype)


# On a CPU with AVX512_BF16 and without AMX (where the float tiles measured faster), the depthwise
# kernel sums bf16 layers whose stride along the row equals their dilation, with 3 taps or more
# along the row (but channels-first stride-1 layers with fewer than 5, the planes below), in pairs
# of windows (VDPBF16PS), 8 windows at a time from the row's start, and the rest on float FMAs: rows
# of 8 windows (all paired), 9 (one left), 23 and 47 (7 left), 70 (6 left), stride and dilation 2
# (33 windows, 1 left), 1-D and 3-D, 20 and 17 channels (a partial vector of lanes), 3 and 4 taps
# along the row (channels-last; channels-first they take the float rows or the planes below), both
# layouts. The pairs are staged straight from channels-last data, and from channels-first rows by
# transposes where the input has 32 pairs or more and grad_output 16 (the 1-D case and the 70-window
# one, whose 20 channels leave a partial transposition); from a float staging of the row otherwise:
# shorter rows, and steps of 2. Each contiguous and with rows read at a stride (channels-last;
# channels-first strided rows take the channels-first float kernel). Each calibration pairs only
# some of them, and runs the rest on the float tiles: the Zen 4 5 taps along rows of more than 28
# windows and 7 along rows of more than 14 (the 7x7, 1-D, 70-windows, 44-windows and stride-2
# cases), the Zen 5 7 taps along rows of more than 28 (the 44-windows and stride-2 cases).
PAIRED_BF16_CASES = {
    # name: (n, c, size, kernel, attributes)
    "8-windows": (2, 16, (5, 8), (3, 5), dict(pads_begin=(1, 2), pads_end=(1, 2))),
    "9-windows": (2, 20, (4, 13), (3, 5), {}),
    "7x7": (1, 24, (9, 23), (7, 7), dict(pads_begin=3, pads_end=3)),
    "stride-2-dilation-2": (2, 16, (6, 70), (3, 7), dict(strides=(1, 2), dilations=(1, 2), pads_begin=(1, 3),
                                                         pads_end=(1, 4))),
    "1-D": (3, 32, (47,), (5,), dict(pads_begin=2, pads_end=2)),
    "3-D": (1, 17, (3, 4, 21), (2, 3, 5), dict(pads_begin=(0, 1, 2), pads_end=(1, 1, 2))),
    "70-windows": (2, 20, (3, 70), (3, 5), dict(pads_begin=(1, 2), pads_end=(1, 2))),
    "3-taps": (2, 24, (5, 40), (3, 3), dict(pads_begin=1, pads_end=1)),
    "4-taps": (2, 16, (4, 35), (2, 4), dict(pads_begin=(0, 2), pads_end=(1, 1))),
    "44-windows": (2, 20, (5, 44), (3, 7), dict(pads_begin=(1, 3), pads_end=(1, 3))),
}


@pytest.mark.parametrize("view", ["contiguous", "strided-rows"])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("case", list(PAIRED_BF16_CASES))
def test_bf16_depthwise_window_pairs(case, data_format, view):
    n, c, size, kernel, attributes = PAIRED_BF16_CASES[case]
    wide = [*size[:-1], 2 * size[-1]]
    x = rand(data_shape(n, c, wide, data_format), torch.bfloat16, seed=49)
    row = [slice(None)] * x.dim()
    row[x.dim() - (2 if data_format == "NXC" else 1)] = slice(None, size[-1]) if view == "contiguous" else slice(None, None, 2)
    x = x[tuple(row)].contiguous() if view == "contiguous" else x[tuple(row)]
    assert list(x.shape) == data_shape(n, c, size, data_format)
    dy = rand(data_shape(n, c, output_size(size, kernel, attributes), data_format), torch.bfloat16, seed=50)
    attributes = dict(attributes, groups=c, data_format=data_format, filter_format="OIX")
    result, ran = run("depthwise", x, dy, [c, 1, *kernel], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [c, 1, *kernel], **attributes), torch.bfloat16)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("row_taps,windows", [(5, 16), (7, 40)])
def test_bf16_depthwise_window_pairs_keep_non_finite_inputs_to_the_taps_that_read_them(
        row_taps, windows, value, data_format):
    """A pair of windows reads only pixels that both its windows read for the tap: an infinity or
    NaN in the input's last column (16 windows of 5 taps, or 40 of 7, unpadded) reaches only the
    last column of taps, and one in its first column only the first."""
    width = windows + row_taps - 1
    x = rand(data_shape(2, 16, (4, width), data_format), torch.bfloat16, seed=51)
    column = width - 1 if value != value else 0
    if data_format == "NCX":
        x[1, 3, 2, column] = value
    else:
        x[1, 2, column, 3] = value
    dy = rand(data_shape(2, 16, (2, windows), data_format), torch.bfloat16, seed=52)
    attributes = dict(groups=16, data_format=data_format, filter_format="OIX")
    result, ran = run("depthwise", x, dy, [16, 1, 3, row_taps], attributes)
    assert ran == "depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [16, 1, 3, row_taps], **attributes))


# On a CPU with AVX512_BF16, channels-first bf16 depthwise layers with stride 1 along the row and
# fewer than 5 taps along it (those the float row tiles do not take: dilated along the row, or
# other than 3 taps along it) run output row by output row, 32 windows at a time in pairs
# (VDPBF16PS), from the input plane staged as it is: rows of 32 windows (one whole step), 33 and 70
# (a partial last step), 9 (one partial step); stride 2 and dilation 3 across rows, dilation 2 along
# them; 1-D and 3-D; a kernel of 36 taps (two tiles of sums); a plane of 100x96. Each contiguous
# (the next planes prefetched), and as views: input rows read with a stride, and a slice of the
# channels and of the rows (planes not contiguous, so nothing prefetched, except in 1-D).
# Elsewhere these run on the other kernels.
BF16_PLANE_CASES = {
    # name: (n, c, size, kernel, attributes)
    "32-windows": (3, 8, (6, 32), (3, 3), dict(pads_begin=1, pads_end=1)),
    "33-windows": (2, 5, (5, 35), (3, 3), {}),
    "70-windows": (2, 3, (4, 70), (2, 4), dict(pads_begin=(0, 2), pads_end=(1, 1))),
    "9-windows": (4, 6, (7, 9), (3, 1), dict(pads_begin=(1, 0), pads_end=(1, 0))),
    "strided-rows": (2, 4, (11, 40), (3, 3), dict(strides=(2, 1), dilations=(3, 2), pads_begin=(2, 1),
                                                     pads_end=(0, 3))),
    "1-D": (3, 7, (100,), (3,), dict(pads_begin=1, pads_end=0)),
    "3-D": (2, 3, (4, 5, 38), (2, 3, 3), dict(pads_begin=(1, 0, 1), pads_end=(0, 1, 1))),
    "36-taps": (1, 2, (12, 40), (9, 4), dict(pads_begin=(4, 1), pads_end=(4, 2))),
    "large-plane": (2, 2, (100, 96), (3, 3), dict(pads_begin=1, pads_end=1)),
}


@pytest.mark.parametrize("view", ["contiguous", "strided-rows", "channel-slice"])
@pytest.mark.parametrize("case", list(BF16_PLANE_CASES))
def test_bf16_channels_first_depthwise_planes(case, view):
    n, c, size, kernel, attributes = BF16_PLANE_CASES[case]
    x = rand(data_shape(n, 2 * c, [*size[:-1], 2 * size[-1]], "NCX"), torch.bfloat16, seed=55)
    x = x[:, :c, ..., :size[-1]] if view == "contiguous" else x[:, :c, ..., ::2] if view == "strided-rows" else x[:, ::2, ..., :size[-1]]
    x = x.contiguous() if view == "contiguous" else x
    out = output_size(size, kernel, attributes)
    dy = rand(data_shape(n, 2 * c, out, "NCX"), torch.bfloat16, seed=56)
    dy = dy[:, ::2] if view == "channel-slice" else dy[:, :c].contiguous()
    attributes = dict(attributes, groups=c, data_format="NCX", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [c, 1, *kernel], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [c, 1, *kernel], **attributes), torch.bfloat16)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("column", [0, 39])
def test_bf16_channels_first_depthwise_planes_keep_non_finite_inputs_to_the_taps_that_read_them(value, column):
    """The lanes past a row's last window load as zero on both sides: an infinity or NaN in the input's
    first or last column (38 windows of 3 taps a row, unpadded: one whole step and a partial one)
    reaches only the taps that read it."""
    x = rand(data_shape(2, 16, (4, 40), "NCX"), torch.bfloat16, seed=57)
    x[1, 3, 2, column] = value
    dy = rand(data_shape(2, 16, (2, 38), "NCX"), torch.bfloat16, seed=58)
    attributes = dict(groups=16, data_format="NCX", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [16, 1, 3, 3], attributes)
    assert ran == "depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [16, 1, 3, 3], **attributes))



# On an AVX-512 CPU without bf16 products, channels-first depthwise layers with 3, 5 or 7 taps along
# the row (stride 1 or 2 and dilation 1 along it) run on float row tiles (on AMX CPUs those with 3
# taps, and with 5 or 7 on rows of at most 32 windows in bf16/f16 and 16 at stride 1 in f32;
# elsewhere on the other kernels; on AVX2 CPUs, in vectors of 8 windows, those with 3 taps along the
# row at stride 1 along it or at stride 2 on rows of up to 14 windows, 28 in bf16/f16, and with 5 taps
# at stride 1 in f32): rows of 16 windows (one whole vector), 17 and 70 (a partial last one), 5 (a
# partial vector alone); 19 and 13 output rows, which run 8 (3 taps along the row), 4 (three rows of 7) or 3 (four
# rows of 7) at a time and the rest one by one; 7x7 and 9x3 kernels (rows of taps split 4 + 3 and
# 3 + 3 + 3), a single row of taps, asymmetric padding; stride 2 along both axes (4 output rows at a
# time; rows of kernels over 9 taps staged into two phases: 32 elements and a partial vector, an odd
# padding that stages the first element alone; rows of 14 and 13 windows, whose input rows leave 10
# and 9 elements past the last whole vector; input rows of 11 and 12 elements, which the AVX2 build
# stages masked (odd and even padding), and of 16 and 17, one whole vector and two that overlap),
# stride 2 along the row only, and stride and dilation
# across rows (one output row at a time); 1-D and 3-D. Each contiguous and as views: input rows read
# with a stride (staged element by element) and a slice of the channels. Rows of kernels up to 3x3
# at stride 1 along the row, 14 windows or more, are read in place in every dtype (16, 17 and 70
# windows, wide and right padding, a single row of taps, 1-D, 3-D with one row of taps), and at
# stride 2 as well (odd, even, wide and no padding along the row, 1-D), and a plane of 4 KiB or more
# prefetches the next planes (large-plane, stride-2-large-plane). On AVX2 CPUs bf16 rows of unit
# stride at stride 2 along the row are read in place, 8 windows a step, with masked steps at both
# ends (the stride-2 cases up to 28 windows, contiguous and channel-slice; strided rows are staged), and
# f32 rows of 3 taps (9 in all) at stride 1 and over 16 windows are, masked by 32-bit lanes (17
# windows, 18 and 35 with padding of 1 and 2, wide and right padding, 3-D with one row of taps,
# large-plane, 1-D-96-windows and 1-D-400-windows), and f16 rows of 28 windows or more in planes of
# 400 or more, loaded whole and masked after their conversion, the planes whose loads would leave
# the tensor staged (3-D-one-tap-row, large-plane, 1-D-400-windows). On the Zen 4 and AMX CPUs, bf16 rows read in
# place at stride 1 load pairs of elements, 32 windows a step, where the row's windows are an even
# count that such steps take with no more idle lanes than steps of 16: rows of 50 windows
# (large-plane, a partial last step), 30 (3-D-one-tap-row) and 96 (1-D-96-windows, a whole step
# between two partial ones).
FLOAT_ROW_CASES = {
    # name: (n, c, size, kernel, attributes)
    "16-windows": (2, 5, (19, 16), (3, 3), dict(pads_begin=1, pads_end=1)),
    "17-windows": (2, 3, (21, 19), (3, 3), {}),
    "5-windows": (2, 3, (9, 5), (3, 3), dict(pads_begin=1, pads_end=1)),
    "70-windows": (2, 3, (9, 70), (3, 5), dict(pads_begin=(1, 2), pads_end=(1, 2))),
    "7x7": (2, 3, (13, 23), (7, 7), dict(pads_begin=3, pads_end=3)),
    "9x3-asymmetric": (2, 2, (16, 20), (9, 3), dict(pads_begin=(1, 2), pads_end=(7, 0))),
    "one-row-of-taps": (3, 2, (11, 33), (1, 7), dict(pads_begin=(0, 3), pads_end=(0, 3))),
    "stride-2": (2, 4, (23, 40), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "stride-2-5x5": (2, 3, (20, 35), (5, 5), dict(strides=2, pads_begin=2, pads_end=(1, 2))),
    "stride-2-14-windows": (2, 3, (9, 27), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "stride-2-13-windows": (2, 3, (8, 25), (3, 3), dict(strides=2, pads_begin=(1, 2), pads_end=(1, 1))),
    "stride-2-11-elements": (2, 3, (7, 11), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "stride-2-12-elements": (2, 3, (6, 12), (3, 3), dict(strides=2, pads_begin=(1, 2), pads_end=(1, 1))),
    "stride-2-16-elements": (2, 3, (5, 16), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "stride-2-17-elements": (2, 3, (5, 17), (3, 3), dict(strides=2)),
    "stride-2-along-rows": (2, 3, (9, 50), (3, 7), dict(strides=(1, 2), pads_begin=(1, 3), pads_end=(1, 2))),
    "strided-rows": (2, 4, (23, 40), (3, 3), dict(strides=(2, 1), pads_begin=1, pads_end=1)),
    "dilated-rows": (2, 4, (20, 18), (5, 5), dict(dilations=(2, 1), pads_begin=(4, 2), pads_end=(4, 2))),
    "wide-padding": (2, 3, (6, 40), (3, 3), dict(pads_begin=(1, 18), pads_end=(1, 17))),
    "right-padding": (2, 3, (7, 40), (3, 3), dict(pads_begin=(1, 0), pads_end=(1, 4))),
    "padding-past-the-windows": (2, 3, (4, 3), (1, 7), dict(pads_begin=(0, 17), pads_end=0)),
    "1-D": (3, 7, (100,), (5,), dict(pads_begin=2, pads_end=1)),
    "3-D-one-tap-row": (2, 3, (4, 6, 30), (3, 1, 3), dict(pads_begin=1, pads_end=1)),
    "3-D": (2, 3, (5, 12, 21), (3, 3, 3), dict(strides=(2, 1, 1), pads_begin=1, pads_end=1)),
    "large-plane": (2, 2, (48, 50), (3, 3), dict(pads_begin=1, pads_end=1)),
    "18-windows": (2, 3, (7, 18), (3, 3), dict(pads_begin=1, pads_end=1)),
    "35-windows-padding-2": (2, 3, (6, 33), (1, 3), dict(pads_begin=(0, 2), pads_end=(0, 2))),
    "stride-2-in-place": (2, 3, (9, 41), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    "stride-2-even-padding": (2, 3, (7, 45), (3, 3), dict(strides=2, pads_begin=(1, 2), pads_end=(1, 1))),
    "stride-2-unpadded-odd": (2, 3, (6, 41), (3, 3), dict(strides=2)),
    "stride-2-wide-padding": (2, 3, (6, 40), (3, 3), dict(strides=2, pads_begin=(1, 9), pads_end=(1, 8))),
    "stride-2-1-D": (3, 7, (100,), (3,), dict(strides=2, pads_begin=1, pads_end=1)),
    "1-D-96-windows": (3, 7, (96,), (3,), dict(pads_begin=1, pads_end=1)),
    "1-D-400-windows": (2, 3, (401,), (3,), dict(pads_begin=1, pads_end=0)),
    "stride-2-large-plane": (2, 2, (48, 64), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("view", ["contiguous", "strided-rows", "channel-slice"])
@pytest.mark.parametrize("case", list(FLOAT_ROW_CASES))
def test_channels_first_depthwise_rows(case, view, dtype):
    n, c, size, kernel, attributes = FLOAT_ROW_CASES[case]
    x = rand(data_shape(n, 2 * c, [*size[:-1], 2 * size[-1]], "NCX"), dtype, seed=61)
    x = x[:, :c, ..., :size[-1]] if view == "contiguous" else x[:, :c, ..., ::2] if view == "strided-rows" else x[:, ::2, ..., :size[-1]]
    x = x.contiguous() if view == "contiguous" else x
    out = output_size(size, kernel, attributes)
    dy = rand(data_shape(n, 2 * c, out, "NCX"), dtype, seed=62)
    dy = dy[:, ::2] if view == "channel-slice" else dy[:, :c].contiguous()
    attributes = dict(attributes, groups=c, data_format="NCX", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [c, 1, *kernel], attributes)
    assert ran == "depthwise"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [c, 1, *kernel], **attributes), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("holder,position", [("x", (1, 3, 2, 0)), ("x", (1, 3, 2, -1)), ("x", (0, 1, 20, 7)),
                                             ("dy", (1, 2, 0, 0)), ("dy", (0, 3, -1, -1))])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("width", [36, 28])
def test_channels_first_depthwise_rows_keep_non_finite_values_where_the_reference_has_them(
        width, stride, value, holder, position, dtype):
    """The lanes past a row's last window load as zero on both sides, and the padding is staged as
    zeros (rows read in place mask it off): an infinity or NaN in the input's first or last
    column or last row reaches only the taps that read it, and one in the output gradient's corners
    meets the padding (NaN) as in the reference. 36 windows a row (two whole vectors and a partial one), or 18
    with stride 2 (read in place: f32 as the even elements of 32, f16/bf16 in pairs); and 28 windows, which
    bf16 at stride 1 on the Zen 4 and AMX CPUs loads as pairs of elements, 32 windows a step.

    Where the float row tiles do not run (AVX2 CPUs at stride 2 in f32), the channels-last kernel's
    transposition takes these planes; it skips the input rows that lie in the padding, as ATen does,
    so the output gradient's corners are not checked there."""
    if holder == "dy" and not (FLOAT_ROWS or avx2_float_rows(stride, width // stride, dtype)):
        pytest.skip("the float row tiles do not take these planes on this CPU")
    x = rand(data_shape(2, 16, (21, width), "NCX"), dtype, seed=63)
    dy = rand(data_shape(2, 16, output_size((21, width), (3, 3), dict(strides=stride, pads_begin=1, pads_end=1)),
                         "NCX"), dtype, seed=64)
    (x if holder == "x" else dy)[position] = value
    attributes = dict(strides=stride, pads_begin=1, pads_end=1, groups=16, data_format="NCX", filter_format="OIX")
    result, ran = run("depthwise", x, dy, [16, 1, 3, 3], attributes)
    assert ran == "depthwise"
    assert_non_finite_where_expected(result, REF.conv_backprop_filters(x, dy, [16, 1, 3, 3], **attributes))

@pytest.mark.skipif(not AVX512 or AMX, reason="the calibrations of AVX-512 CPUs without AMX")
def test_f32_strided_channels_last_depthwise_goes_to_the_depthwise_kernel():
    """MobileNetV2's stride-2 depthwise layer, channels-last f32: the depthwise kernel ran it 1.55-1.6
    times as fast as oneDNN (Zen 4, 2 threads); on a Zen 5 0.74-1.17 times, faster in 2 of 5 runs
    (in bf16 in 4 of 5), where oneDNN's times varied most."""
    x, dy = rand(data_shape(16, 144, (56, 56), "NXC"), seed=5), rand(data_shape(16, 144, (28, 28), "NXC"), seed=6)
    attributes = dict(strides=2, pads_begin=1, pads_end=1, groups=144, data_format="NXC", filter_format="OIX")
    assert run(None, x, dy, [144, 1, 3, 3], attributes)[1] == "depthwise"


@pytest.mark.skipif(not AVX512 or AMX, reason="the calibrations of AVX-512 CPUs without AMX")
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_f32_1d_layer_picks(data_format):
    """The benchmark's 1-D layer (k10 s5, 32 -> 64 channels, 16000 samples) in f32: gemm, whose
    fused kernel reads a channels-first input's rows in place. On a Zen 4 gemm ran it 1.13-1.15x
    as fast as oneDNN channels-first and 1.4-1.6x channels-last (2 threads, three runs,
    2026-12-04); on a Cascade Lake oneDNN ran at 24 and 33 GMAC/s, gemm at 61 and 38 (1.13x
    channels-first, before the in-place rows); on a Zen 5 gemm ran it 1.26-2.04x as fast as
    oneDNN in either layout (two runs)."""
    x, dy = rand(data_shape(4, 32, (16000,), data_format), seed=5), rand(data_shape(4, 64, (3199,), data_format), seed=6)
    attributes = dict(strides=5, data_format=data_format, filter_format="OIX")
    assert run(None, x, dy, [64, 32, 10], attributes)[1] == "gemm"


# The picks of the calibration of AVX-512 CPUs without bf16 products, each measured faster on an
# Intel Xeon (Cascade Lake, 2 threads, 2026-11-27, benchmarks/forced_algorithms.py): oneDNN on
# ResNet-50's 3x3 channels-first (9.9 ms against gemm's 13.0) and 1x1 64 -> 256 channels-last
# layers (6.2 against 7.8), and on bf16 as float32 copies for its 3x3 on 14x14 maps (11.4 against
# 19.4); gemm for the 1x1 channels-first (7.7 against 10.3) and the stride-2 1x1 in bf16 (10.5
# against 14.1); MKL's product (matmul) for the f32 channels-last 1x1 1024 -> 256 (5.1 against
# gemm's 5.7) and stride-2 1x1 (10.1 against oneDNN's 10.3), but not for its channels-first twin
# (5.5 against gemm's 4.5).
CASCADE_LAKE_PICKS = [
    # (data_format, dtype, C, O, size, kernel, attributes, pick)
    ("NCX", torch.float32, 64, 64, (56, 56), 3, dict(pads_begin=1, pads_end=1), "aten"),
    ("NXC", torch.float32, 64, 256, (56, 56), 1, dict(), "aten"),
    ("NCX", torch.float32, 64, 256, (56, 56), 1, dict(), "gemm"),
    ("NCX", torch.bfloat16, 256, 256, (14, 14), 3, dict(pads_begin=1, pads_end=1), "aten"),
    # oneDNN on float32 copies: 1.17-1.27 times gemm's speed on 16-bit data.
    ("NXC", torch.bfloat16, 64, 64, (56, 56), 3, dict(pads_begin=1, pads_end=1), "aten"),
    ("NXC", torch.float16, 64, 64, (56, 56), 3, dict(pads_begin=1, pads_end=1), "aten"),
    # gemm ran the channels-first stride-2 3x3 layer 1.24-1.48x as fast as oneDNN on copies.
    ("NCX", torch.bfloat16, 128, 128, (56, 56), 3, dict(strides=2, pads_begin=0, pads_end=1), "gemm"),
    # ... and tied with oneDNN in f32 when the machine was quiet, 1.17-1.5x as fast under load.
    ("NCX", torch.float32, 128, 128, (56, 56), 3, dict(strides=2, pads_begin=0, pads_end=1), "gemm"),
    ("NXC", torch.bfloat16, 256, 512, (56, 56), 1, dict(strides=2), "gemm"),
    ("NXC", torch.float32, 1024, 256, (14, 14), 1, dict(), "matmul"),
    ("NXC", torch.float32, 256, 512, (56, 56), 1, dict(strides=2), "matmul"),
    ("NCX", torch.float32, 1024, 256, (14, 14), 1, dict(), "gemm"),
]


@pytest.mark.skipif(not AVX512 or AVX512_BF16 or AMX, reason="the calibration of AVX-512 CPUs without bf16 products")
@pytest.mark.parametrize("data_format,dtype,c,o,size,kernel,attributes,pick", CASCADE_LAKE_PICKS)
def test_cascade_lake_picks(data_format, dtype, c, o, size, kernel, attributes, pick):
    stride = attributes.get("strides", 1)
    pads = attributes.get("pads_begin", 0) + attributes.get("pads_end", 0)
    out = [(s + pads - kernel) // stride + 1 for s in size]
    x = rand(data_shape(8, c, size, data_format), dtype, seed=21)
    dy = rand(data_shape(8, o, out, data_format), dtype, seed=22)
    assert run(None, x, dy, [o, c, kernel, kernel], dict(attributes, data_format=data_format, filter_format="OIX"))[1] == pick


# The AVX2 calibration's picks on the benchmark's layers, each measured faster in two runs of
# benchmarks/forced_algorithms.py on an AMD EPYC (Zen 3, 2 threads, 2026-12-01): gemm for the 1-D
# layer's channels-first f32 data (5.1-7.2 ms against oneDNN's 8.0-11.0), U-Net's (5.7-6.2
# against 6.6-7.1), the 1x1 64 -> 256 (7.8-8.8 against 11.4-12.1) and the 3x3 64-channel
# channels-last layers (18.1 against 34.2); oneDNN for the 3x3 256-channel (21.1-22.4 against
# 23.6-24.7) and DCGAN's channels-first layers (18.3-24.5 against 21.6-27.9); MKL's product
# (matmul) for the stride-2 1x1 channels-last f32 layer (15.1-17.3 against gemm's 19.0-25.8), but
# gemm in bf16 there (matmul copies bf16 to float32 first) and on the 1x1 1024 -> 256 f32 layer
# (tied; on 2026-12-05, interleaved in one process, 5.62-6.01 ms against MKL's 5.45-5.87).
AVX2_PICKS = [
    # (layer name's start, layout, dtype, pick)
    ("audio 1-D", "NCX", "f32", "gemm"),
    ("unet convT", "NCX", "f32", "gemm"),
    ("resnet50 1x1 64->256", "NCX", "f32", "gemm"),
    ("resnet50 3x3 64ch", "NXC", "f32", "gemm"),
    ("resnet50 3x3 256ch", "NCX", "f32", "aten"),
    ("dcgan convT", "NCX", "f32", "aten"),
    ("resnet50 1x1 s2", "NXC", "f32", "matmul"),
    ("resnet50 1x1 s2", "NXC", "bf16", "gemm"),
    ("resnet50 1x1 1024->256", "NXC", "f32", "gemm"),
    ("resnet50 1x1 1024->256", "NXC", "bf16", "gemm"),
    ("resnet50 1x1 64->256", "NXC", "f32", "aten"),
]


# The Zen 4 calibration's picks where oneDNN runs at one of two speeds by process, from the averages
# of both (benchmarks/forced_algorithms.py, the benchmark and the glue's call, AMD EPYC Zen 4, 2
# threads, 2026-12-04; ms): the fused kernel (gemm) for ResNet-50's channels-first stride-2 3x3 f32
# layer (10.8-11.9 against oneDNN's 11.1-12.4 or 17.1-19.6, the slower in processes whose allocator
# had not settled: benchmark.settle_allocator). And brgemm's bf16 products on AVX-512 BF16
# (benchmarks/forced_algorithms.py, the same CPU and day): the 1-D layer (1.50 and 1.59 ms,
# channels-last and channels-first, against matmul's 3.64 and gemm's 3.32), U-Net's (1.34 and 1.28
# against matmul's 2.78 and 2.02), ResNet-50's channels-first 1x1 64 -> 256 (2.27 against matmul's
# 3.60) and its channels-last stride-2 1x1 (4.7-5.1 settled, 6-16% faster than oneDNN in each of
# ten paired measurements, oneDNN's bf16 matmul 5.3-6.4).
ZEN4_PICKS = [
    # (layer name's start, layout, dtype, pick)
    ("resnet50 3x3 s2", "NCX", "f32", "gemm"),
    ("audio 1-D", "NXC", "bf16", "brgemm"),
    ("audio 1-D", "NCX", "bf16", "brgemm"),
    ("unet convT", "NXC", "bf16", "brgemm"),
    ("unet convT", "NCX", "bf16", "brgemm"),
    ("resnet50 1x1 64->256", "NCX", "bf16", "brgemm"),
    ("resnet50 1x1 s2", "NXC", "bf16", "brgemm"),
]


# The Zen 5 calibration's picks where they differed from the Zen 4's model, each measured faster by
# 1.15x or more in two runs of benchmarks/forced_algorithms.py on an AMD EPYC (Zen 5, 2 threads,
# 2026-12-02; ms, the two runs): oneDNN for ResNet-50's channels-first f32 1x1 layers, where MKL's
# products (gemm) run AVX2 code (64 -> 256: 4.58, 4.41 against 5.64, 5.84; 1024 -> 256: 3.65, 2.94
# against 5.39, 4.72; stride 2: 6.54, 6.58 against 12.6, 11.7; in f16 1024 -> 256: 4.08, 3.38
# against 5.56, 5.17); the fused kernel (gemm) for the channels-first stride-2 3x3 f32 layer
# (6.12, 6.11 against 8.83, 7.72), DCGAN's channels-last f16 (7.84, 7.91 against 10.2,
# 9.16) and the 1-D layer's channels-first f32 (1.88, 1.97 against 2.37, 2.53); oneDNN's bf16
# matmul for ResNet-50's channels-first 1x1 64 -> 256 (1.98, 1.73 against 3.47, 3.30) and U-Net's
# channels-first bf16 layer (1.09, 1.10 against gemm's 1.56, 1.62).
ZEN5_PICKS = [
    # (layer name's start, layout, dtype, pick)
    ("resnet50 1x1 64->256", "NCX", "f32", "aten"),
    ("resnet50 1x1 1024->256", "NCX", "f32", "aten"),
    ("resnet50 1x1 s2", "NCX", "f32", "aten"),
    ("resnet50 1x1 1024->256", "NCX", "f16", "aten"),
    ("resnet50 3x3 s2", "NCX", "f32", "gemm"),
    ("dcgan convT", "NXC", "f16", "gemm"),
    ("audio 1-D", "NCX", "f32", "gemm"),
    ("resnet50 1x1 64->256", "NCX", "bf16", "matmul"),
    ("unet convT", "NCX", "bf16", "matmul"),
]


@pytest.mark.parametrize("calibration,name,layout,dtype,pick",
                         [("avx2", *pick) for pick in AVX2_PICKS] + [("avx512_bf16", *pick) for pick in ZEN4_PICKS]
                         + [("avx512_bf16_wide", *pick) for pick in ZEN5_PICKS])
def test_calibration_picks(calibration, name, layout, dtype, pick):
    """The selector's pick for the benchmark's layer whose name starts with `name`, where the
    calibration's kernels run (not the portable ones of ATEN_CPU_CAPABILITY=default)."""
    if CALIBRATION != calibration or torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip(f"the {calibration} calibration's pick (this CPU's is {CALIBRATION})")
    from torch_convgrad import benchmark
    case = next(case for case in benchmark.CASES if case.name.startswith(name))
    problem = benchmark.Problem.make(case, case.ops[0], layout, benchmark.DTYPES[dtype], torch.device("cpu"),
                                     torch.Generator().manual_seed(0))
    with torch_convgrad.use_algorithm(None):
        problem.ours()
    assert torch_convgrad.last_algorithm() == pick


# The AVX2 calibration's picks for depthwise layers on ConvNeXt's and MobileNetV2's smaller maps (N=8,
# 2 threads, every algorithm forced in one process, AMD EPYC Zen 3, 2026-12-05; ms): the depthwise
# kernel for 5x5 and 7x7 kernels, where oneDNN is bound by its products (7x7 on 14x14 maps, 384
# channels: 0.94 channels-last and 1.07 channels-first against 6.08 and 14.6; on 7x7 maps, 768
# channels, 0.53 and 0.81 against 2.28 and 7.87; bf16 1.86 against 6.51; 5x5 on 7x7 maps 0.39 and
# 0.95 against 1.49 and 6.55); oneDNN for f32 3x3 kernels on 7x7 maps (0.23 against 0.28
# channels-last, 0.29 against 0.47 channels-first).
AVX2_DEPTHWISE_PICKS = [
    # (layout, dtype, channels, size, kernel, pick)
    ("NXC", torch.float32, 384, 14, 7, "depthwise"),
    ("NCX", torch.float32, 384, 14, 7, "depthwise"),
    ("NXC", torch.float32, 768, 7, 7, "depthwise"),
    ("NCX", torch.float32, 768, 7, 7, "depthwise"),
    ("NXC", torch.bfloat16, 384, 14, 7, "depthwise"),
    ("NXC", torch.float32, 768, 7, 5, "depthwise"),
    ("NCX", torch.float32, 768, 7, 5, "depthwise"),
    ("NXC", torch.float32, 768, 7, 3, "aten"),
    ("NCX", torch.float32, 768, 7, 3, "aten"),
]


# The AVX2 calibration's picks on layers the benchmark leaves out
# (benchmarks/forced_algorithms.py --layers sweep; Zen 3, 2 threads,
# 2026-12-05, ms): few input channels a group that many taps read go to the
# fused kernel, whose tiles run (tap, channel) rows at full width (the 7x7
# stem channels-last f32 9.2-10.0 against oneDNN's 17.4-20.3, 4 groups of 32
# channels 4.2-5.4 against 7.4-8.2); 1x1 layers on 7x7 maps and stride-2 ones
# down to them, channels-first bf16, to MKL's product on float32 copies
# (512 -> 2048: 5.8-5.9 against gemm's 7.2-8.3 and oneDNN's 6.8-7.6; stride 2,
# 1024 -> 2048: 12.2-17.2 against 16.7-25.7 and 15.3-25.3); ResNet-50's 3x3
# layer on 7x7 maps, channels-last f32, to the fused kernel since it skips the
# pitch's rows (19.1 against oneDNN's 22.1; before, 21.1-30.4 against
# 26.5-48.1, when the model counted those rows and picked oneDNN). 1x1
# expansions on channels-last data, which MKL's product reads in place
# (f16/bf16 converted), go to it on 14x14 and 7x7 maps (all three algorithms
# interleaved in one process, 8 rounds: 512 -> 2048 f32 5.96 against gemm's
# 7.01, bf16 6.39 against 7.07; MobileNetV2's 96 -> 576 f32 1.15 against
# oneDNN's 1.36 and gemm's 1.26), but bf16 on 14x14 maps stays on the fused
# kernel (256 -> 1024: 5.89 against 6.13), whose conversion costs nothing,
# and so do the reductions (2048 -> 512 f32: 5.61 against MKL's 6.45); the
# stride-2 expansions' bf16 down to 7x7 maps go to MKL too (1024 -> 2048:
# 12.5 against gemm's 15.0), ResNet-50's 256 -> 512 on 56x56 not (tied). A
# 1-D layer's channels-first f32 data goes to the fused kernel, whose
# transposition of whole rows costs little (stride 2, 5 taps, 4000 positions:
# 9.4 ms against oneDNN's 17.6, all algorithms interleaved in one process).
# A size given as a tuple is the spatial shape, else a square's side.
AVX2_SWEEP_PICKS = [
    # (n, c, o, size, kernel, stride, groups, layout, dtype, pick)
    (4, 3, 64, 224, 7, 2, 1, "NXC", torch.float32, "gemm"),
    (8, 512, 512, 7, 3, 1, 1, "NXC", torch.float32, "gemm"),
    (8, 128, 128, 28, 3, 1, 4, "NXC", torch.float32, "gemm"),
    (8, 512, 2048, 7, 1, 1, 1, "NCX", torch.bfloat16, "matmul"),
    (8, 1024, 2048, 14, 1, 2, 1, "NCX", torch.bfloat16, "matmul"),
    (8, 512, 2048, 7, 1, 1, 1, "NXC", torch.float32, "matmul"),
    (8, 512, 2048, 7, 1, 1, 1, "NXC", torch.bfloat16, "matmul"),
    (8, 96, 576, 14, 1, 1, 1, "NXC", torch.float32, "matmul"),
    (8, 256, 1024, 14, 1, 1, 1, "NXC", torch.bfloat16, "gemm"),
    (8, 2048, 512, 7, 1, 1, 1, "NXC", torch.float32, "gemm"),
    (8, 1024, 2048, 14, 1, 2, 1, "NXC", torch.bfloat16, "matmul"),
    (8, 64, 128, (4000,), 5, 2, 1, "NCX", torch.float32, "gemm"),
]


@pytest.mark.parametrize("n,c,o,size,kernel,stride,groups,data_format,dtype,pick", AVX2_SWEEP_PICKS + [
    (8, channels, channels, size, kernel, 1, channels, data_format, dtype, pick)
    for data_format, dtype, channels, size, kernel, pick in AVX2_DEPTHWISE_PICKS])
def test_avx2_picks_off_the_benchmark(n, c, o, size, kernel, stride, groups, data_format, dtype, pick):
    if CALIBRATION != "avx2" or torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip(f"the avx2 calibration's pick (this CPU's is {CALIBRATION})")
    size = size if isinstance(size, tuple) else (size, size)
    pad = kernel // 2
    out = tuple((axis + 2 * pad - kernel) // stride + 1 for axis in size)
    x = rand(data_shape(n, c, size, data_format), dtype, seed=83)
    dy = rand(data_shape(n, o, out, data_format), dtype, seed=84)
    attributes = dict(strides=stride, pads_begin=pad, pads_end=pad, groups=groups, data_format=data_format,
                      filter_format="OIX")
    assert run(None, x, dy, [o, c // groups, *[kernel] * len(size)], attributes)[1] == pick


def cpuinfo_field(name):
    """The first value of `name` in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


@pytest.mark.skipif(cpuinfo_field("vendor_id") is None, reason="needs Linux's /proc/cpuinfo")
def test_cpu_calibration_follows_the_cpu():
    """The calibration follows ATen's capability, AMX, AVX-512 BF16 and, between AMD's Zen 4 and
    Zen 5 (the same features), the family /proc/cpuinfo reports (25 and 26)."""
    zen5_or_later = cpuinfo_field("vendor_id") == "AuthenticAMD" and int(cpuinfo_field("cpu family")) >= 26
    expected = ("avx2" if not AVX512 else "avx512_amx" if AMX else "avx512" if not AVX512_BF16
                else "avx512_bf16_wide" if zen5_or_later else "avx512_bf16")
    assert CALIBRATION == expected


@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
@pytest.mark.parametrize("stride", [1, 2])
def test_matmul_sums_bf16_in_float32(stride, data_format):
    """matmul multiplies bf16 as it is where the CPU has AVX512_BF16 (oneDNN's bf16 matmul), and
    copies it to float32 elsewhere; either way the 20000 products of each weight, all near 1, sum
    in float32 (a bf16 sum would stop growing at 256)."""
    size = (100 * stride, 100)
    x = 1 + rand(data_shape(2, 24, size, data_format), torch.bfloat16, seed=55) / 8
    dy = torch.ones(data_shape(2, 40, (100, 100), data_format), dtype=torch.bfloat16)
    attributes = dict(strides=(stride, 1), data_format=data_format, filter_format="OIX")
    result, ran = run("matmul", x, dy, [40, 24, 1, 1], attributes)
    assert ran == "matmul"
    assert_matches_ref(result, REF.conv_backprop_filters(x, dy, [40, 24, 1, 1], **attributes), torch.bfloat16)


@pytest.mark.skipif(not AVX512_BF16 or AMX,
                    reason="the calibration of AVX-512 CPUs with AVX512_BF16 and without AMX")
@pytest.mark.parametrize("data_format,c,o,size,stride,onednn_pick", [
    ("NXC", 1024, 256, 14, 1, "matmul"), ("NCX", 1024, 256, 14, 1, "matmul"), ("NCX", 256, 512, 56, 2, "matmul"),
    ("NXC", 64, 256, 56, 1, "aten")])
def test_bf16_1x1_picks(data_format, c, o, size, stride, onednn_pick):
    """ResNet-50's 1x1 layers in bf16: oneDNN's bf16 matmul ran 1024 -> 256 1.07-1.19 times as fast
    as its convolution, 256 -> 512 with stride 2 on channels-first data 1.16-1.29 times, and
    64 -> 256 channels-last 0.93-0.97 times (Zen 4, 2 threads). brgemm's products ran them within 6%
    of those or faster (Zen 4, two forced runs, 2026-12-04, ms): 1024 -> 256 channels-last 2.51 and 2.67
    against matmul's 2.35 and 2.75, channels-first 2.20 and 2.17 against 2.21 and 2.24, 256 -> 512
    4.90 and 4.81 against 5.70 and 6.00, 64 -> 256 channels-last 3.17 and 2.91 against oneDNN's
    3.44 and 2.76, and take them there; the Zen 5's calibration, which has not measured brgemm,
    keeps oneDNN's picks."""
    expected = "brgemm" if CALIBRATION == "avx512_bf16" else onednn_pick
    out = (size - 1) // stride + 1
    x = rand(data_shape(8, c, (size, size), data_format), torch.bfloat16, seed=5)
    dy = rand(data_shape(8, o, (out, out), data_format), torch.bfloat16, seed=6)
    attributes = dict(strides=stride, data_format=data_format, filter_format="OIX")
    assert run(None, x, dy, [o, c, 1, 1], attributes)[1] == expected
    # Without oneDNN, ATen's own bf16 product would run matmul (slowly), and brgemm has none: neither.
    with torch.backends.mkldnn.flags(enabled=False):
        assert run(None, x, dy, [o, c, 1, 1], attributes)[1] not in ("matmul", "brgemm")


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
@pytest.mark.parametrize("data_format,kernel,channels,size,expected", [
    ("NCX", 7, 96, 56, "amx_depthwise"), ("NXC", 7, 96, 56, "amx_depthwise"), ("NXC", 7, 768, 7, "depthwise"),
    ("NCX", 3, 96, 56, "depthwise"), ("NXC", 5, 240, 28, "amx_depthwise")])
def test_bf16_depthwise_picks(data_format, kernel, channels, size, expected):
    """ConvNeXt's 7x7 depthwise layer in bf16 ran 1.3-1.9x faster on AMX tiles than on the
    depthwise kernel's FMA tiles channels-first, 1.1-1.2x channels-last (Sapphire Rapids, 2
    threads); on its 7x7 maps channels-last the transposition made it 1.7x slower, and 3x3 layers
    are bound by memory. A channels-last 5x5 layer on 28x28 maps ran 1.2-1.3x faster on the tiles
    once its transposition made grad_output's pair rows (AMX CPU, 2 threads)."""
    x = rand(data_shape(8, channels, (size, size), data_format), torch.bfloat16, seed=47)
    dy = rand(data_shape(8, channels, (size, size), data_format), torch.bfloat16, seed=48)
    pad = kernel // 2
    attributes = dict(pads_begin=pad, pads_end=pad, groups=channels, data_format=data_format, filter_format="OIX")
    assert run(None, x, dy, [channels, 1, kernel, kernel], attributes)[1] == expected


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
def test_bf16_1x1_channels_first_goes_to_brgemm():
    """ResNet-50's channels-first 1x1 layers in bf16 ran 1.7-5x faster on brgemm than in oneDNN
    (Sapphire Rapids, 2 threads)."""
    x, dy = rand([8, 64, 28, 28], torch.bfloat16, seed=5), rand([8, 256, 28, 28], torch.bfloat16, seed=6)
    assert run(None, x, dy, [256, 64, 1, 1], dict(data_format="NCX", filter_format="OIX"))[1] == "brgemm"


@pytest.mark.skipif(not AMX, reason="needs a CPU with AMX")
def test_bf16_strided_3x3_channels_first_goes_to_amx_planes():
    """ResNet-50's channels-first stride-2 3x3 layer in bf16 ran 1.2-1.5x faster on amx_planes than
    in oneDNN (Sapphire Rapids, 2 threads)."""
    x, dy = rand([8, 128, 56, 56], torch.bfloat16, seed=5), rand([8, 128, 28, 28], torch.bfloat16, seed=6)
    attributes = dict(strides=2, pads_begin=0, pads_end=1, data_format="NCX", filter_format="OIX")
    assert run(None, x, dy, [128, 128, 3, 3], attributes)[1] == "amx_planes"


def cuda_matmul_problem(dtype):
    """An unpadded stride-2 1x1 layer on NCX CUDA data, which matmul supports."""
    x = rand(data_shape(2, 16, (8, 8), "NCX"), dtype, seed=23, device="cuda")
    dy = rand(data_shape(2, 24, (4, 4), "NCX"), dtype, seed=24, device="cuda")
    return x, dy, [24, 16, 1, 1], dict(strides=2, data_format="NCX", filter_format="OIX")


@requires_cuda
@pytest.mark.parametrize("config", [None, ":4096:8", ":16:8"])
def test_cuda_matmul_runs_deterministically_only_with_a_fixed_cublas_workspace(config, monkeypatch):
    """Under torch.use_deterministic_algorithms, cuBLAS (matmul) runs only with a deterministic
    workspace; without one the problem goes to cuDNN, where ATen's mm would have raised."""
    if config is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    x, dy, shape, attributes = cuda_matmul_problem(torch.bfloat16)
    with setting(torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, True):
        result, ran = run("matmul", x, dy, shape, attributes)
    assert (ran == "matmul") == (config is not None)
    assert_matches_ref(result, REF.conv_backprop_filters(x.cpu(), dy.cpu(), shape, **attributes), torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("cublas_tf32,cudnn_tf32,runs", [(True, False, False), (False, True, True),
                                                          (False, False, True), (True, True, True)])
def test_cuda_f32_matmul_is_never_less_precise_than_the_convolution_tf32_setting(cublas_tf32, cudnn_tf32, runs):
    """f32 follows torch.backends.cudnn.allow_tf32: cuBLAS (matmul) runs unless only its own
    setting allows TF32."""
    x, dy, shape, attributes = cuda_matmul_problem(torch.float32)
    def tf32(backend):
        return lambda: backend.allow_tf32, lambda value: setattr(backend, "allow_tf32", value)
    with setting(*tf32(torch.backends.cudnn), cudnn_tf32), setting(*tf32(torch.backends.cuda.matmul), cublas_tf32):
        ran = run("matmul", x, dy, shape, attributes)[1]
    assert (ran == "matmul") == runs


# The CUDA cost models' picks on the benchmark's layers at its CUDA batch (64), each the fastest
# or within 3% of it on an H100 (GPU time, torch 2.11, 2026-11-27, benchmarks/forced_algorithms.py):
# f32 7x7 depthwise on channels-last data copied to NCX (3.4x), NCX data copied to channels-last
# by the tiled transposition for bf16 7x7 (6.8x) and 3x3 (2.6x) depthwise, f16 1x1 on 14x14
# maps (1.2x), bf16 3x3 (1.09x) and f32 3x3 with stride 2 (1.2x); a stride-2 1x1 layer on NCX
# bf16 data as one cuBLAS product (1.15x); cuDNN in place where the copy costs more than it
# saves (NCX 1x1 on 56x56 maps: the copy took 2.7x; f32 depthwise with stride 2: 1.7x; f32 1x1
# on 14x14 maps: 1.01x, and 1.05x on an H200 on 2026-12-04) or the data is channels-last already.
CUDA_PICKS = [
    # (data_format, dtype, C, O, size, kernel, attributes, pick)
    ("NXC", torch.float32, 96, 96, (56, 56), 7, dict(pads_begin=3, pads_end=3, groups=96), "aten_channels_first"),
    ("NCX", torch.bfloat16, 96, 96, (56, 56), 7, dict(pads_begin=3, pads_end=3, groups=96), "aten_channels_last"),
    ("NCX", torch.bfloat16, 144, 144, (56, 56), 3, dict(pads_begin=1, pads_end=1, groups=144), "aten_channels_last"),
    ("NCX", torch.float32, 144, 144, (56, 56), 3, dict(strides=2, pads_begin=1, pads_end=1, groups=144), "aten"),
    ("NCX", torch.bfloat16, 256, 512, (56, 56), 1, dict(strides=2), "matmul"),
    ("NXC", torch.bfloat16, 256, 512, (56, 56), 1, dict(strides=2), "aten"),
    ("NXC", torch.float16, 1024, 256, (14, 14), 1, dict(), "aten"),
    ("NCX", torch.float16, 1024, 256, (14, 14), 1, dict(), "aten_channels_last"),
    ("NCX", torch.float32, 1024, 256, (14, 14), 1, dict(), "aten"),
    ("NCX", torch.float16, 64, 256, (56, 56), 1, dict(), "aten"),
    ("NCX", torch.bfloat16, 64, 64, (56, 56), 3, dict(pads_begin=1, pads_end=1), "aten_channels_last"),
    ("NCX", torch.float32, 128, 128, (56, 56), 3, dict(strides=2, pads_begin=0, pads_end=1), "aten_channels_last"),
]


@requires_cuda
@pytest.mark.parametrize("data_format,dtype,c,o,size,kernel,attributes,pick", CUDA_PICKS)
def test_cuda_picks(data_format, dtype, c, o, size, kernel, attributes, pick):
    stride = attributes.get("strides", 1)
    pads = attributes.get("pads_begin", 0) + attributes.get("pads_end", 0)
    out = [(s + pads - kernel) // stride + 1 for s in size]
    x = rand(data_shape(64, c, size, data_format), dtype, seed=21, device="cuda")
    dy = rand(data_shape(64, o, out, data_format), dtype, seed=22, device="cuda")
    shape = [o, c // attributes.get("groups", 1), kernel, kernel]
    assert run(None, x, dy, shape, dict(attributes, data_format=data_format, filter_format="OIX"))[1] == pick


# The layout copy of aten_channels_last/aten_channels_first (_batched_transpose): shapes on and
# off its CUDA kernel's 64x64 tiles, batch and row strides of views, and rows that are not
# unit-strided (ATen's copy).
TRANSPOSE_SHAPES = [(1, 1, 1), (2, 64, 64), (3, 65, 130), (1, 1, 200), (2, 200, 1), (2, 7, 3), (0, 4, 5), (5, 130, 67)]


def transpose_views(shape, dtype, device):
    """(name, (B, R, S) matrices) views of ``shape``: contiguous, inside a larger tensor (batch
    and row strides of their own), with rows of stride 2, and with R unit-strided."""
    b, r, s = shape
    big = rand((b, 2 * r + 1, s + 3), torch.float64, seed=31).to(dtype).to(device)
    yield "contiguous", rand(shape, torch.float64, seed=32).to(dtype).to(device)
    yield "sliced", big[:, 1::2, 2:2 + s]
    yield "strided rows", rand((b, r, 2 * s), torch.float64, seed=33).to(dtype).to(device)[:, :, ::2]
    yield "transposed", rand((b, s, r), torch.float64, seed=34).to(dtype).to(device).transpose(1, 2)


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_batched_transpose(device, shape, dtype):
    for name, matrices in transpose_views(shape, dtype, device):
        if matrices.numel():
            matrices[:, 0, 0] = float("nan")
        out = torch.ops.torch_convgrad._batched_transpose(matrices)
        expected = matrices.transpose(1, 2).contiguous()
        assert out.is_contiguous() and out.shape == expected.shape, name
        assert out.data_ptr() != matrices.data_ptr() or out.numel() == 0, name
        # Bit for bit, NaN included.
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
        assert torch.equal(out.view(bits), expected.view(bits)), name


def test_batched_transpose_checks_its_argument():
    with pytest.raises(ValueError, match="expected \\(B, R, S\\) matrices, got 2 dims"):
        torch.ops.torch_convgrad._batched_transpose(torch.zeros(3, 4))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_batched_transpose_opcheck(device, requires_grad):
    matrices = rand((2, 70, 9), device=device).requires_grad_(requires_grad)
    torch.library.opcheck(torch.ops.torch_convgrad._batched_transpose.default, (matrices,))


# Data that the layout copies take as one transposition (dense NCX or NXC, batch-sliced) and
# that they do not (spatially sliced), in every rank.
LAYOUT_COPY_VIEWS = ["dense", "batch sliced", "spatially sliced"]


@pytest.mark.parametrize("algorithm", ["aten_channels_last", "aten_channels_first"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("view", LAYOUT_COPY_VIEWS)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_layout_copies(device, algorithm, data_format, view, rank):
    size = (9, 8, 7)[:rank]
    def data(channels, seed):
        n = 5 if view == "batch sliced" else 2
        spatial = [s + 2 for s in size] if view == "spatially sliced" else list(size)
        t = rand(data_shape(n, channels, spatial, data_format), seed=seed, device=device)
        if view == "batch sliced":
            t = t[1::2]
        if view == "spatially sliced":
            first = 0 if data_format == "NCX" else 1
            for axis in range(rank):
                t = t.narrow(2 + axis - first, 1, size[axis])
        return t
    x, dy = data(12, 41), data(9, 42)
    shape = [9, 4, *[3] * rank]
    attributes = dict(pads_begin=[1] * rank, pads_end=[1] * rank, groups=3, data_format=data_format,
                      filter_format="OIX")
    out, ran = run(algorithm, x, dy, shape, attributes)
    if ran != algorithm:  # the data is already dense in that layout; views of it are copied
        assert view == "dense"
        assert (algorithm, data_format) in {("aten_channels_last", "NXC"), ("aten_channels_first", "NCX")}
        return
    expected = REF.conv_backprop_filters(x.double().cpu(), dy.double().cpu(), shape, **attributes)
    assert_matches_ref(out, expected, torch.float32)
