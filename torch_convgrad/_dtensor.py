"""DTensor sharding strategies for the ops and their ``*_backward`` ops.

Registered with DTensor's op-strategy registration
(``DTensor._op_dispatcher.sharding_propagator.register_op_strategy``), not
with ``torch.distributed.tensor.experimental.register_sharding``, for two
reasons:

- ``register_sharding`` hashes only the arguments from the first ``int``
  argument on (``groups``) into DTensor's sharding cache, so two calls that
  differ only in ``filter_shape`` or ``strides`` would share one cached output
  shape. Here every attribute is hashed.
- ``filter_shape`` and ``groups`` describe the global problem. When the
  channels are sharded, each rank's local call needs them for its own shard;
  DTensor rewrites such arguments through its per-op argument adjusters, which
  ``register_sharding`` cannot reach.

Placements per mesh dimension (``c``: the data tensors' channel axis; the
filter axes come from ``_filter_axes.CHANNEL_AXES``):

==========================================  ===============================================
inputs (input_forward, output_delta)        result
==========================================  ===============================================
Shard(0), Shard(0)     (data parallel)      Partial(sum): each rank sums its own samples
Replicate, Shard(c)    (groups == 1)        Shard on the filter's output_delta-channel axis
Shard(c), Replicate    (groups == 1)        Shard on the filter's input_forward-channel axis
Shard(c), Shard(c)     (groups aligned)     Shard on the filter axis spanning all groups,
                                            when the shard count divides the groups and
                                            both channel counts
Partial, Replicate / Replicate, Partial     Partial(sum) (the result is bilinear)
Replicate, Replicate                        Replicate
==========================================  ===============================================

Any other placement (spatial shards, groups that do not line up, mixed
placements) is redistributed by DTensor to the cheapest of these before the
local call; the result is always the global problem's. The ``*_backward`` ops
follow the same table with the roles of inputs and outputs exchanged.

Channel sharding needs DTensor's argument adjusters (torch 2.13 and later
have them); without them only the placements that leave the arguments
unchanged are offered, and channel shards are redistributed.
"""
from __future__ import annotations

import inspect

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, RuntimeSchemaInfo
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ._filter_axes import BACKWARD_OPS, CHANNEL_AXES, GROUP_SPANNING_TENSOR

_ops = torch.ops.torch_convgrad

# Each registered op, and the op whose filter formats it takes.
_OPS = {**{name: name for name in CHANNEL_AXES}, **BACKWARD_OPS}

_propagator = DTensor._op_dispatcher.sharding_propagator
_adjusts_arguments = hasattr(_propagator, "op_to_scalar_shape_adjuster")
_COMPUTES_OFFSET_OPTIONALLY = "skip_offset" in inspect.signature(compute_local_shape_and_global_offset).parameters


class _Call:
    """One call's arguments by name, and the layout facts the strategies need."""

    def __init__(self, op_name: str, op_schema: OpSchema):
        schema = op_schema.op._schema
        self.names = [argument.name for argument in schema.arguments]
        self.values = {argument.name: argument.default_value for argument in schema.arguments}
        self.values.update(zip(self.names, op_schema.args_schema))
        self.values.update(op_schema.kwargs_schema)
        self.is_backward = self.names[0] == "grad"
        first_data = 1 if self.is_backward else 0
        self.data_names = self.names[first_data : first_data + 2]  # input_forward/src, output_delta/diff_dst
        self.shape_name = self.names[first_data + 2]
        self.format_name = [name for name in self.names if name.endswith("_format") and name != "data_format"][0]
        self.group_spanning = GROUP_SPANNING_TENSOR[op_name]
        self.is_transpose = op_name == "conv_transpose_backprop_filters"

        data = self.values[self.data_names[0]]
        self.ndim = data.ndim
        data_format = str(self.values["data_format"]).upper()
        filter_axes = CHANNEL_AXES[op_name].get(str(self.values[self.format_name]).upper())
        # None: an argument the op will reject; only Replicate is offered then.
        self.channel_axis = {"NCX": 1, "NXC": self.ndim - 1}.get(data_format)
        self.filter_axes = None if filter_axes is None else [axis % self.ndim for axis in filter_axes]

    def channels(self):
        return [self.values[name].shape[self.channel_axis] for name in self.data_names]


def _placements(call: _Call, mesh) -> list:
    """The acceptable [outputs..., inputs...] placements on one mesh dimension."""
    # (input_forward, output_delta, filter-shaped tensor) placements
    rows = [
        (Replicate(), Replicate(), Replicate()),
        (Partial(), Replicate(), Partial()),
        (Replicate(), Partial(), Partial()),
    ]
    if call.channel_axis is not None and call.filter_axes is not None and _adjusts_arguments:
        c = Shard(call.channel_axis)
        groups = call.values["groups"]
        if groups == 1:
            rows.append((c, Replicate(), Shard(call.filter_axes[0])))
            rows.append((Replicate(), c, Shard(call.filter_axes[1])))
        elif groups > 1 and all(count % mesh.size() == 0 for count in (groups, *call.channels())):
            rows.append((c, c, Shard(call.filter_axes[call.group_spanning])))

    if not call.is_backward:
        return [[Partial(), Shard(0), Shard(0)]] + [[result, x, dy] for x, dy, result in rows]

    # Backward: (grad_input_forward, grad_output_delta) from (grad, input_forward, output_delta).
    # grad_input_forward combines grad with output_delta, grad_output_delta grad with
    # input_forward, and both are linear in grad.
    backward_rows = [
        [Shard(0), Shard(0), Replicate(), Shard(0), Shard(0)],
        [Partial(), Partial(), Partial(), Replicate(), Replicate()],
    ]
    for x, dy, grad in rows:
        if isinstance(grad, Partial):
            # One data tensor is Partial: the output built from it is Partial, the other Replicate.
            backward_rows.append([dy, x, Replicate(), x, dy])
        elif isinstance(grad, Replicate):
            backward_rows.append([Replicate(), Replicate(), grad, x, dy])
        else:
            # Channel shards: a gradient keeps its tensor's shard, or sums over the other's.
            grad_x = x if isinstance(x, Shard) else Partial()
            grad_dy = dy if isinstance(dy, Shard) else Partial()
            backward_rows.append([grad_x, grad_dy, grad, x, dy])
    # An output that is not computed (output_mask) has no placement.
    mask = call.values["output_mask"]
    return [[p if mask[i] else None for i, p in enumerate(row[:2])] + row[2:] for row in backward_rows]


def _make_strategy(op_name: str):
    def strategy(op_schema: OpSchema):
        call = _Call(op_name, op_schema)
        mesh = op_schema.get_mesh_from_args()
        return expand_to_full_mesh_op_strategy(
            mesh, op_schema, _placements(call, mesh), input_index=2 if call.is_backward else 1
        )

    return strategy


def _sharded_on(spec, dim: int) -> bool:
    return any(isinstance(placement, Shard) and placement.dim == dim for placement in spec.placements)


def _local_size(spec, dim: int) -> int:
    """This rank's size of ``dim``; the offset (data-dependent under torch.compile) is skipped."""
    if _COMPUTES_OFFSET_OPTIONALLY:
        return compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements, skip_offset=True)[0][dim]
    return compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)[0][dim]


def _make_local_arguments(op_name: str):
    """Rewrites the global filter shape and groups into this rank's shard's."""

    def adjust(input_specs, op_schema: OpSchema) -> OpSchema:
        call = _Call(op_name, op_schema)
        if call.channel_axis is None or call.filter_axes is None:
            return op_schema  # the op rejects these formats itself
        global_channels = call.channels()
        local_channels = [
            _local_size(spec, call.channel_axis) if _sharded_on(spec, call.channel_axis) else whole
            for spec, whole in zip(input_specs[-2:], global_channels)
        ]
        groups = call.values["groups"]
        sharded = [local != whole for local, whole in zip(local_channels, global_channels)]
        if all(sharded):  # the groups-aligned placement: each shard holds whole groups
            groups = groups * local_channels[0] // global_channels[0]
        shape = list(call.values[call.shape_name])
        # The per-group entry is C/g for a convolution and OC/g for a ConvTranspose.
        per_group = 1 if call.is_transpose else 0
        for tensor, axis in enumerate(call.filter_axes):
            shape[axis] = local_channels[tensor] // (groups if tensor == per_group else 1)
        values = dict(call.values, **{call.shape_name: shape, "groups": groups})
        positional = len(op_schema.args_schema)
        args = tuple(values[name] for name in call.names[:positional])
        kwargs = {name: values[name] for name in op_schema.kwargs_schema}
        return OpSchema(op_schema.op, args, kwargs)

    return adjust


def _register():
    for name, op_name in _OPS.items():
        overload = getattr(_ops, name).default
        names = [argument.name for argument in overload._schema.arguments]
        first_attribute = 3 if names[0] == "grad" else 2
        # Every attribute, positional or keyword, decides the sharding (and the local arguments).
        schema_info = RuntimeSchemaInfo(first_attribute, names[first_attribute:])
        _propagator.register_op_strategy(overload, _make_strategy(op_name), schema_info)
        if _adjusts_arguments:
            _propagator.op_to_scalar_shape_adjuster[overload] = _make_local_arguments(op_name)


_register()
