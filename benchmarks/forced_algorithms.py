"""Calibration of the cost models: every algorithm forced on the benchmark's layers.

For each layer of ``torch_convgrad.benchmark.CASES`` (on CUDA at the CUDA batch), data layout
and dtype, runs each algorithm that applies forced, checks it against ``aten`` (ATen in the
caller's layout, the glue's path), times them interleaved in one process (CUDA events on CUDA:
GPU time) and prints which was fastest and which the selector picks. On CUDA it then times the
layout copy alone: the ``_batched_transpose`` kernel against ATen's strided copy on each
layer's input, in bytes read and written per second.

    PYTHONPATH=. python benchmarks/forced_algorithms.py [--device cpu|cuda] [--threads N]
        [--dtypes f32,...] [--repeats R] [--block-seconds S] [--cases SUBSTRING,...] [--json FILE]

(from the repository root, with the extension built in place: ``make build``).
"""
import argparse
import dataclasses
import json
import statistics
import sys

import torch

import torch_convgrad
from torch_convgrad import benchmark

# The ones worth timing on the benchmark's layers (direct is for tiny problems).
ALGORITHMS = {
    "cuda": ("aten", "aten_channels_last", "aten_channels_first", "matmul"),
    "cpu": ("aten", "aten_channels_last", "gemm", "depthwise", "matmul", "brgemm", "amx_planes", "amx_depthwise"),
}


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
        if device.type == "cuda":
            case = dataclasses.replace(case, batch=case.batch * benchmark.CUDA_BATCH_SCALE)
        for layout in benchmark.LAYOUTS:
            for dtype_name in args.dtypes:
                yield case, layout, dtype_name, benchmark.Problem.make(
                    case, case.ops[0], layout, benchmark.DTYPES[dtype_name], device, generator)


def time_algorithms(args, device, records):
    names = ALGORITHMS[device.type]
    print("layer | layout | dtype | ms: " + ", ".join(names) + " | fastest | picked", flush=True)
    for case, layout, dtype_name, problem in layers(args, device):
        functions, results, errors = {}, {}, []
        for algorithm in names:
            call = forced(problem, algorithm)
            if call is not None:
                functions[algorithm], results[algorithm] = call, call()
        expected = results["aten"].double()
        for algorithm, result in results.items():
            error = (result.double() - expected).abs().max().item() / max(expected.abs().max().item(), 1e-30)
            if error > benchmark.TOLERANCE[problem.dtype]:
                errors.append(f"{algorithm}: max error {error:.3g} of max |aten|")
        problem.ours()
        picked = torch_convgrad.last_algorithm()
        times = benchmark.time_interleaved(functions, args.repeats, args.block_seconds, device)
        medians = {name: statistics.median(values) for name, values in times.items()}
        fastest = min(medians, key=medians.get)
        cells = [f"{medians[name] * 1e3:.3f}" if name in medians else "-" for name in names]
        print(f"{case.name} | {layout} | {dtype_name} | {', '.join(cells)} | {fastest} | {picked}"
              + (f" | WRONG: {'; '.join(errors)}" if errors else ""), flush=True)
        records.append(dict(case=case.name, layout=layout, dtype=dtype_name, seconds=medians, picked=picked,
                            errors=errors))


def time_layout_copies(args, device, records):
    print("\nlayout copy of each layer's input (NCX -> channels-last, NXC -> channels-first): TB/s read+written")
    for case, layout, dtype_name, problem in layers(args, device):
        data = problem.input_forward
        ncx = data if layout == "NCX" else data.movedim(-1, 1)
        matrices = ncx.flatten(2) if layout == "NCX" else data.flatten(1, -2)
        aten = (lambda: ncx.movedim(1, -1).contiguous()) if layout == "NCX" else (lambda: ncx.contiguous())
        ours = lambda: torch.ops.torch_convgrad._batched_transpose(matrices)
        assert torch.equal(ours().view(-1), aten().view(-1)), case.name
        times = benchmark.time_interleaved({"ours": ours, "aten": aten}, args.repeats, args.block_seconds, device)
        moved = 2 * data.numel() * data.element_size()
        rates = {name: moved / statistics.median(values) / 1e12 for name, values in times.items()}
        print(f"{case.name} | {layout} | {dtype_name} | {moved / 1e6:.0f} MB | ours {rates['ours']:.2f} | "
              f"aten {rates['aten']:.2f}", flush=True)
        records.append(dict(case=case.name, layout=layout, dtype=dtype_name, copy_tbps=rates))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtypes", type=lambda text: text.split(","), default=list(benchmark.DTYPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-seconds", type=float, default=None,
                        help="length of a timed block (default 0.02 on CUDA, 0.1 on CPU)")
    parser.add_argument("--cases", type=lambda text: [part.strip().lower() for part in text.split(",")])
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    benchmark.settle_allocator()
    if args.block_seconds is None:
        args.block_seconds = 0.02 if device.type == "cuda" else 0.1
    records = []
    time_algorithms(args, device, records)
    if device.type == "cuda":
        time_layout_copies(args, device, records)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
    return 1 if any(record.get("errors") for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
