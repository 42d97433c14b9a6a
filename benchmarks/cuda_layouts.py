"""Calibration of the CUDA cost model: every algorithm that runs the benchmark's layers on CUDA.

For each layer of ``torch_convgrad.benchmark.CASES`` (at the CUDA batch), data layout and
dtype, times the glue and each CUDA algorithm forced (the ATen layouts and ``matmul``), each
checked against the glue first, interleaved in one process with CUDA events (GPU time), and
prints which was fastest and which the selector picks. Then the layout copy alone: the
``_batched_transpose`` kernel against ATen's strided copy on each layer's input, in bytes
read and written per second.

    python benchmarks/cuda_layouts.py [--repeats R] [--cases SUBSTRING,...] [--json FILE]
"""
import argparse
import dataclasses
import json
import statistics
import sys

import torch

import torch_convgrad
from torch_convgrad import benchmark

ALGORITHMS = ("aten", "aten_channels_last", "aten_channels_first", "matmul")


def forced(problem, algorithm):
    """A callable running ``problem`` with ``algorithm`` forced, or None where it does not apply."""
    def call():
        with torch_convgrad.use_algorithm(algorithm):
            return problem.ours()
    call()
    return call if torch_convgrad.last_algorithm() == algorithm else None


def layers(args, device):
    generator = torch.Generator(device=device).manual_seed(0)
    for case in benchmark.CASES:
        if args.cases and not any(part in case.name.lower() for part in args.cases):
            continue
        case = dataclasses.replace(case, batch=case.batch * benchmark.CUDA_BATCH_SCALE)
        for layout in benchmark.LAYOUTS:
            for dtype_name, dtype in benchmark.DTYPES.items():
                yield case, layout, dtype_name, benchmark.Problem.make(case, case.ops[0], layout, dtype, device,
                                                                       generator)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", type=lambda text: [part.strip().lower() for part in text.split(",")])
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    records = []
    print("layer | layout | dtype | GPU ms: glue, " + ", ".join(ALGORITHMS) + " | fastest | picked")
    for case, layout, dtype_name, problem in layers(args, device):
        functions = {"glue": problem.glue}
        errors = []
        for algorithm in ALGORITHMS:
            call = forced(problem, algorithm)
            if call is None:
                continue
            ours, glue = call(), problem.glue()
            error = (ours.double() - glue.double()).abs().max().item() / max(glue.abs().max().item(), 1e-30)
            if error > benchmark.TOLERANCE[problem.dtype]:
                errors.append(f"{algorithm}: max error {error:.3g} of max |glue|")
            functions[algorithm] = call
        problem.ours()
        picked = torch_convgrad.last_algorithm()
        times = benchmark.time_interleaved(functions, args.repeats, 0.02, device)
        medians = {name: statistics.median(values) for name, values in times.items()}
        fastest = min((name for name in medians if name != "glue"), key=medians.get)
        cells = [f"{medians[name] * 1e3:.3f}" if name in medians else "-" for name in ("glue", *ALGORITHMS)]
        print(f"{case.name} | {layout} | {dtype_name} | {', '.join(cells)} | {fastest} | {picked}"
              + (f" | WRONG: {'; '.join(errors)}" if errors else ""), flush=True)
        records.append(dict(case=case.name, layout=layout, dtype=dtype_name, seconds=medians, picked=picked,
                            errors=errors))

    print("\nlayout copy of each layer's input (NCX -> channels-last, NXC -> channels-first): TB/s read+written")
    for case, layout, dtype_name, problem in layers(args, device):
        if dtype_name == "f16":
            continue
        data = problem.input_forward
        ncx = data if layout == "NCX" else data.movedim(-1, 1)
        if layout == "NCX":
            matrices = ncx.flatten(2)
            aten = lambda: ncx.movedim(1, -1).contiguous()
        else:
            matrices = data.flatten(1, -2)
            aten = lambda: ncx.contiguous()
        ours = lambda: torch.ops.torch_convgrad._batched_transpose(matrices)
        assert torch.equal(ours().view(-1), aten().view(-1)), case.name
        times = benchmark.time_interleaved({"ours": ours, "aten": aten}, args.repeats, 0.02, device)
        moved = 2 * data.numel() * data.element_size()
        rates = {name: moved / statistics.median(values) / 1e12 for name, values in times.items()}
        print(f"{case.name} | {layout} | {dtype_name} | {moved / 1e6:.0f} MB | ours {rates['ours']:.2f} | "
              f"aten {rates['aten']:.2f}", flush=True)
        records.append(dict(case=case.name, layout=layout, dtype=dtype_name, copy_tbps=rates))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
    return 1 if any(record.get("errors") for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
