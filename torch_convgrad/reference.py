"""Slow, obviously-correct float64 reference for the ``torch_convgrad`` ops.

Written only from ``SPEC.md`` sections 2-4 (layouts, padding, math).  It uses
nothing but plain torch indexing, slicing and ``einsum`` in a Python loop over
kernel offsets: no ``torch.nn.functional`` convolution, no
``aten.convolution_backward`` and no ``torch_convgrad`` op, so it can serve as
an independent oracle for the extension.

Every function computes in float64 (whatever the input dtype) and returns a new
contiguous float64 tensor laid out in the requested filter format.  Input is
assumed valid: there are no friendly error messages here.

The one computational kernel is :func:`_wgrad_ncx`, the SPEC section 4 formula

    dW[o, c, k] = sum_n sum_j  x[n, (o // Og)*Cg + c, j*s - pb + k*d] * dy[n, o, j]

(NCX data, OIX result, zero outside the input).  ConvTranspose is the same
formula with the two data tensors swapped, which yields an IOX result.
"""

import itertools
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "same_pads",
    "conv_backprop_filters",
    "conv_backprop_weights",
    "conv_transpose_backprop_filters",
    "conv_backprop_filters_v1",
]

IntOrInts = Union[int, Sequence[int], torch.Tensor]


# ---------------------------------------------------------------------------
# argument helpers
# ---------------------------------------------------------------------------

def _ints(value: Optional[IntOrInts], r: int, default: int) -> List[int]:
    """An int (same for every axis), a sequence of r ints, or None -> list of r ints."""
    if value is None:
        value = default
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, int):
        return [int(value)] * r
    return [int(v) for v in value]


def _shape_list(shape: IntOrInts) -> List[int]:
    """A sequence of ints or a 1-D integer tensor -> list of ints."""
    if isinstance(shape, torch.Tensor):
        return [int(v) for v in shape.reshape(-1).tolist()]
    return [int(v) for v in shape]


def _mode(auto_pad: Optional[str]) -> str:
    return "none" if auto_pad is None else str(auto_pad).lower()


def _to_ncx(t: torch.Tensor, data_format: str) -> torch.Tensor:
    """float64 copy of a data tensor in NCX order."""
    t = t.detach().to(torch.float64)
    if str(data_format).upper() == "NXC":
        t = t.movedim(-1, 1)
    return t


def same_pads(size: int, kernel: int, stride: int = 1, dilation: int = 1,
              lower: bool = False) -> Tuple[int, int]:
    """Padding ``(pb, pe)`` of one axis for ``auto_pad`` same_upper / same_lower (SPEC section 3).

    ``eff_k = (kernel - 1) * dilation + 1`` and
    ``total = max(0, (ceil(size / stride) - 1) * stride + eff_k - size)``.
    same_upper (``lower=False``): ``pb = floor(total / 2)``, ``pe = total - pb``;
    same_lower (``lower=True``): ``pe = floor(total / 2)``, ``pb = total - pe``.
    ``size`` is the input_forward spatial size for the convolutions and the
    output_delta spatial size for ConvTranspose.
    """
    eff_k = (kernel - 1) * dilation + 1
    out = -(-size // stride)  # ceil(size / stride), exact for ints
    total = max(0, (out - 1) * stride + eff_k - size)
    if lower:
        pe = total // 2
        pb = total - pe
    else:
        pb = total // 2
        pe = total - pb
    return pb, pe


def _resolve_pads(auto_pad, sizes, ks, s, d, pads_begin, pads_end):
    """Per-axis (pads_begin, pads_end) after applying ``auto_pad`` (SPEC section 3)."""
    r = len(sizes)
    mode = _mode(auto_pad)
    if mode in ("none", "explicit"):
        return _ints(pads_begin, r, 0), _ints(pads_end, r, 0)
    if mode == "valid":
        return [0] * r, [0] * r
    if mode in ("same_upper", "same_lower"):
        pairs = [same_pads(int(sizes[a]), ks[a], s[a], d[a], lower=(mode == "same_lower"))
                 for a in range(r)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    raise ValueError(f"reference: unknown auto_pad {auto_pad!r}")


# ---------------------------------------------------------------------------
# the kernel: SPEC section 4, convolution, NCX data, OIX result
# ---------------------------------------------------------------------------

def _wgrad_ncx(x: torch.Tensor, dy: torch.Tensor, ks: Sequence[int], s: Sequence[int],
               d: Sequence[int], pb: Sequence[int], pe: Sequence[int], g: int) -> torch.Tensor:
    """Convolution weight gradient, OIX ``(O, C/g, *ks)``, from float64 NCX ``x`` and ``dy``.

    ``dW[o, c, k] = sum_n sum_j x[n, (o // Og)*Cg + c, j*s - pb + k*d] * dy[n, o, j]``
    with ``x`` read as zero outside its extent.
    """
    n, c = x.shape[0], x.shape[1]
    o = dy.shape[1]
    r = x.dim() - 2
    xs = list(x.shape[2:])
    ys = list(dy.shape[2:])
    cg, og = c // g, o // g

    # Zero-padded copy of x: padded index p holds x[p - pb].  Long enough for every
    # window position the formula touches (so nothing is read out of range).
    psz = [max(xs[a] + pb[a] + pe[a], (ys[a] - 1) * s[a] + (ks[a] - 1) * d[a] + 1, 1)
           for a in range(r)]
    xp = torch.zeros([n, c] + psz, dtype=torch.float64, device=x.device)
    xp[(slice(None), slice(None)) + tuple(slice(pb[a], pb[a] + xs[a]) for a in range(r))] = x
    xp = xp.reshape([n, g, cg] + psz)
    ny = math.prod(ys)
    dyg = dy.reshape(n, g, og, ny)  # (N, g, Og, prod(Y))

    dw = torch.zeros([g, og, cg] + list(ks), dtype=torch.float64, device=x.device)
    for kk in itertools.product(*[range(k) for k in ks]):
        # x positions j*s - pb + k*d for j = 0..Y-1  ->  padded positions k*d + j*s
        window = tuple(slice(kk[a] * d[a], kk[a] * d[a] + (ys[a] - 1) * s[a] + 1, s[a])
                       for a in range(r))
        xw = xp[(slice(None),) * 3 + window].reshape(n, g, cg, ny)  # (N, g, Cg, prod(Y))
        dw[(slice(None),) * 3 + tuple(kk)] = torch.einsum("ngcj,ngoj->goc", xw, dyg)
    return dw.reshape([o, cg] + list(ks))


def _conv(x, dy, filter_shape, strides, pads_begin, pads_end, dilations, auto_pad, groups,
          data_format, fmt):
    x = _to_ncx(x, data_format)
    dy = _to_ncx(dy, data_format)
    r = x.dim() - 2
    fmt = str(fmt).upper()
    shape = _shape_list(filter_shape)
    if fmt == "OIX":
        ks = shape[2:]
    elif fmt == "XIO":
        ks = shape[:r]
    else:
        raise ValueError(f"reference: unknown convolution filter format {fmt!r}")
    s = _ints(strides, r, 1)
    d = _ints(dilations, r, 1)
    pb, pe = _resolve_pads(auto_pad, x.shape[2:], ks, s, d, pads_begin, pads_end)
    dw = _wgrad_ncx(x, dy, ks, s, d, pb, pe, int(groups))  # OIX
    if fmt == "XIO":
        dw = dw.permute(*range(2, 2 + r), 1, 0)
    dw = dw.contiguous()
    assert list(dw.shape) == shape, (list(dw.shape), shape)
    return dw


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------

def conv_backprop_filters(input_forward: torch.Tensor, output_delta: torch.Tensor,
                          filter_shape: IntOrInts, *, strides: IntOrInts = 1,
                          pads_begin: Optional[IntOrInts] = 0, pads_end: Optional[IntOrInts] = 0,
                          dilations: IntOrInts = 1, auto_pad: Optional[str] = None,
                          groups: int = 1, data_format: str = "NXC",
                          filter_format: str = "XIO") -> torch.Tensor:
    """Reference ConvolutionBackpropFilters: gradient of a convolution w.r.t. its filter.

    ``input_forward`` is the convolution input ``(N, C, X...)`` / ``(N, X..., C)``,
    ``output_delta`` the gradient of its output ``(N, O, Y...)`` / ``(N, Y..., O)``
    (``data_format`` NCX / NXC).  ``filter_shape`` (list or 1-D int tensor) is the full
    filter shape: OIX ``(O, C/g, K...)`` or XIO ``(K..., C/g, O)``.  Returns float64.
    """
    return _conv(input_forward, output_delta, filter_shape, strides, pads_begin, pads_end,
                 dilations, auto_pad, groups, data_format, filter_format)


def conv_backprop_weights(src: torch.Tensor, diff_dst: torch.Tensor, weights_shape: IntOrInts,
                          *, strides: IntOrInts = 1, pads_begin: Optional[IntOrInts] = 0,
                          pads_end: Optional[IntOrInts] = 0, dilations: IntOrInts = 1,
                          auto_pad: Optional[str] = None, groups: int = 1,
                          data_format: str = "NXC", weights_format: str = "XIO") -> torch.Tensor:
    """Reference ConvolutionBackpropWeights: same semantics as :func:`conv_backprop_filters`
    (``src`` = input_forward, ``diff_dst`` = output_delta, ``weights_format`` = filter_format)."""
    return _conv(src, diff_dst, weights_shape, strides, pads_begin, pads_end, dilations,
                 auto_pad, groups, data_format, weights_format)


def conv_transpose_backprop_filters(input_forward: torch.Tensor, output_delta: torch.Tensor,
                                    filter_shape: IntOrInts, *, strides: IntOrInts = 1,
                                    pads_begin: Optional[IntOrInts] = 0,
                                    pads_end: Optional[IntOrInts] = 0,
                                    dilations: IntOrInts = 1, auto_pad: Optional[str] = None,
                                    output_padding: Optional[IntOrInts] = None, groups: int = 1,
                                    data_format: str = "NXC",
                                    filter_format: str = "XIO") -> torch.Tensor:
    """Reference ConvTransposeBackpropFilters: gradient of a ConvTranspose w.r.t. its filter.

    ``input_forward`` is the ConvTranspose input (``IC`` channels, spatial ``I``),
    ``output_delta`` the gradient of its output (``OC`` channels, spatial ``O``).
    ``filter_format``: OIX ``(OC/g, IC, K...)``, XIO ``(K..., IC, OC/g)``,
    IOX ``(IC, OC/g, K...)``, XOI ``(K..., OC/g, IC)``.  same_* pads are computed on the
    output_delta spatial size.  ``output_padding`` never changes the result and is ignored.

    Math (SPEC section 4): the convolution weight gradient with the data tensors swapped,
    ``dW[ic, oc, k] = sum_n sum_i x[n, ic, i] * dy[n, (ic // ICg)*OCg + oc, i*s - pb + k*d]``.
    """
    del output_padding  # only a shape check; never changes the result
    x = _to_ncx(input_forward, data_format)
    dy = _to_ncx(output_delta, data_format)
    r = x.dim() - 2
    fmt = str(filter_format).upper()
    shape = _shape_list(filter_shape)
    if fmt in ("OIX", "IOX"):
        ks = shape[2:]
    elif fmt in ("XIO", "XOI"):
        ks = shape[:r]
    else:
        raise ValueError(f"reference: unknown ConvTranspose filter format {fmt!r}")
    s = _ints(strides, r, 1)
    d = _ints(dilations, r, 1)
    pb, pe = _resolve_pads(auto_pad, dy.shape[2:], ks, s, d, pads_begin, pads_end)
    # conv input := output_delta, conv output_delta := input_forward  ->  IOX (IC, OC/g, K...)
    dw = _wgrad_ncx(dy, x, ks, s, d, pb, pe, int(groups))
    sp = tuple(range(2, 2 + r))
    perm = {"IOX": (0, 1) + sp, "OIX": (1, 0) + sp, "XIO": sp + (0, 1), "XOI": sp + (1, 0)}[fmt]
    dw = dw.permute(*perm).contiguous()
    assert list(dw.shape) == shape, (list(dw.shape), shape)
    return dw


def conv_backprop_filters_v1(input: torch.Tensor, filters_shape: IntOrInts,
                             output_delta: torch.Tensor, *, strides: IntOrInts = 1,
                             pads_begin: Optional[IntOrInts] = 0,
                             pads_end: Optional[IntOrInts] = 0, dilations: IntOrInts = 1,
                             auto_pad: Optional[str] = None, groups: int = 1) -> torch.Tensor:
    """Reference draft ConvolutionBackpropFilters-1 (SPEC section 5).

    Inputs in the order ``(input, filters_shape, output_delta)``; data is NCX and
    ``filters_shape`` holds the spatial kernel sizes only.  Returns OIX
    ``(O, C/g, *filters_shape)`` in float64.
    """
    ks = _shape_list(filters_shape)
    c, o = int(input.shape[1]), int(output_delta.shape[1])
    full = [o, c // int(groups)] + ks
    return _conv(input, output_delta, full, strides, pads_begin, pads_end, dilations, auto_pad,
                 groups, "NCX", "OIX")

