"""One rank of the DTensor tests (tests/test_distributed.py starts 2 or 4 of these on gloo).

Every case distributes the same global tensors with given placements, runs an op on the
DTensors and checks, against the single-process result on the full tensors:
the values (forward, first and second derivatives), the result's placements, and for the
placements the strategies support natively that no collective ran.
Prints one line per case and exits non-zero on the first mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import torch_convgrad
from torch_convgrad._filter_axes import CHANNEL_AXES, GROUP_SPANNING_TENSOR

OPS = {
    "conv_backprop_filters": (torch_convgrad.conv_backprop_filters, "filter_format", ("XIO", "OIX")),
    "conv_backprop_weights": (torch_convgrad.conv_backprop_weights, "weights_format", ("XIO", "OIX")),
    "conv_transpose_backprop_filters": (
        torch_convgrad.conv_transpose_backprop_filters, "filter_format", ("XIO", "OIX", "IOX", "XOI")),
}

# Each op's cases are 2-D, 1-D or 3-D.
SPATIAL_RANK = {"conv_backprop_filters": 2, "conv_backprop_weights": 1, "conv_transpose_backprop_filters": 3}


def problem(op_name, data_format, filter_format, groups):
    """Global float64 tensors, the filter shape and the attributes; 1-D, 2-D or 3-D by op."""
    n, c, o, k, s = 4, 8, 8, 3, 2
    r = SPATIAL_RANK[op_name]
    # Convolution: input 7 -> output 4 with k 3, s 2, pads (1, 1). ConvTranspose: the reverse.
    big, small = [7, 6, 5][:r], [4, 3, 3][:r]
    pads_end = [1, 0, 1][:r]
    x_size, dy_size = (small, big) if op_name.startswith("conv_transpose") else (big, small)
    generator = torch.Generator().manual_seed(1234)

    def data(channels, size):
        shape = [n, channels, *size] if data_format == "NCX" else [n, *size, channels]
        return torch.randn(shape, dtype=torch.float64, generator=generator)

    x, dy = data(c, x_size), data(o, dy_size)
    x_axis, dy_axis = [axis % (r + 2) for axis in CHANNEL_AXES[op_name][filter_format]]
    shape = [k] * (r + 2)
    transpose = op_name.startswith("conv_transpose")
    shape[x_axis] = c if transpose else c // groups
    shape[dy_axis] = o // groups if transpose else o
    attributes = dict(strides=s, pads_begin=1, pads_end=pads_end, groups=groups, data_format=data_format)
    return x, dy, shape, attributes


def run_case(mesh, op_name, data_format, filter_format, groups, placements, expected, tag):
    """placements: (input_forward, output_delta) per mesh dimension; expected: the result's, or None."""
    function, format_name, _ = OPS[op_name]
    x, dy, shape, attributes = problem(op_name, data_format, filter_format, groups)
    attributes[format_name] = filter_format

    def f(a, b):
        return function(a, b, shape, **attributes)

    x_placements = [p[0] for p in placements]
    dy_placements = [p[1] for p in placements]
    xd = distribute_tensor(x, mesh, x_placements).requires_grad_()
    dyd = distribute_tensor(dy, mesh, dy_placements).requires_grad_()
    with CommDebugMode() as comm:
        out = f(xd, dyd)
    forward_collectives = comm.get_total_counts()

    xr, dyr = x.clone().requires_grad_(), dy.clone().requires_grad_()
    want = f(xr, dyr)
    check(out.full_tensor(), want, tag, "forward")
    if expected is not None:
        assert tuple(out.placements) == tuple(expected), f"{tag}: placements {out.placements}, want {expected}"
        assert forward_collectives == 0, f"{tag}: {forward_collectives} collectives in a native placement"

    # First and second derivatives. The incoming gradient has the result's placements (a
    # Partial result's gradient is Replicate).
    weight = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    grad_placements = [Replicate() if isinstance(p, Partial) else p for p in out.placements]
    weight_d = distribute_tensor(weight, mesh, grad_placements)
    with CommDebugMode() as comm:
        gx, gdy = torch.autograd.grad(out, (xd, dyd), weight_d, create_graph=True)
    backward_collectives = comm.get_total_counts()
    rx, rdy = torch.autograd.grad(want, (xr, dyr), weight, create_graph=True)
    check(gx.full_tensor(), rx, tag, "grad input_forward")
    check(gdy.full_tensor(), rdy, tag, "grad output_delta")
    if expected is not None:
        assert backward_collectives == 0, f"{tag}: {backward_collectives} collectives in the backward"

    second = torch.autograd.grad((gx * gx).sum() + (gdy * gdy).sum(), (xd, dyd))
    want_second = torch.autograd.grad((rx * rx).sum() + (rdy * rdy).sum(), (xr, dyr))
    for got, reference, name in zip(second, want_second, ("input_forward", "output_delta")):
        check(got.full_tensor(), reference, tag, f"second derivative {name}")
    if dist.get_rank() == 0:
        print(f"ok {tag}: result {list(out.placements)}, collectives forward {forward_collectives}, "
              f"backward {backward_collectives}", flush=True)


def check(got, want, tag, what):
    if not torch.allclose(got, want, rtol=1e-10, atol=1e-10):
        raise AssertionError(f"{tag}: {what} differs by {(got - want).abs().max().item()}")


def one_dimensional_cases(world):
    """(op, data_format, filter_format, groups, placements, expected result placements or None)."""
    for op_name, (_, _, formats) in OPS.items():
        ndim = SPATIAL_RANK[op_name] + 2
        for data_format in ("NXC", "NCX"):
            channel = Shard(1 if data_format == "NCX" else ndim - 1)
            # Four ranks take one filter format per op, to bound the time.
            for filter_format in formats if world == 2 else formats[:1]:
                x_axis, dy_axis = [axis % ndim for axis in CHANNEL_AXES[op_name][filter_format]]
                spanning = (x_axis, dy_axis)[GROUP_SPANNING_TENSOR[op_name]]
                tag = f"{op_name} {data_format} {filter_format}"
                yield op_name, data_format, filter_format, 1, [(Shard(0), Shard(0))], [Partial()], tag + " batch"
                yield (op_name, data_format, filter_format, 1, [(Replicate(), channel)], [Shard(dy_axis)],
                       tag + " output_delta channels")
                yield (op_name, data_format, filter_format, 1, [(channel, Replicate())], [Shard(x_axis)],
                       tag + " input_forward channels")
                yield (op_name, data_format, filter_format, world, [(channel, channel)], [Shard(spanning)],
                       tag + f" both channels, groups {world}")
            # Placements that are redistributed: values only, one filter format each.
            filter_format = formats[0]
            tag = f"{op_name} {data_format} {filter_format}"
            spatial = Shard(2) if data_format == "NCX" else Shard(1)
            yield op_name, data_format, filter_format, 1, [(spatial, Replicate())], None, tag + " spatial"
            yield op_name, data_format, filter_format, 1, [(Shard(0), Replicate())], None, tag + " batch, replicate"
            yield op_name, data_format, filter_format, 1, [(channel, channel)], None, tag + " both channels, groups 1"
            if world == 4:
                yield op_name, data_format, filter_format, 2, [(channel, channel)], None, \
                    tag + " both channels, groups 2"


def check_attributes_key_the_cache_and_errors_name_the_argument(mesh):
    """Two calls on the same DTensors that differ only in an attribute get their own results
    (DTensor caches sharding decisions; every attribute is in the key), and a bad attribute
    raises the op's own error."""
    x, dy, shape, attributes = problem("conv_backprop_filters", "NCX", "OIX", 1)
    xd, dyd = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(dy, mesh, [Shard(0)])
    for pads_begin, pads_end in (([1, 1], [1, 0]), ([2, 0], [0, 1])):  # same shapes, other windows
        call = dict(attributes, pads_begin=pads_begin, pads_end=pads_end, filter_format="OIX")
        got = torch_convgrad.conv_backprop_filters(xd, dyd, shape, **call).full_tensor()
        check(got, torch_convgrad.conv_backprop_filters(x, dy, shape, **call), "cache", f"pads {pads_begin}")
    try:
        torch_convgrad.conv_backprop_filters(xd, dyd, shape, **dict(attributes, groups=3))
    except RuntimeError as error:
        # DTensor re-raises errors from sharding propagation as RuntimeError, caused by ours.
        assert isinstance(error.__cause__, ValueError) and "groups" in str(error.__cause__), error
    else:
        raise AssertionError("groups=3 with 8 channels was accepted")


def check_compiled(mesh):
    """torch.compile(fullgraph=True) of the op on DTensors: the same values, placements and
    gradients as eager, for the data-parallel and both channel placements (NXC, XIO)."""
    x, dy, shape, attributes = problem("conv_backprop_filters", "NXC", "XIO", 1)
    x, dy = x.float(), dy.float()

    def f(a, b):
        return torch_convgrad.conv_backprop_filters(a, b, shape, **attributes)

    compiled = torch.compile(f, fullgraph=True)
    channel = Shard(x.dim() - 1)
    for x_placement, dy_placement in ((Shard(0), Shard(0)), (Replicate(), channel), (channel, Replicate())):
        tag = f"compiled {x_placement}, {dy_placement}"
        results = []
        for function in (compiled, f):
            xd = distribute_tensor(x, mesh, [x_placement]).requires_grad_()
            dyd = distribute_tensor(dy, mesh, [dy_placement]).requires_grad_()
            out = function(xd, dyd)
            grads = torch.autograd.grad((out * out).sum(), (xd, dyd))
            results.append((out, *grads))
        for got, want in zip(*results):
            assert got.placements == want.placements, f"{tag}: {got.placements} against eager {want.placements}"
            if not torch.allclose(got.full_tensor(), want.full_tensor(), rtol=1e-4, atol=1e-4):
                raise AssertionError(f"{tag}: differs from eager")
        if dist.get_rank() == 0:
            print(f"ok {tag}: result {list(results[0][0].placements)}", flush=True)


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    if "--compile" in sys.argv:
        check_compiled(mesh)
        dist.destroy_process_group()
        print("all cases passed", flush=True)
        return
    # Where DTensor cannot rewrite per-rank arguments (torch before 2.13, or as if so with the
    # flag), channel shards are redistributed, with the same values.
    from torch_convgrad import _dtensor
    if "--without-argument-adjusters" in sys.argv:
        _dtensor._adjusts_arguments = False
    without_adjusters = not _dtensor._adjusts_arguments
    for op_name, data_format, filter_format, groups, placements, expected, tag in one_dimensional_cases(world):
        channel_sharded = any(isinstance(p, Shard) and p.dim != 0 for pair in placements for p in pair)
        if without_adjusters and channel_sharded:
            expected = None
        run_case(mesh, op_name, data_format, filter_format, groups, placements, expected, tag)
    check_attributes_key_the_cache_and_errors_name_the_argument(mesh)
    if world == 4 and not without_adjusters:
        # Data parallel x tensor parallel on a 2x2 mesh.
        mesh_2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for data_format, channel in (("NCX", Shard(1)), ("NXC", Shard(3))):
            run_case(mesh_2d, "conv_backprop_filters", data_format, "OIX", 1,
                     [(Shard(0), Shard(0)), (Replicate(), channel)], [Partial(), Shard(0)],
                     f"conv_backprop_filters {data_format} OIX 2-D mesh batch x output_delta channels")
    dist.barrier()
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print("all cases passed", flush=True)


if __name__ == "__main__":
    main()  # test_distributed.run_ranks leaves without finalization after it
