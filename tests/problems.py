"""A weight-gradient problem builder shared by the integration tests.

`Problem` derives consistent data sizes from SPEC section 3 (pads, strides,
dilations) and produces the op-level arguments of each op.
"""
from dataclasses import dataclass

import torch

OPS = torch.ops.torch_convgrad
OP_NAMES = {
    "filters": "conv_backprop_filters",
    "weights": "conv_backprop_weights",
    "transpose": "conv_transpose_backprop_filters",
}
FORMATS = {"filters": ("XIO", "OIX"), "weights": ("XIO", "OIX"), "transpose": ("XIO", "OIX", "IOX", "XOI")}
FORMAT_KW = {"filters": "filter_format", "weights": "weights_format", "transpose": "filter_format"}


def op_packet(op):
    return getattr(OPS, OP_NAMES[op])


def same_pads(size, k, s, d, lower):
    eff = (k - 1) * d + 1
    total = max(0, (-(-size // s) - 1) * s + eff - size)
    small, big = total // 2, total - total // 2
    return (big, small) if lower else (small, big)


def filter_shape(op, fmt, c, o, g, ks):
    """Conv: c = input_forward channels, o = output_delta channels.  ConvTranspose: c = IC, o = OC."""
    ks = list(ks)
    if op != "transpose":
        return {"OIX": [o, c // g] + ks, "XIO": ks + [c // g, o]}[fmt]
    return {"OIX": [o // g, c] + ks, "XIO": ks + [c, o // g], "IOX": [c, o // g] + ks, "XOI": ks + [o // g, c]}[fmt]


def data_tensor(n, ch, spatial, data_format, dtype, gen):
    shape = [n, ch, *spatial] if data_format == "NCX" else [n, *spatial, ch]
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


@dataclass(frozen=True)
class Problem:
    """One weight-gradient problem.  ``size``: the spatial size of the convolution input
    (input_forward for the convolutions, output_delta for ConvTranspose); ``pads`` is
    ``(pads_begin, pads_end)`` or an auto_pad mode name."""

    op: str
    size: tuple
    n: int = 2
    c: int = 2
    o: int = 2
    g: int = 1
    k: tuple = None
    s: tuple = None
    d: tuple = None
    pads: object = "none"
    data_format: str = "NCX"
    fmt: str = "XIO"
    output_padding: bool = False

    @property
    def r(self):
        return len(self.size)

    def _axis(self, value, default):
        return tuple(value) if value is not None else (default,) * self.r

    def resolve(self):
        """(pads_begin, pads_end, auto_pad, small spatial size) of the problem."""
        k, s, d = self._axis(self.k, 2), self._axis(self.s, 1), self._axis(self.d, 1)
        if isinstance(self.pads, str):
            auto_pad = self.pads
            if auto_pad in ("same_upper", "same_lower"):
                pairs = [same_pads(x, *a, auto_pad == "same_lower") for x, *a in zip(self.size, k, s, d)]
                pb, pe = [p[0] for p in pairs], [p[1] for p in pairs]
            else:
                pb, pe = [0] * self.r, [0] * self.r
        else:
            auto_pad = "none"
            pb, pe = list(self.pads[0]), list(self.pads[1])
        small = [(x + b + e - ((kk - 1) * dd + 1)) // ss + 1
                 for x, b, e, kk, ss, dd in zip(self.size, pb, pe, k, s, d)]
        assert all(v >= 1 for v in small), self
        return pb, pe, auto_pad, small

    def shape(self):
        return filter_shape(self.op, self.fmt, self.c, self.o, self.g, self._axis(self.k, 2))

    def kwargs(self, explicit_pads_with_auto=False):
        """The op-level keyword arguments (every list has exactly r entries)."""
        pb, pe, auto_pad, small = self.resolve()
        kw = {
            "strides": list(self._axis(self.s, 1)),
            "pads_begin": None if (auto_pad != "none" and not explicit_pads_with_auto) else pb,
            "pads_end": None if (auto_pad != "none" and not explicit_pads_with_auto) else pe,
            "dilations": list(self._axis(self.d, 1)),
            "auto_pad": auto_pad,
            "groups": self.g,
            "data_format": self.data_format,
            FORMAT_KW[self.op]: self.fmt,
        }
        if self.op == "transpose":
            op_pad = None
            if self.output_padding:
                k, s, d = self._axis(self.k, 2), self._axis(self.s, 1), self._axis(self.d, 1)
                op_pad = [x - (ss * (i - 1) + (kk - 1) * dd + 1 - b - e)
                          for x, i, kk, ss, dd, b, e in zip(self.size, small, k, s, d, pb, pe)]
                assert all(0 <= v < max(ss, dd) for v, ss, dd in zip(op_pad, s, d)), (self, op_pad)
            kw["output_padding"] = op_pad
        return kw

    def tensors(self, dtype=torch.float64, seed=0, requires_grad=False, n=None, device="cpu"):
        """(input_forward, output_delta) with random normal values (drawn on the CPU, so the
        same on every device) on ``device``."""
        n = self.n if n is None else n
        _, _, _, small = self.resolve()
        gen = torch.Generator().manual_seed(seed)
        if self.op == "transpose":
            x = data_tensor(n, self.c, small, self.data_format, dtype, gen)
            dy = data_tensor(n, self.o, self.size, self.data_format, dtype, gen)
        else:
            x = data_tensor(n, self.c, self.size, self.data_format, dtype, gen)
            dy = data_tensor(n, self.o, small, self.data_format, dtype, gen)
        return x.to(device).requires_grad_(requires_grad), dy.to(device).requires_grad_(requires_grad)

    def args(self, **tensor_kw):
        x, dy = self.tensors(**tensor_kw)
        return (x, dy, self.shape()), self.kwargs()

    def id(self):
        pads = self.pads if isinstance(self.pads, str) else (
            f"pb{''.join(map(str, self.pads[0]))}-pe{''.join(map(str, self.pads[1]))}")
        return (f"{self.op}-{self.r}d-{pads}-g{self.g}-{self.data_format}-{self.fmt}"
                f"-s{''.join(map(str, self._axis(self.s, 1)))}-d{''.join(map(str, self._axis(self.d, 1)))}")
