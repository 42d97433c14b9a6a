"""vmap rules for the ops (autograd is in C++: csrc/autograd/).

vmap: a batch of problems is one problem with the batch folded into the
channels and ``groups * B`` groups, so per-sample weight gradients cost one
call, not B.
"""
from __future__ import annotations

import torch

_ops = torch.ops.torch_convgrad

# Where the filter axis that spans all groups (conv: O; ConvTranspose: IC)
# stands in each filter format; vmap multiplies that axis by the batch.
_GROUPED_AXIS = {
    "conv_backprop_filters": {"XIO": -1, "OIX": 0},
    "conv_backprop_weights": {"XIO": -1, "OIX": 0},
    "conv_transpose_backprop_filters": {"XIO": -2, "OIX": 1, "IOX": 0, "XOI": -1},
}


def _batch_first(tensor, dim, batch_size):
    return tensor.movedim(dim, 0) if dim is not None else tensor.expand(batch_size, *tensor.shape)


def _fold_into_channels(batched, channels_last):
    """(B, N, C, X...) -> (N, B*C, X...), or (B, N, X..., C) -> (N, X..., B*C)."""
    if channels_last:
        return batched.movedim(0, -2).flatten(-2)
    return batched.movedim(0, 1).flatten(1, 2)


def _make_vmap_rule(op_name):
    op = getattr(_ops, op_name).default
    names = [argument.name for argument in op._schema.arguments]
    defaults = [argument.default_value for argument in op._schema.arguments]
    shape_name, format_name = names[2], names[-1]

    def rule(info, in_dims, *args, **kwargs):
        # The dispatcher drops trailing arguments equal to their defaults.
        arguments = dict(zip(names, defaults))
        arguments.update(zip(names, args), **kwargs)
        batch = info.batch_size
        samples = [_batch_first(args[index], in_dims[index], batch) for index in range(2)]
        axis = _GROUPED_AXIS[op_name].get(str(arguments[format_name]).upper())
        data_format = str(arguments["data_format"]).upper()

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
            folded_arguments = dict(arguments, groups=arguments["groups"] * batch)
            for name, sample in zip(names[:2], samples):
                folded_arguments[name] = _fold_into_channels(sample, channels_last=data_format == "NXC")
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


for _name in _GROUPED_AXIS:
    torch.library.register_vmap(f"torch_convgrad::{_name}", _make_vmap_rule(_name))
