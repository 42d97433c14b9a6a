"""Benchmarks: torch_convgrad against the hand-written ATen glue, and vmap against a loop.

    PYTHONPATH=. python benchmarks/bench_weight_gradient.py [--device cpu|cuda] [--threads N]

The glue is what users write without this package: permute NXC data to NCX,
F.pad the asymmetric pads, aten.convolution_backward for the weight gradient,
permute the OIX result to the requested format. Both sides produce the same
tensor (checked before timing). Times are medians of torch.utils.benchmark.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.utils import benchmark

import torch_convgrad


def aten_glue(x, dy, kernel, stride, pads_begin, pads_end, groups):
    """Weight gradient of an NXC convolution with asymmetric pads, XIO result, via ATen."""
    x_ncx, dy_ncx = x.movedim(-1, 1), dy.movedim(-1, 1)
    pad = [p for begin, end in zip(reversed(pads_begin), reversed(pads_end)) for p in (begin, end)]
    x_ncx = F.pad(x_ncx, pad)
    weight = torch.empty(dy_ncx.shape[1], x_ncx.shape[1] // groups, *kernel, dtype=x.dtype, device=x.device)
    rank = len(kernel)
    _, grad_weight, _ = torch.ops.aten.convolution_backward(
        dy_ncx, x_ncx, weight, None, [stride] * rank, [0] * rank, [1] * rank, False, [0] * rank, groups,
        [False, True, False],
    )
    return grad_weight.permute(*range(2, 2 + rank), 1, 0).contiguous()


# (name, N, spatial, C, O, kernel, stride, pads_begin, pads_end, groups)
LAYERS = [
    ("resnet 3x3 s1 (same)", 32, (56, 56), 64, 64, (3, 3), 1, (1, 1), (1, 1), 1),
    ("resnet 3x3 s2 same_upper", 32, (56, 56), 64, 128, (3, 3), 2, (0, 0), (1, 1), 1),
    ("mobilenet depthwise 3x3", 32, (56, 56), 128, 128, (3, 3), 1, (1, 1), (1, 1), 128),
    ("1-D audio k9 s1", 16, (4000,), 64, 64, (9,), 1, (4,), (4,), 1),
    ("3-D video 3x3x3", 4, (8, 28, 28), 32, 32, (3, 3, 3), 1, (1, 1, 1), (1, 1, 1), 1),
]


def compare_with_glue(device, dtype):
    print(f"\n== weight gradient, NXC data, XIO result, {dtype}, {device} ==")
    print(f"{'layer':28s} {'glue ms':>9s} {'ours ms':>9s} {'speed-up':>9s}")
    for name, n, spatial, c, o, kernel, stride, pb, pe, groups in LAYERS:
        out = [(x + b + e - k) // stride + 1 for x, b, e, k in zip(spatial, pb, pe, kernel)]
        x = torch.randn(n, *spatial, c, device=device, dtype=dtype)
        dy = torch.randn(n, *out, o, device=device, dtype=dtype)
        shape = [*kernel, c // groups, o]
        ours = lambda: torch_convgrad.conv_backprop_filters(  # noqa: E731
            x, dy, shape, strides=stride, pads_begin=list(pb), pads_end=list(pe), groups=groups)
        glue = lambda: aten_glue(x, dy, kernel, stride, pb, pe, groups)  # noqa: E731
        torch.testing.assert_close(ours(), glue(), rtol=2e-2, atol=2e-2 * glue().abs().max().item())
        t_glue = benchmark.Timer("f()", globals={"f": glue}).blocked_autorange(min_run_time=1).median
        t_ours = benchmark.Timer("f()", globals={"f": ours}).blocked_autorange(min_run_time=1).median
        print(f"{name:28s} {t_glue * 1e3:9.2f} {t_ours * 1e3:9.2f} {t_glue / t_ours:8.2f}x")


def compare_vmap_with_loop(device):
    """Per-sample weight gradients (differential privacy) of a ResNet 3x3 conv layer."""
    batch, c, o, size = 32, 64, 64, 28
    x = torch.randn(batch, 1, c, size, size, device=device)
    dy = torch.randn(batch, 1, o, size, size, device=device)

    def one(x_sample, dy_sample):
        return torch_convgrad.conv_backprop_filters(
            x_sample, dy_sample, [o, c, 3, 3], pads_begin=1, pads_end=1, data_format="NCX", filter_format="OIX")

    vmapped = torch.func.vmap(one)
    looped = lambda: torch.stack([one(a, b) for a, b in zip(x, dy)])  # noqa: E731
    torch.testing.assert_close(vmapped(x, dy), looped(), rtol=1e-4, atol=1e-4)
    t_vmap = benchmark.Timer("f(x, dy)", globals={"f": vmapped, "x": x, "dy": dy}).blocked_autorange(min_run_time=1)
    t_loop = benchmark.Timer("f()", globals={"f": looped}).blocked_autorange(min_run_time=1)
    print(f"\n== per-sample weight gradients, B={batch}, {c}->{o} 3x3 pad 1, {size}x{size}, f32, {device} ==")
    print(f"loop of {batch} calls: {t_loop.median * 1e3:.2f} ms; vmap (one call): {t_vmap.median * 1e3:.2f} ms; "
          f"speed-up {t_loop.median / t_vmap.median:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads")
    for dtype in (torch.float32, torch.bfloat16):
        compare_with_glue(args.device, dtype)
    compare_vmap_with_loop(args.device)


if __name__ == "__main__":
    main()
