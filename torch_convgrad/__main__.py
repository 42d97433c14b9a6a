"""``python -m torch_convgrad``: report the build and check every op against the reference.

Prints the versions and which dispatch keys have kernels, runs each public
function on sample data (every data layout and filter format, asymmetric and
automatic pads, groups, strides, dilations) and compares it with the float64
reference of ``torch_convgrad.reference``. Exits 1 on any mismatch.

``python -m torch_convgrad bench [options]`` runs the benchmark instead
(``torch_convgrad.benchmark``; ``bench --help`` lists the options).
"""
from __future__ import annotations

import signal
import subprocess
import sys

import torch

import torch_convgrad
from torch_convgrad import _library, reference

DISPATCH_KEYS = ("CPU", "CUDA", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA", "FuncTorchBatched")
OPS = ("conv_backprop_filters", "conv_backprop_weights", "conv_transpose_backprop_filters")
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _data(shape_ncx, data_format, dtype, device, generator):
    data = torch.randn(shape_ncx, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
    return data.movedim(1, -1).contiguous() if data_format == "NXC" else data


def _samples():
    """(name, kwargs) pairs: each op x a few attribute sets, all consistent in size."""
    conv_cases = [
        # (x NCX, dy NCX, kernel, attrs)
        ((2, 4, 11), (2, 6, 5), [3], dict(strides=2, pads_begin=1, pads_end=0)),
        ((2, 4, 9, 8), (2, 6, 5, 4), [3, 2], dict(strides=2, dilations=[1, 2], auto_pad="same_upper", groups=2)),
        ((1, 3, 5, 6, 4), (1, 3, 5, 6, 4), [3, 3, 3], dict(auto_pad="same_lower", groups=3)),
    ]
    for op in ("conv_backprop_filters", "conv_backprop_weights"):
        for index, (x, dy, kernel, attrs) in enumerate(conv_cases):
            data_format = ("NXC", "NCX")[index % 2]
            for filter_format in ("XIO", "OIX"):
                groups = attrs.get("groups", 1)
                shape_oix = [dy[1], x[1] // groups, *kernel]
                shape = shape_oix if filter_format == "OIX" else [*kernel, x[1] // groups, dy[1]]
                yield op, x, dy, shape, dict(attrs, data_format=data_format), filter_format
    transpose_cases = [
        # (x NCX = ConvTranspose input, dy NCX = its output gradient, kernel, attrs)
        ((2, 4, 5), (2, 6, 11), [3], dict(strides=2, output_padding=0)),
        ((2, 4, 3, 4), (2, 6, 6, 8), [2, 3], dict(strides=2, auto_pad="same_upper", groups=2)),
        ((1, 2, 3, 3, 3), (1, 4, 5, 5, 5), [2, 2, 2], dict(strides=2, pads_begin=[0, 1, 1], pads_end=[1, 0, 1])),
    ]
    for index, (x, dy, kernel, attrs) in enumerate(transpose_cases):
        groups = attrs.get("groups", 1)
        ic, ocg = x[1], dy[1] // groups
        shapes = {"IOX": [ic, ocg, *kernel], "OIX": [ocg, ic, *kernel], "XIO": [*kernel, ic, ocg], "XOI": [*kernel, ocg, ic]}
        for filter_format, shape in shapes.items():
            yield "conv_transpose_backprop_filters", x, dy, shape, dict(attrs, data_format=("NXC", "NCX")[index % 2]), filter_format


def check(device: str) -> int:
    generator = torch.Generator().manual_seed(0)
    failures = 0
    count = 0
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for op, x_shape, dy_shape, shape, attrs, filter_format in _samples():
            data_format = attrs["data_format"]
            x = _data(x_shape, data_format, dtype, device, generator)
            dy = _data(dy_shape, data_format, dtype, device, generator)
            format_key = "weights_format" if op == "conv_backprop_weights" else "filter_format"
            kwargs = dict(attrs, **{format_key: filter_format})
            got = getattr(torch_convgrad, op)(x, dy, shape, **kwargs)
            expected = getattr(reference, op)(x.cpu(), dy.cpu(), shape, **kwargs)
            error = (got.cpu().double() - expected).abs().max().item() / max(expected.abs().max().item(), 1.0)
            count += 1
            if error > TOLERANCE[dtype] or got.dtype != dtype or list(got.shape) != shape:
                failures += 1
                print(f"  MISMATCH {op} {dtype} {attrs} {filter_format}: relative error {error:.3g}")
    print(f"  {device}: {count - failures} of {count} samples match the float64 reference")
    return failures


# A bad argument, raised as ValueError by the C++ resolver: the exception must
# cross from the extension into torch and Python.
BAD_ARGUMENT_CHECK = """
import torch, torch_convgrad
try:
    torch_convgrad.conv_backprop_filters(torch.zeros(1, 4, 4, 2), torch.zeros(1, 2, 2, 2), [3, 3, 2, 2], strides=0)
except ValueError as error:
    print("ValueError:", error)
"""


def _torch_compiler() -> str:
    for line in torch.__config__.show().splitlines():
        if line.strip().startswith(("- GCC", "- clang", "- Clang", "- MSVC")):
            return line.strip()[2:]
    return "an unknown compiler"


def check_bad_arguments_raise(code: str = BAD_ARGUMENT_CHECK) -> bool:
    """Runs ``code`` in a child process and checks it printed a ValueError; diagnoses a crash.

    A child that dies (SIGSEGV, SIGABRT) instead means C++ exceptions cannot cross from the
    extension into torch: the extension was built by a compiler whose C++ runtime does not
    match the one torch was built with.
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if result.returncode == 0 and "ValueError: strides" in result.stdout:
        print("  bad arguments raise ValueError (checked in a child process)")
        return True
    if result.returncode < 0:
        how = f"died with {signal.Signals(-result.returncode).name}"
    else:
        how = f"exited with status {result.returncode}"
    print(f"  FAILED: a bad argument should raise ValueError, but the child process {how}.")
    print(f"  The extension was built by {_library.compiler()}; torch {torch.__version__} by {_torch_compiler()}.\n"
          "  A crash here means the two C++ runtimes do not match, so C++ exceptions (every bad\n"
          "  argument) cannot be caught. Rebuild with the system compiler, e.g.\n"
          "    CC=/usr/bin/gcc CXX=/usr/bin/g++ python setup.py build_ext --inplace --force\n"
          "  (the build prints the compiler it uses).")
    output = (result.stdout + result.stderr).strip()
    if output:
        print("  child output: " + output[-2000:].replace("\n", "\n  "))
    return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from torch_convgrad import benchmark  # only the benchmark needs its imports

        return benchmark.main(argv[1:])
    if argv:
        print(f"usage: python -m torch_convgrad [bench [options]]; got {' '.join(argv)}", file=sys.stderr)
        return 2
    print(f"torch_convgrad {torch_convgrad.__version__}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda or 'none'} (available: {torch.cuda.is_available()})")
    for op in OPS:
        keys = [key for key in DISPATCH_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(f"torch_convgrad::{op}", key)]
        print(f"  torch.ops.torch_convgrad.{op}: kernels for {', '.join(keys)}")
    devices = ["cpu"]
    if torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("torch_convgrad::conv_backprop_filters", "CUDA"):
        devices.append("cuda")
    # The comparison is against float64 at float32 tolerance: keep cuDNN from
    # using TF32 (which the op, like nn.Conv2d, follows when it is allowed).
    torch.backends.cudnn.allow_tf32 = False
    failures = sum(check(device) for device in devices)
    failures += 0 if check_bad_arguments_raise() else 1
    print("OK" if failures == 0 else f"FAILED: {failures} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
