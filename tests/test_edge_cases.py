"""Edge cases found in review: padding-only kernel taps, problems oneDNN gets wrong, size
overflow, argument types, vmap over an empty batch, the weights op's names in messages, and the
backward with a shape tensor under torch.compile."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_convgrad
from torch_convgrad import reference

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _poison_allocator():
    """Leave NaN in freed memory, so that an uninitialised result shows up."""
    for size in (36, 64, 300, 1000, 5000):
        torch.full((size,), float("nan"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["conv_backprop_filters", "conv_transpose_backprop_filters"])
def test_kernel_taps_that_meet_only_padding_give_exact_zeros(op, dtype):
    """Width 1, pads 2, kernel 3, stride 2: the middle tap never meets data. ATen's oneDNN
    bf16 path leaves such entries uninitialised; the op must return zeros there."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 2, 3, 1, generator=generator).to(dtype)     # conv input / convT output_delta
    dy = torch.randn(16, 2, 3, 2, generator=generator).to(dtype)    # conv output_delta / convT input
    if op == "conv_transpose_backprop_filters":
        x, dy = dy, x
    kwargs = dict(strides=[1, 2], pads_begin=[1, 2], pads_end=[1, 2], data_format="NCX", filter_format="OIX")
    expected = getattr(reference, op)(x, dy, [2, 2, 3, 3], **kwargs)
    assert (expected[..., 1] == 0).all()  # the dead middle tap of the last axis
    for _ in range(3):
        _poison_allocator()
        got = getattr(torch_convgrad, op)(x, dy, [2, 2, 3, 3], **kwargs)
        assert torch.equal(got[..., 1], torch.zeros_like(got[..., 1]))
        torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


# op: (input_forward NCX shape, output_delta channels, kernel, pads, strides, groups). oneDNN's
# bf16 weight gradient without AMX tiles got each of these wrong every time on a Zen 4 with their
# padding passed to it; none has a kernel tap that meets only padding.
PADDED_BF16_PROBLEMS = {
    "kernel-deeper-than-input": ("conv_backprop_filters", (3, 16, 2, 5, 6), 16, [3, 3, 3], [1, 1, 1], [1, 1, 1], 1),
    "strided": ("conv_backprop_filters", (3, 4, 3, 5, 6), 16, [5, 3, 3], [2, 1, 1], [2, 1, 1], 1),
    "transposed-grouped": ("conv_transpose_backprop_filters", (3, 3, 2, 4, 2), 6, [3, 3, 1], [1, 1, 0], [1, 1, 1], 3),
}


@pytest.mark.parametrize("algorithm", ["aten", "aten_channels_last"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("problem", PADDED_BF16_PROBLEMS.values(), ids=PADDED_BF16_PROBLEMS.keys())
def test_padded_3d_bf16_problems_through_aten_match_the_reference(problem, data_format, algorithm):
    op, shape, delta_channels, kernel, pads, strides, groups = problem
    sizes = zip(shape[2:], pads, kernel, strides)
    if op == "conv_transpose_backprop_filters":
        delta_size = [(size - 1) * stride + k - 2 * pad for size, pad, k, stride in sizes]
        filter_shape = [delta_channels // groups, shape[1], *kernel]
    else:
        delta_size = [(size + 2 * pad - k) // stride + 1 for size, pad, k, stride in sizes]
        filter_shape = [delta_channels, shape[1] // groups, *kernel]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=generator).to(torch.bfloat16)
    dy = torch.randn(shape[0], delta_channels, *delta_size, generator=generator).to(torch.bfloat16)
    if data_format == "NXC":
        x, dy = x.movedim(1, -1).contiguous(), dy.movedim(1, -1).contiguous()
    kwargs = dict(strides=strides, pads_begin=pads, pads_end=pads, groups=groups, data_format=data_format,
                  filter_format="OIX")
    expected = getattr(reference, op)(x, dy, filter_shape, **kwargs)
    for _ in range(3):
        _poison_allocator()
        with torch_convgrad.use_algorithm(algorithm):
            got = getattr(torch_convgrad, op)(x, dy, filter_shape, **kwargs)
        torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


# (input_forward NCX shape, output_delta channels, kernel, strides, dilations, pads_begin, pads_end,
# groups). oneDNN's CPU weight gradient (torch 2.13, Sapphire Rapids) got each of these wrong in
# float32 with its padding passed to it, channels-last: garbage or infinities every time, a heap
# corrupted (glibc aborted the process at a later free), and a call that did not return.
PADDED_3D_PROBLEMS = {
    "garbage": ((4, 16, 7, 5, 3), 50, [7, 2, 2], [2, 1, 2], [1, 3, 1], [3, 1, 0], [3, 2, 1], 2),
    "heap-corrupted": ((3, 24, 3, 4, 6), 21, [5, 2, 5], [2, 1, 2], [1, 2, 1], [3, 0, 2], [3, 0, 2], 3),
    "never-returned": ((2, 9, 4, 8, 8), 3, [7, 2, 2], [3, 1, 1], [1, 3, 1], [4, 2, 1], [4, 2, 1], 1),
}

# Runs in a child process, under glibc's heap checks: every PADDED_3D_PROBLEMS problem through
# ATen's algorithms, in both layouts, f32 and bf16, against the float64 reference.
PADDED_3D_CHILD = """
import sys, torch, torch_convgrad
from torch_convgrad import reference
problems = eval(sys.argv[1])
for shape, delta_channels, kernel, strides, dilations, pads_begin, pads_end, groups in problems:
    delta_size = [(size + b + e - (k - 1) * d - 1) // s + 1
                  for size, b, e, k, d, s in zip(shape[2:], pads_begin, pads_end, kernel, dilations, strides)]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    dy = torch.randn(shape[0], delta_channels, *delta_size, generator=generator, dtype=torch.float64)
    for data_format in ("NXC", "NCX"):
        xs, dys = (x.movedim(1, -1).contiguous(), dy.movedim(1, -1).contiguous()) if data_format == "NXC" else (x, dy)
        kwargs = dict(strides=strides, dilations=dilations, pads_begin=pads_begin, pads_end=pads_end,
                      groups=groups, data_format=data_format, filter_format="OIX")
        filter_shape = [delta_channels, shape[1] // groups, *kernel]
        expected = reference.conv_backprop_filters(xs, dys, filter_shape, **kwargs)
        for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
            for algorithm in ("aten", "aten_channels_last", "aten_channels_first"):
                for _ in range(3):
                    with torch_convgrad.use_algorithm(algorithm):
                        got = torch_convgrad.conv_backprop_filters(xs.to(dtype), dys.to(dtype), filter_shape, **kwargs)
                    error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
                    assert error < tolerance, (shape, data_format, dtype, algorithm, error)
print("ok")
"""


@pytest.mark.parametrize("problem", PADDED_3D_PROBLEMS.values(), ids=PADDED_3D_PROBLEMS.keys())
def test_padded_3d_problems_through_aten_match_the_reference(problem):
    """The aten algorithms give oneDNN 3-D problems with their padding materialised."""
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.check=3")
    child = subprocess.run([sys.executable, "-c", PADDED_3D_CHILD, repr([problem])], env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "ok", (child.returncode, child.stderr[-2000:])


# op, (input_forward NCX shape, output_delta channels, kernel, dilations, pads): grouped bf16 with
# a dilated kernel, which oneDNN's bf16 weight gradient got wrong on channels-last data (garbage
# or NaN every time; torch 2.13, Sapphire Rapids), a 1x1 kernel's dilation included.
DILATED_GROUPED_BF16_PROBLEMS = {
    "depthwise-3x3": ("conv_backprop_filters", (2, 16, 28, 31), 16, [3, 3], [2, 1], [2, 1]),
    "depthwise-3x3-both-axes": ("conv_backprop_filters", (2, 16, 28, 31), 16, [3, 3], [2, 2], [2, 2]),
    "transposed-depthwise-1x1": ("conv_transpose_backprop_filters", (4, 33, 28, 31), 33, [1, 1], [2, 1], [0, 0]),
}


@pytest.mark.parametrize("algorithm", ["aten", "aten_channels_last", None])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("problem", DILATED_GROUPED_BF16_PROBLEMS.values(), ids=DILATED_GROUPED_BF16_PROBLEMS.keys())
def test_dilated_grouped_bf16_problems_through_aten_match_the_reference(problem, data_format, algorithm):
    op, shape, delta_channels, kernel, dilations, pads = problem
    groups = shape[1]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=generator).to(torch.bfloat16)
    dy = torch.randn(shape[0], delta_channels, *shape[2:], generator=generator).to(torch.bfloat16)
    if data_format == "NXC":
        x, dy = x.movedim(1, -1).contiguous(), dy.movedim(1, -1).contiguous()
    transposed = op == "conv_transpose_backprop_filters"
    filter_shape = [shape[1], delta_channels // groups, *kernel] if transposed else [delta_channels, 1, *kernel]
    kwargs = dict(dilations=dilations, pads_begin=pads, pads_end=pads, groups=groups, data_format=data_format,
                  filter_format="IOX" if transposed else "OIX")
    expected = getattr(reference, op)(x, dy, filter_shape, **kwargs)
    with torch_convgrad.use_algorithm(algorithm):
        got = getattr(torch_convgrad, op)(x, dy, filter_shape, **kwargs)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-2 * expected.abs().max().item())


# 1x1 kernels with a stride, which oneDNN's weight gradient got wrong now and then on channels-last
# data (18 of 465 random small 2-D float32 problems, bf16 too; right again on the next call with the
# same data; torch 2.13, Zen 3): (N, C, O, input size, strides, pads_begin, pads_end). The padded
# ones leave windows that read only padding, the last one every window but one.
STRIDED_1X1_PROBLEMS = {
    "2d-stride-1x2": (2, 2, 1, (4, 2), [1, 2], [0, 0], [0, 0]),
    "2d-stride-2x2": (2, 4, 4, (8, 8), [2, 2], [0, 0], [0, 0]),
    "2d-stride-2x1": (2, 4, 1, (8, 4), [2, 1], [0, 0], [0, 0]),
    "2d-padded": (2, 3, 5, (7, 6), [2, 3], [1, 2], [1, 0]),
    "2d-padded-beyond": (1, 2, 3, (3, 2), [3, 2], [3, 2], [4, 3]),
    "1d": (3, 4, 2, (9,), [2], [0], [0]),
    "3d": (2, 3, 2, (4, 6, 5), [1, 2, 2], [0, 1, 0], [0, 0, 1]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("algorithm,data_format", [("aten", "NXC"), ("aten_channels_last", "NCX")])
@pytest.mark.parametrize("problem", STRIDED_1X1_PROBLEMS.values(), ids=STRIDED_1X1_PROBLEMS.keys())
def test_strided_1x1_problems_through_onednn_on_channels_last_data_match_the_reference(
        problem, algorithm, data_format, dtype):
    n, c, o, size, strides, pads_begin, pads_end = problem
    windows = [(s + b + e - 1) // stride + 1 for s, b, e, stride in zip(size, pads_begin, pads_end, strides)]
    generator = torch.Generator().manual_seed(7)
    kwargs = dict(strides=strides, pads_begin=pads_begin, pads_end=pads_end, data_format=data_format,
                  filter_format="OIX")
    for _ in range(8):  # oneDNN's errors came and went from call to call
        x = torch.randn(n, c, *size, generator=generator).to(dtype)
        dy = torch.randn(n, o, *windows, generator=generator).to(dtype)
        if data_format == "NXC":
            x, dy = x.movedim(1, -1).contiguous(), dy.movedim(1, -1).contiguous()
        expected = reference.conv_backprop_filters(x, dy, [o, c, *([1] * len(size))], **kwargs)
        with torch_convgrad.use_algorithm(algorithm):
            got = torch_convgrad.conv_backprop_filters(x, dy, [o, c, *([1] * len(size))], **kwargs)
            assert torch_convgrad.last_algorithm() == algorithm
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=tolerance * max(1, expected.abs().max().item()))


@pytest.mark.parametrize("attribute", ["strides", "dilations", "pads_begin", "pads_end"])
def test_attribute_values_above_int32_are_rejected(attribute):
    x, dy = torch.randn(1, 1, 4), torch.randn(1, 1, 2)
    with pytest.raises(ValueError, match=rf"{attribute}: expected values between \d and 2147483647"):
        torch_convgrad.conv_backprop_filters(x, dy, [1, 1, 3], data_format="NCX", filter_format="OIX",
                                             **{attribute: 2**62})


def test_overflowing_kernel_sizes_are_rejected_by_real_and_meta_kernels():
    for device in ("cpu", "meta"):
        x, dy = torch.randn(1, 1, 4, device=device), torch.randn(1, 1, 1, device=device)
        with pytest.raises(ValueError, match="filter_shape: expected kernel sizes up to 2147483647"):
            torch_convgrad.conv_backprop_filters(x, dy, [1, 1, 2**32 + 1], dilations=2**31 - 1,
                                                 data_format="NCX", filter_format="OIX")


@pytest.mark.parametrize("value", [np.int64(2), np.int32(2), torch.tensor(2)], ids=["np.int64", "np.int32", "0-d"])
def test_integer_likes_are_accepted_as_attributes(value):
    x, dy = torch.randn(2, 3, 9, 9), torch.randn(2, 4, 4, 4)
    got = torch_convgrad.conv_backprop_filters(x, dy, [4, 3, 3, 3], strides=value, data_format="NCX",
                                               filter_format="OIX")
    expected = torch_convgrad.conv_backprop_filters(x, dy, [4, 3, 3, 3], strides=2, data_format="NCX",
                                                    filter_format="OIX")
    assert torch.equal(got, expected)


@pytest.mark.parametrize("op, shape", [("conv_backprop_filters", [3, 3, 2, 6]),
                                       ("conv_transpose_backprop_filters", [3, 3, 6, 2])])
def test_vmap_over_an_empty_batch(op, shape):
    xs, dys = torch.randn(0, 2, 7, 7, 2), torch.randn(0, 2, 7, 7, 6)
    if op == "conv_transpose_backprop_filters":
        xs, dys = dys, xs
    fn = getattr(torch_convgrad, op)
    got = torch.func.vmap(lambda x, dy: fn(x, dy, shape, pads_begin=1, pads_end=1))(xs, dys)
    assert got.shape == (0, *shape) and got.dtype == xs.dtype
    with pytest.raises(ValueError, match="filter_shape"):
        torch.func.vmap(lambda x, dy: fn(x, dy, [3, 3, 5, 5], pads_begin=1, pads_end=1))(xs, dys)


def test_weights_op_messages_use_its_own_argument_names():
    src, diff_dst = torch.randn(2, 8, 8, 4), torch.randn(2, 6, 6, 5)
    with pytest.raises(ValueError) as info:
        torch_convgrad.conv_backprop_weights(src, diff_dst, [3, 3, 4, 7])
    message = str(info.value)
    assert message.startswith("weights_shape:") and "diff_dst" in message
    assert "output_delta" not in message and "input_forward" not in message


def test_backward_compiles_with_a_shape_tensor():
    x = torch.randn(2, 6, 7, 4, requires_grad=True)
    dy = torch.randn(2, 3, 3, 6, requires_grad=True)

    def fn(x, dy, shape):
        return torch_convgrad.conv_backprop_filters(x, dy, shape, strides=2, pads_begin=[1, 0], pads_end=[0, 1],
                                                    groups=2).square().sum()

    shape = torch.tensor([3, 3, 2, 6])
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, dy, shape), (x, dy))
    expected = torch.autograd.grad(fn(x, dy, shape.tolist()), (x, dy))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
