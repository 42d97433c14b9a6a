"""Where each data tensor's channels stand in each op's filter formats.

Used by the vmap rules (which fold a batch into the grouped channels) and the
DTensor sharding strategies (which shard the filter along a channel axis).
"""

# Per op and filter format: the filter axis holding input_forward's channels
# and the one holding output_delta's channels. Negative axes count from the
# end, so one entry serves 1-D, 2-D and 3-D filters.
CHANNEL_AXES = {
    # Convolution: C/g and O.
    "conv_backprop_filters": {"XIO": (-2, -1), "OIX": (1, 0)},
    "conv_backprop_weights": {"XIO": (-2, -1), "OIX": (1, 0)},
    # ConvTranspose: IC and OC/g.
    "conv_transpose_backprop_filters": {"XIO": (-2, -1), "OIX": (1, 0), "IOX": (0, 1), "XOI": (-1, -2)},
}

# The backward ops, each with the op whose filter formats it takes.
BACKWARD_OPS = {
    "conv_backprop_filters_backward": "conv_backprop_filters",
    "conv_transpose_backprop_filters_backward": "conv_transpose_backprop_filters",
}

# Which data tensor's channels the filter spans whole, across all groups
# (0: input_forward, 1: output_delta): convolution filters hold all O output
# channels, ConvTranspose filters all IC input channels.
GROUP_SPANNING_TENSOR = {
    "conv_backprop_filters": 1,
    "conv_backprop_weights": 1,
    "conv_transpose_backprop_filters": 0,
}


def group_spanning_axis(op_name: str, filter_format: str):
    """The filter axis that spans all groups, or None for an unknown format."""
    axes = CHANNEL_AXES[op_name].get(filter_format)
    return None if axes is None else axes[GROUP_SPANNING_TENSOR[op_name]]
