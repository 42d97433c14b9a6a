"""Inputs with more than 2**31 elements: every index computation must be 64-bit.

The input is zero except a stretch that straddles element 2**31, holding small integers, so
the exact result is known from that stretch alone and is exactly representable in float32: an
index that wraps at 2**31 (or 2**32) reads zeros or other values and changes the result.
Skipped with a reason where the device has too little free memory.
"""
import pytest
import torch

import torch_convgrad

from conftest import DEVICES

LENGTH = 2**31 + 2**20  # one batch, one channel, 1-D
STRETCH = range(2**31 - 2**20, LENGTH)  # the nonzero input elements
STRIDE = 1024  # keeps output_delta small: 2**21 + 2**10 elements
NEEDED_BYTES = 2 * LENGTH * 4  # the input, and room for one copy of it


def free_bytes(device):
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


@pytest.mark.parametrize("device", DEVICES)
def test_input_over_two_to_the_31_elements(device):
    available = free_bytes(device)
    if available < NEEDED_BYTES:
        pytest.skip(f"needs {NEEDED_BYTES / 2**30:.0f} GiB free on {device}, {available / 2**30:.1f} GiB available")
    x = torch.zeros(1, 1, LENGTH, device=device)
    positions = torch.arange(STRETCH.start, STRETCH.stop, device=device)
    x[0, 0, STRETCH.start:] = (positions % 3 + 1).float()
    outputs = (LENGTH - 1) // STRIDE + 1
    dy = (torch.arange(outputs, device=device) % 2 + 1).float().view(1, 1, outputs).expand(1, 2, outputs)
    dy = dy * torch.tensor([1.0, -2.0], device=device).view(1, 2, 1)  # two output channels
    # dW[o, 0, 0] = sum_j x[j * STRIDE] * dy[o, j]
    read = positions[positions % STRIDE == 0]
    dot = ((read % 3 + 1) * ((read // STRIDE) % 2 + 1)).sum().item()
    want = torch.tensor([dot, -2 * dot], dtype=torch.float32).view(2, 1, 1)
    assert dot < 2**24  # exact in float32, whatever the summation order
    # Every CPU algorithm (one that does not support the problem leaves it to the selector).
    for algorithm in torch_convgrad.algorithm_names() if device == "cpu" else [None]:
        with torch_convgrad.use_algorithm(algorithm):
            got = torch_convgrad.conv_backprop_filters(x, dy, [2, 1, 1], strides=STRIDE,
                                                       data_format="NCX", filter_format="OIX")
        ran = torch_convgrad.last_algorithm()
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=lambda m: f"{ran} (forced {algorithm}): {m}")
