"""Shared helpers for the torch_convgrad tests.

The float64 reference is loaded straight from ``torch_convgrad/reference.py`` by file path,
so ``tests/test_reference.py`` runs even before the C++ extension is built (importing the
package would load ``torch_convgrad._C``).  Test modules use ``from conftest import ...``.
"""

import importlib.util
import os
import pathlib
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

# Hypothesis profiles (registered here, before pytest reads --hypothesis-profile):
# the suite's, and `make fuzz`'s.
settings.register_profile("suite", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# TORCH_CONVGRAD_FAILURE_LOG=PATH appends each failure's traceback to PATH as it happens, so that
# a run stopped by a time limit (a lent GPU machine's call) still says why its failures failed.
# Under pytest-xdist the controller writes it, from the reports its workers send.
_FAILURE_LOG = os.environ.get("TORCH_CONVGRAD_FAILURE_LOG")


def pytest_runtest_logreport(report):
    if _FAILURE_LOG and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(_FAILURE_LOG, "a") as log:
            log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


# The devices the device-generic tests run on; CUDA is skipped, with the reason, where absent.
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_reference():
    name = "_torch_convgrad_reference_standalone"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "torch_convgrad" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


REF = _load_reference()

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "sliced", "transposed", "channels_last"]

# Tolerance per result dtype.  f64/f32: relative to each element plus the same fraction of the
# largest magnitude (sums can cancel); f16/bf16: a fraction of the largest magnitude (the result
# is rounded to 11 / 8 significant bits).
_TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (0.0, 5e-3),
    torch.bfloat16: (0.0, 2e-2),
}


def short(dtype):
    """Short dtype name for test ids."""
    return {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
            torch.bfloat16: "bf16"}.get(dtype, str(dtype))


def with_layout(t, layout):
    """The same values as ``t`` with the strides of ``layout``.

    contiguous: plain; sliced: every dimension a stride-2 view (offset 1) into a larger buffer
    poisoned with NaN, so reading outside the view shows; transposed: every stride reversed;
    channels_last: the channel dimension (dim 1) fastest (torch.channels_last[_3d] for 4/5-D);
    expanded: the batch dimension of stride 0 (the values become those of batch 0).
    """
    if layout == "contiguous":
        return t.contiguous()
    if layout == "sliced":
        big = torch.full([2 * n + 1 for n in t.shape], float("nan"), dtype=t.dtype, device=t.device)
        view = big[tuple(slice(1, 1 + 2 * n, 2) for n in t.shape)]
        view.copy_(t)
        return view
    if layout == "transposed":
        rev = tuple(range(t.dim() - 1, -1, -1))
        return t.permute(rev).contiguous().permute(rev)
    if layout == "channels_last":
        if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        if t.dim() == 5:
            return t.contiguous(memory_format=torch.channels_last_3d)
        return t.movedim(1, -1).contiguous().movedim(-1, 1)
    if layout == "expanded":
        return t[:1].expand(t.shape)
    raise ValueError(layout)


def rand(shape, dtype=torch.float32, seed=0, layout="contiguous", device="cpu"):
    """Random normal data (generated in float64 on the CPU, rounded to ``dtype``, so every
    device gets the same values) on ``device``, in ``layout``."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(list(shape), generator=gen, dtype=torch.float64).to(dtype).to(device)
    return with_layout(t, layout)


def data_shape(n, c, spatial, data_format):
    """Logical shape of a data tensor: NCX ``(N, C, X...)`` or NXC ``(N, X..., C)``."""
    if data_format.upper() == "NCX":
        return [n, c] + list(spatial)
    return [n] + list(spatial) + [c]


def assert_matches_ref(out, ref, dtype):
    """``out`` (in ``dtype``, on any device) equals the float64 reference (on the CPU) within
    the dtype's tolerance."""
    rtol, frac = _TOL[dtype]
    scale = ref.abs().max().item() if ref.numel() else 0.0
    atol = max(frac * scale, 1e-12)
    torch.testing.assert_close(out.detach().to("cpu", torch.float64), ref, rtol=rtol, atol=atol)


def check_result(out, x, shape):
    """Result dtype/device of the data, contiguous, shape equal to the shape argument."""
    assert isinstance(out, torch.Tensor)
    assert out.dtype == x.dtype, (out.dtype, x.dtype)
    assert out.device == x.device, (out.device, x.device)
    assert out.is_contiguous()
    assert list(out.shape) == [int(v) for v in shape], (list(out.shape), list(shape))


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    """Each of DEVICES in turn. On CUDA, cuDNN runs without TF32 (results are compared with
    the float64 reference at float32 tolerance) and deterministically (results of two runs
    are compared bit for bit, and gradcheck needs a reentrant backward)."""
    if request.param == "cuda":
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    return request.param


@pytest.fixture
def ref():
    """The float64 reference module."""
    return REF
