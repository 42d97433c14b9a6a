"""torch_convgrad: convolution weight-gradient operators for PyTorch.

Ops (``torch.ops.torch_convgrad.*``): ``conv_backprop_filters``,
``conv_backprop_weights`` and ``conv_transpose_backprop_filters``, with CPU,
CUDA and Meta kernels, autograd (double backward), vmap and autocast rules.
The functions below are their Python API; ``torch_convgrad.algorithms`` tells
and forces which algorithm computes them; ``torch_convgrad.reference`` holds a
slow float64 reference written from the spec.
"""
import torch  # noqa: F401  (loads libtorch before our library)

from . import _C  # noqa: F401  (registers the torch_convgrad ops)
from . import _dtensor_hook  # noqa: F401  (DTensor sharding strategies)
from . import _registrations  # noqa: F401  (vmap rules)
from .algorithms import algorithm_names, last_algorithm, use_algorithm
from .functional import (
    conv_backprop_filters,
    conv_backprop_filters_v1,
    conv_backprop_weights,
    conv_transpose_backprop_filters,
)

__version__ = "0.1.0"

__all__ = [
    "conv_backprop_filters",
    "conv_backprop_weights",
    "conv_transpose_backprop_filters",
    "conv_backprop_filters_v1",
    "algorithm_names",
    "last_algorithm",
    "use_algorithm",
]
