"""Checks of the float64 reference itself (torch_convgrad/reference.py) against SPEC.md.

Runs without the C++ extension: the reference is loaded by file path (see conftest.py).
"""

import itertools

import pytest
import torch

from conftest import REF, rand


def t(values):
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------------------
# SPEC section 3: same_upper / same_lower examples
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "size,kernel,stride,dilation,upper,lower",
    [
        (5, 3, 2, 1, (1, 1), (1, 1)),
        (6, 3, 2, 1, (0, 1), (1, 0)),
        (7, 3, 1, 2, (2, 2), (2, 2)),
        (4, 1, 2, 1, (0, 0), (0, 0)),
    ],
)
def test_same_pads_spec_examples(size, kernel, stride, dilation, upper, lower):
    assert REF.same_pads(size, kernel, stride, dilation, False) == upper
    assert REF.same_pads(size, kernel, stride, dilation, True) == lower


def test_same_pads_output_size_is_ceil():
    # With same_* padding the convolution output size is ceil(X / s) (TensorFlow SAME).
    for size, kernel, stride, dilation in itertools.product(range(1, 12), range(1, 5),
                                                            range(1, 4), range(1, 4)):
        for lower in (False, True):
            pb, pe = REF.same_pads(size, kernel, stride, dilation, lower)
            assert pb >= 0 and pe >= 0 and abs(pb - pe) <= 1
            assert (pb <= pe) if not lower else (pb >= pe)
            eff = (kernel - 1) * dilation + 1
            out = (size + pb + pe - eff) // stride + 1
            assert out == -(-size // stride)


# ---------------------------------------------------------------------------
# SPEC section 4: the hand vectors
# ---------------------------------------------------------------------------

def test_hand_conv_1d():
    x = t([[[1, 2, 3, 4, 5]]])
    dy = t([[[1, 1]]])
    dw = REF.conv_backprop_filters(x, dy, [1, 1, 2], strides=2, data_format="NCX",
                                   filter_format="OIX")
    assert dw.dtype == torch.float64
    assert dw.tolist() == [[[4.0, 6.0]]]
    # XIO and NXC give the same numbers, laid out differently
    dw2 = REF.conv_backprop_filters(x.transpose(1, 2), dy.transpose(1, 2), [2, 1, 1], strides=[2])
    assert dw2.tolist() == [[[4.0]], [[6.0]]]


def test_hand_conv_1d_groups():
    x = t([[[1, 2, 3, 4], [5, 6, 7, 8]]])
    dy = t([[[1, 0, 0, 1], [0, 1, 1, 0]]])
    dw = REF.conv_backprop_filters(x, dy, [2, 1, 2], strides=1, pads_begin=1, pads_end=0,
                                   groups=2, data_format="NCX", filter_format="OIX")
    assert dw.tolist() == [[[3.0, 5.0]], [[11.0, 13.0]]]
    dw_w = REF.conv_backprop_weights(x, dy, torch.tensor([2, 1, 2], dtype=torch.int32),
                                     pads_begin=[1], pads_end=[0], groups=2, data_format="ncx",
                                     weights_format="oix")
    assert dw_w.tolist() == dw.tolist()


def test_hand_convT_1d():
    x = t([[[1, 2]]])
    dy = t([[[1, 0, 0, 0, 1]]])
    dw = REF.conv_transpose_backprop_filters(x, dy, [1, 1, 3], strides=2, data_format="NCX",
                                             filter_format="IOX")
    assert dw.tolist() == [[[1.0, 0.0, 2.0]]]


def test_hand_convT_1d_groups():
    x = t([[[1, 2], [3, 4]]])
    dy = t([[[1, 2, 3, 4], [5, 6, 7, 8]]])
    kw = dict(strides=2, pads_begin=0, pads_end=1, output_padding=1, groups=2, data_format="NCX")
    dw = REF.conv_transpose_backprop_filters(x, dy, [2, 1, 2], filter_format="IOX", **kw)
    assert dw.tolist() == [[[7.0, 10.0]], [[43.0, 50.0]]]
    # the other three ConvTranspose formats are permutations of IOX
    iox = torch.tensor([[[7.0, 10.0]], [[43.0, 50.0]]], dtype=torch.float64)
    assert torch.equal(REF.conv_transpose_backprop_filters(x, dy, [1, 2, 2], filter_format="OIX",
                                                           **kw), iox.permute(1, 0, 2))
    assert torch.equal(REF.conv_transpose_backprop_filters(x, dy, [2, 2, 1], filter_format="XIO",
                                                           **kw), iox.permute(2, 0, 1))
    assert torch.equal(REF.conv_transpose_backprop_filters(x, dy, [2, 1, 2], filter_format="XOI",
                                                           **kw), iox.permute(2, 1, 0))


def test_v1_hand():
    x = t([[[1, 2, 3, 4], [5, 6, 7, 8]]])
    dy = t([[[1, 0, 0, 1], [0, 1, 1, 0]]])
    dw = REF.conv_backprop_filters_v1(x, [2], dy, pads_begin=1, pads_end=0, groups=2)
    assert dw.tolist() == [[[3.0, 5.0]], [[11.0, 13.0]]]


# ---------------------------------------------------------------------------
# brute force: pure-Python scalar loops over the SPEC section 4 formulas
# ---------------------------------------------------------------------------

def _brute_conv_oix(x, dy, ks, s, d, pb, g):
    """dW[o, c, k] = sum_n sum_j x[n, (o//Og)*Cg + c, j*s - pb + k*d] * dy[n, o, j] (2-D, NCX)."""
    n_, c_, h_, w_ = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    o_, yh, yw = len(dy[0]), len(dy[0][0]), len(dy[0][0][0])
    cg, og = c_ // g, o_ // g
    out = [[[[0.0] * ks[1] for _ in range(ks[0])] for _ in range(cg)] for _ in range(o_)]
    for o in range(o_):
        for c in range(cg):
            for k0 in range(ks[0]):
                for k1 in range(ks[1]):
                    acc = 0.0
                    for n in range(n_):
                        for j0 in range(yh):
                            for j1 in range(yw):
                                p0 = j0 * s[0] - pb[0] + k0 * d[0]
                                p1 = j1 * s[1] - pb[1] + k1 * d[1]
                                if 0 <= p0 < h_ and 0 <= p1 < w_:
                                    acc += x[n][(o // og) * cg + c][p0][p1] * dy[n][o][j0][j1]
                    out[o][c][k0][k1] = acc
    return out


def _brute_convT_iox(x, dy, ks, s, d, pb, g):
    """dW[ic, oc, k] = sum_n sum_i x[n, ic, i] * dy[n, (ic//ICg)*OCg + oc, i*s - pb + k*d]."""
    n_, ic_, ih, iw = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    oc_, oh, ow = len(dy[0]), len(dy[0][0]), len(dy[0][0][0])
    icg, ocg = ic_ // g, oc_ // g
    out = [[[[0.0] * ks[1] for _ in range(ks[0])] for _ in range(ocg)] for _ in range(ic_)]
    for ic in range(ic_):
        for oc in range(ocg):
            for k0 in range(ks[0]):
                for k1 in range(ks[1]):
                    acc = 0.0
                    for n in range(n_):
                        for i0 in range(ih):
                            for i1 in range(iw):
                                p0 = i0 * s[0] - pb[0] + k0 * d[0]
                                p1 = i1 * s[1] - pb[1] + k1 * d[1]
                                if 0 <= p0 < oh and 0 <= p1 < ow:
                                    acc += (x[n][ic][i0][i1]
                                            * dy[n][(ic // icg) * ocg + oc][p0][p1])
                    out[ic][oc][k0][k1] = acc
    return out


def _out_size(size, k, s, d, pb, pe):
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def test_brute_force_conv_2d_grouped_strided_dilated_asym_pads():
    n, c, o, g = 2, 4, 6, 2
    ks, s, d, pb, pe = [3, 2], [2, 3], [2, 1], [1, 0], [3, 2]
    hw = [9, 8]
    ys = [_out_size(hw[a], ks[a], s[a], d[a], pb[a], pe[a]) for a in range(2)]
    assert ys == [5, 3]
    x = rand([n, c] + hw, torch.float64, seed=1)
    dy = rand([n, o] + ys, torch.float64, seed=2)
    want = torch.tensor(_brute_conv_oix(x.tolist(), dy.tolist(), ks, s, d, pb, g),
                        dtype=torch.float64)
    got = REF.conv_backprop_filters(x, dy, [o, c // g] + ks, strides=s, dilations=d,
                                    pads_begin=pb, pads_end=pe, groups=g, data_format="NCX",
                                    filter_format="OIX")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # NXC data / XIO result: same numbers
    got2 = REF.conv_backprop_filters(x.movedim(1, -1), dy.movedim(1, -1), ks + [c // g, o],
                                     strides=s, dilations=d, pads_begin=pb, pads_end=pe,
                                     groups=g)
    torch.testing.assert_close(got2, want.permute(2, 3, 1, 0), rtol=1e-12, atol=1e-12)


def test_brute_force_convT_2d_grouped_strided_dilated_asym_pads():
    n, ic, oc, g = 2, 4, 6, 2
    ks, s, d, pb, pe = [2, 3], [3, 2], [1, 2], [2, 0], [0, 1]
    o_hw = [10, 9]
    i_hw = [_out_size(o_hw[a], ks[a], s[a], d[a], pb[a], pe[a]) for a in range(2)]
    assert i_hw == [4, 3]
    x = rand([n, ic] + i_hw, torch.float64, seed=3)
    dy = rand([n, oc] + o_hw, torch.float64, seed=4)
    want = torch.tensor(_brute_convT_iox(x.tolist(), dy.tolist(), ks, s, d, pb, g),
                        dtype=torch.float64)
    got = REF.conv_transpose_backprop_filters(x, dy, [ic, oc // g] + ks, strides=s, dilations=d,
                                              pads_begin=pb, pads_end=pe, groups=g,
                                              data_format="NCX", filter_format="IOX")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_reference_same_pads_used_on_output_delta_for_convT():
    # same_upper on O=6, k=3, s=2 -> (0, 1); input size I = floor((6+1-3)/2)+1 = 3
    x = rand([1, 2, 3], torch.float64, seed=5)
    dy = rand([1, 2, 6], torch.float64, seed=6)
    auto = REF.conv_transpose_backprop_filters(x, dy, [2, 2, 3], strides=2, auto_pad="SAME_UPPER",
                                               data_format="NCX", filter_format="IOX")
    explicit = REF.conv_transpose_backprop_filters(x, dy, [2, 2, 3], strides=2, pads_begin=0,
                                                   pads_end=1, data_format="NCX",
                                                   filter_format="IOX")
    assert torch.equal(auto, explicit)


def test_reference_accepts_low_precision_and_returns_f64():
    x = rand([2, 5, 3], torch.bfloat16, seed=7)
    dy = rand([2, 3, 4], torch.bfloat16, seed=8)
    dw = REF.conv_backprop_filters(x, dy, [3, 3, 4])
    assert dw.dtype == torch.float64 and dw.is_contiguous()
    assert torch.equal(dw, REF.conv_backprop_filters(x.double(), dy.double(), [3, 3, 4]))
