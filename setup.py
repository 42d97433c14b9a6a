"""Builds torch_convgrad._C against the installed torch (use --no-build-isolation).

CUDA kernels are built when torch has CUDA and nvcc is found; set
TORCH_CONVGRAD_CUDA=1 to force them or TORCH_CONVGRAD_CUDA=0 to skip them.
TORCH_CONVGRAD_SANITIZE=1 builds the C++ with ASan and UBSan (scripts/sanitize.sh).
"""
import glob
import os
import shutil
import subprocess

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension


def want_cuda() -> bool:
    choice = os.environ.get("TORCH_CONVGRAD_CUDA", "auto").strip().lower()
    if choice in ("1", "on", "true", "yes"):
        return True
    if choice in ("0", "off", "false", "no"):
        return False
    if choice != "auto":
        raise SystemExit(f"TORCH_CONVGRAD_CUDA: expected auto, 1 or 0, got {choice!r}")
    return torch.version.cuda is not None and CUDA_HOME is not None


def report_compiler():
    """Print the C++ compiler the build uses: a compiler whose C++ runtime differs from torch's
    builds fine but turns every C++ exception (every bad argument) into a crash."""
    compiler = os.environ.get("CXX", "c++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = "version unknown"
    print(f"torch_convgrad: compiling C++ with {shutil.which(compiler) or compiler} ({version})")


def extension():
    # py_limited_api=True: BuildExtension compiles against CPython's stable ABI
    # (Py_LIMITED_API), so one abi3 binary serves every CPython >= 3.10 for the
    # torch it was built against.
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/*/*.cpp"))
    # The kernels are C++20 (requires-expressions, template lambdas); torch 2.11's
    # BuildExtension would otherwise pass -std=c++17.
    cxx_flags = ["-std=c++20", "-O3", "-fdiagnostics-color=always"]
    link_flags = []
    if os.environ.get("TORCH_CONVGRAD_SANITIZE") == "1":
        # vptr checks need RTTI of torch's (uninstrumented) classes: false reports.
        sanitizers = ["-fsanitize=address,undefined", "-fno-sanitize=vptr", "-fno-sanitize-recover=undefined"]
        cxx_flags = ["-std=c++20", "-O1", "-g", "-fno-omit-frame-pointer", *sanitizers, "-fdiagnostics-color=always"]
        link_flags = list(sanitizers)
    # at::parallel_for is header code: without OpenMP it runs on one thread.
    # torch's own libgomp then serves both.
    if torch.backends.openmp.is_available():
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")
    if want_cuda():
        print(f"torch_convgrad: building CPU and CUDA kernels (nvcc from {CUDA_HOME})")
        return CUDAExtension(
            "torch_convgrad._C",
            sources + sorted(glob.glob("csrc/cuda/*.cu")),
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
            extra_link_args=link_flags,
            py_limited_api=True,
        )
    reason = "torch has no CUDA" if torch.version.cuda is None else "CUDA disabled or nvcc not found"
    print(f"torch_convgrad: building CPU kernels only ({reason})")
    return CppExtension(
        "torch_convgrad._C",
        sources,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
        py_limited_api=True,
    )


report_compiler()
setup(
    name="torch_convgrad",
    version="0.1.0",
    description="Convolution weight-gradient operators for PyTorch, exact to spec",
    packages=find_packages(include=["torch_convgrad", "torch_convgrad.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    install_requires=["torch>=2.11,<2.15"],
)
