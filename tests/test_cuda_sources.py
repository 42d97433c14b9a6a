"""The CUDA sources are compiled with nvcc here even without a GPU, so they cannot rot."""
import pathlib
import shutil
import subprocess

import pytest
import torch.utils.cpp_extension as cpp_extension

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
NVCC = shutil.which("nvcc") or (cpp_extension.CUDA_HOME and str(pathlib.Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"))
# A CUDA build of torch generates this header; the CPU wheel ships the other
# ATen/c10 CUDA headers but not this one.
GENERATED_HEADER = "c10/cuda/impl/cuda_cmake_macros.h"


def test_there_are_cuda_sources():
    assert CUDA_SOURCES, "csrc/cuda/*.cu is empty"


@pytest.mark.skipif(not NVCC or not pathlib.Path(NVCC).exists(), reason="nvcc is not installed")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda path: path.name)
def test_cuda_source_compiles(source, tmp_path):
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    if not any((pathlib.Path(path) / GENERATED_HEADER).exists() for path in cpp_extension.include_paths()):
        header = tmp_path / GENERATED_HEADER
        header.parent.mkdir(parents=True)
        header.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(f"-I{tmp_path}")
    command = [
        # The flags torch 2.13's CUDAExtension compiles .cu files with (less arch flags).
        NVCC, "-c", "-std=c++20", *includes, "-DPy_LIMITED_API=0x030A0000", "-DTORCH_EXTENSION_NAME=_C",
        "-DTORCH_API_INCLUDE_EXTENSION_H", *cpp_extension.COMMON_NVCC_FLAGS,
        "-Xcompiler", "-fPIC", str(source), "-o", str(tmp_path / "out.o"),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-6000:]
    assert (tmp_path / "out.o").stat().st_size > 0
