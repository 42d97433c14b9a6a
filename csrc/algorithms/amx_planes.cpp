// bf16 and f16 weight gradients on AMX tiles with the input read in place, through
// ATen's brgemm (oneDNN's ukernel), accumulating in float32. Per sample, the
// input is copied once into phase planes: per channel and per phase r of the
// strides, plane[i] = padded_input[i * stride + r] (zero in the padding). A
// kernel tap k then reads phase (k * dilation) % stride of every axis, shifted
// by q = (k * dilation) / stride planes' positions, so on positions laid out
// with the planes' row lengths ("wide" positions) every tap's operand is one
// contiguous run of each channel's plane, at an offset:
//
//     C[tap] (C x O) += planes[:, phase(tap)][offset(tap) : offset(tap) + K] @ B (K x O),
//
// where B is the output gradient on the same wide positions (zero at those
// that are not outputs), packed in VNNI pairs once a sample and shared by all
// taps. The brgemm algorithm instead gathers and packs the input once per tap
// and sample; on the benchmark's strided channels-first layers that copying
// was most of its time.
//
// A wide position that is not an output multiplies a real input element by
// zero, which is exact for finite inputs. With an infinity or NaN in the
// input it would add NaN to taps whose windows never read that element, so
// such calls run ATen instead.
//
// f16 splits into high and low bf16 parts (split_half, as in brgemm.cpp): the
// planes and every panel of B once each, and a tap's product is high * high +
// high * low + low * high, three products into the same C.
#include "algorithm.h"
#include "scratch.h"
#include "tap_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace torch_convgrad {
namespace {

// Where the planes lie and what each tap reads of them.
struct Planes {
  int64_t extent[3];     // plane positions per axis: Y + ((K - 1) * d) / s
  int64_t phases;        // s0 * s1 * s2 planes a channel
  int64_t plane_stride;  // elements a plane (even), with a zero tail that the last tap's run reaches into
  int64_t columns;       // K: wide positions from the first output to the last, rounded up to even
  bool wide;             // whether K holds positions that are not outputs

  explicit Planes(const Geometry& g) {
    for (int64_t axis = 0; axis < 3; ++axis)
      extent[axis] = g.out[axis] + (g.kernel[axis] - 1) * g.dilation[axis] / g.stride[axis];
    phases = g.stride[0] * g.stride[1] * g.stride[2];
    const int64_t exact = ((g.out[0] - 1) * extent[1] + g.out[1] - 1) * extent[2] + g.out[2];
    wide = exact != g.out_positions();
    columns = exact + exact % 2;
    const int64_t last[3] = {g.kernel[0] - 1, g.kernel[1] - 1, g.kernel[2] - 1};
    plane_stride = std::max(extent[0] * extent[1] * extent[2], offset(g, last) + columns);
    plane_stride += plane_stride % 2;
  }
  // Of tap (k0, k1, k2): its plane among a channel's, and its first element there.
  int64_t phase(const Geometry& g, const int64_t (&tap)[3]) const {
    int64_t index = 0;
    for (int64_t axis = 0; axis < 3; ++axis) index = index * g.stride[axis] + tap[axis] * g.dilation[axis] % g.stride[axis];
    return index;
  }
  int64_t offset(const Geometry& g, const int64_t (&tap)[3]) const {
    int64_t index = 0;
    for (int64_t axis = 0; axis < 3; ++axis)
      index = index * extent[axis] + tap[axis] * g.dilation[axis] / g.stride[axis];
    return index;
  }
};

bool supports(const Problem& problem) {
  if (!cpu_has_amx_bf16() || !runs_brgemm_bf16(problem)) return false;
  const Geometry g = geometry_of(problem);
  return g.batch > 0 && g.out_positions() > 0 && g.in_channels > 0 && g.out_channels > 0;
}

// K columns a panel of B: its VNNI copy and the taps' runs of A stay in L2
// while every tap reads them. On ResNet-50's 3x3 64-channel layer, panels of
// 512 ran at 505 GMAC/s and of 2048 at 271; the other layers changed by 10%
// or less.
constexpr int64_t kPanelColumns = 512;

// Whether B is copied into wide positions first: read in place it needs the
// outputs' positions as rows of even length at an even channel stride.
bool b_needs_staging(const Geometry& g, const Planes& planes) {
  return planes.wide || !spatial_flattens(g.out, g.grad_output_strides) || planes.columns != g.out_positions() ||
         g.grad_output_strides[1] % 2 != 0;
}

// Samples are split into groups of taps where there are too few of them to
// keep every thread busy; each group copies its sample's planes and B again.
int64_t tap_groups_of(const Geometry& g, int64_t threads) {
  return std::min(g.taps(), ceil_div(2 * threads, g.batch));
}

// Estimated seconds, fitted with torch 2.13 on an Intel Xeon (Sapphire
// Rapids, AMX-BF16, 2 threads) to the benchmark's channels-first layers
// (2026-11-24; 1.8 to 4 ms, within 20% but for ResNet-50's 3x3 256-channel
// layer, modelled at 3.2): the tiles multiply at about 700 GMAC/s from 64
// channels a side, over every wide position; every (sample, tap, panel)
// loads and stores its C at L2 speed, or at about 25 GB/s where a sample has
// fewer than 512 wide positions (dcgan, 14x14 layers); the planes are copied
// at about 20 GB/s where the input's positions are adjacent elements, and an
// element at a time otherwise; B is staged and packed at about 30 GB/s. f16
// (split into high and low bf16 parts, as in brgemm.cpp) runs three products a
// tap, which took about twice bf16's tiles and C (ResNet-50's 3x3 64-channel
// layer 3.3 ms NCX, 4.4 NXC; the strided 3x3 4.1 and 5.6; DCGAN 5.0 and 5.5;
// the 3-D layer 3.8 and 4.0), and splits the planes and B's panels, 8 bytes
// an element, at about 60 GB/s.
double cost(const Problem& problem, const Geometry& g) {
  const bool half = problem.input.scalar_type() == at::kHalf;
  const Planes planes(g);
  const double m = static_cast<double>(g.in_channels), n = static_cast<double>(g.out_channels);
  const double copies = static_cast<double>(g.batch) * tap_groups_of(g, at::get_num_threads());
  const double columns = static_cast<double>(planes.columns);
  const double panels = std::ceil(columns / kPanelColumns);
  const double c_rate = planes.columns < kPanelColumns ? 25e9 : 120e9;
  const double plane_bytes = copies * m * planes.phases * planes.plane_stride * 2;
  const double plane_rate = g.input_strides[4] == 1 || g.in[2] == 1 ? 20e9 : 2e9;
  const double b_bytes = copies * n * columns * 2;
  const double products = half ? 2 : 1;
  const double split_bytes = half ? (plane_bytes + b_bytes) * 4 : 0;
  return 20e-6 + products * g.macs() * columns / g.out_positions() / (700e9 * tile_width(m) * tile_width(n)) +
         products * g.batch * g.taps() * panels * m * n * 8 / c_rate + plane_bytes / plane_rate +
         b_bytes / 30e9 * (b_needs_staging(g, planes) ? 2 : 1) + split_bytes / 60e9;
}

using Element = uint16_t;  // bf16 or f16, copied as it is

// Sample n's input as planes: (C, phases, plane_stride) at `out`.
void build_planes(const Element* x, const Geometry& g, const Planes& planes, int64_t n, Element* out) {
  const int64_t* xs = g.input_strides;
  for (int64_t c = 0; c < g.in_channels; ++c)
    for (int64_t r0 = 0; r0 < g.stride[0]; ++r0)
      for (int64_t r1 = 0; r1 < g.stride[1]; ++r1)
        for (int64_t r2 = 0; r2 < g.stride[2]; ++r2) {
          const int64_t r[3] = {r0, r1, r2};
          Element* plane = out + (c * planes.phases + (r0 * g.stride[1] + r1) * g.stride[2] + r2) * planes.plane_stride;
          std::fill(plane, plane + planes.plane_stride, Element{0});
          // Per axis, the plane positions [lo, hi) that are input elements:
          // 0 <= i * s + r - pad_begin < in.
          int64_t lo[3], hi[3];
          bool empty = false;
          for (int64_t axis = 0; axis < 3; ++axis) {
            const int64_t shift = g.pad_begin[axis] - r[axis], s = g.stride[axis];
            lo[axis] = shift > 0 ? ceil_div(shift, s) : 0;
            hi[axis] = g.in[axis] + shift > 0 ? std::min(planes.extent[axis], ceil_div(g.in[axis] + shift, s)) : 0;
            empty |= hi[axis] <= lo[axis];
          }
          if (empty) continue;
          const auto input_index = [&](int64_t axis, int64_t i) {
            return i * g.stride[axis] + r[axis] - g.pad_begin[axis];
          };
          for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0) {
            const Element* source = x + n * xs[0] + c * xs[1] + input_index(0, i0) * xs[2] +
                                    input_index(1, lo[1]) * xs[3] + input_index(2, lo[2]) * xs[4];
            gather_every(source, g.stride[1] * xs[3], g.stride[2] * xs[4],
                         plane + (i0 * planes.extent[1] + lo[1]) * planes.extent[2] + lo[2], planes.extent[2],
                         hi[2] - lo[2], hi[1] - lo[1], sizeof(Element));
          }
        }
}

// Whether every bf16 element is finite (its exponent not all ones), as the
// largest of the exponents' bits: a reduction compilers vectorise, where a
// flag or-ed element by element stayed a scalar loop that took a third of
// ResNet-50's stride-2 3x3 channels-first layer (2026-12-05, 2 threads).
bool all_finite(const Element* data, int64_t count) {
  constexpr int16_t kExponent = 0x7F80;
  int16_t top = 0;
  for (int64_t i = 0; i < count; ++i) top = std::max<int16_t>(top, static_cast<int16_t>(data[i] & kExponent));
  return top != kExponent;
}

#ifdef CPUBLAS_BRGEMM_BF16BF16F32
at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const Planes planes(g);
  const bool staging = b_needs_staging(g, planes);
  const at::Tensor x5 = lift(problem.input), dy5 = lift(problem.grad_output);
  const int64_t m = g.in_channels, n_columns = g.out_channels, taps = g.taps();
  const int64_t threads = at::get_num_threads();
  const int64_t tap_groups = tap_groups_of(g, threads);
  // A's rows: per channel, its planes of each phase.
  const int64_t lda = planes.phases * planes.plane_stride;
  const auto* x = static_cast<const Element*>(x5.const_data_ptr());
  const at::TensorOptions options = problem.input.options();
  // f16: the planes and B's panels split into high and low bf16 parts
  // (split_half), three products a tap.
  const bool half = problem.input.scalar_type() == at::kHalf;
  const int64_t parts = half ? 2 : 1;

  ThreadPartials partials({taps, m, n_columns}, options);
  std::atomic<bool> non_finite{false};
  at::parallel_for(0, g.batch * tap_groups, 1, [&](int64_t unit_begin, int64_t unit_end) {
    float* thread_c = partials.take();
    const at::Tensor plane_data = scratch_tensor(ScratchSlot::PackedInput, {parts, m, lda}, options);
    auto* a_data = static_cast<Element*>(plane_data.data_ptr());
    Element* const a_low = half ? a_data + m * lda : nullptr;
    at::Tensor staged;
    if (staging) staged = scratch_tensor(ScratchSlot::StagedOperand, {n_columns, planes.columns}, options);
    const at::Tensor panel =
        scratch_tensor(ScratchSlot::VnniPanel, {parts, kPanelColumns / 2, n_columns, 2}, options);
    auto* panel_data = static_cast<at::BFloat16*>(panel.data_ptr());
    at::BFloat16* const panel_low = half ? panel_data + kPanelColumns * n_columns : nullptr;
    int64_t built = -1;  // the sample whose planes and B are in place
    const at::BFloat16* b = nullptr;
    int64_t ldb = 0;
    for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
      const int64_t n = unit / tap_groups, tap_group = unit % tap_groups;
      if (n != built) {
        built = n;
        build_planes(x, g, planes, n, a_data);
        // An f16 infinity's or NaN's low part is NaN.
        if (half ? !split_half(a_data, m * lda, a_data, a_low) : planes.wide && !all_finite(a_data, m * lda)) {
          non_finite = true;
          break;
        }
        if (staging) {
          // The outputs at their wide positions, zero between them.
          staged.zero_();
          staged
              .as_strided({n_columns, g.out[0], g.out[1], g.out[2]},
                          {planes.columns, planes.extent[1] * planes.extent[2], planes.extent[2], 1})
              .copy_(dy5[n]);
          b = static_cast<const at::BFloat16*>(staged.const_data_ptr());
          ldb = planes.columns;
        } else {
          b = static_cast<const at::BFloat16*>(dy5.const_data_ptr()) + n * dy5.stride(0);
          ldb = dy5.stride(1);
        }
      }
      const int64_t tap_begin = tap_group * taps / tap_groups, tap_end = (tap_group + 1) * taps / tap_groups;
      for (int64_t k0 = 0; k0 < planes.columns; k0 += kPanelColumns) {
        const int64_t k = std::min(kPanelColumns, planes.columns - k0);
        // Pairs of 16-bit elements as one 32-bit element: (N x K/2) -> (K/2 x N).
        transpose_to_rows(b + k0, ldb / 2, panel_data, n_columns, n_columns, k / 2, 4);
        if (half) {
          auto* panel_bits = reinterpret_cast<uint16_t*>(panel_data);
          if (!split_half(panel_bits, k * n_columns, panel_bits, reinterpret_cast<uint16_t*>(panel_low)))
            non_finite = true;
        }
        for (int64_t tap = tap_begin; tap < tap_end; ++tap) {
          const int64_t tap_index[3] = {tap / (g.kernel[1] * g.kernel[2]), tap / g.kernel[2] % g.kernel[1],
                                        tap % g.kernel[2]};
          const int64_t first = planes.phase(g, tap_index) * planes.plane_stride + planes.offset(g, tap_index) + k0;
          const auto* a = reinterpret_cast<const at::BFloat16*>(a_data) + first;
          float* c = thread_c + tap * m * n_columns;
          brgemm_bf16_blocks(m, n_columns, k, lda, a, panel_data, c, n_columns);
          if (half) {  // high * low + low * high
            brgemm_bf16_blocks(m, n_columns, k, lda, a, panel_low, c, n_columns);
            brgemm_bf16_blocks(m, n_columns, k, lda, reinterpret_cast<const at::BFloat16*>(a_low) + first, panel_data,
                               c, n_columns);
          }
        }
      }
    }
    at::native::cpublas::brgemm_release();
  });
  if (non_finite) return kAtenAlgorithm.run(problem);
  return problem.finish_sum(canonical_from_taps(partials.sums(), g, problem.spatial_rank()));  // (threads, taps, C, O)
}
#else
at::Tensor run(const Problem&) {
  TORCH_CHECK(false, "the amx_planes algorithm needs ATen's cpublas::brgemm");
  return {};
}
#endif

}  // namespace

const Algorithm kAmxPlanesAlgorithm{"amx_planes", supports, cost, run};

}  // namespace torch_convgrad
