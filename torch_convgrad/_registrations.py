"""vmap rules for the ops (autograd is in C++: csrc/autograd/; DTensor in _dtensor.py).

vmap: a batch of problems is one problem with the batch folded into the
channels and ``groups * B`` groups, so per-sample weight gradients cost one
call, not B.
"""
from __future__ import annotations

import torch

from ._filter_axes import BACKWARD_OPS, CHANNEL_AXES, group_spanning_axis

_ops = torch.ops.torch_convgrad


def _batch_first(tensor, dim, batch_size):
    return tensor.movedim(dim, 0) if dim is not None else tensor.expand(batch_size, *tensor.shape)


def _fold_into_channels(batched, channels_last):
    """(B, N, C, X...) -> (N, B*C, X...), or (B, N, X..., C) -> (N, X..., B*C)."""
    if channels_last:
        return batched.movedim(0, -2).flatten(-2)
    return batched.movedim(0, 1).flatten(1, 2)


def _unfold_from_channels(folded, batch, channels_last):
    """The inverse of _fold_into_channels."""
    if channels_last:
        return folded.unflatten(-1, (batch, -1)).movedim(-2, 0)
    return folded.unflatten(1, (batch, -1)).movedim(1, 0)


def _folded_arguments(arguments, names, samples, batch, channels_last):
    """``arguments`` with the batch folded into the groups and, for each of ``names``, its
    batched data tensor from ``samples`` folded into the channels."""
    folded = dict(arguments, groups=arguments["groups"] * batch)
    for name, sample in zip(names, samples):
        folded[name] = _fold_into_channels(sample, channels_last)
    return folded


def _binder(op):
    """The op's argument names, and a function giving every argument by name from a call's
    (args, kwargs): the dispatcher drops trailing arguments equal to their defaults."""
    names = [argument.name for argument in op._schema.arguments]
    defaults = [argument.default_value for argument in op._schema.arguments]

    def bind(args, kwargs):
        arguments = dict(zip(names, defaults))
        arguments.update(zip(names, args), **kwargs)
        return arguments

    return names, bind


def _batched_call(op_name, format_name, info, in_dims, args, arguments, tensors):
    """The first ``tensors`` arguments with the batch first, the filter axis that spans all
    groups (None for an unknown format) and the upper-cased data format."""
    samples = [_batch_first(args[index], in_dims[index], info.batch_size) for index in range(tensors)]
    axis = group_spanning_axis(op_name, str(arguments[format_name]).upper())
    return samples, axis, str(arguments["data_format"]).upper()


def _make_vmap_rule(op_name):
    op = getattr(_ops, op_name).default
    names, bind = _binder(op)
    shape_name, format_name = names[2], names[-1]

    def rule(info, in_dims, *args, **kwargs):
        arguments = bind(args, kwargs)
        batch = info.batch_size
        samples, axis, data_format = _batched_call(op_name, format_name, info, in_dims, args, arguments, 2)

        def run_first_sample():
            return op(**dict(arguments, **dict(zip(names[:2], (samples[0][0], samples[1][0])))))

        if batch == 0:
            # Meta tensors of one sample's shape check the arguments and give the result's shape.
            metas = [torch.empty(sample.shape[1:], dtype=sample.dtype, device="meta") for sample in samples]
            shape = op(**dict(arguments, **dict(zip(names[:2], metas)))).shape
            return samples[0].new_empty((0, *shape)), 0
        if axis is None or data_format not in ("NXC", "NCX"):
            return run_first_sample(), 0  # an unknown format: the op raises its usual error
        try:
            folded_arguments = _folded_arguments(arguments, names[:2], samples, batch, data_format == "NXC")
            shape = list(arguments[shape_name])
            per_sample = shape[axis]
            shape[axis] = per_sample * batch
            folded_arguments[shape_name] = shape
            folded = op(**folded_arguments)
        except (IndexError, TypeError, ValueError):
            # The folded problem's message would quote folded sizes; a sample's quotes the caller's.
            run_first_sample()
            raise
        # Split the grouped axis into (B, per-sample) and bring B to the front.
        axis = axis % folded.dim()
        return folded.unflatten(axis, (batch, per_sample)).movedim(axis, 0).contiguous(), 0

    return rule


def _make_backward_vmap_rule(backward_name, op_name):
    """The same fold for a ``*_backward`` op: the filter-shaped ``grad`` folds the batch into
    its group-spanning axis, and the two results unfold from the channels."""
    op = getattr(_ops, backward_name).default
    names, bind = _binder(op)
    shape_name, format_name = names[3], names[-2]

    def rule(info, in_dims, *args, **kwargs):
        arguments = bind(args, kwargs)
        batch = info.batch_size
        samples, axis, data_format = _batched_call(op_name, format_name, info, in_dims, args, arguments, 3)
        mask = arguments["output_mask"]
        out_dims = tuple(0 if needed else None for needed in mask)  # a result not asked for is None
        if batch == 0:
            return tuple(sample.new_empty(sample.shape) if needed else None
                         for sample, needed in zip(samples[1:], mask)), out_dims
        if axis is None or data_format not in ("NXC", "NCX"):
            # An argument the op rejects: a call per sample raises its usual error.
            per_sample = [op(**dict(arguments, **dict(zip(names[:3], sample)))) for sample in zip(*samples)]
            return tuple(torch.stack(results) if needed else None
                         for results, needed in zip(zip(*per_sample), mask)), out_dims
        channels_last = data_format == "NXC"
        folded_arguments = _folded_arguments(arguments, names[1:3], samples[1:], batch, channels_last)
        axis %= samples[0].dim() - 1  # in the per-sample filter
        grad = samples[0].movedim(0, axis).flatten(axis, axis + 1)
        shape = list(arguments[shape_name])
        shape[axis] *= batch
        folded_arguments.update(grad=grad, **{shape_name: shape})
        results = op(**folded_arguments)
        unfolded = tuple(
            None if result is None else _unfold_from_channels(result, batch, channels_last).contiguous()
            for result in results
        )
        return unfolded, out_dims

    return rule


for _name in CHANNEL_AXES:
    torch.library.register_vmap(f"torch_convgrad::{_name}", _make_vmap_rule(_name))
for _backward, _name in BACKWARD_OPS.items():
    torch.library.register_vmap(f"torch_convgrad::{_backward}", _make_backward_vmap_rule(_backward, _name))

# The internal layout copy of the aten_channels_last/aten_channels_first algorithms is
# linear: its gradient is the transposition back. (The algorithms call it below autograd.)
torch.library.register_autograd(
    "torch_convgrad::_batched_transpose", lambda ctx, grad: grad.transpose(1, 2).contiguous()
)
