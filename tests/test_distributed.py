"""The ops on DTensors, on a real gloo process group of 2 and 4 CPU processes.

Each test starts the ranks of ``distributed_worker.py`` on localhost and fails if any
rank fails, or if they have not finished within the time limit. The worker checks every
supported placement (values, first and second derivatives, the result's placements, no
collective in the native placements) and the redistributed ones (values).
"""
import os
import re
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import ROOT

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is unavailable"
)

TIME_LIMIT_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Runs the script named by its first argument (with the rest as its arguments), then leaves
# without interpreter finalization: there gloo's threads now and then abort a rank ("terminate
# called without an active exception"; torch 2.11 and 2.14) after the script has run. An
# exception or sys.exit in the script still sets the exit status.
RUN_AND_LEAVE = ("import os, runpy, sys\n"
                 "sys.argv = sys.argv[1:]\n"
                 "runpy.run_path(sys.argv[0], run_name='__main__')\n"
                 "sys.stdout.flush()\n"
                 "sys.stderr.flush()\n"
                 "os._exit(0)\n")


def run_ranks(world_size, script):
    """Runs ``script`` (a path and its arguments) as ranks 0..world_size-1; returns rank 0's output."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen([sys.executable, "-c", RUN_AND_LEAVE, *script], env=dict(env, RANK=str(rank)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world_size)
    ]
    outputs = []
    try:
        for rank in ranks:
            outputs.append(rank.communicate(timeout=TIME_LIMIT_S)[0])
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        pytest.fail(f"{world_size} ranks did not finish within {TIME_LIMIT_S} s")
    for number, (rank, output) in enumerate(zip(ranks, outputs)):
        assert rank.returncode == 0, f"rank {number} failed:\n{output[-6000:]}"
    return outputs[0]


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_placement_matches_one_process(world_size):
    output = run_ranks(world_size, [str(ROOT / "tests" / "distributed_worker.py")])
    assert "all cases passed" in output
    # Channel shards run without collectives only where DTensor rewrites each rank's arguments
    # (torch 2.13 and later); before, only the 12 batch-sharded cases do.
    from torch_convgrad import _dtensor
    assert output.count("collectives forward 0, backward 0") >= (20 if _dtensor._adjusts_arguments else 12), output


def test_without_argument_adjusters_channel_shards_are_redistributed():
    """Where DTensor has no per-op argument adjusters (torch before 2.13), the strategies offer
    no channel-sharded placement and DTensor redistributes: the values stay right."""
    output = run_ranks(2, [str(ROOT / "tests" / "distributed_worker.py"), "--without-argument-adjusters"])
    assert "all cases passed" in output
    assert "output_delta channels: result [Replicate()]" in output or \
        "output_delta channels: result [Partial(sum)]" in output, output


def test_compiled_on_dtensors_matches_eager():
    """torch.compile(fullgraph=True) over the op on DTensors (batch and channel shards)."""
    output = run_ranks(2, [str(ROOT / "tests" / "distributed_worker.py"), "--compile"])
    assert "all cases passed" in output and output.count("ok compiled") == 3, output


def test_ddp_example_matches_plain_autograd():
    output = run_ranks(2, [str(ROOT / "examples" / "ddp_weight_gradient.py")])
    assert "matches plain autograd on every rank" in output, output


def test_readme_dtensor_example_runs_on_two_ranks(tmp_path):
    readme = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```python\n(# torchrun.*?)```", readme, flags=re.S)
    script = tmp_path / "readme_dtensor.py"
    script.write_text(block + "from torch.distributed.tensor import Partial\n"
                      "assert dw.placements == (Partial(),), dw.placements\n"
                      "print('readme example', tuple(dw.full_tensor().shape))\n")
    assert "readme example (3, 3, 32, 64)" in run_ranks(2, [str(script)])


def test_importing_does_not_import_dtensor_and_registers_when_it_is_imported():
    """DTensor costs about a second to import: torch_convgrad registers its strategies only
    once DTensor is imported, whichever comes first."""
    registered = "assert torch.ops.torch_convgrad.conv_backprop_filters.default in " \
        "DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
    torch_convgrad_first = (
        "import sys\nimport torch\nimport torch_convgrad\nassert 'torch.distributed.tensor' not in sys.modules\n"
        "from torch.distributed.tensor import DTensor\n" + registered
    )
    dtensor_first = "import torch\nfrom torch.distributed.tensor import DTensor\nimport torch_convgrad\n" + registered
    for script in (torch_convgrad_first, dtensor_first):
        subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=120)
