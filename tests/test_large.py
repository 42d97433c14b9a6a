"""Inputs with more than 2**31 elements: every index computation must be 64-bit.

The input is zero except three stretches holding small integers: one that straddles element
2**31, one at the start and one in the middle (where a sample this large is split in two, see
csrc/algorithms/aten.cpp). The exact result is known from the stretches alone and is exactly
representable in float32: an index that wraps at 2**31 (or 2**32) reads zeros or other values,
and a misplaced piece reads the wrong elements, and either changes the result. Skipped with a
reason where the device has too little free memory.
"""
import os
import subprocess
import sys

import pytest
import torch

import torch_convgrad

from conftest import DEVICES, ROOT

LENGTH = 2**31 + 2**20  # one batch, one channel, 1-D
STRETCHES = [range(0, 2**20), range(2**30 - 2**20, 2**30 + 2**20), range(2**31 - 2**20, LENGTH)]  # nonzero
STRIDE = 1024  # keeps output_delta small: 2**21 + 2**10 elements
NEEDED_BYTES = 2 * LENGTH * 4  # the input, and room for one copy of it


def free_bytes(device):
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


# (kernel, dilation, pads_begin, pads_end): windows on the input alone, and dilated windows that
# start in padding and are wider than the stride, so that the two pieces' inputs overlap.
GEOMETRIES = [(1, 1, 0, 0), (3, 600, 700, 100)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "k{}-d{}-pb{}-pe{}".format(*g))
@pytest.mark.parametrize("device", DEVICES)
def test_input_over_two_to_the_31_elements(device, geometry):
    available = free_bytes(device)
    if available < NEEDED_BYTES:
        pytest.skip(f"needs {NEEDED_BYTES / 2**30:.0f} GiB free on {device}, {available / 2**30:.1f} GiB available")
    if device == "cpu":
        check(device, geometry)
        return
    # In a child process: ATen's CUDA convolutions have faulted past 2**31 elements
    # (pytorch/pytorch#117736), and a fault here would otherwise fail every later CUDA call
    # of this test process, not this test alone.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, __file__, device, *map(str, geometry)], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=path))
    assert child.returncode == 0, f"exit {child.returncode}:\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"


def check(device, geometry):
    kernel, dilation, pad_begin, pad_end = geometry
    x = torch.zeros(1, 1, LENGTH, device=device)
    for stretch in STRETCHES:
        positions = torch.arange(stretch.start, stretch.stop, device=device)
        x[0, 0, stretch.start:stretch.stop] = (positions % 3 + 1).float()
    outputs = (LENGTH + pad_begin + pad_end - (kernel - 1) * dilation - 1) // STRIDE + 1
    dy = (torch.arange(outputs, device=device) % 2 + 1).float().view(1, 1, outputs).expand(1, 2, outputs)
    dy = dy * torch.tensor([1.0, -2.0], device=device).view(1, 2, 1)  # two output channels
    # dW[o, 0, k] = sum_j x[j * STRIDE - pad_begin + k * dilation] * dy[o, j]
    windows = torch.arange(outputs)
    dots = []
    for tap in range(kernel):
        read = windows * STRIDE - pad_begin + tap * dilation
        inside = sum((read >= stretch.start) & (read < stretch.stop) for stretch in STRETCHES).bool()
        dots.append(((read[inside] % 3 + 1) * (windows[inside] % 2 + 1)).sum().item())
    assert 0 < max(dots) < 2**24  # exact in float32, whatever the summation order
    want = torch.tensor([dots, [-2 * dot for dot in dots]], dtype=torch.float32).view(2, 1, kernel)
    # Every CPU algorithm (one that does not support the problem leaves it to the selector).
    for algorithm in torch_convgrad.algorithm_names() if device == "cpu" else [None]:
        with torch_convgrad.use_algorithm(algorithm):
            got = torch_convgrad.conv_backprop_filters(x, dy, [2, 1, kernel], strides=STRIDE, pads_begin=pad_begin,
                                                       pads_end=pad_end, dilations=dilation, data_format="NCX",
                                                       filter_format="OIX")
        ran = torch_convgrad.last_algorithm()
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=lambda m: f"{ran} (forced {algorithm}): {m}")


if __name__ == "__main__":  # the child process of a CUDA case: DEVICE KERNEL DILATION PADS_BEGIN PADS_END
    check(sys.argv[1], tuple(int(value) for value in sys.argv[2:]))
