"""``python -m torch_convgrad bench``: time every op against the ATen glue, on real layers, with a roofline.

For each layer of ``CASES`` (ResNet-50, MobileNetV2, ConvNeXt, U-Net, DCGAN, a 1-D
audio front end, a 3-D video block), each op that computes its weight gradient,
each data layout (NXC, NCX) and each dtype (f32, bf16, f16), the benchmark

1. checks that ours equals the glue, the ATen code users write without this
   package (:func:`glue_weight_gradient`);
2. times the two interleaved in one process: ``repeats`` times a block of glue
   calls, then a block of ours (each after one untimed call, unless a call takes
   seconds), so that a noisy neighbour slows both alike (on
   CUDA with events, each block queued behind a sleeping kernel so that the GPU's
   work is timed, not the host's launch rate; the per-call lines at the end time
   the host);
3. compares our median with a roofline measured in the same run, before and
   after the cases (the higher of each rate, since a noisy neighbour can
   depress one measurement): the best GEMM rate for the dtype (``torch.mm``, and
   on CPUs a 1x1 convolution on channels-last data too, oneDNN's GEMM, which
   outruns MKL's ``torch.mm`` on AMD's AVX-512 CPUs) and the read bandwidth of
   ``Tensor.sum``.
   Roofline time = max(2 * MACs / GEMM rate, bytes of both data tensors and the
   result / bandwidth); %roofline = roofline time / our median.

The result format follows the data layout: XIO for NXC data, OIX (IOX for
ConvTranspose, PyTorch's ``ConvTransposeNd.weight``) for NCX data.

    python -m torch_convgrad bench [--device cpu|cuda] [--threads N] [--dtypes f32,bf16,f16]
        [--layouts NXC,NCX] [--ops OP,...] [--cases SUBSTRING,...] [--repeats R] [--quick]
        [--plot FILE.png] [--markdown]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

import torch_convgrad

CONV_OPS = ("conv_backprop_filters", "conv_backprop_weights")
TRANSPOSE_OPS = ("conv_transpose_backprop_filters",)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
LAYOUTS = ("NXC", "NCX")
# Largest |ours - glue| allowed, as a fraction of max |glue|: the two sum in different orders,
# and the low-precision results are rounded to 8 (bf16) or 11 (f16) significant bits.
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}
# On CUDA the layers run with a larger batch, so that each call still takes milliseconds.
CUDA_BATCH_SCALE = 8


@dataclasses.dataclass(frozen=True)
class Case:
    """One layer's weight gradient, described as the op sees it.

    ``input_forward`` is ``(batch, in_channels, *in_size)`` in NCX terms (the
    convolution input, or the ConvTranspose input when ``transposed``);
    ``output_delta`` has ``out_channels`` and the spatial size :attr:`delta_size`.
    """

    name: str
    batch: int
    in_channels: int
    out_channels: int
    in_size: tuple
    kernel: tuple
    stride: int = 1
    pads_begin: Optional[tuple] = None  # None: no padding
    pads_end: Optional[tuple] = None
    groups: int = 1
    transposed: bool = False

    @property
    def pads(self) -> tuple:
        zeros = (0,) * len(self.kernel)
        return self.pads_begin or zeros, self.pads_end or zeros

    @property
    def delta_size(self) -> tuple:
        """Spatial size of output_delta (SPEC section 3; ConvTranspose without output_padding)."""
        pads_begin, pads_end = self.pads
        if self.transposed:
            return tuple(self.stride * (i - 1) + k - b - e
                         for i, k, b, e in zip(self.in_size, self.kernel, pads_begin, pads_end))
        return tuple((x + b + e - k) // self.stride + 1
                     for x, k, b, e in zip(self.in_size, self.kernel, pads_begin, pads_end))

    @property
    def ops(self) -> tuple:
        return TRANSPOSE_OPS if self.transposed else CONV_OPS

    @property
    def macs(self) -> int:
        """Multiply-adds: batch * prod(conv output size) * conv output channels * (conv input channels / g) * prod(K).

        A ConvTranspose weight gradient is the convolution one with the data roles
        swapped (SPEC section 4): its input_forward plays the convolution's output.
        """
        if self.transposed:
            out_size, out_channels, in_channels = self.in_size, self.in_channels, self.out_channels
        else:
            out_size, out_channels, in_channels = self.delta_size, self.out_channels, self.in_channels
        return self.batch * math.prod(out_size) * out_channels * (in_channels // self.groups) * math.prod(self.kernel)

    def filter_format(self, layout: str) -> str:
        if layout == "NXC":
            return "XIO"
        return "IOX" if self.transposed else "OIX"

    def filter_shape(self, layout: str) -> list:
        """The result shape in :meth:`filter_format` (SPEC section 2)."""
        if self.transposed:
            sizes = {"I": self.in_channels, "O": self.out_channels // self.groups}
        else:
            sizes = {"I": self.in_channels // self.groups, "O": self.out_channels}
        return [size for letter in self.filter_format(layout)
                for size in (self.kernel if letter == "X" else (sizes[letter],))]


# CPU batch sizes give roughly 5-100 ms per call on 2 cores.
CASES = [
    Case("resnet50 3x3 64ch 56x56", 8, 64, 64, (56, 56), (3, 3), pads_begin=(1, 1), pads_end=(1, 1)),
    Case("resnet50 3x3 256ch 14x14", 8, 256, 256, (14, 14), (3, 3), pads_begin=(1, 1), pads_end=(1, 1)),
    Case("resnet50 1x1 64->256 56x56", 8, 64, 256, (56, 56), (1, 1)),
    Case("resnet50 1x1 1024->256 14x14", 8, 1024, 256, (14, 14), (1, 1)),
    # TensorFlow SAME padding: the stride-2 3x3 pads only the end (asymmetric).
    Case("resnet50 3x3 s2 128ch 56->28 SAME", 8, 128, 128, (56, 56), (3, 3), stride=2,
         pads_begin=(0, 0), pads_end=(1, 1)),
    Case("resnet50 1x1 s2 256->512 56->28", 8, 256, 512, (56, 56), (1, 1), stride=2),
    Case("mobilenetv2 dw 3x3 144ch 56x56", 16, 144, 144, (56, 56), (3, 3), pads_begin=(1, 1), pads_end=(1, 1),
         groups=144),
    Case("mobilenetv2 dw 3x3 s2 144ch 56->28", 16, 144, 144, (56, 56), (3, 3), stride=2, pads_begin=(1, 1),
         pads_end=(1, 1), groups=144),
    Case("convnext dw 7x7 96ch 56x56", 8, 96, 96, (56, 56), (7, 7), pads_begin=(3, 3), pads_end=(3, 3), groups=96),
    Case("unet convT 2x2 s2 128->64 28->56", 8, 128, 64, (28, 28), (2, 2), stride=2, transposed=True),
    Case("dcgan convT 4x4 s2 256->128 16->32", 8, 256, 128, (16, 16), (4, 4), stride=2, pads_begin=(1, 1),
         pads_end=(1, 1), transposed=True),
    Case("audio 1-D k10 s5 32->64 16k", 4, 32, 64, (16000,), (10,), stride=5),
    Case("video 3-D 3x3x3 64ch 8x28x28", 1, 64, 64, (8, 28, 28), (3, 3, 3), pads_begin=(1, 1, 1),
         pads_end=(1, 1, 1)),
]
# --quick: one convolution with asymmetric pads and one ConvTranspose, at a small batch.
QUICK_CASES = [dataclasses.replace(case, batch=2) for case in CASES
               if case.name.startswith(("resnet50 3x3 s2", "unet convT"))]


def _permutation(source: str, target: str, rank: int) -> list:
    """Dims that turn a filter in format ``source`` (e.g. "OIX") into ``target`` (e.g. "XIO")."""
    def dims(letter):
        start = source.index(letter)
        return range(start, start + rank) if letter == "X" else [start]
    return [dim for letter in target for dim in dims(letter)]


def glue_weight_gradient(conv_input, conv_delta, kernel, stride, pads_begin, pads_end, groups, data_format,
                         permutation):
    """A convolution weight gradient as users write it with ATen alone.

    ``conv_input`` ``(N, C, X..)`` / ``(N, X.., C)`` and ``conv_delta`` ``(N, O, Y..)`` /
    ``(N, Y.., O)`` in ``data_format``: permute NXC data to NCX (a view), hand the
    symmetric part of the pads to ATen, ``F.pad`` the asymmetric excess, call
    ``aten.convolution_backward`` for the ``(O, C/g, K..)`` gradient and return it
    permuted by ``permutation`` and made contiguous. A ConvTranspose weight gradient
    is this with the roles swapped: ``conv_input`` = its output_delta,
    ``conv_delta`` = its input_forward, result ``(IC, OC/g, K..)``.
    """
    if data_format == "NXC":
        conv_input, conv_delta = conv_input.movedim(-1, 1), conv_delta.movedim(-1, 1)
    symmetric = [min(begin, end) for begin, end in zip(pads_begin, pads_end)]
    excess = [pad - common for begin, end, common in zip(reversed(pads_begin), reversed(pads_end), reversed(symmetric))
              for pad in (begin, end)]
    if any(excess):
        conv_input = F.pad(conv_input, excess)
    rank = len(kernel)
    weight = torch.empty(conv_delta.shape[1], conv_input.shape[1] // groups, *kernel,
                         dtype=conv_input.dtype, device=conv_input.device)
    _, grad_weight, _ = torch.ops.aten.convolution_backward(
        conv_delta, conv_input, weight, None, [stride] * rank, symmetric, [1] * rank, False, [0] * rank, groups,
        [False, True, False],
    )
    return grad_weight.permute(permutation).contiguous()


@dataclasses.dataclass
class Problem:
    """One case's data in one layout and dtype, with the two callables to compare."""

    case: Case
    op: str
    layout: str
    dtype: torch.dtype
    input_forward: torch.Tensor
    output_delta: torch.Tensor

    @classmethod
    def make(cls, case: Case, op: str, layout: str, dtype: torch.dtype, device, generator) -> "Problem":
        def data(channels, size):
            ncx = torch.randn(case.batch, channels, *size, generator=generator, device=device, dtype=dtype)
            return ncx.movedim(1, -1).contiguous() if layout == "NXC" else ncx
        return cls(case, op, layout, dtype, data(case.in_channels, case.in_size),
                   data(case.out_channels, case.delta_size))

    def ours(self, api=torch_convgrad) -> torch.Tensor:
        """The op's result; ``api`` may be ``torch_convgrad.reference``, which has the same functions."""
        case = self.case
        format_key = "weights_format" if self.op == "conv_backprop_weights" else "filter_format"
        pads_begin, pads_end = case.pads
        return getattr(api, self.op)(
            self.input_forward, self.output_delta, case.filter_shape(self.layout), strides=case.stride,
            pads_begin=list(pads_begin), pads_end=list(pads_end), groups=case.groups, data_format=self.layout,
            **{format_key: case.filter_format(self.layout)})

    def glue(self) -> torch.Tensor:
        case = self.case
        pads_begin, pads_end = case.pads
        # Roles swapped for ConvTranspose (SPEC section 4): its gradient is then IOX.
        conv_input, conv_delta, source = ((self.output_delta, self.input_forward, "IOX") if case.transposed
                                          else (self.input_forward, self.output_delta, "OIX"))
        permutation = _permutation(source, case.filter_format(self.layout), len(case.kernel))
        return glue_weight_gradient(conv_input, conv_delta, case.kernel, case.stride, pads_begin, pads_end,
                                    case.groups, self.layout, permutation)

    def mismatch(self) -> Optional[str]:
        """None when ours equals the glue within TOLERANCE, else what differs."""
        ours, glue = self.ours(), self.glue()
        if ours.shape != glue.shape or ours.dtype != glue.dtype:
            return f"ours {ours.dtype} {tuple(ours.shape)}, glue {glue.dtype} {tuple(glue.shape)}"
        error = (ours.double() - glue.double()).abs().max().item() / max(glue.abs().max().item(), 1e-30)
        return None if error <= TOLERANCE[self.dtype] else f"max error {error:.3g} of max |glue|"

    @property
    def traffic_bytes(self) -> int:
        """Bytes of the two data tensors and the result: what any implementation reads and writes."""
        elements = self.input_forward.numel() + self.output_delta.numel() + math.prod(self.case.filter_shape("NCX"))
        return elements * self.input_forward.element_size()


# On CUDA a block of calls is queued behind a sleeping kernel, so that the GPU, not
# the host's launch rate, paces it: the events then time the block's GPU work alone.
# The sleep must outlast the queueing: it grows (up to about 0.1 s) until it does.
# Blocks hold at most CUDA_BLOCK_CALLS calls, so that their kernels fit CUDA's launch
# queue (about 1000) and queueing them never waits for the GPU.
CUDA_BLOCK_CALLS = 128
_MAX_SLEEP_CYCLES = 200_000_000
_sleep_cycles = 1 << 20


def time_block(function: Callable, calls: int, device: torch.device, gpu_paced: bool = True) -> float:
    """Seconds per call of ``calls`` back-to-back calls: ``perf_counter`` on CPU; on CUDA,
    events recorded around the block after a synchronize, so only the block's work counts.
    With ``gpu_paced`` (CUDA, blocks of several calls) the block is queued before the GPU
    starts it, so a call's host time (the per-call overhead lines' subject) does not count,
    only its GPU time."""
    global _sleep_cycles
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        asleep = torch.cuda.Event(enable_timing=True)
        paced = gpu_paced and calls > 1
        for _ in range(4):
            torch.cuda.synchronize(device)
            if paced:
                asleep.record()
                torch.cuda._sleep(_sleep_cycles)
            start.record()
            queued = time.perf_counter()
            for _ in range(calls):
                function()
            queued = time.perf_counter() - queued
            end.record()
            end.synchronize()
            slept = asleep.elapsed_time(start) / 1e3 if paced else math.inf
            if slept > queued or _sleep_cycles >= _MAX_SLEEP_CYCLES:
                break
            # The GPU may have waited for the host: again, with a sleep long enough.
            _sleep_cycles = min(_MAX_SLEEP_CYCLES, int(_sleep_cycles * 2 * queued / max(slept, 1e-6)))
        return start.elapsed_time(end) / 1e3 / calls
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls


# A call this slow is timed over SLOW_REPEATS blocks at most: oneDNN's f16 weight
# gradient (the glue's) took 1-5 s a call on an AVX-512 FP16 CPU.
SLOW_CALL_SECONDS = 0.25
SLOW_REPEATS = 3


def time_interleaved(functions: dict, repeats: int, block_seconds: float, device: torch.device,
                     gpu_paced: bool = True) -> dict:
    """Per-call seconds of each function, one value per repeat, the functions' blocks alternating.

    One timed warm-up call each first (callers have run each function once already,
    to check it); a block holds enough calls to last ``block_seconds`` (on CUDA at most
    ``CUDA_BLOCK_CALLS``) so that timer resolution and per-call jitter stay small. Where
    one call of some function takes over ``SLOW_CALL_SECONDS``, at most ``SLOW_REPEATS``
    repeats. Each block of a function faster than that starts after one untimed call:
    the first call after the other side's block pays for the machine's return from
    it (on a 2-core VM, 2026-11-28: 20-35 ms more for a 7 ms call after the glue's
    7-second f16 calls, or after 2 s of sleep; ``Tensor.sum`` of 16 MB 7-15 ms
    instead of 0.4), which a block of few calls would spread over its average.
    ``gpu_paced``: see :func:`time_block`.
    """
    calls, warm_seconds = {}, {}
    for name, function in functions.items():
        warm = warm_seconds[name] = time_block(function, 1, device, gpu_paced)
        calls[name] = max(1, math.ceil(block_seconds / max(warm, 1e-6)))
        if device.type == "cuda" and gpu_paced:
            calls[name] = min(calls[name], CUDA_BLOCK_CALLS)
        if warm > SLOW_CALL_SECONDS:
            repeats = min(repeats, SLOW_REPEATS)
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            if warm_seconds[name] <= SLOW_CALL_SECONDS:
                function()
            times[name].append(time_block(function, calls[name], device, gpu_paced))
    return times


def median_and_spread(times: Sequence[float]) -> tuple:
    """Median, and half the interquartile range as a fraction of the median."""
    median = statistics.median(times)
    if len(times) < 2:
        return median, 0.0
    low, _, high = statistics.quantiles(times, n=4, method="inclusive")
    return median, (high - low) / 2 / median


@dataclasses.dataclass
class Roofline:
    """Best measured GEMM FLOP/s per dtype (``measure_roofline``) and ``Tensor.sum`` read bytes/s."""

    gemm_rate: dict
    read_bandwidth: float

    def seconds(self, flops: float, traffic_bytes: float, dtype: torch.dtype) -> float:
        # A low-precision gradient may be computed in f32 (CPUs without bf16/f16 GEMM
        # instructions do so), so f32's rate bounds it too.
        rate = max(self.gemm_rate[dtype], self.gemm_rate[torch.float32])
        return max(flops / rate, traffic_bytes / self.read_bandwidth)

    def best_of(self, other: "Roofline") -> "Roofline":
        """The higher of each rate: the ceiling the machine showed in either measurement."""
        return Roofline({dtype: max(rate, other.gemm_rate[dtype]) for dtype, rate in self.gemm_rate.items()},
                        max(self.read_bandwidth, other.read_bandwidth))


def _best_seconds(function: Callable, device: torch.device, budget: float) -> float:
    """Fastest of repeated calls (the first one included), stopping after ``budget`` seconds."""
    best, spent = math.inf, 0.0
    while spent < budget or best == math.inf:
        seconds = time_block(function, 1, device)
        best, spent = min(best, seconds), spent + seconds
    return best


def settle_allocator() -> None:
    """Put the process's memory allocator in the state a training loop keeps it in.

    glibc's malloc serves a large block as a fresh mapping until the process has freed a block
    that size (it then raises its mapping threshold to that size, at most 32 MB), and every
    page of a fresh mapping faults on first touch. Until then, oneDNN's temporary buffers do so
    on every call: on a Zen 4 (2026-12-04) ResNet-50's 3x3 64-channel f32 layer on channels-first
    data took 15-18 ms per call in such a process, with 3000 more page faults a call, and 11-12 ms
    after one 24 MB tensor had been allocated and freed (the "two speeds by process" of earlier
    measurements). A training step frees activations larger than that, so both this benchmark and
    ``benchmarks/forced_algorithms.py`` time every call in the settled state.
    """
    torch.empty(6 << 20, dtype=torch.float32)  # 24 MB, freed at once


def measure_roofline(device: torch.device, dtypes: Sequence[torch.dtype], quick: bool) -> Roofline:
    """GEMM rates: square (compute bound) and skinny ``(M, K) @ (K, N)`` with a long K
    (the shape of a weight gradient), best per dtype; on CPUs, for f32 and bf16, also the
    square product as a 1x1 convolution of channels-last data (oneDNN's GEMM: on an AMD Zen 5
    1.5-1.8x MKL's f32 ``torch.mm``, which runs AVX2 code there); read bandwidth: sum of 256 MB
    of f32."""
    scale = 2 if quick else 1  # quick: 1/8 (square) and 1/4 (skinny) of the work
    shapes = [(1024 // scale, 1024 // scale, 1024 // scale), (64, 100_000 // scale ** 2, 64)]
    if device.type == "cuda":
        shapes = [(8192, 8192, 8192), (256, 1 << 20, 256)]
    budget = 0.1 if quick else 0.3
    gemm_rate = {}
    # f32 convolutions follow cuDNN's TF32 setting: the f32 GEMM does the same here, and
    # only here (the matmul algorithm's choice follows the caller's matmul setting).
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        for dtype in dict.fromkeys([torch.float32, *dtypes]):  # f32 first, no repeats
            rates = []
            for m, k, n in shapes:
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                rates.append(2 * m * k * n / _best_seconds(lambda: torch.mm(a, b), device, budget))
            if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
                rows, depth, columns = shapes[0]  # (1, K, M, 1) pixels times (N, K, 1, 1) filters
                pixels = torch.randn(1, depth, rows, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
                filters = torch.randn(columns, depth, 1, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
                product = lambda: torch.nn.functional.conv2d(pixels, filters)
                rates.append(2 * rows * depth * columns / _best_seconds(product, device, budget))
            gemm_rate[dtype] = max(rates)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    data = torch.ones(64 << 20, device=device)  # 256 MB of f32
    read_bandwidth = data.numel() * data.element_size() / _best_seconds(data.sum, device, budget)
    return Roofline(gemm_rate, read_bandwidth)


@dataclasses.dataclass
class Row:
    """One line of the table: glue and ours timings, and the rates ours reached."""

    case: str
    op: str
    layout: str
    dtype: str
    glue: tuple  # (median seconds, spread fraction)
    ours: tuple
    gflops: float
    algorithm: Optional[str]
    bound: tuple  # (FLOPs, bytes, dtype): what Roofline.seconds bounds the row by
    roofline_fraction: float = math.nan  # set once the run's ceiling is known, after every case

    @property
    def ratio(self) -> float:
        return self.glue[0] / self.ours[0]


def benchmark_problem(problem: Problem, repeats: int, block_seconds: float, device: torch.device) -> Row:
    times = time_interleaved({"glue": problem.glue, "ours": problem.ours}, repeats, block_seconds, device)
    glue, ours = median_and_spread(times["glue"]), median_and_spread(times["ours"])
    # The ours block ran last, so this names the algorithm of the timed calls.
    algorithm = torch_convgrad.last_algorithm()
    flops = 2 * problem.case.macs
    return Row(problem.case.name, problem.op, problem.layout, _dtype_name(problem.dtype), glue, ours,
               flops / ours[0] / 1e9, algorithm, (flops, problem.traffic_bytes, problem.dtype))


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def _cpu_description() -> str:
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    flags = next((set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines() if line.startswith("flags")),
                 set())
    simd = ", ".join(flag for flag in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "avx2") if flag in flags)
    return f"{model} ({simd or 'no AVX2'})"


def header_lines(device: torch.device, roofline: Roofline) -> list:
    lines = [f"torch_convgrad {torch_convgrad.__version__}, torch {torch.__version__}, device {device}"]
    if device.type == "cuda":
        lines.append(f"GPU: {torch.cuda.get_device_name(device)}")
    lines.append(f"CPU: {_cpu_description()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
                 f"{torch.get_num_threads()} threads")
    lines.append(f"roofline: {_ceiling(roofline)}")
    return lines


def _ceiling(roofline: Roofline) -> str:
    rates = ", ".join(f"{_dtype_name(dtype)} {rate / 1e9:.1f}" for dtype, rate in roofline.gemm_rate.items())
    low_precision_note = " (bf16/f16 use max(own, f32))" if len(roofline.gemm_rate) > 1 else ""
    return f"GEMM GFLOP/s {rates}{low_precision_note}; read bandwidth {roofline.read_bandwidth / 1e9:.1f} GB/s"


COLUMNS = ("case", "op", "layout", "dtype", "glue ms", "ours ms", "ratio", "GFLOP/s", "%roofline")


def _cells(row: Row, with_algorithm: bool) -> list:
    def milliseconds(timing):
        median, spread = timing
        return f"{median * 1e3:.3g} ±{spread * 100:.0f}%"
    cells = [row.case, row.op, row.layout, row.dtype, milliseconds(row.glue), milliseconds(row.ours),
             f"{row.ratio:.2f}x", f"{row.gflops:.1f}", f"{row.roofline_fraction * 100:.0f}%"]
    return cells + [row.algorithm] if with_algorithm else cells


def format_table(rows: Sequence[Row], markdown: bool) -> str:
    """The rows as aligned text or as a Markdown table; an algorithm column when the build reports one."""
    with_algorithm = any(row.algorithm is not None for row in rows)
    columns = list(COLUMNS) + ["algorithm"] * with_algorithm
    table = [columns] + [_cells(row, with_algorithm) for row in rows]
    if markdown:
        lines = ["| " + " | ".join(cells) + " |" for cells in table]
        lines.insert(1, "|" + "|".join("---" for _ in columns) + "|")
        return "\n".join(lines)
    widths = [max(len(cells[i]) for cells in table) for i in range(len(columns))]
    numeric = set(range(4, 9))  # right-align the numbers
    return "\n".join("  ".join(cell.rjust(width) if i in numeric else cell.ljust(width)
                               for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()
                     for cells in table)


def summary_lines(rows: Sequence[Row]) -> list:
    def geomean(values):
        return math.exp(statistics.fmean(math.log(value) for value in values))
    def label(row):
        return f"{row.case} {row.op} {row.layout} {row.dtype}"
    slowest = min(rows, key=lambda row: row.ratio)
    least = min(rows, key=lambda row: row.roofline_fraction)
    return [
        f"ratio glue/ours over {len(rows)} rows: geomean {geomean(row.ratio for row in rows):.2f}x, "
        f"min {slowest.ratio:.2f}x ({label(slowest)})",
        f"roofline: geomean {geomean(row.roofline_fraction for row in rows) * 100:.0f}%, "
        f"min {least.roofline_fraction * 100:.0f}% ({label(least)})",
    ]


def plot_ratios(rows: Sequence[Row], path: str) -> bool:
    """Bar chart of the ratios, one bar per row, a line at 1.0; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        print("matplotlib is not installed: pip install matplotlib", file=sys.stderr)
        return False
    short_op = {"conv_backprop_filters": "filters", "conv_backprop_weights": "weights",
                "conv_transpose_backprop_filters": "transpose"}
    labels = [f"{row.case} {short_op[row.op]} {row.layout} {row.dtype}" for row in rows]
    figure, axes = plt.subplots(figsize=(max(8.0, 0.2 * len(rows)), 6.0))
    axes.bar(range(len(rows)), [row.ratio for row in rows],
             color=["tab:green" if row.ratio >= 1 else "tab:red" for row in rows])
    axes.set_yscale("log")  # 2x faster and 2x slower are the same distance from the line
    ratio_labels = FuncFormatter(lambda value, _: f"{value:g}x")
    axes.yaxis.set_major_formatter(ratio_labels)
    axes.yaxis.set_minor_formatter(ratio_labels)
    axes.axhline(1.0, color="black", linewidth=1)
    axes.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
    axes.set_ylabel("glue time / ours time (above 1: ours faster)")
    axes.set_title(f"torch_convgrad weight gradients against the ATen glue\ntorch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads")
    figure.savefig(path, dpi=150, bbox_inches="tight")  # "tight" keeps the long labels inside
    plt.close(figure)
    print(f"plot written to {path}")
    return True


def _comma_list(choices: Sequence[str]) -> Callable:
    def parse(text: str) -> list:
        values = [value.strip() for value in text.split(",") if value.strip()]
        unknown = [value for value in values if value not in choices]
        if unknown or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(choices)}, got {text!r}")
        return values
    return parse


def per_call_overhead(device: torch.device, repeats: int) -> list:
    """Lines timing a tiny problem (1x8x8x8 NXC, 3x3, pads 1, XIO result) four ways, interleaved:
    the Python API, the registered op, the glue, and the bare ``aten.convolution_backward`` (OIX,
    no permute), where nearly all the time is per-call overhead."""
    x = torch.randn(1, 8, 8, 8, device=device)
    dy = torch.randn(1, 8, 8, 8, device=device)
    x_ncx, dy_ncx = x.movedim(-1, 1), dy.movedim(-1, 1)
    weight = torch.empty(8, 8, 3, 3, device=device)
    op = torch.ops.torch_convgrad.conv_backprop_filters.default
    functions = {
        "Python API": lambda: torch_convgrad.conv_backprop_filters(x, dy, [3, 3, 8, 8], pads_begin=1, pads_end=1),
        "registered op": lambda: op(x, dy, [3, 3, 8, 8], None, [1, 1], [1, 1], None, "none", 1, "NXC", "XIO"),
        "glue": lambda: glue_weight_gradient(x, dy, (3, 3), 1, (1, 1), (1, 1), 1, "NXC", [2, 3, 1, 0]),
        "aten.convolution_backward": lambda: torch.ops.aten.convolution_backward(
            dy_ncx, x_ncx, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]),
    }
    for function in functions.values():
        function()
    times = time_interleaved(functions, repeats, 0.02, device, gpu_paced=False)
    medians = {name: median_and_spread(values) for name, values in times.items()}
    aten = medians["aten.convolution_backward"][0]
    lines = ["per-call overhead, tiny problem (1x8x8x8 NXC, 3x3, pads 1, XIO):"]
    for name, (median, spread) in medians.items():
        lines.append(f"  {name:26s} {median * 1e6:7.1f} us ±{spread:.0%}   {median / aten:4.2f}x aten")
    return lines


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torch_convgrad bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--dtypes", type=_comma_list(tuple(DTYPES)), default=list(DTYPES))
    parser.add_argument("--layouts", type=_comma_list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--ops", type=_comma_list(CONV_OPS + TRANSPOSE_OPS), default=list(CONV_OPS + TRANSPOSE_OPS))
    parser.add_argument("--cases", type=lambda text: [part.strip().lower() for part in text.split(",")], default=None,
                        help="keep the cases whose name contains one of these comma-separated substrings")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per side (default 7; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: two small cases, 3 repeats, short blocks")
    parser.add_argument("--plot", metavar="FILE.png", help="bar chart of the ratios (needs matplotlib)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None, cases: Optional[Sequence[Case]] = None) -> int:
    """Run the benchmark; ``cases`` replaces the built-in list (tests use tiny ones). Returns the exit status."""
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if cases is None:
        cases = QUICK_CASES if args.quick else CASES
        if device.type == "cuda":
            cases = [dataclasses.replace(case, batch=case.batch * CUDA_BATCH_SCALE) for case in cases]
    if args.cases:
        cases = [case for case in cases if any(part in case.name.lower() for part in args.cases)]
    if not cases:
        print("no case matches --cases", file=sys.stderr)
        return 2
    repeats = args.repeats or (3 if args.quick else 7)
    block_seconds = 0.02 if args.quick else 0.05
    dtypes = [DTYPES[name] for name in args.dtypes]

    start = time.perf_counter()
    settle_allocator()
    roofline = measure_roofline(device, dtypes, args.quick)
    print("\n".join(header_lines(device, roofline)), flush=True)
    generator = torch.Generator(device).manual_seed(0)
    rows, mismatches = [], []
    for index, case in enumerate(cases, 1):
        print(f"[{index}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)  # progress of a long run
        for op in (op for op in case.ops if op in args.ops):
            for layout in args.layouts:
                for dtype in dtypes:
                    problem = Problem.make(case, op, layout, dtype, device, generator)
                    mismatch = problem.mismatch()
                    if mismatch:  # a wrong result is not worth timing
                        mismatches.append(f"MISMATCH {case.name} {op} {layout} {_dtype_name(dtype)}: {mismatch}")
                        print(mismatches[-1], flush=True)
                        continue
                    rows.append(benchmark_problem(problem, repeats, block_seconds, device))
    if not rows:
        print("nothing timed: " + ("every result mismatched" if mismatches else "no case has one of --ops"),
              file=sys.stderr)
        return 1 if mismatches else 2
    # The ceiling moves with the neighbours' load, and one low measurement would
    # flatter every row: measured again after the cases, the higher of each
    # rate bounds them all.
    after = measure_roofline(device, dtypes, args.quick)
    roofline = roofline.best_of(after)
    rows = [dataclasses.replace(row, roofline_fraction=roofline.seconds(*row.bound) / row.ours[0]) for row in rows]
    print(f"roofline measured again after the cases: {_ceiling(after)}; %roofline uses the higher of each")
    print()
    print(format_table(rows, args.markdown))
    print()
    print("\n".join(summary_lines(rows)))
    print(f"glue/ours: median per call ±half the interquartile range over {repeats} interleaved blocks "
          f"({SLOW_REPEATS} where a call takes over {SLOW_CALL_SECONDS} s)")
    print()
    print("\n".join(per_call_overhead(device, repeats)))
    print(f"total {time.perf_counter() - start:.0f} s")
    status = 1 if mismatches else 0
    if args.plot and not plot_ratios(rows, args.plot):
        status = 1
    return status
