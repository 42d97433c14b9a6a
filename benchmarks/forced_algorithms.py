"""Calibration of the cost models: every algorithm forced on the benchmark's layers.

For each layer of ``torch_convgrad.benchmark.CASES`` (on CUDA at the CUDA batch), data layout
and dtype, runs each algorithm that applies forced, checks it against ``aten`` (ATen in the
caller's layout, the glue's path), times them interleaved in one process (CUDA events on CUDA:
GPU time) and prints which was fastest and which the selector picks. On CUDA it then times the
layout copy alone: the ``_batched_transpose`` kernel against ATen's strided copy on each
layer's input, in bytes read and written per second.

    PYTHONPATH=. python benchmarks/forced_algorithms.py [--device cpu|cuda] [--threads N]
        [--layers benchmark|sweep] [--dtypes f32,...] [--repeats R] [--block-seconds S]
        [--cases SUBSTRING,...] [--json FILE]

``--layers sweep`` takes real layers the benchmark leaves out instead (SWEEP_CASES): stems of few
input channels, ResNet-50's last stage on 7x7 maps and its stride-2 1x1 layers, grouped, 1-D and
3-D layers, at the batch given (on CUDA too).

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


Case = benchmark.Case
# name, batch, in channels, out channels, input size, kernel, stride, padding, groups
SWEEP_CASES = [
    Case("resnet50 7x7 stem 3->64 224", 4, 3, 64, (224, 224), (7, 7), 2, (3, 3), (3, 3)),
    Case("mobilenetv2 stem 3x3 s2 3->32 224", 4, 3, 32, (224, 224), (3, 3), 2, (1, 1), (1, 1)),
    Case("convnext stem 4x4 s4 3->96 224", 4, 3, 96, (224, 224), (4, 4), 4),
    Case("resnet50 3x3 128ch 28x28", 8, 128, 128, (28, 28), (3, 3), 1, (1, 1), (1, 1)),
    Case("resnet50 3x3 512ch 7x7", 8, 512, 512, (7, 7), (3, 3), 1, (1, 1), (1, 1)),
    Case("resnet50 1x1 256->64 56x56", 8, 256, 64, (56, 56), (1, 1)),
    Case("resnet50 1x1 128->512 28x28", 8, 128, 512, (28, 28), (1, 1)),
    Case("resnet50 1x1 256->1024 14x14", 8, 256, 1024, (14, 14), (1, 1)),
    Case("resnet50 1x1 2048->512 7x7", 8, 2048, 512, (7, 7), (1, 1)),
    Case("resnet50 1x1 512->2048 7x7", 8, 512, 2048, (7, 7), (1, 1)),
    Case("resnet50 1x1 512->2048 7x7 N32", 32, 512, 2048, (7, 7), (1, 1)),
    Case("resnet50 1x1 s2 512->1024 28->14", 8, 512, 1024, (28, 28), (1, 1), 2),
    Case("resnet50 1x1 s2 1024->2048 14->7", 8, 1024, 2048, (14, 14), (1, 1), 2),
    Case("resnext 3x3 g32 256ch 28x28", 8, 256, 256, (28, 28), (3, 3), 1, (1, 1), (1, 1), groups=32),
    Case("resnext 3x3 g32 512ch 14x14", 8, 512, 512, (14, 14), (3, 3), 1, (1, 1), (1, 1), groups=32),
    Case("grouped 3x3 g4 128ch 28x28", 8, 128, 128, (28, 28), (3, 3), 1, (1, 1), (1, 1), groups=4),
    Case("mobilenetv2 1x1 24->144 56x56", 8, 24, 144, (56, 56), (1, 1)),
    Case("mobilenetv2 1x1 96->576 14x14", 8, 96, 576, (14, 14), (1, 1)),
    Case("convnext 1x1 96->384 56x56", 4, 96, 384, (56, 56), (1, 1)),
    Case("vgg 3x3 64ch 112x112", 2, 64, 64, (112, 112), (3, 3), 1, (1, 1), (1, 1)),
    Case("1-D k3 256ch 1000", 8, 256, 256, (1000,), (3,), 1, (1,), (1,)),
    Case("1-D k5 s2 64->128 4000", 8, 64, 128, (4000,), (5,), 2, (2,), (2,)),
    Case("3-D 1x3x3 64ch 8x56x56", 2, 64, 64, (8, 56, 56), (1, 3, 3), 1, (0, 1, 1), (0, 1, 1)),
    Case("3-D 3x1x1 64ch 8x56x56", 2, 64, 64, (8, 56, 56), (3, 1, 1), 1, (1, 0, 0), (1, 0, 0)),
]


def forced(problem, algorithm):
    """A callable running ``problem`` with ``algorithm`` forced, or None where it does not apply."""
    def call():
        with torch_convgrad.use_algorithm(algorithm):
            return problem.ours()
    call()
    return call if torch_convgrad.last_algorithm() == algorithm else None


def layers(args, device):
    generator = torch.Generator(device=device).manual_seed(0)
    for case in benchmark.CASES if args.layers == "benchmark" else SWEEP_CASES:
        if args.cases and not any(part in case.name.lower() for part in args.cases):
            continue
        if device.type == "cuda" and args.layers == "benchmark":
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
    parser.add_argument("--layers", choices=("benchmark", "sweep"), default="benchmark")
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
