"""The benchmark, `python -m torch_convgrad bench`: its glue is right, and it prints what it promises.

Tiny synthetic cases keep this fast; nothing here asserts a timing.
"""
import importlib.util
import json
import sys
import time

import pytest
import torch

import torch_convgrad
from torch_convgrad import benchmark, reference
from torch_convgrad.__main__ import main as cli_main
from torch_convgrad.benchmark import Case, Problem

from conftest import ROOT

# Asymmetric pads, strides and groups in 1-D, 2-D and 3-D, for each op kind.
TINY_CASES = [
    Case("tiny conv 1-D", 2, 3, 4, (11,), (3,), stride=2, pads_begin=(1,), pads_end=(0,)),
    Case("tiny conv 2-D g2", 2, 4, 6, (9, 8), (3, 2), stride=2, pads_begin=(0, 1), pads_end=(1, 0), groups=2),
    Case("tiny convT 2-D g2", 2, 4, 6, (3, 4), (2, 3), stride=2, pads_begin=(0, 1), pads_end=(1, 1), groups=2,
         transposed=True),
    Case("tiny convT 3-D", 1, 2, 4, (3, 3, 3), (2, 2, 2), stride=2, pads_begin=(0, 1, 1), pads_end=(1, 0, 1),
         transposed=True),
]
PROBLEMS = [(case, op, layout) for case in TINY_CASES for op in case.ops for layout in benchmark.LAYOUTS]


def _id(problem):
    case, op, layout = problem
    return f"{case.name}-{op}-{layout}"


@pytest.fixture
def fixed_roofline(monkeypatch):
    """Skip measuring the roofline (about a second) where a test does not look at it."""
    roofline = benchmark.Roofline({dtype: 1e11 for dtype in benchmark.DTYPES.values()}, 1e10)
    monkeypatch.setattr(benchmark, "measure_roofline", lambda *args: roofline)


@pytest.mark.parametrize("problem", PROBLEMS, ids=_id)
def test_glue_equals_the_float64_reference(problem):
    case, op, layout = problem
    tiny = Problem.make(case, op, layout, torch.float64, "cpu", torch.Generator().manual_seed(0))
    glue = tiny.glue()
    assert list(glue.shape) == case.filter_shape(layout) and glue.is_contiguous()
    torch.testing.assert_close(glue, tiny.ours(api=reference), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", benchmark.DTYPES.values(), ids=benchmark.DTYPES.keys())
@pytest.mark.parametrize("problem", PROBLEMS, ids=_id)
def test_ours_equals_the_glue(problem, dtype):
    assert Problem.make(*problem, dtype, "cpu", torch.Generator().manual_seed(0)).mismatch() is None


def test_a_wrong_result_is_a_mismatch(monkeypatch):
    tiny = Problem.make(TINY_CASES[1], "conv_backprop_filters", "NXC", torch.float32, "cpu",
                        torch.Generator().manual_seed(0))
    monkeypatch.setattr(Problem, "ours", lambda self: self.glue() * 1.01)
    assert "max error" in tiny.mismatch()


def test_macs_swap_roles_for_conv_transpose():
    conv = Case("conv", 2, 3, 4, (5,), (2,))  # output_delta 2 x 4 channels x 4 positions
    assert conv.macs == 2 * 4 * 4 * 3 * 2
    transposed = Case("convT", 2, 3, 4, (5,), (2,), transposed=True)  # input_forward plays the conv output
    assert transposed.delta_size == (6,) and transposed.macs == 2 * 5 * 3 * 4 * 2


def _table_rows(output):
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case "))
    return lines[start].split("  "), lines[start + 1:lines.index("", start)]


@pytest.mark.parametrize("algorithm", [None, "fake-algorithm"])
def test_bench_prints_the_header_table_and_summary(capsys, monkeypatch, algorithm):
    # None: no algorithm was needed (last_algorithm's answer for empty problems); no column then.
    monkeypatch.setattr(torch_convgrad, "last_algorithm", lambda: algorithm)
    status = benchmark.main(["--quick", "--repeats", "2", "--dtypes", "f32", "--cases", "2-D"], cases=TINY_CASES)
    output = capsys.readouterr().out
    assert status == 0
    for expected in ("torch " + torch.__version__, "threads", "GEMM GFLOP/s f32", "read bandwidth"):
        assert expected in output
    header, rows = _table_rows(output)
    columns = [cell.strip() for cell in header if cell.strip()]
    assert columns == list(benchmark.COLUMNS) + ["algorithm"] * (algorithm is not None)
    # 2-D cases only: the conv with its two ops, the ConvTranspose with one, in two layouts.
    assert len(rows) == (2 + 1) * 2
    assert all(" f32 " in row and "x " in row and "%" in row for row in rows)
    assert all(row.rstrip().endswith(algorithm) for row in rows) if algorithm else True
    assert "ratio glue/ours over 6 rows: geomean" in output and "roofline: geomean" in output


def test_the_roofline_is_the_higher_of_two_measurements(capsys, monkeypatch):
    """A ceiling depressed by a noisy neighbour before the cases must not flatter the rows: the
    second measurement, after them, raises it, and every row's percentage follows."""
    low = benchmark.Roofline({torch.float32: 1e9}, 1e8)
    high = benchmark.Roofline({torch.float32: 4e9}, 4e8)
    measurements = iter([low, high])
    monkeypatch.setattr(benchmark, "measure_roofline", lambda *args: next(measurements))
    rows = []
    monkeypatch.setattr(benchmark, "format_table", lambda table, markdown: rows.extend(table) or "")
    status = benchmark.main(["--repeats", "1", "--dtypes", "f32", "--layouts", "NXC", "--cases", "2-D"],
                            cases=TINY_CASES)
    output = capsys.readouterr().out
    assert status == 0 and rows
    assert "roofline measured again after the cases: GEMM GFLOP/s f32 4.0" in output
    for row in rows:
        flops, traffic_bytes, dtype = row.bound
        assert row.roofline_fraction == pytest.approx(max(flops / 4e9, traffic_bytes / 4e8) / row.ours[0])


def test_markdown_table(capsys, fixed_roofline):
    status = benchmark.main(["--repeats", "1", "--dtypes", "bf16", "--layouts", "NCX", "--ops",
                             "conv_transpose_backprop_filters", "--markdown"], cases=TINY_CASES)
    output = capsys.readouterr().out
    assert status == 0
    lines = [line for line in output.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| case | op | layout | dtype | glue ms |") and set(lines[1]) == set("|-")
    assert len(lines) == 2 + 2 and all("| NCX | bf16 |" in line for line in lines[2:])


def test_plot_without_matplotlib_prints_the_hint_and_the_table(capsys, monkeypatch, tmp_path, fixed_roofline):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    plot = tmp_path / "ratios.png"
    status = benchmark.main(["--repeats", "1", "--dtypes", "f32", "--layouts", "NXC", "--cases", "1-D",
                             "--plot", str(plot)], cases=TINY_CASES)
    captured = capsys.readouterr()
    assert status != 0 and not plot.exists()
    assert "matplotlib is not installed: pip install matplotlib" in captured.err
    assert "tiny conv 1-D" in captured.out and "ratio glue/ours" in captured.out


def test_a_mismatch_is_reported_not_timed(capsys, monkeypatch, fixed_roofline):
    monkeypatch.setattr(Problem, "ours", lambda self: self.glue() + 1)
    status = benchmark.main(["--repeats", "1", "--dtypes", "f32", "--layouts", "NXC", "--cases", "1-D"],
                            cases=TINY_CASES)
    output = capsys.readouterr().out
    assert status == 1 and "MISMATCH tiny conv 1-D conv_backprop_filters NXC f32" in output


def test_module_main_dispatches_bench_and_keeps_the_check_as_default(capsys):
    assert cli_main(["bench", "--cases", "no such case"]) == 2
    assert "no case matches --cases" in capsys.readouterr().err
    assert cli_main(["frobnicate"]) == 2
    assert "usage: python -m torch_convgrad [bench [options]]" in capsys.readouterr().err


def test_each_block_starts_after_an_untimed_call(monkeypatch):
    """The first call after the other side's block stalls here (as a machine returning from another
    workload does): it is not timed. A slow function gets no extra call."""
    monkeypatch.setattr(benchmark, "SLOW_CALL_SECONDS", 0.05)
    state = {"stale": True, "slow_calls": 0}

    def fast():
        if state["stale"]:
            time.sleep(0.02)
            state["stale"] = False

    def slow():
        state["stale"] = True
        state["slow_calls"] += 1
        time.sleep(0.06)

    times = benchmark.time_interleaved({"fast": fast, "slow": slow}, repeats=3, block_seconds=0.001,
                                       device=torch.device("cpu"))
    assert len(times["fast"]) == 3 and max(times["fast"]) < 0.01
    assert state["slow_calls"] == 1 + 3  # the warm-up call, then one a block


def test_slow_calls_are_timed_over_fewer_blocks(monkeypatch):
    monkeypatch.setattr(benchmark, "SLOW_CALL_SECONDS", 0.002)
    functions = {"fast": lambda: None, "slow": lambda: time.sleep(0.003)}
    times = benchmark.time_interleaved(functions, repeats=7, block_seconds=0.001, device=torch.device("cpu"))
    assert [len(values) for values in times.values()] == [benchmark.SLOW_REPEATS] * 2
    monkeypatch.setattr(benchmark, "SLOW_CALL_SECONDS", 60)
    times = benchmark.time_interleaved(functions, repeats=7, block_seconds=0.001, device=torch.device("cpu"))
    assert [len(values) for values in times.values()] == [7] * 2


def test_forced_algorithms_sweep_layers(tmp_path):
    """benchmarks/forced_algorithms.py --layers sweep forces every algorithm on a layer the
    benchmark leaves out, checks each against aten and records their times and the pick."""
    spec = importlib.util.spec_from_file_location("forced_algorithms", ROOT / "benchmarks" / "forced_algorithms.py")
    forced_algorithms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(forced_algorithms)
    out = tmp_path / "sweep.json"
    threads = torch.get_num_threads()
    try:
        status = forced_algorithms.main(["--device", "cpu", "--threads", "1", "--layers", "sweep", "--dtypes", "f32",
                                         "--cases", "grouped 3x3 g4", "--repeats", "1", "--block-seconds", "0.001",
                                         "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    records = json.loads(out.read_text())
    assert status == 0
    assert [(record["case"], record["layout"]) for record in records] == [
        ("grouped 3x3 g4 128ch 28x28", "NXC"), ("grouped 3x3 g4 128ch 28x28", "NCX")]
    for record in records:
        assert {"aten", "gemm"} <= set(record["seconds"]) and not record["errors"]
        assert record["picked"] in record["seconds"]
