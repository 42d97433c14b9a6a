"""The main job, `python -m torch_convgrad`."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_main_job_checks_every_op_and_passes():
    result = subprocess.run([sys.executable, "-m", "torch_convgrad"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for op in ("conv_backprop_filters", "conv_backprop_weights", "conv_transpose_backprop_filters"):
        assert f"torch.ops.torch_convgrad.{op}: kernels for CPU, Meta, Autograd" in result.stdout
    assert "96 of 96 samples match" in result.stdout
    assert result.stdout.rstrip().endswith("OK")
