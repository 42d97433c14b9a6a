"""The main job, `python -m torch_convgrad`."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_main_job_checks_every_op_and_passes():
    result = subprocess.run([sys.executable, "-m", "torch_convgrad"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for op in ("conv_backprop_filters", "conv_backprop_weights", "conv_transpose_backprop_filters"):
        line = next(line for line in result.stdout.splitlines() if f"torch.ops.torch_convgrad.{op}: kernels for" in line)
        # CUDA kernels exist only in CUDA builds; these everywhere.
        assert {"CPU", "Meta", "Autograd", "AutocastCPU", "FuncTorchBatched"} <= set(line.split("for ")[1].split(", "))
    assert "96 of 96 samples match" in result.stdout
    assert "bad arguments raise ValueError (checked in a child process)" in result.stdout
    assert result.stdout.rstrip().endswith("OK")


def test_a_crash_on_a_bad_argument_is_diagnosed(capsys):
    """A child that dies instead of raising (as with a mismatched C++ runtime) gets a diagnosis
    naming both compilers and how to rebuild."""
    from torch_convgrad.__main__ import check_bad_arguments_raise

    assert not check_bad_arguments_raise("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    out = capsys.readouterr().out
    assert "died with SIGSEGV" in out
    assert "The extension was built by " in out and "; torch " in out
    assert "CXX=/usr/bin/g++" in out


def test_the_library_reports_its_compiler():
    from torch_convgrad import _library

    assert _library.compiler()  # e.g. "12.2.0" for GCC
