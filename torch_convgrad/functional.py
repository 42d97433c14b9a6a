"""The Python API: argument normalisation and documentation.

Every function here only turns Python-friendly arguments into the op schema's
(an int becomes one value per spatial axis, a shape tensor becomes a list,
``None`` for auto_pad becomes ``"none"``) and calls the registered op. The
semantics and the validation of the op's arguments live in the C++ resolver
(``csrc/problem.cpp``), so ``torch.ops.torch_convgrad.*``, ``torch.compile`` and
``torch.export`` see the same op and raise the same errors; Python checks only
what the op never sees (a shape tensor's dtype and rank, the draft signature's
``filters_shape``).
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = [
    "conv_backprop_filters",
    "conv_backprop_weights",
    "conv_transpose_backprop_filters",
    "conv_backprop_filters_v1",
]

IntOrInts = Union[int, Sequence[int]]
Shape = Union[Tensor, Sequence[int]]

# The ops' overloads, called directly: the packet's __call__ adds a Python
# frame to every call.
_filters = torch.ops.torch_convgrad.conv_backprop_filters.default
_weights = torch.ops.torch_convgrad.conv_backprop_weights.default
_transpose_filters = torch.ops.torch_convgrad.conv_transpose_backprop_filters.default


def _spatial_rank(data: Tensor) -> int:
    # Negative for a tensor of bad rank, whose per-axis lists come out empty
    # ([v] * -1); the op rejects its rank first.
    return data.dim() - 2 if isinstance(data, Tensor) else 0


def _is_int_list(value) -> bool:
    # A loop, not all() over a generator: half the time on a filter shape.
    if type(value) is not list:
        return False
    for item in value:
        if type(item) is not int:
            return False
    return True


def _ints(value, name: str) -> list:
    if _is_int_list(value):
        return value
    try:
        return [operator.index(item) for item in value]
    except TypeError:
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {value!r}") from None


def _per_axis(value: Optional[IntOrInts], rank: int, name: str) -> Optional[list]:
    """An int means that value on every spatial axis; None means the default."""
    # The common forms first, checked by exact type: cheap per call, and
    # traced by every supported dynamo without an exception probe.
    if type(value) is int:
        return [value] * rank
    if value is None or _is_int_list(value):
        return value
    if not isinstance(value, (bool, list, tuple)):
        try:
            return [operator.index(value)] * rank  # SymInt, numpy integer, 0-d integer tensor
        except TypeError:
            pass
    return _ints(value, name)


def _shape(shape: Optional[Shape], name: str) -> list:
    """The spec's shape input: a 1-D integer tensor (s32 in the spec) or a sequence of ints."""
    if _is_int_list(shape):
        return shape
    if shape is None:
        raise ValueError(f"{name}: expected the filter shape (a 1-D integer tensor or a sequence of ints), got None")
    if isinstance(shape, Tensor):
        if shape.is_floating_point() or shape.is_complex() or shape.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor, got dtype {shape.dtype}")
        if shape.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got {shape.dim()}-D with shape {tuple(shape.shape)}")
        return shape.tolist()
    return _ints(shape, name)


def _string(value: Optional[str], name: str, default: str) -> str:
    if type(value) is str:
        return value
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {type(value).__name__} {value!r}")
    return value


def _conv_attributes(data, strides, pads_begin, pads_end, dilations, auto_pad) -> tuple:
    rank = _spatial_rank(data)
    return (
        _per_axis(strides, rank, "strides"),
        _per_axis(pads_begin, rank, "pads_begin"),
        _per_axis(pads_end, rank, "pads_end"),
        _per_axis(dilations, rank, "dilations"),
        _string(auto_pad, "auto_pad", "none"),
    )


def conv_backprop_filters(
    input_forward: Tensor,
    output_delta: Tensor,
    filter_shape: Shape,
    *,
    strides: IntOrInts = 1,
    pads_begin: Optional[IntOrInts] = None,
    pads_end: Optional[IntOrInts] = None,
    dilations: IntOrInts = 1,
    auto_pad: Optional[str] = None,
    groups: int = 1,
    data_format: str = "NXC",
    filter_format: str = "XIO",
) -> Tensor:
    """Gradient of a convolution with respect to its filters (ConvolutionBackpropFilters-1).

    Shapes (``r`` = 1, 2 or 3 spatial axes, ``g`` = groups):

    - ``input_forward``: the convolution's input, ``(N, X1..Xr, C)`` for
      ``data_format="NXC"`` or ``(N, C, X1..Xr)`` for ``"NCX"``.
    - ``output_delta``: the gradient of the convolution's output, ``(N, Y1..Yr, O)``
      or ``(N, O, Y1..Yr)``, with ``Y = floor((X + pb + pe - (K - 1) * d - 1) / s) + 1``.
    - ``filter_shape``: the full filter shape in ``filter_format``: ``(K1..Kr, C/g, O)``
      for ``"XIO"`` or ``(O, C/g, K1..Kr)`` for ``"OIX"``; a sequence of ints or a 1-D
      integer tensor.
    - returns: a new contiguous tensor of shape ``filter_shape``, with the dtype and
      device of the inputs (f32, f16, bf16 or f64; f16/bf16 accumulate in f32).

    ``strides``, ``dilations``, ``pads_begin`` and ``pads_end`` take an int (every axis)
    or ``r`` ints. ``auto_pad`` is ``None``/``"none"``/``"explicit"`` (use the pads),
    ``"valid"`` (no padding) or ``"same_upper"``/``"same_lower"`` (TensorFlow/JAX SAME;
    the odd pad goes to the end/beginning); with the last three the pads are ignored.
    Strings are case-insensitive. Bad input raises ``ValueError``/``TypeError`` naming
    the argument.

    Example::

        >>> x = torch.randn(8, 32, 32, 16)            # NXC input, C = 16
        >>> dy = torch.randn(8, 16, 16, 64)           # stride 2, same_upper -> 16x16, O = 64
        >>> dw = conv_backprop_filters(x, dy, [3, 3, 16, 64], strides=2, auto_pad="same_upper")
        >>> dw.shape                                  # XIO
        torch.Size([3, 3, 16, 64])
    """
    return _filters(
        input_forward,
        output_delta,
        _shape(filter_shape, "filter_shape"),
        *_conv_attributes(input_forward, strides, pads_begin, pads_end, dilations, auto_pad),
        groups,
        _string(data_format, "data_format", "NXC"),
        _string(filter_format, "filter_format", "XIO"),
    )


def conv_backprop_weights(
    src: Tensor,
    diff_dst: Tensor,
    weights_shape: Shape,
    *,
    strides: IntOrInts = 1,
    pads_begin: Optional[IntOrInts] = None,
    pads_end: Optional[IntOrInts] = None,
    dilations: IntOrInts = 1,
    auto_pad: Optional[str] = None,
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XIO",
) -> Tensor:
    """Gradient of a convolution with respect to its weights (ConvolutionBackpropWeights-1).

    The same operation as :func:`conv_backprop_filters` under the oneDNN names:
    ``src`` is the convolution input ``(N, X1..Xr, C)`` / ``(N, C, X1..Xr)``,
    ``diff_dst`` the output gradient ``(N, Y1..Yr, O)`` / ``(N, O, Y1..Yr)``, and
    ``weights_shape`` the full weights shape in ``weights_format`` (``"XIO"``:
    ``(K1..Kr, C/g, O)``, ``"OIX"``: ``(O, C/g, K1..Kr)``). Returns a new contiguous
    tensor of shape ``weights_shape``.

    Example::

        >>> src = torch.randn(2, 3, 10, 10)           # NCX
        >>> diff_dst = torch.randn(2, 6, 8, 8)
        >>> conv_backprop_weights(src, diff_dst, (6, 3, 3, 3), data_format="NCX",
        ...                       weights_format="OIX").shape
        torch.Size([6, 3, 3, 3])
    """
    return _weights(
        src,
        diff_dst,
        _shape(weights_shape, "weights_shape"),
        *_conv_attributes(src, strides, pads_begin, pads_end, dilations, auto_pad),
        groups,
        _string(data_format, "data_format", "NXC"),
        _string(weights_format, "weights_format", "XIO"),
    )


def conv_transpose_backprop_filters(
    input_forward: Tensor,
    output_delta: Tensor,
    filter_shape: Shape,
    *,
    strides: IntOrInts = 1,
    pads_begin: Optional[IntOrInts] = None,
    pads_end: Optional[IntOrInts] = None,
    dilations: IntOrInts = 1,
    auto_pad: Optional[str] = None,
    output_padding: Optional[IntOrInts] = None,
    groups: int = 1,
    data_format: str = "NXC",
    filter_format: str = "XIO",
) -> Tensor:
    """Gradient of a transposed convolution with respect to its filters (ConvTransposeBackpropFilters-1).

    Shapes (``IC``/``OC`` = channels of the ConvTranspose input/output):

    - ``input_forward``: the ConvTranspose input, ``(N, I1..Ir, IC)`` (NXC) or ``(N, IC, I1..Ir)`` (NCX).
    - ``output_delta``: the gradient of its output, ``(N, O1..Or, OC)`` or ``(N, OC, O1..Or)``,
      with ``I = floor((O + pb + pe - (K - 1) * d - 1) / s) + 1``.
    - ``filter_shape`` in ``filter_format``: ``"XIO"`` ``(K1..Kr, IC, OC/g)`` (default),
      ``"OIX"`` ``(OC/g, IC, K1..Kr)``, ``"IOX"`` ``(IC, OC/g, K1..Kr)`` (= PyTorch's
      ``ConvTransposeNd.weight``) or ``"XOI"`` ``(K1..Kr, OC/g, IC)`` (= TensorFlow's
      ``conv2d_transpose`` filter).
    - returns: a new contiguous tensor of shape ``filter_shape``.

    ``auto_pad="same_*"`` computes the pads on the output_delta spatial size.
    ``output_padding`` (int or ``r`` ints, ``0 <= op < max(s, d)``) never changes the
    result; when given it is checked: ``O == s * (I - 1) + (K - 1) * d + 1 - pb - pe + op``.

    Example::

        >>> x = torch.randn(4, 8, 8, 32)              # NXC ConvTranspose input, IC = 32
        >>> dy = torch.randn(4, 16, 16, 16)           # its output gradient, OC = 16
        >>> conv_transpose_backprop_filters(x, dy, [4, 4, 32, 16], strides=2,
        ...                                 pads_begin=1, pads_end=1).shape
        torch.Size([4, 4, 32, 16])
    """
    return _transpose_filters(
        input_forward,
        output_delta,
        _shape(filter_shape, "filter_shape"),
        *_conv_attributes(input_forward, strides, pads_begin, pads_end, dilations, auto_pad),
        _per_axis(output_padding, _spatial_rank(input_forward), "output_padding"),
        groups,
        _string(data_format, "data_format", "NXC"),
        _string(filter_format, "filter_format", "XIO"),
    )


def conv_backprop_filters_v1(
    input: Tensor,
    filters_shape: Shape,
    output_delta: Tensor,
    *,
    strides: IntOrInts = 1,
    pads_begin: Optional[IntOrInts] = None,
    pads_end: Optional[IntOrInts] = None,
    dilations: IntOrInts = 1,
    auto_pad: Optional[str] = None,
    groups: int = 1,
) -> Tensor:
    """The draft ConvolutionBackpropFilters-1 signature: ``(input, filters_shape, output_delta)``.

    Data is NCX: ``input`` ``(N, C, X1..Xr)``, ``output_delta`` ``(N, O, Y1..Yr)``.
    ``filters_shape`` holds the spatial kernel sizes only, ``(K1..Kr)``. Returns the OIX
    filter gradient ``(O, C/g, K1..Kr)``. Same padding rules as :func:`conv_backprop_filters`,
    onto which it maps.

    Example::

        >>> x = torch.randn(2, 4, 9)
        >>> dy = torch.randn(2, 6, 7)
        >>> conv_backprop_filters_v1(x, [3], dy).shape
        torch.Size([6, 4, 3])
    """
    kernel = _shape(filters_shape, "filters_shape")
    shape = kernel
    # The channel entries are only knowable for data the op will accept; for
    # anything else the op rejects the data or groups before reading the shape.
    rank = _spatial_rank(input)
    data_ok = isinstance(output_delta, Tensor) and 1 <= rank <= 3 and output_delta.dim() == input.dim()
    if data_ok and isinstance(groups, int) and groups >= 1:
        if len(kernel) != rank or any(size < 1 for size in kernel):
            raise ValueError(
                f"filters_shape: expected {rank} positive spatial kernel sizes (one per spatial axis of input), "
                f"got {kernel}"
            )
        shape = [output_delta.shape[1], input.shape[1] // groups, *kernel]
    try:
        return conv_backprop_filters(
            input,
            output_delta,
            shape,
            strides=strides,
            pads_begin=pads_begin,
            pads_end=pads_end,
            dilations=dilations,
            auto_pad=auto_pad,
            groups=groups,
            data_format="NCX",
            filter_format="OIX",
        )
    except (TypeError, ValueError) as error:
        # The op knows this signature's `input` as input_forward.
        raise type(error)(str(error).replace("input_forward", "input")) from None
