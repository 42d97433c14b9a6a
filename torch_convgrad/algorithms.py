"""Which algorithm computes a weight gradient, and forcing one.

Every call picks, in C++ (``csrc/algorithms/select.cpp``), the cheapest
algorithm that supports its problem by a cost model measured on each device:

- ``"aten"``: ATen's convolution weight gradient (oneDNN, cuDNN) on the data as given;
- ``"aten_channels_last"``: one copy to channels-last memory, then ATen;
- ``"aten_channels_first"``: one copy to contiguous NCX memory, then ATen (on CUDA,
  cuDNN's float32 depthwise weight gradient with large kernels is faster there);
- ``"matmul"``: one ATen matrix product (cuBLAS on CUDA, oneDNN's bf16 matmul
  on CPUs with AVX-512 BF16, MKL's float32 product on channels-last data on
  AVX-512 CPUs without bf16 products) per group over the input's im2col
  windows, for problems whose windows read no padding;
- ``"gemm"``: one matrix product per kernel tap over the (sample, spatial) rows,
  on the data as given or packed once into zero-padded channels-last planes;
- ``"depthwise"``: a vectorised CPU kernel for ``groups == channels``;
- ``"direct"``: plain CPU loops over the windows, for tiny problems, where a
  call's time is its fixed cost;
- ``"brgemm"``: bf16 products through ATen's batch-reduce GEMM (oneDNN's
  ukernel) on AMX tiles, or on AVX-512 BF16's dot products on CPUs without
  them: per tap and sample, one operand read in place as rows of positions
  (channels-first data) and the other gathered and packed; channels-last 1x1
  layers, and layers whose taps along the last axis fold into rows (a 1-D
  front end), as matrices of pixel rows (named ``"amx"`` while it ran on AMX
  tiles only);
- ``"amx_planes"``: on AMX tiles, the input copied once a sample into phase
  planes that every tap reads in place;
- ``"amx_depthwise"``: bf16 depthwise 2-D layers on AMX tiles.

Every algorithm gives the same values to rounding, accumulates f16/bf16 in
float32 and is deterministic. Forcing one (``use_algorithm`` or the environment
variable ``TORCH_CONVGRAD_ALGORITHM``) is for tests and measurements; a forced
algorithm that does not support a problem leaves that problem to the selector.
The override is process-wide, like ``torch.backends`` flags.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple

from ._library import library as _library

__all__ = ["algorithm_names", "cpu_calibration", "last_algorithm", "use_algorithm"]


def algorithm_names() -> Tuple[str, ...]:
    """The names ``use_algorithm`` accepts, e.g. ``('aten', 'gemm', ...)``."""
    return tuple(_library.torch_convgrad_algorithm_names().decode().split(","))


def cpu_calibration() -> str:
    """The calibration of this CPU that the cost models pick algorithms by.

    One of ``"avx2"`` (measured on an AMD Zen 3), ``"avx512"`` (AVX-512 without
    bf16 products: an Intel Cascade Lake), ``"avx512_bf16"`` (AVX-512 BF16
    without AMX: an AMD Zen 4), ``"avx512_bf16_wide"`` (the same on AMD's family
    1Ah, with whole 512-bit units: an AMD Zen 5) and ``"avx512_amx"`` (an Intel
    Sapphire Rapids), chosen once by what the CPU reports and ATen's CPU
    capability (``ATEN_CPU_CAPABILITY=avx2`` gives ``"avx2"`` anywhere).

    Example::

        >>> cpu_calibration() in ("avx2", "avx512", "avx512_bf16", "avx512_bf16_wide", "avx512_amx")
        True
    """
    return _library.torch_convgrad_cpu_calibration().decode()


def last_algorithm() -> Optional[str]:
    """The algorithm of this thread's last weight gradient computed on CPU or CUDA.

    ``None`` when it needed none (an empty batch, or windows that meet only
    padding, give zeros) or no op has run yet.

    Example::

        >>> x, dy = torch.randn(2, 8, 8, 4), torch.randn(2, 8, 8, 4)
        >>> with use_algorithm("gemm"):
        ...     _ = torch_convgrad.conv_backprop_filters(x, dy, [3, 3, 4, 4], pads_begin=1, pads_end=1)
        >>> last_algorithm()
        'gemm'
    """
    return _library.torch_convgrad_last_algorithm().decode() or None


@contextlib.contextmanager
def use_algorithm(name: Optional[str]) -> Iterator[None]:
    """Forces algorithm ``name`` (one of ``algorithm_names()``) inside the block; ``None`` lifts any override.

    Problems the forced algorithm does not support still run, on the algorithm
    the selector picks; ``last_algorithm()`` tells which one ran.
    """
    if name is not None and name not in algorithm_names():
        raise ValueError(f"name: expected one of {', '.join(algorithm_names())} or None, got {name!r}")
    previous = _library.torch_convgrad_forced_algorithm()
    _library.torch_convgrad_force_algorithm(name.encode() if name else None)
    try:
        yield
    finally:
        _library.torch_convgrad_force_algorithm(previous or None)
