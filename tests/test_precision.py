"""f16/bf16 accumulate in at least float32 (SPEC section 6).

A long reduction of positive values exposes low-precision accumulation: summed
in bf16/f16, the partial sums stop growing once the addends fall below half
an ulp, giving errors of tens of percent. With float32 accumulation the only
error left is the final rounding of the result.
"""
import pytest
import torch

import torch_convgrad
from torch_convgrad import reference

# (rank, N, spatial): N * prod(spatial) terms per weight entry, kept below f16's
# overflow for values in [0, 1).
CASES = [(1, 32, (512,)), (2, 16, (32, 32)), (3, 4, (8, 16, 16))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rank, batch, spatial", CASES, ids=lambda case: str(case))
@pytest.mark.parametrize("op", ["conv_backprop_filters", "conv_transpose_backprop_filters"])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "no-onednn"])
@pytest.mark.parametrize("groups", [1, 4], ids=["dense", "depthwise"])
@pytest.mark.parametrize("algorithm", torch_convgrad.algorithm_names())
def test_long_reductions_accumulate_in_float32(op, rank, batch, spatial, dtype, onednn, groups, algorithm):
    """Every algorithm accumulates in float32; with oneDNN off, ATen's slow paths would sum in
    the low precision, so the ATen algorithms then compute in float32."""
    generator = torch.Generator().manual_seed(rank)
    channels = 4
    x = torch.rand(batch, channels, *spatial, generator=generator).to(dtype)
    dy = torch.rand(batch, channels, *spatial, generator=generator).to(dtype)
    # OIX: (O, C/g, K) for a convolution, (OC/g, IC, K) for a ConvTranspose.
    channel_entries = [channels, channels // groups] if op == "conv_backprop_filters" else [channels // groups, channels]
    shape = [*channel_entries, *([3] * rank)]
    kwargs = dict(pads_begin=1, pads_end=1, groups=groups, data_format="NCX", filter_format="OIX")
    with torch.backends.mkldnn.flags(enabled=onednn), torch_convgrad.use_algorithm(algorithm):
        got = getattr(torch_convgrad, op)(x, dy, shape, **kwargs)
    expected = getattr(reference, op)(x, dy, shape, **kwargs)
    assert got.dtype == dtype
    relative_error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    # One rounding to bf16 (8 mantissa bits) or f16 (11) of the result, not of every partial sum.
    assert relative_error < (5e-3 if dtype == torch.bfloat16 else 1e-3), relative_error
