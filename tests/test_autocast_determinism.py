"""Autocast policy and run-to-run determinism of the torch_convgrad ops, on each device.

Autocast (csrc/autocast/): inside ``torch.autocast(device, dtype=...)`` floating inputs other
than float64 are cast to the region's dtype and the op runs and returns in it; float64
inputs are left alone.

Determinism: on CPU only run-to-run reproducibility at a fixed thread count is promised
(results at different thread counts may differ in the last bits), so only that is checked.
On CUDA it is promised under ``torch.use_deterministic_algorithms(True)``, as for
``nn.Conv2d``.
"""
import contextlib
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import torch_convgrad  # noqa: F401  (registers the ops)
from problems import OP_NAMES, FORMATS, FORMAT_KW, op_packet, Problem
from conftest import REF, requires_cuda



def op_function(problem):
    shape, kw = problem.shape(), problem.kwargs()
    packet = op_packet(problem.op)
    return lambda x, dy: packet(x, dy, shape, **kw)


REF_FN = {"filters": REF.conv_backprop_filters, "weights": REF.conv_backprop_weights,
          "transpose": REF.conv_transpose_backprop_filters}


def reference(problem, x, dy):
    """The float64 reference, computed on the CPU."""
    kw = problem.kwargs()
    pb, pe, auto_pad, _ = problem.resolve()
    fmt_kw = FORMAT_KW[problem.op]
    args = dict(strides=kw["strides"], pads_begin=pb, pads_end=pe, dilations=kw["dilations"],
                groups=problem.g, data_format=problem.data_format)
    args[fmt_kw] = problem.fmt
    return REF_FN[problem.op](x.cpu(), dy.cpu(), problem.shape(), **args)


AUTOCAST_PROBLEMS = [
    Problem(op=op, fmt=FORMATS[op][i % len(FORMATS[op])], size=(9, 8), n=3, c=4, o=6, g=2, k=(3, 2),
            s=(2, 1), d=(1, 2), pads=["same_upper", ((1, 0), (0, 1))][i % 2], data_format=df)
    for op in OP_NAMES for i, df in enumerate(("NXC", "NCX"))
]

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
# The region's dtype when none is given.
DEFAULT_AUTOCAST_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.float16}


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("problem", AUTOCAST_PROBLEMS, ids=Problem.id)
def test_autocast_casts_float32(problem, dtype, device):
    # CPU autocast takes float16 as well as bfloat16 in this torch; a torch that did not would
    # disable the region (caught by the first assertion), not skip.
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=1, device=device)
    with torch.autocast(device, dtype=dtype):
        assert torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == dtype
        got = fn(x, dy)
    assert got.dtype == dtype
    assert list(got.shape) == problem.shape() and got.is_contiguous()
    want = fn(x.to(dtype), dy.to(dtype))  # outside autocast, inputs cast by hand
    assert want.dtype == dtype
    # Autocast only casts the inputs and runs the same kernel: the results are equal (zero
    # tolerance; the kernels are deterministic, see the determinism tests below).
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # and close to the float64 reference (accumulation in float32, one rounding)
    ref = reference(problem, x.to(dtype), dy.to(dtype))
    scale = ref.abs().max().item()
    torch.testing.assert_close(got.to("cpu", torch.float64), ref, rtol=0,
                               atol=(2e-2 if dtype == torch.bfloat16 else 5e-3) * scale)


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("problem", AUTOCAST_PROBLEMS, ids=Problem.id)
def test_autocast_keeps_float64(problem, dtype, device):
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float64, seed=2, device=device)
    with torch.autocast(device, dtype=dtype):
        got = fn(x, dy)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, fn(x, dy), rtol=0, atol=0)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_autocast_mixed_float32_and_bfloat16(op, device):
    """Outside autocast mixed dtypes are a TypeError; inside, both are cast to bf16."""
    problem = AUTOCAST_PROBLEMS[[p.op for p in AUTOCAST_PROBLEMS].index(op)]
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=3, device=device)
    with pytest.raises(TypeError):
        fn(x, dy.to(torch.bfloat16))
    with torch.autocast(device, dtype=torch.bfloat16):
        got = fn(x, dy.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, fn(x.bfloat16(), dy.bfloat16()), rtol=0, atol=0)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_autocast_default_dtype_disabled_region_and_python_api(op, device):
    api = {"filters": torch_convgrad.conv_backprop_filters, "weights": torch_convgrad.conv_backprop_weights,
           "transpose": torch_convgrad.conv_transpose_backprop_filters}[op]
    problem = Problem(op=op, fmt="XIO", size=(6, 6), n=2, c=2, o=4, k=(3, 3), pads=((1, 1), (1, 1)),
                      data_format="NXC")
    x, dy = problem.tensors(dtype=torch.float32, seed=4, device=device)
    call = lambda: api(x, dy, problem.shape(), pads_begin=1, pads_end=1)
    with torch.autocast(device):
        assert call().dtype == DEFAULT_AUTOCAST_DTYPE[device]
        with torch.autocast(device, enabled=False):
            assert call().dtype == torch.float32
    assert call().dtype == torch.float32


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_autocast_backward(op, device):
    """Autograd through an autocast region: the float32 leaves get float32 gradients equal to
    the gradients of the bf16 computation cast back."""
    problem = AUTOCAST_PROBLEMS[[p.op for p in AUTOCAST_PROBLEMS].index(op)]
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=5, device=device)
    weight = torch.randn(problem.shape(), device=device)

    a, b = x.clone().requires_grad_(), dy.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        out = fn(a, b)
    assert out.dtype == torch.bfloat16 and out.requires_grad
    ga, gb = torch.autograd.grad((out.float() * weight).sum(), (a, b))
    assert ga.dtype == torch.float32 and gb.dtype == torch.float32

    a16, b16 = x.bfloat16().requires_grad_(), dy.bfloat16().requires_grad_()
    wa, wb = torch.autograd.grad((fn(a16, b16).float() * weight).sum(), (a16, b16))
    torch.testing.assert_close(ga, wa.float(), rtol=0, atol=0)
    torch.testing.assert_close(gb, wb.float(), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------

def _medium(op, data_format, fmt, g=1):
    # 2-D, 16 -> 32 channels, 32x32, batch 8 (for ConvTranspose: IC 16 at 32x32 -> OC 32 at 64x64)
    if op == "transpose":
        return Problem(op=op, fmt=fmt, size=(64, 64), n=8, c=16, o=32, g=g, k=(4, 4), s=(2, 2),
                       pads=((1, 1), (1, 1)), data_format=data_format)
    return Problem(op=op, fmt=fmt, size=(32, 32), n=8, c=16, o=32, g=g, k=(3, 3), pads="same_upper",
                   data_format=data_format)


DETERMINISM = [
    (op, df, FORMATS[op][i % len(FORMATS[op])], g)
    for op in OP_NAMES for i, df in enumerate(("NXC", "NCX")) for g in (1, 4)
]


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def deterministic(device, monkeypatch):
    """What determinism is promised under: on CUDA ``torch.use_deterministic_algorithms(True)``
    alone (the device fixture's deterministic cuDNN is lifted), restored after; nothing on CPU."""
    if device != "cuda":
        yield
        return
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


# CPU at each thread count; CUDA once (threads do not matter there). `device` goes through the
# device fixture.
@pytest.mark.parametrize("device,num_threads", [
    pytest.param("cpu", 1, id="cpu-1"), pytest.param("cpu", 2, id="cpu-2"),
    pytest.param("cuda", None, id="cuda", marks=requires_cuda),
], indirect=["device"])
@pytest.mark.parametrize("op,data_format,fmt,g", DETERMINISM, ids=lambda v: str(v))
def test_run_to_run_bitwise_identical(op, data_format, fmt, g, device, num_threads, threads,
                                      deterministic):
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    problem = _medium(op, data_format, fmt, g)
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=6, device=device)
    if problem.op != "transpose":
        assert list(x.shape) == ([8, 32, 32, 16] if data_format == "NXC" else [8, 16, 32, 32])
    first = fn(x, dy)
    assert list(first.shape) == problem.shape()
    for _ in range(2):
        assert torch.equal(fn(x, dy), first)
    # and from fresh copies of the inputs (other buffers, same values)
    assert torch.equal(fn(x.clone(), dy.clone()), first)


@contextlib.contextmanager
def busy_core():
    """Another process spinning on a core: the CPU algorithms' threads take their parts of the
    work as they come free (csrc/algorithms/tasks.h), so which thread sums which samples then
    differs from an idle machine's."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


# The medium problem sums 8 samples of 32x32: gemm splits them into more parts than threads, and
# depthwise into more sample groups (channels-last) or channel blocks (channels-first).
@pytest.mark.parametrize("algorithm,data_format,g", [
    ("gemm", "NXC", 1), ("gemm", "NCX", 1), ("depthwise", "NXC", 16), ("depthwise", "NCX", 16),
])
def test_bitwise_identical_whichever_thread_sums_which_part(algorithm, data_format, g, threads):
    torch.set_num_threads(2)
    problem = replace(_medium("filters", data_format, "XIO", g), o=16)
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=10)
    with torch_convgrad.use_algorithm(algorithm):
        idle = fn(x, dy)
        assert torch_convgrad.last_algorithm() == algorithm
        with busy_core():
            for _ in range(6):
                assert torch.equal(fn(x, dy), idle)
    ref = reference(problem, x, dy)
    torch.testing.assert_close(idle.double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("op", list(OP_NAMES))
def test_run_to_run_bitwise_identical_half(op, dtype, device, deterministic):
    problem = _medium(op, "NXC", "XIO")
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=dtype, seed=7, device=device)
    first = fn(x, dy)
    for _ in range(2):
        assert torch.equal(fn(x, dy), first)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_backward_run_to_run_bitwise_identical(op, device, deterministic):
    problem = replace(_medium(op, "NCX", FORMATS[op][-1]), n=2)
    fn = op_function(problem)
    x, dy = problem.tensors(dtype=torch.float32, seed=8, device=device)
    weight = torch.randn(problem.shape(), generator=torch.Generator().manual_seed(9)).to(device)

    def grads():
        a, b = x.clone().requires_grad_(), dy.clone().requires_grad_()
        return torch.autograd.grad((fn(a, b) * weight).sum(), (a, b))

    first = grads()
    for _ in range(2):
        for got, want in zip(grads(), first):
            assert torch.equal(got, want)


@pytest.mark.parametrize("op", list(OP_NAMES))
def test_autocast_composes_with_vmap_and_compile(op, device):
    problem = AUTOCAST_PROBLEMS[[p.op for p in AUTOCAST_PROBLEMS].index(op)]
    fn = op_function(problem)
    pairs = [problem.tensors(dtype=torch.float32, seed=30 + i, device=device) for i in range(3)]
    xs, dys = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    with torch.autocast(device, dtype=torch.bfloat16):
        batched = torch.func.vmap(fn)(xs, dys)
    assert batched.dtype == torch.bfloat16
    torch.testing.assert_close(batched, torch.func.vmap(fn)(xs.bfloat16(), dys.bfloat16()), rtol=0, atol=0)

    def autocast_fn(x, dy):
        with torch.autocast(device, dtype=torch.bfloat16):
            return fn(x, dy)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(autocast_fn, backend="aot_eager", fullgraph=True)(xs[0], dys[0])
    finally:
        torch._dynamo.reset()
    assert compiled.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, autocast_fn(xs[0], dys[0]), rtol=0, atol=0)
