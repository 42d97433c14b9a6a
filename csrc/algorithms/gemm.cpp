// One GEMM per kernel tap over the (sample, spatial) axes.
//
// Lifted to three spatial axes, tap k reads input position j*s + k*d - pb for
// output position j. Splitting the input by phase, (k*d - pb) mod s, makes
// every axis stride 1 within a phase plane; a tap then reads its plane at a
// fixed flat offset from the output position, if the output gradient is laid
// out with the plane's row pitch. So each tap is one matrix product
//
//     dW[tap] (C/g x O/g) = plane[offset : offset + rows]^T @ grad_output[0 : rows]
//
// over the flat (spatial) rows of every sample, on strided views read
// directly: by a fused kernel that computes every tap at once (tap_gemm.h)
// where the CPU has one, by BLAS otherwise. The input is packed into
// zero-padded phase planes (channels-last, or channels-first for BLAS) only
// where padding or stride need it; a 1x1 stride-1 weight gradient on either
// layout needs no copy at all.
// Both accumulate in float32: the fused kernel reads f16/bf16 as they are and
// converts them in its panels, and for BLAS they are converted in one copy
// (the packing one where there is one). Rows of the
// pitch-padded output gradient are zero: the fused kernel skips them
// (window_line_starts); BLAS multiplies them, where they add nothing but
// where they meet an infinite input value the product is NaN, as in any
// BLAS-based convolution.
#include "algorithm.h"
#include "scratch.h"
#include "tap_gemm.h"
#include "tasks.h"

#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

#include <algorithm>
#include <cmath>

namespace torch_convgrad {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// How one spatial axis's taps map onto phase planes.
struct AxisPlan {
  std::vector<int64_t> phase;          // per phase plane: (k*d - pb) mod s
  std::vector<int64_t> origin;         // per phase plane: its first row's window-relative offset
  std::vector<int64_t> tap_plane;      // per tap: its phase plane
  std::vector<int64_t> tap_offset;     // per tap: its offset from the output position, in plane rows
  std::vector<int64_t> tap_column;     // per tap: its position within an interleaved row (else 0)
  int64_t length = 0;                  // rows of every phase plane
  int64_t interleave = 1;              // positions a row: the stride where its phases share one plane
  bool direct = false;                 // the plane is the input itself (no padding read)
};

// Every phase of a strided axis in one plane instead, side by side: a row
// holds `stride` consecutive positions, so tap k reads the row of its window
// at a fixed offset and column. The plane is then a plain (padded) copy of
// the input, contiguous along the axis, or the input itself.
AxisPlan plan_interleaved_axis(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation,
                               int64_t pad_begin) {
  AxisPlan plan;
  plan.interleave = stride;
  // Row i holds input positions (i + origin) * stride + column.
  const int64_t origin = floor_div(-pad_begin, stride);
  int64_t furthest = 0;  // the largest shift from a window's first row
  for (int64_t tap = 0; tap < kernel; ++tap) {
    const int64_t shift = tap * dilation - pad_begin - origin * stride;
    plan.tap_plane.push_back(0);
    plan.tap_offset.push_back(shift / stride);
    plan.tap_column.push_back(shift % stride);
    furthest = std::max(furthest, shift);
  }
  plan.phase = {0};
  plan.origin = {origin};
  plan.length = out + furthest / stride;
  // Without padding, the input's rows serve, as many as it holds whole.
  plan.direct = origin == 0 && plan.length * stride <= in;
  if (plan.direct) plan.length = in / stride;
  return plan;
}

AxisPlan plan_axis(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad_begin) {
  AxisPlan plan;
  std::vector<int64_t> lowest, highest;
  for (int64_t tap = 0; tap < kernel; ++tap) {
    const int64_t shift = tap * dilation - pad_begin;
    const int64_t phase = shift - floor_div(shift, stride) * stride;
    const int64_t offset = floor_div(shift, stride);  // window j reads phase row j + offset
    auto found = std::find(plan.phase.begin(), plan.phase.end(), phase);
    const int64_t plane = found - plan.phase.begin();
    if (found == plan.phase.end()) {
      plan.phase.push_back(phase);
      lowest.push_back(offset);
      highest.push_back(offset);
    }
    lowest[plane] = std::min(lowest[plane], offset);
    highest[plane] = std::max(highest[plane], offset);
    plan.tap_plane.push_back(plane);
    plan.tap_offset.push_back(offset);
    plan.tap_column.push_back(0);
  }
  plan.direct = stride == 1 && lowest[0] >= 0 && out - 1 + highest[0] < in;
  if (plan.direct) {
    plan.origin = {0};
    plan.length = in;
  } else {
    plan.origin = lowest;
    for (size_t plane = 0; plane < plan.phase.size(); ++plane)
      plan.length = std::max(plan.length, out + highest[plane] - lowest[plane]);
  }
  for (int64_t tap = 0; tap < kernel; ++tap) plan.tap_offset[tap] -= plan.origin[plan.tap_plane[tap]];
  return plan;
}

// Windows a line that a product of one sample's rows amortises (about 4 us
// of call overhead against a copy of the output gradient for a pitch that
// multiplies samples together): a 1-D layer of 3199 windows (k10 s5,
// 32 -> 64 channels, N = 4, f32) took 1.84 ms so, 2.13 with the copy.
constexpr int64_t kLongLine = 1024;

struct Layout {
  AxisPlan plans[3];
  bool direct;   // the input serves as its own phase plane
  bool pitched;  // the output gradient needs the planes' (longer) row pitch
};

Layout plan(const Geometry& g) {
  Layout layout;
  layout.direct = true;
  for (int64_t axis = 0; axis < 3; ++axis) {
    layout.plans[axis] =
        plan_axis(g.in[axis], g.out[axis], g.kernel[axis], g.stride[axis], g.dilation[axis], g.pad_begin[axis]);
    layout.direct &= layout.plans[axis].direct;
  }
  // A strided last axis whose taps read every phase interleaves them: its
  // rows are copied contiguously (or read in place), where separate planes
  // take a strided gather. Channels-last input of whole rows is read in place.
  AxisPlan& last = layout.plans[2];
  if (g.stride[2] > 1 && static_cast<int64_t>(last.phase.size()) == g.stride[2]) {
    last = plan_interleaved_axis(g.in[2], g.out[2], g.kernel[2], g.stride[2], g.dilation[2], g.pad_begin[2]);
    const int64_t* strides = g.input_strides;
    const bool whole_rows = last.length * last.interleave == g.in[2] || g.in[0] * g.in[1] == 1;
    const bool pixels_contiguous = strides[1] == 1 && strides[4] == g.in_channels &&
                                   (g.in[1] == 1 || strides[3] == g.in[2] * strides[4]) &&
                                   (g.in[0] == 1 || strides[2] == g.in[1] * strides[3]);
    layout.direct = layout.plans[0].direct && layout.plans[1].direct && last.direct && whole_rows &&
                    pixels_contiguous;
  }
  // The output gradient's rows need the planes' pitch where a sample has
  // several lines of windows; with one line, only to multiply samples
  // together, which is worth its copy only for short lines.
  const bool lines_pitched = (g.out[1] > 1 && layout.plans[2].length != g.out[2]) ||
                             (g.out[0] > 1 && layout.plans[1].length * layout.plans[2].length != g.out[1] * g.out[2]);
  const bool samples_pitched = layout.plans[2].length != g.out[2] && g.out[2] < kLongLine;
  layout.pitched = lines_pitched || samples_pitched;
  return layout;
}

// (N, rows, C) matrices of `ncx5` (N, C, S0, S1, S2): a view where the
// spatial axes flatten.
at::Tensor as_rows(const at::Tensor& ncx5) { return ncx5.flatten(2).transpose(1, 2); }

// Whether `t` steps by one element along `dim`, or has a single element
// there (whose stride views may set to anything: as_rows gives a single
// channel of a 1-D tensor the row length's).
bool unit_stride(const at::Tensor& t, int64_t dim) { return t.size(dim) == 1 || t.stride(dim) == 1; }

// Copies `source` into `target`, both (N, A, B, W, C), one W x C matrix per
// (N, A, B) row, in parallel, where ATen's strided copy is slow: from
// channels-first sources (W unit-stride, C not) into channels-last targets
// through the transposing kernel (ATen moved them at about a fifth of a
// plain copy's speed), and from every step-th element of W into
// channels-first targets through the gathering one (ATen gathers element by
// element; ResNet's stride-2 1x1 layer, channels-first f32, ran 1.04x as
// fast so on the AMX Xeon, its gather bound by the reads either way).
void copy_as_rows(const at::Tensor& target, const at::Tensor& source) {
  const int64_t element_size = target.element_size();
  const bool kernels_copy = target.is_cpu() && target.scalar_type() == source.scalar_type() &&
                            (element_size == 4 || element_size == 2);
  const bool transposes = kernels_copy && target.stride(4) == 1 && (source.stride(3) == 1 || source.size(3) == 1) &&
                          source.stride(4) != 1;
  const bool gathers = kernels_copy && target.stride(3) == 1 && target.size(3) > 1 && source.stride(3) > 1;
  if (!transposes && !gathers) {
    target.copy_(source);
    return;
  }
  const int64_t sizes[3] = {target.size(0), target.size(1), target.size(2)};
  const auto* source_data = static_cast<const char*>(source.const_data_ptr());
  auto* target_data = static_cast<char*>(target.mutable_data_ptr());
  const int64_t matrix = target.size(3) * target.size(4);
  at::parallel_for(0, sizes[0] * sizes[1] * sizes[2], std::max<int64_t>(1, 16384 / std::max<int64_t>(matrix, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row) {
                       const int64_t index[3] = {row / (sizes[1] * sizes[2]), row / sizes[2] % sizes[1], row % sizes[2]};
                       int64_t from = 0, to = 0;
                       for (int64_t dim = 0; dim < 3; ++dim) {
                         from += index[dim] * source.stride(dim);
                         to += index[dim] * target.stride(dim);
                       }
                       const char* from_data = source_data + from * element_size;
                       char* to_data = target_data + to * element_size;
                       if (transposes)
                         transpose_to_rows(from_data, source.stride(4), to_data, target.stride(3), target.size(4),
                                           target.size(3), element_size);
                       else
                         gather_every(from_data, source.stride(4), source.stride(3), to_data, target.stride(4),
                                      target.size(3), target.size(4), element_size);
                     }
                   });
}

// The input as phase planes: (planes, N, rows, C * interleave), zero outside
// the input; channels-last, or with `channels_first` (no interleaved axis)
// each channel's rows contiguous.
at::Tensor pack_input(const at::Tensor& x5, const AxisPlan (&plans)[3], at::ScalarType dtype, const Geometry& g,
                      bool channels_first) {
  const int64_t counts[3] = {static_cast<int64_t>(plans[0].phase.size()), static_cast<int64_t>(plans[1].phase.size()),
                             static_cast<int64_t>(plans[2].phase.size())};
  // An interleaved axis is packed as a stride-1 one: position u of the
  // plane's (length * stride) holds input position u + origin * stride.
  int64_t lengths[3];
  for (int64_t axis = 0; axis < 3; ++axis) lengths[axis] = plans[axis].length * plans[axis].interleave;
  // (planes, N, L0, L1, L2, C), its channels stored first or last.
  std::vector<int64_t> sizes = {counts[0] * counts[1] * counts[2], g.batch, lengths[0], lengths[1], lengths[2]};
  sizes.insert(sizes.begin() + (channels_first ? 2 : 5), g.in_channels);
  at::Tensor packed = scratch_tensor(ScratchSlot::PackedInput, sizes, x5.options().dtype(dtype));
  if (channels_first) packed = packed.permute({0, 1, 3, 4, 5, 2});
  const at::Tensor x_nxc = x5.permute({0, 2, 3, 4, 1});
  for (int64_t p0 = 0; p0 < counts[0]; ++p0)
    for (int64_t p1 = 0; p1 < counts[1]; ++p1)
      for (int64_t p2 = 0; p2 < counts[2]; ++p2) {
        const int64_t planes[3] = {p0, p1, p2};
        at::Tensor plane = packed[(p0 * counts[1] + p1) * counts[2] + p2];
        at::Tensor interior = plane;
        at::Tensor source = x_nxc;
        bool empty = false;
        for (int64_t axis = 0; axis < 3; ++axis) {
          const AxisPlan& plan = plans[axis];
          const int64_t interleave = plan.interleave;
          const int64_t s = g.stride[axis] / interleave, phase = plan.phase[planes[axis]],
                        origin = plan.origin[planes[axis]] * interleave;
          // Row i holds input position (i + origin) * s + phase.
          const int64_t first = std::max<int64_t>(0, -origin);
          const int64_t end = std::min(lengths[axis], floor_div(g.in[axis] - phase + s - 1, s) - origin);
          if (end <= first) {
            empty = true;
            break;
          }
          const int64_t dim = 1 + axis;
          plane.narrow(dim, 0, first).zero_();
          plane.narrow(dim, end, lengths[axis] - end).zero_();
          interior = interior.narrow(dim, first, end - first);
          source = source.slice(dim, (first + origin) * s + phase, (end - 1 + origin) * s + phase + 1, s);
        }
        if (empty)
          plane.zero_();
        else
          copy_as_rows(interior, source);
      }
  const int64_t interleave = plans[2].interleave;
  return packed.flatten(2, 4).unflatten(2, {-1, interleave}).flatten(3, 4);
}

// The input read in place as (1, N, rows, C * interleave): channels-last
// pixels, rows of `interleave` of them.
at::Tensor input_rows(const at::Tensor& x5, const Layout& layout) {
  const int64_t interleave = layout.plans[2].interleave;
  if (interleave == 1) return as_rows(x5).unsqueeze(0);
  const int64_t rows = x5.size(2) * x5.size(3) * layout.plans[2].length;
  return x5.as_strided({1, x5.size(0), rows, interleave * x5.size(1)},
                       {0, x5.stride(0), interleave * x5.stride(4), 1});
}

// The output gradient as rows (N, rows, O): a view of the caller's data, or
// with `pack` a channels-last copy in `dtype` with row pitch (L1, L2).
at::Tensor grad_output_rows(const at::Tensor& dy5, const Layout& layout, at::ScalarType dtype, const Geometry& g,
                            bool pack) {
  const auto& plans = layout.plans;
  if (!pack) return as_rows(dy5);
  const at::Tensor packed = scratch_tensor(ScratchSlot::PackedGradOutput,
                                          {g.batch, g.out[0], plans[1].length, plans[2].length, g.out_channels},
                                          dy5.options().dtype(dtype));
  // Each element written once: the pitch's extra rows and columns are zero.
  packed.narrow(2, g.out[1], plans[1].length - g.out[1]).zero_();
  packed.narrow(2, 0, g.out[1]).narrow(3, g.out[2], plans[2].length - g.out[2]).zero_();
  copy_as_rows(packed.narrow(2, 0, g.out[1]).narrow(3, 0, g.out[2]), dy5.permute({0, 2, 3, 4, 1}));
  return packed.flatten(1, 3);
}

TapElement tap_element(at::ScalarType dtype) {
  return dtype == at::kHalf ? TapElement::Half : dtype == at::kBFloat16 ? TapElement::BFloat16 : TapElement::Float;
}

// Whether the fused kernel takes the output gradient as its first operand:
// it packs B's rows once for every tile of A's, so with one tap and fewer
// input channels than output ones the output gradient is A.
bool fused_swaps_operands(const Geometry& g) { return g.taps() == 1 && g.in_channels < g.out_channels; }

// The products' multiply-adds a second, on the fused kernel or through BLAS
// (the constants: cost() below).
double products_macs_per_second(const Geometry& g, bool fused, at::ScalarType dtype) {
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const auto width = [fused](double channels) {
    return fused ? width_share(channels, 64, 32) : width_share(channels, 96, 200);
  };
  const CpuCalibration calibration = cpu_calibration();
  // On the Zen 3 the fused kernel ran ResNet-50's stride-2 1x1 layer on
  // channels-last float32 data at 32-43 GMAC/s (two runs, 2026-12-01): one
  // tap whose rows lie a stride apart, copied a chunk at a time (an aliasing
  // row stride) or read a line a row. f16/bf16 rows are converted a chunk at
  // a time into a region (tap_gemm_kernel.h), where the stride costs
  // nothing: 63-64 GMAC/s (12.8-13.1 ms, float32 17.7; 2026-12-05). Its
  // tiles run A's (tap, channel) rows, so its rate follows their count, as
  // the AVX-512 build's does below: few input channels a group read by many
  // taps run at full width (2026-12-05, f32, against oneDNN: ResNet-50's 7x7
  // stem, 3 channels, N=4 on 224x224 channels-last, 10.0 ms against 20.3;
  // ConvNeXt's 4x4 stem 1.85 against 2.19; a 3x3 layer of 4 groups of 32
  // channels, 5.4 against 8.2; the model by channels alone estimated 2.5,
  // 1.7 and 2.2 times those times).
  const bool strided = g.strided();
  if (calibration == CpuCalibration::Avx2)
    return (fused ? 60e9 * (g.taps() == 1 && strided && dtype == at::kFloat ? 0.65 : 1.0) : 48e9) *
           width((fused ? g.taps() : 1) * in_per_group) * width(out_per_group);
  // The AVX-512 build's rate follows the rows of its product, A's taps times
  // channels (each row of B is packed once for all of them), and B's width.
  const bool swaps = fused_swaps_operands(g);
  const int64_t a_rows = swaps ? out_per_group : g.taps() * in_per_group;
  const int64_t b_width = swaps ? in_per_group : out_per_group;
  const double fused_avx512_width = width_share(static_cast<double>(a_rows), 120, 64);
  const bool amx_cpu = calibration == CpuCalibration::Avx512Amx;
  // On the Zen 4 the benchmark's 1-D layer ran at 68 GMAC/s (2026-11-25);
  // every problem whose rows run along one axis (1-D, or 2-D of height 1) is
  // taken to run so.
  const double one_axis = !amx_cpu && g.one_axis() ? 0.8 : 1.0;
  // On the Cascade Lake (2026-11-27) the benchmark's 3x3 layers ran at the
  // Zen 4's rates, its 1x1 and strided ones at 0.7-0.9 of them, and those
  // with strides and several taps on channels-first data at 0.55-0.7 (U-Net's,
  // ResNet-50's stride-2 3x3; the 1-D layer at 0.8). Without the block loop's
  // divisions (9332bf6) the stride-2 3x3 layer ran channels-first in 1.13
  // times its channels-last time (0.72 of the Zen 4's rate; U-Net's still at
  // 0.6; random-order interleaved, two runs): windows that overlap across
  // phases, where a stride that divides the kernel tiles them. Against
  // oneDNN (aten) on that layer in f32, gemm tied on the quietest run
  // (14.24 against 14.36 ms) and ran 1.17-1.5 times as fast under load
  // (oneDNN slows more when a neighbour takes a core's time), so its rate
  // there is 0.77, which the quiet tie gives against aten's model.
  const bool channels_first = g.in_channels > 1 && g.input_strides[1] != 1;
  const double cascade_lake = calibration != CpuCalibration::Avx512 ? 1.0
                              : strided && g.taps() > 1 && channels_first && g.in[1] > 1
                                  ? (strides_divide_kernel(g) ? 0.6 : 0.77)
                              : g.taps() == 1 || strided ? 0.8
                                                         : 1.0;
  // On the Zen 4 its 1x1 products (N=8, ResNet's layers from 56x56 down to 7x7,
  // 2026-11-25) ran faster the wider B: at 61-66 GMAC/s with 32 columns,
  // 70-82 with 64 and 84-95 with 256 and more on maps of 14x14 and 7x7; on
  // 28x28 and 56x56 maps (from 4096 rows) at 72-84 whatever the width.
  // On the Zen 5 (2026-12-02, the benchmark's layers) the fused kernel ran
  // layers of several taps about twice as fast as this model of the Zen 4
  // says (1.8-2.25), and 1x1 layers at 129-145 GMAC/s whatever B's width;
  // MKL's products ran 0.7-0.93 times as fast.
  const bool zen5 = calibration == CpuCalibration::Avx512Bf16Wide;
  if (zen5 && fused && g.taps() == 1) return 140e9 * fused_avx512_width;
  const double zen5_speedup = !zen5 ? 1.0 : fused ? 2.0 : 0.85;
  if (fused && !amx_cpu && g.taps() == 1) {
    const double rows = static_cast<double>(g.batch) * g.out[0] * g.out[1] * g.out[2];
    const double maps_share = rows >= 4096 ? 0.85 : std::min(1.0, 0.7 + 0.1 * std::log2(b_width / 32.0));
    return cascade_lake * 92e9 * maps_share * fused_avx512_width;
  }
  // On the Zen 4, after its L2 prefetches (2026-12-04), the fused kernel ran
  // ResNet-50's unstrided 3x3 64-channel layer's products at about 100
  // GMAC/s (9.7-10.3 ms a call, f32 and f16 alike), 1.18 times the rate
  // above; taken as 1.15. The f16 channels-last layer then goes to the fused
  // kernel, which ran it 1.04-1.25x as fast as oneDNN on float32 copies
  // (three interleaved runs); the f32 one stays on oneDNN (0.98-1.03x).
  const double zen4_unstrided = calibration == CpuCalibration::Avx512Bf16 && !strided ? 1.15 : 1.0;
  return cascade_lake * zen5_speedup *
         (fused ? (amx_cpu ? 130e9 : 85e9) * zen4_unstrided * one_axis * fused_avx512_width * width(b_width)
                : (amx_cpu ? 150e9 : 88e9) * width(in_per_group) * width(out_per_group));
}

// Whether BLAS, reading a float32 1x1 stride-1 problem in place, runs its
// products faster than the fused kernel would: on the Xeon's calibration
// (fused_kernel_reads_rows).
bool blas_outruns_fused_in_place(const Problem& problem, const Layout& layout, const Geometry& g) {
  const bool blas_reads_in_place = layout.direct && !layout.pitched && g.taps() == 1 &&
                                   problem.input.scalar_type() == at::kFloat &&
                                   cpu_calibration() == CpuCalibration::Avx512Amx;
  return blas_reads_in_place && products_macs_per_second(g, false, at::kFloat) >
                                    products_macs_per_second(g, true, at::kFloat);
}

// Whether run() hands both operands to the fused kernel as channels-last
// rows: on a CPU that runs it, in a dtype it reads (not float64), unless an
// operand would need a copy that BLAS does without, or BLAS reads both in
// place too (float32, 1x1 with stride 1) and runs faster: on a Sapphire
// Rapids Xeon (2 threads, channels-last f32) MKL ran ResNet's 1x1 layers
// 1024->256 at 14x14 1.23x and 64->256 at 56x56 1.07x as fast as the fused
// kernel, in one process, interleaved; on an AMD EPYC (Zen 4) 1.0x and
// 0.8-0.85x (6.8-7.9 ms against 5.5-6.7), so there they stay on the fused
// kernel (the Xeon's calibration is the only one with the rule). With more
// taps read in place (an unpadded 3x3, channels-last, N=8) neither won
// throughout, BLAS running
// 0.90x as fast at 96 channels (58x58), 0.98x at 128 (30x30) and 1.15x at 256
// (16x16), so those stay on the fused kernel. BLAS multiplies
// channels-first data in place (unless the fused kernel reads both operands
// channels-first: fused_kernel_reads_channels_first): an input read in
// place (1x1, stride 1), and
// a channels-first output gradient without the planes' pitch where there is
// one tap (1x1 with stride: transposing it would cost more than sharing its
// loads between taps saves; with more taps it is packed as rows).
bool fused_kernel_reads_rows(const Problem& problem, const Layout& layout, const Geometry& g) {
  return problem.input.is_cpu() && problem.input.scalar_type() != at::kDouble && cpu_runs_avx2_kernels() &&
         (!layout.direct || problem.input.stride(1) == 1) &&
         (layout.pitched || problem.grad_output.stride(1) == 1 || g.taps() > 1) &&
         !blas_outruns_fused_in_place(problem, layout, g);
}

// Whether run() hands the fused kernel both operands channels-first, in
// place (channels_first_products): a 1x1 stride-1 weight gradient whose
// samples' spatial rows are contiguous, on an AVX-512 CPU, where BLAS
// multiplied them a sample at a time. The kernel reads A's channels as runs
// of rows and transposes B's into its slabs a chunk at a time. ResNet-50's
// channels-first 1x1 64->256 layer (N=8, 56x56, 2 threads) ran 1.1-1.2x as
// fast so in f32 and 1.15-1.3x in f16 (5.3-5.7 ms; channels-last on the
// fused kernel 5.2), its 1024->256 layer at 14x14 1.0-1.2x and 1.05-1.1x
// (Zen 4, interleaved, three runs).
bool fused_kernel_reads_channels_first(const Problem& problem, const Layout& layout, const Geometry& g) {
  return problem.input.is_cpu() && problem.input.scalar_type() != at::kDouble && cpu_is_avx512() &&
         layout.direct && !layout.pitched && g.taps() == 1 && g.in_channels > 1 && g.out_channels > 1 &&
         problem.input.stride(1) != 1 && problem.grad_output.stride(1) != 1 &&
         spatial_flattens(g.in, g.input_strides) && spatial_flattens(g.out, g.grad_output_strides) &&
         !blas_outruns_fused_in_place(problem, layout, g);
}

// Whether the fused kernel reads the caller's channels-last output gradient
// in place, a window a row (WindowLines::b_compact), where the planes' pitch
// leaves rows between rows of windows: it skips those rows (window_line_starts)
// and needs no copy of the output gradient at that pitch. Not where it swaps
// the operands, nor on planes that are an input it cannot read (BLAS needs
// the pitch). The benchmark's padded channels-last layers ran 0.99-1.05x as
// fast so (f32 and bf16; Zen 3, 2 threads, interleaved).
bool reads_grad_output_unpitched(const Problem& problem, const Layout& layout, const Geometry& g, bool fused) {
  return fused && layout.pitched && !fused_swaps_operands(g) && problem.grad_output.stride(1) == 1 &&
         spatial_flattens(g.out, g.grad_output_strides, g.grad_output_strides[4]) &&
         (!layout.direct || problem.input.stride(1) == 1);
}

// Whether run() copies the output gradient: for the planes' row pitch, or as
// rows for the fused kernel.
bool packs_grad_output(const Problem& problem, const Layout& layout, const Geometry& g, bool fused) {
  return (layout.pitched && !reads_grad_output_unpitched(problem, layout, g, fused)) ||
         (fused && problem.grad_output.stride(1) != 1);
}

// Whether pack_input keeps channels-first data channels-first: for BLAS,
// which reads either, where no axis is interleaved and the output gradient
// is read in place channels-first (more than one channel: one channel's
// rows flatten across samples), so that samples are multiplied one at a
// time whatever the planes' layout. Copied without the transposition, ResNet's
// stride-2 1x1 layer (256->512, 56->28, N=8, f32) ran 1.05-1.10x as fast
// (5.73 ms against 6.29; Sapphire Rapids, 2 threads, interleaved), and 1.07x
// with ATen's AVX2 kernels forced on that CPU.
bool packs_input_channels_first(const Problem& problem, const Layout& layout, const Geometry& g, bool fused_rows,
                                bool packs_dy) {
  return !fused_rows && !packs_dy && !layout.direct && layout.plans[2].interleave == 1 &&
         problem.input.stride(1) != 1 && problem.grad_output.stride(1) != 1 && g.out_channels > 1;
}

// Below this many rows per product, samples are multiplied together where
// their rows are contiguous (BLAS runs best at a few thousand rows).
constexpr int64_t kRowsPerProduct = 8192;
// From this many rows per sample, BLAS multiplies samples whose rows do not
// flatten together in batches (run()), of as many samples as keep the
// batch's products (channels_a x channels_b a sample, counted in float64)
// within 16 MiB.
constexpr int64_t kRowsPerBatchedProduct = 512;
int64_t samples_per_batch(int64_t channels_a, int64_t channels_b) {
  constexpr int64_t kBatchedProductBytes = int64_t{16} << 20;
  return std::max<int64_t>(1, kBatchedProductBytes / (channels_a * channels_b * static_cast<int64_t>(sizeof(double))));
}

// Whether BLAS takes f16/bf16 data that it reads in place channels-first,
// converted a sample's block at a time (blas_products): its samples do not
// flatten into longer products, so they are multiplied one at a time anyway.
bool converts_samples_apart(const Problem& problem, bool fused_rows) {
  return !fused_rows && problem.input.scalar_type() != accumulation_dtype(problem.input.scalar_type()) &&
         problem.input.size(1) > 1 && problem.input.stride(1) != 1;
}

// Whether there are threads to give a sample or more each.
bool threads_split_samples(const Geometry& g) {
  const int64_t threads = at::get_num_threads();
  return threads > 1 && g.batch >= threads && !at::in_parallel_region();
}

// Whether run() packs and multiplies runs of samples, each by one thread
// into its own partial sum (partial_sums), rather than packing all samples,
// then splitting the products between the threads: every thread then reads
// only copies it wrote itself, from its own cache. Read across cores instead, freshly
// written lines made the fused kernel 1.5x slower (audio NCX f32, 3.45 ->
// 2.42 ms; 3x3 64ch NCX 7.2 -> 6.3) and BLAS 1.08x (stride-2 1x1 NCX, 6.04
// -> 5.58; Xeon, 2 threads). Only where something is copied (the input's
// planes, the output gradient, or f16/bf16 converted a sample at a time:
// converts_samples_apart), and with a sample per thread. Converted by
// ATen's parallel copy between products instead, ResNet's 1x1 64->256 NCX
// f16 layer ran 7.6-8.2 ms in most processes and 14.5-16 in some (Zen 4, 2
// threads): the copy, one sample's output gradient, 0.13-0.18 ms on two
// threads and 0.10-0.12 on one, took 0.65-0.86 ms for a whole process in
// one of about eight. With
// nothing packed (a channels-first 1-D input read in place, its output
// gradient's channels-last rows read in place too), splitting each
// sample's products inside the kernel ran 1.03-1.07x as fast as by samples
// on four channels-first 1-D layers of 16-64 channels in one interleaved
// run, 0.97-1.04x in another (Cascade Lake, 2 threads). Packed planes that
// BLAS multiplies are not, where a thread's samples have few rows
// (kLeastRowsPerThread): each thread's partial sum then costs about as much
// as its products. ResNet-50's stride-2 1x1 1024->2048 layer (14x14 -> 7x7,
// channels-first f32, N=8: 196 rows a thread) ran 1.33-1.36x as fast so,
// at N=32 1.07x; 512->1024 (28->14, N=8) 1.02x; the benchmark's layers
// 0.99-1.05x (Zen 3, 2 threads, interleaved). The partial sums are added
// in a fixed order: deterministic for a thread count, as the depthwise
// kernels are.
constexpr int64_t kLeastRowsPerThread = 1024;
bool multiplies_by_samples(const Problem& problem, const Geometry& g, bool fused_rows, bool packs) {
  if (!threads_split_samples(g) || (fused_rows && fused_swaps_operands(g))) return false;
  if (converts_samples_apart(problem, fused_rows)) return true;
  const int64_t threads = at::get_num_threads();
  const int64_t rows_per_thread = g.out_positions() * ceil_div(g.batch, threads);
  return packs && (fused_rows || rows_per_thread >= kLeastRowsPerThread);
}

// How many runs of samples partial_sums splits the batch into: one a thread,
// and more, up to kMostPartsPerThread a thread and one a sample, one for
// every kRowsPerPart rows the batch sums over, as a multiple of the threads
// (cores of equal speed then take as many each). More parts let a faster core
// take more of them, but each adds a partial sum that finish_sum reads.
// Under another process busy on one of the two cores, 4 parts a thread ran
// ResNet-50's 3x3 64-channel layer 1.34-1.7x as fast as one, its 1x1 64->256
// 1.25-1.94x, its stride-2 3x3 and 1x1 layers 1.07-1.34x, U-Net's 0.99-1.09x;
// with no load, the same within noise (0.96-1.01x, the 3x3 64-channel NCX
// layer 1.15x once, with the cores at unequal speeds). On 14x14 maps (1568
// rows, 2.4 MB sums a part) 8 parts ran ResNet-50's 3x3 256-channel layer at
// 0.84-0.92x with no load: there the sums cost more than the products they
// even out, and one part a thread stays (Zen 3, f32, 2 threads, interleaved).
constexpr int64_t kMostPartsPerThread = 4;
constexpr int64_t kRowsPerPart = 1200;
int64_t parts_of_samples(const Geometry& g) {
  const int64_t threads = at::get_num_threads();
  const int64_t wanted = g.batch * g.out_positions() / kRowsPerPart;
  return std::max(threads, std::min({wanted, g.batch, kMostPartsPerThread * threads}) / threads * threads);
}

// Partial sums (parts, sizes...) in `options`, where products(first, last,
// out) writes into `out` the sum over samples [first, last). With
// `by_thread`, each part sums its own run of samples, there are at least as
// many parts as threads, and each part goes to whichever thread is free
// (tasks.h), so that a slower core takes fewer; otherwise one part over every
// sample. Each part's sum and their fixed-order total (Problem::finish_sum)
// do not depend on which thread ran it: deterministic for a thread count.
template <typename F>
at::Tensor partial_sums(const Geometry& g, bool by_thread, at::IntArrayRef sizes, const at::TensorOptions& options,
                        const F& products) {
  const int64_t batch = g.batch;
  const int64_t parts = by_thread ? parts_of_samples(g) : 1;
  std::vector<int64_t> shape = {parts};
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  const at::Tensor sums = at::empty(shape, options);
  if (!by_thread) {
    products(0, batch, sums[0]);
    return sums;
  }
  run_tasks(parts, [&](int64_t part) { products(part * batch / parts, (part + 1) * batch / parts, sums[part]); });
  return sums;
}

// Where each tap reads the planes: its phase plane, its row offset in it and
// its first column.
struct TapPlacement {
  std::vector<int64_t> plane, offset, column;
};

TapPlacement place_taps(const Layout& layout, const Geometry& g) {
  const auto& plans = layout.plans;
  const int64_t pitch1 = plans[2].length, pitch0 = plans[1].length * pitch1;
  const int64_t plane_counts[2] = {static_cast<int64_t>(plans[1].phase.size()),
                                   static_cast<int64_t>(plans[2].phase.size())};
  TapPlacement taps;
  for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0)
    for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1)
      for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
        taps.plane.push_back((plans[0].tap_plane[k0] * plane_counts[0] + plans[1].tap_plane[k1]) * plane_counts[1] +
                             plans[2].tap_plane[k2]);
        taps.offset.push_back(plans[0].tap_offset[k0] * pitch0 + plans[1].tap_offset[k1] * pitch1 +
                              plans[2].tap_offset[k2]);
        taps.column.push_back(plans[2].tap_column[k2] * g.in_channels);
      }
  return taps;
}

// What the fused kernel reads as A: phase planes (P, N, rows, C *
// interleave), packed or read in place channels-last, or a 1-D input's
// channels-first rows in place (reads_input_in_place), `positions` long,
// channel_stride apart and zero outside. Offsets in elements from a sample's
// first, a tap each.
struct FusedInput {
  at::Tensor data;
  int64_t sample_stride, lda, channel_stride, positions;
  std::vector<int64_t> offsets;
};

FusedInput fused_input_of_planes(const at::Tensor& planes, const TapPlacement& taps) {
  FusedInput input{planes, planes.stride(1), planes.stride(2), 1, 0, {}};
  for (size_t tap = 0; tap < taps.offset.size(); ++tap)
    input.offsets.push_back(taps.plane[tap] * planes.stride(0) + taps.offset[tap] * planes.stride(2) +
                            taps.column[tap]);
  return input;
}

// The lifted 1-D input (N, C, 1, 1, L): window j's tap k reads position
// j * s + k * d - pb, its row j.
FusedInput fused_input_in_place(const at::Tensor& x5, const Geometry& g) {
  FusedInput input{x5, x5.stride(0), g.stride[2], x5.stride(1), g.in[2], {}};
  for (int64_t k = 0; k < g.kernel[2]; ++k) input.offsets.push_back(k * g.dilation[2] - g.pad_begin[2]);
  return input;
}

// Whether run() hands the caller's channels-first 1-D input (unit-stride
// rows) to the fused kernel in place, with no copy, whatever its stride,
// dilation and padding (f16/bf16 converted by the kernel a chunk of rows at a
// time, as are chunks that reach into the padding), where the input is A and
// groups have at most 64 input and 64 output channels. Against its
// transposition into rows (phase planes), on the Cascade Lake (2 threads,
// N=4, interleaved; f32 / bf16): the benchmark's layer (k10 s5, 32 -> 64,
// 16000) ran 1.14-1.25 / 1.10-1.19 times as fast, k3 s2 p1 layers of 48 and
// 64 channels 1.18-1.23 / 1.06-1.09, k3 s1 p1 at 64 channels 1.08 / 1.03;
// but with more channels, where the products outweigh the copy and the
// kernel reads channels-first rows more slowly than packed ones, less: 96
// channels 1.06 / 0.90, 128 0.98 / 0.82, 256 0.85 / 0.66, 64 -> 256 0.97 /
// 0.92.
bool reads_input_in_place(const Problem& problem, const Geometry& g, bool fused_rows) {
  constexpr int64_t kMostChannels = 64;
  // The first two axes: one position, which the only window's only tap reads.
  bool one_axis = true;
  for (int64_t axis = 0; axis < 2; ++axis)
    one_axis &= g.in[axis] == 1 && g.kernel[axis] == 1 && g.out[axis] == 1 && g.pad_begin[axis] == 0;
  return fused_rows && !fused_swaps_operands(g) && one_axis && g.input_strides[4] == 1 &&
         (g.in_channels == 1 || problem.input.stride(1) != 1) && g.in_channels / g.groups <= kMostChannels &&
         g.out_channels / g.groups <= kMostChannels;
}

// The layout of the output gradient's rows that run() multiplies with
// `layout`'s planes, or with an input read in place (reads_input_in_place),
// a window a row: no planes' pitch to meet.
Layout grad_output_layout(const Layout& layout, const Geometry& g, bool input_in_place) {
  if (!input_in_place) return layout;
  Layout windows = layout;
  windows.plans[2].length = g.out[2];
  windows.pitched = false;
  return windows;
}

// The rows of `samples` consecutive samples of the output gradient laid out
// as `dy_layout` (one sample's `sample_rows` from the next's) that hold
// windows, as the first row of each line of windows: the fused kernel skips
// the rows between lines, the pitch's zeros. None where no row lies between.
// Multiplied, those rows were 12% of ResNet-50's 3x3 layer on 14x14 maps
// (222 rows a sample for 196 windows), 10% of DCGAN's and 12% of the 3-D
// layer's; skipped, those layers ran 1.01-1.14x, 1.04-1.21x and 1.07-1.14x
// as fast, the 3x3 layers on 56x56 maps and with stride 2 0.94-1.08x (f32,
// bf16, f16, both layouts; Zen 3, 2 threads, interleaved, 2026-12-05).
std::vector<int64_t> window_line_starts(const Layout& dy_layout, const Geometry& g, int64_t sample_rows,
                                       int64_t samples) {
  const int64_t pitch1 = dy_layout.plans[2].length, pitch0 = dy_layout.plans[1].length * pitch1;
  std::vector<int64_t> starts;
  bool gapless = true;
  for (int64_t n = 0; n < samples; ++n)
    for (int64_t i0 = 0; i0 < g.out[0]; ++i0)
      for (int64_t i1 = 0; i1 < g.out[1]; ++i1) {
        gapless &= n * sample_rows + i0 * pitch0 + i1 * pitch1 == static_cast<int64_t>(starts.size()) * g.out[2];
        starts.push_back(n * sample_rows + i0 * pitch0 + i1 * pitch1);
      }
  if (gapless) starts.clear();
  return starts;
}

// The first `samples` samples' lines of `starts` (window_line_starts), the
// output gradient's rows one a window where `compact`.
WindowLines lines_of(const std::vector<int64_t>& starts, const Geometry& g, int64_t samples, bool compact) {
  if (starts.empty()) return {};
  return {starts.data(), samples * g.out[0] * g.out[1], g.out[2], compact};
}

// out (groups, taps, C/g, O/g) (+)= every tap's product over `product_rows`
// rows of `input` and `grad_output` (N, rows, O) from sample `first` (those
// of `lines` only), on the fused kernel.
void fused_products(const FusedInput& input, const at::Tensor& grad_output, int64_t first, int64_t product_rows,
                    const WindowLines& lines, const Geometry& g, const at::Tensor& out, bool accumulate) {
  TORCH_INTERNAL_ASSERT(unit_stride(grad_output, 2), "the fused kernel reads the output gradient as rows");
  const int64_t size = input.data.element_size();
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const auto* a = static_cast<const char*>(input.data.const_data_ptr()) + first * input.sample_stride * size;
  const auto* b = static_cast<const char*>(grad_output.const_data_ptr()) + first * grad_output.stride(0) * size;
  for (int64_t group = 0; group < g.groups; ++group)
    tap_products(tap_element(input.data.scalar_type()), a + group * in_per_group * input.channel_stride * size,
                 input.lda, b + group * out_per_group * size, grad_output.stride(1), product_rows,
                 input.offsets.data(), g.taps(), in_per_group, out_per_group, out[group].mutable_data_ptr<float>(),
                 accumulate, input.channel_stride, input.positions, /*b_channel_stride=*/1, lines);
}

// The same through BLAS in `dtype`, for `count` samples from `first`:
// products over `product_rows` rows that run across the samples, or with
// `batched`, one product a sample (`product_rows` each), as one batch (a
// bmm and its sum a tap and group).
// Operands in another dtype are converted a block of samples at a time,
// into this thread's scratch buffers: a whole-tensor conversion would write
// fresh memory and fault in every page of it (1x1 64->256 NCX f16 took
// 7.1 ms so, 4.1 converted a sample at a time; N=8, 56x56, 2 threads), and
// fresh blocks took 3-4% longer than reused ones (f16 NCX 1x1).
void blas_products(const at::Tensor& planes, const at::Tensor& grad_output, int64_t first, int64_t count,
                   int64_t product_rows, bool batched, const TapPlacement& taps, const Geometry& g,
                   at::ScalarType dtype, const at::Tensor& out, bool accumulate) {
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const auto block = [&](const at::Tensor& per_sample, int64_t dim, ScratchSlot slot) {
    const at::Tensor samples = per_sample.narrow(dim, first, count);
    return samples.scalar_type() == dtype ? samples : float32_copy(samples, slot);
  };
  // (count * plane rows, channels) matrices, or (count, plane rows,
  // channels) batches. The copies take slots that the packing does not: an
  // operand packed in f16/bf16 for the fused kernel (planes it cannot read:
  // fused_reads) is converted from its own slot.
  const auto rows_of = [&](const at::Tensor& samples, int64_t offset) {
    return batched ? samples.narrow(1, offset, product_rows) : samples.flatten(0, 1).narrow(0, offset, product_rows);
  };
  const at::Tensor b = rows_of(block(grad_output, 0, ScratchSlot::VnniPanel), 0);
  const at::Tensor plane_block = block(planes, 1, ScratchSlot::StagedOperand);
  for (int64_t tap = 0; tap < g.taps(); ++tap) {
    const at::Tensor a = rows_of(plane_block[taps.plane[tap]], taps.offset[tap]);
    for (int64_t group = 0; group < g.groups; ++group) {
      at::Tensor tap_out = out[group][tap];
      at::Tensor a_group = a.narrow(-1, taps.column[tap] + group * in_per_group, in_per_group).transpose(-2, -1);
      at::Tensor b_group = b.narrow(-1, group * out_per_group, out_per_group);
      // Into a column-major `out` (empty_tap_sums), the transposed product,
      // out^T = b^T a^T, which BLAS writes row by row.
      if (tap_out.stride(0) == 1 && tap_out.stride(1) != 1) {
        tap_out = tap_out.transpose(0, 1);
        std::swap(a_group, b_group);
        a_group = a_group.transpose(-2, -1);
        b_group = b_group.transpose(-2, -1);
      }
      if (batched && accumulate) {
        tap_out.add_(at::bmm(a_group, b_group).sum(0));
      } else if (batched) {
        at::sum_out(tap_out, at::bmm(a_group, b_group), 0);
      } else if (accumulate) {
        tap_out.addmm_(a_group, b_group);
      } else {
        at::mm_out(tap_out, a_group, b_group);
      }
    }
  }
}

// The weight gradient of fused_kernel_reads_channels_first's problems: per
// sample and group one product of channels-first rows, the operand with
// fewer channels as B (fused_swaps_operands), whose rows the kernel
// transposes. Each thread multiplies its own samples into a partial sum
// where there are enough (threads_split_samples, partial_sums): then only
// that thread transposes a sample's B, where splitting the products would
// have both transpose it (ResNet-50's channels-first 1x1 64->256 layer, f32,
// 1.05-1.15x as fast so; Zen 4, 2 threads, interleaved).
at::Tensor channels_first_products(const Problem& problem, const Geometry& g, const at::Tensor& x5,
                                   const at::Tensor& dy5) {
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const bool swaps = fused_swaps_operands(g);
  const at::Tensor& a = swaps ? dy5 : x5;
  const at::Tensor& b = swaps ? x5 : dy5;
  const int64_t channels_a = swaps ? out_per_group : in_per_group, channels_b = swaps ? in_per_group : out_per_group;
  const int64_t rows = g.out_positions(), size = x5.element_size(), no_offset = 0;
  const auto* a_data = static_cast<const char*>(a.const_data_ptr());
  const auto* b_data = static_cast<const char*>(b.const_data_ptr());
  // out (groups, channels_a, channels_b) = samples [first, last)'s products.
  const auto products = [&](int64_t first, int64_t last, const at::Tensor& out) {
    for (int64_t n = first; n < last; ++n)
      for (int64_t group = 0; group < g.groups; ++group)
        tap_products(tap_element(x5.scalar_type()),
                     a_data + (n * a.stride(0) + group * channels_a * a.stride(1)) * size, /*lda=*/1,
                     b_data + (n * b.stride(0) + group * channels_b * b.stride(1)) * size, /*ldb=*/1, rows,
                     &no_offset, 1, channels_a, channels_b, out[group].mutable_data_ptr<float>(),
                     /*accumulate=*/n != first, a.stride(1), /*a_positions=*/0, b.stride(1));
  };
  const at::Tensor sums = partial_sums(g, threads_split_samples(g), {g.groups, channels_a, channels_b},
                                       x5.options().dtype(at::kFloat), products);
  // (parts, groups, taps, C/g, O/g)
  const at::Tensor taps = (swaps ? sums.transpose(2, 3) : sums).unsqueeze(2);
  return problem.finish_sum(canonical_from_taps(taps, g, problem.spatial_rank()));
}

// Uninitialised tap sums (groups, taps, C/g, O/g), each (C/g, O/g) matrix
// column-major where `transposed`: blas_products then has BLAS write the
// transposed products, (O/g, C/g) row by row.
at::Tensor empty_tap_sums(const Geometry& g, bool transposed, const at::TensorOptions& options) {
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  if (!transposed) return at::empty({g.groups, g.taps(), in_per_group, out_per_group}, options);
  return at::empty({g.groups, g.taps(), out_per_group, in_per_group}, options).transpose(2, 3);
}

at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const Layout layout = plan(g);
  const auto& plans = layout.plans;
  const at::ScalarType dtype = accumulation_dtype(problem.input.scalar_type());
  const at::Tensor x5 = lift(problem.input), dy5 = lift(problem.grad_output);
  if (fused_kernel_reads_channels_first(problem, layout, g)) return channels_first_products(problem, g, x5, dy5);
  // The fused kernel reads f16/bf16 as they are; for BLAS they are converted,
  // as they are packed or, where BLAS reads the caller's data in place, a
  // product's block of samples at a time.
  const bool fused_rows = fused_kernel_reads_rows(problem, layout, g);
  const at::ScalarType storage = fused_rows ? problem.input.scalar_type() : dtype;
  const bool in_place = reads_input_in_place(problem, g, fused_rows);
  const Layout dy_layout = grad_output_layout(layout, g, in_place);
  const bool packs_dy = packs_grad_output(problem, dy_layout, g, fused_rows);
  const bool compact_dy = reads_grad_output_unpitched(problem, dy_layout, g, fused_rows);
  const bool planes_first = packs_input_channels_first(problem, layout, g, fused_rows, packs_dy);
  // The flat rows of one sample's output gradient that hold windows.
  const int64_t pitch1 = dy_layout.plans[2].length, pitch0 = dy_layout.plans[1].length * pitch1;
  const int64_t rows = (g.out[0] - 1) * pitch0 + (g.out[1] - 1) * pitch1 + g.out[2];
  const TapPlacement placement = place_taps(layout, g);
  // The fused kernel computes every tap at once from row-major operands; BLAS
  // takes the rest (float64, channels-first operands, f32 1x1 products it
  // runs faster, other devices).
  const auto fused_reads = [&](const at::Tensor& planes, const at::Tensor& grad_output) {
    return fused_rows && unit_stride(planes, 3) && unit_stride(grad_output, 2);
  };

  const int64_t groups = g.groups, in_per_group = g.in_channels / groups, out_per_group = g.out_channels / groups;
  const at::TensorOptions sums_options = x5.options().dtype(dtype);

  // The input's planes are packed unless they are the input itself or it is
  // read in place.
  const bool packs_planes = !layout.direct && !in_place;
  if (multiplies_by_samples(problem, g, fused_rows, packs_planes || packs_dy)) {
    Geometry sample = g;
    sample.batch = 1;
    const std::vector<int64_t> starts = window_line_starts(dy_layout, g, rows, 1);
    const auto products = [&](int64_t first, int64_t last, const at::Tensor& out) {
      for (int64_t n = first; n < last; ++n) {
        const at::Tensor x_n = x5.narrow(0, n, 1), dy_n = dy5.narrow(0, n, 1);
        const at::Tensor grad_output = grad_output_rows(dy_n, dy_layout, storage, sample, packs_dy);
        if (in_place) {
          fused_products(fused_input_in_place(x_n, g), grad_output, 0, rows, /*lines=*/{}, g, out,
                         /*accumulate=*/n != first);
          continue;
        }
        const at::Tensor planes =
            layout.direct ? input_rows(x_n, layout) : pack_input(x_n, plans, storage, sample, planes_first);
        TORCH_INTERNAL_ASSERT(!compact_dy || fused_reads(planes, grad_output), "BLAS needs the pitch");
        if (fused_reads(planes, grad_output))
          fused_products(fused_input_of_planes(planes, placement), grad_output, 0, rows,
                         lines_of(starts, g, 1, compact_dy), g, out, /*accumulate=*/n != first);
        else
          blas_products(planes, grad_output, 0, 1, rows, /*batched=*/false, placement, g, dtype, out,
                        /*accumulate=*/n != first);
      }
    };
    const at::Tensor partials = partial_sums(g, /*by_thread=*/true,
                                             {groups, g.taps(), in_per_group, out_per_group}, sums_options, products);
    return problem.finish_sum(canonical_from_taps(partials, g, problem.spatial_rank()));
  }

  if (in_place) {  // a sample a product (channels-first samples do not flatten together), unpitched
    const at::Tensor grad_output = grad_output_rows(dy5, dy_layout, storage, g, packs_dy);
    const FusedInput input = fused_input_in_place(x5, g);
    const at::Tensor taps = empty_tap_sums(g, /*transposed=*/false, sums_options);
    for (int64_t n = 0; n < g.batch; ++n)
      fused_products(input, grad_output, n, rows, /*lines=*/{}, g, taps, /*accumulate=*/n != 0);
    return problem.finish_sum(canonical_from_taps(taps.unsqueeze(0), g, problem.spatial_rank()));
  }

  // (planes, N, rows, C) and (N, rows, O)
  const at::Tensor planes = layout.direct ? input_rows(x5, layout) : pack_input(x5, plans, storage, g, planes_first);
  const at::Tensor grad_output = grad_output_rows(dy5, dy_layout, storage, g, packs_dy);
  const bool fused = fused_reads(planes, grad_output);
  TORCH_INTERNAL_ASSERT(!compact_dy || fused, "BLAS needs the pitch");
  const int64_t plane_rows = planes.size(2), dy_sample_rows = compact_dy ? g.out_positions() : plane_rows;
  // Samples multiply together when both operands step from one sample to the
  // next by exactly one plane (the output gradient: one sample's windows).
  const bool samples_flatten = dy_sample_rows == grad_output.size(1) &&
                               planes.stride(1) == plane_rows * planes.stride(2) &&
                               grad_output.stride(0) == dy_sample_rows * grad_output.stride(1);
  // Otherwise BLAS multiplies the samples in batches (samples_per_batch)
  // where a sample has long products, and one at a time elsewhere. Products
  // of a sample's 1x1 NCX data, against one at a time (MKL, Zen 4, 2
  // threads, N=8): 1.1x at 64->256 (56x56), 1.45x at 64->64 (56x56), 1.13x
  // at 128->512 (28x28), 1.02x at 512->128; but 0.9x at 1024->256 (14x14)
  // and 0.3x at 2048->512 (7x7), though 1.25x at 256->1024 (14x14). Only
  // where nothing is converted: see blas_products.
  const bool converts = planes.scalar_type() != dtype || grad_output.scalar_type() != dtype;
  const bool batched = !samples_flatten && !fused && rows >= kRowsPerBatchedProduct && !converts;
  const int64_t samples_per_product =
      samples_flatten ? std::max<int64_t>(1, kRowsPerProduct / std::max<int64_t>(plane_rows, 1))
      : batched       ? samples_per_batch(in_per_group, out_per_group)
                      : 1;
  // BLAS's products of a sample or a batch with more output than input
  // channels a group are written transposed, each product's larger side as
  // its rows, unless they are of converted f16/bf16. Batches: MKL ran
  // ResNet's 1x1 64->256 NCX f32 layer (N=8, 56x56, 2 threads) 1.10-1.35
  // times as fast so (three runs), and bmm alone 1.04-1.1 times at 64->256
  // and 128->512 (0.9-0.94 times the other way round: 512->128, 256->64,
  // 1024->256). A sample at a time: ResNet's channels-first f32 1x1
  // expansions on small maps ran 1.12-1.21x as fast (512->2048 on 7x7, N=8
  // to 32; 256->1024 on 14x14), 128->512 on 28x28 1.08x (Zen 3,
  // interleaved; 2026-12-05); converted f16/bf16 0.94-0.95x on the Cascade
  // Lake and 0.96-1.10x on the Zen 3 (other CPUs' MKL not measured).
  const bool transposed = !fused && !samples_flatten && !converts && in_per_group < out_per_group;
  const at::Tensor taps = empty_tap_sums(g, transposed, sums_options);

  const FusedInput fused_input = fused_input_of_planes(planes, placement);
  const std::vector<int64_t> starts =
      fused ? window_line_starts(dy_layout, g, plane_rows, samples_per_product) : std::vector<int64_t>{};
  if (fused && fused_swaps_operands(g)) {
    // out (groups, O/g, C/g) (+)= the products of samples [first, last), a
    // product of up to samples_per_product samples at a time.
    const auto swapped_products = [&](int64_t first, int64_t last, const at::Tensor& out) {
      const int64_t size = planes.element_size(), no_offset = 0;
      for (int64_t n = first; n < last; n += samples_per_product) {
        const int64_t samples = std::min(samples_per_product, last - n);
        const int64_t product_rows = (samples - 1) * plane_rows + rows;
        const auto* a = static_cast<const char*>(planes.const_data_ptr()) + n * planes.stride(1) * size;
        const auto* b = static_cast<const char*>(grad_output.const_data_ptr()) + n * grad_output.stride(0) * size;
        for (int64_t group = 0; group < groups; ++group)
          tap_products(tap_element(storage), b + group * out_per_group * size, grad_output.stride(1),
                       a + (group * in_per_group + fused_input.offsets[0]) * size, planes.stride(2), product_rows,
                       &no_offset, 1, out_per_group, in_per_group, out[group].mutable_data_ptr<float>(),
                       /*accumulate=*/n != first, /*a_channel_stride=*/1, /*a_positions=*/0, /*b_channel_stride=*/1,
                       lines_of(starts, g, samples, compact_dy));
      }
    };
    // Runs of samples are each multiplied by one thread into a partial sum where
    // there are enough, rather than every product being split between the
    // threads: ResNet-50's channels-last 1x1 64->256 layer ran 1.0-1.11x as
    // fast so in f32 and 0.97-1.23x in f16 (five interleaved runs, Zen 4, 2
    // threads; the gains where the split products ran slowly, 5.7-7.4 ms
    // against 5.1-6.0, as they did in some benchmark runs).
    const at::Tensor swapped = partial_sums(g, threads_split_samples(g),
                                            {groups, out_per_group, in_per_group}, sums_options, swapped_products);
    // (parts, groups, taps, C/g, O/g)
    return problem.finish_sum(canonical_from_taps(swapped.transpose(2, 3).unsqueeze(2), g, problem.spatial_rank()));
  }

  for (int64_t first = 0; first < g.batch; first += samples_per_product) {
    const int64_t count = std::min(samples_per_product, g.batch - first);
    const int64_t product_rows = batched ? rows : (count - 1) * plane_rows + rows;
    if (fused)
      fused_products(fused_input, grad_output, first, product_rows, lines_of(starts, g, count, compact_dy), g, taps,
                     /*accumulate=*/first != 0);
    else
      blas_products(planes, grad_output, first, count, product_rows, batched, placement, g, dtype, taps,
                    /*accumulate=*/first != 0);
  }
  // (groups, taps, C/g, O/g)
  return problem.finish_sum(canonical_from_taps(taps.unsqueeze(0), g, problem.spatial_rank()));
}

// Every device, dtype and attribute.
bool supports(const Problem&) { return true; }

// Estimated seconds. Measured with torch 2.13 on an AMD EPYC (Zen 3, AVX2, 2
// threads) over ResNet, U-Net, DCGAN, audio and video layers: the fused
// kernel runs at about 60 GMAC/s from 64 channels a side, BLAS at about 48
// and less below 128 channels; packing copies about 6 GB/s from channels-last
// data and 3 GB/s from channels-first (a transposition, or a strided gather
// kept channels-first); each BLAS product
// call costs about 4 us. On an Intel Xeon (Sapphire Rapids, AVX-512, 2
// threads), BLAS ran 1x1 NCX layers at 130-165 GMAC/s and channels-last copies
// of phase planes at 19-21 GB/s, channels-first ones at 9 (2026-11-23). The
// fused kernel's AVX-512 build ran the benchmark's layers at 165 GMAC/s in f32
// and f16 alike, 0.7 times that at 64 product rows (1x1, 64 input channels),
// and copies with contiguous rows at 32 GB/s (channels-last) and 19 (through
// the transposition) on 2026-11-24, a day when torch.mm and oneDNN ran
// 1.2-1.3 times as fast as the day before: the constants are the earlier
// day's. On an AMD EPYC (Zen 4, AVX-512 without AMX, 2 threads; 2026-11-24)
// the fused kernel ran the benchmark's layers at 63-86 GMAC/s and 1x1
// 64 -> 256 NXC at 61-75, 1.17-1.24 times as fast as MKL (52-60; with 1024
// input channels both 84-87); the whole layers took 1.3-1.5 times the Xeon
// calibration's estimate on the fused kernel and 1.6-2.2 times on BLAS, so
// the products' rates here are about 0.65 and 0.6 of the Xeon's. On other
// devices this is not calibrated: it runs there only when forced.
double cost(const Problem& problem, const Geometry& g) {
  if (!problem.input.is_cpu()) return 1e30;
  const Layout layout = plan(g);
  // Nothing copied; the slabs' transposition costs about a twentieth of the
  // products (ResNet-50's 1x1 64->256 layer, f32, 5.3-5.5 ms channels-first
  // against 5.2 channels-last, Zen 4).
  if (fused_kernel_reads_channels_first(problem, layout, g))
    return 30e-6 +
           g.macs() / (0.95 * products_macs_per_second(g, /*fused=*/true, problem.input.scalar_type()));
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  const at::ScalarType dtype = problem.input.scalar_type();
  const bool fused = fused_kernel_reads_rows(problem, layout, g);
  const bool in_place = reads_input_in_place(problem, g, fused);
  const Layout dy_layout = grad_output_layout(layout, g, in_place);
  // The rows the products run over, a sample's output gradient's at its pitch.
  const double padded_rows = static_cast<double>(dy_layout.plans[1].length) * dy_layout.plans[2].length;
  const double rows = static_cast<double>(g.out[1]) * g.out[2];
  const bool converts = !fused && dtype != accumulation_dtype(dtype);
  const bool packs_planes = !layout.direct && !in_place;
  const bool packs_input = packs_planes || converts;
  const bool packs_dy = packs_grad_output(problem, dy_layout, g, fused);
  const bool input_channels_last = problem.input.stride(1) == 1;

  const bool avx512 = cpu_is_avx512();
  double macs_per_second = products_macs_per_second(g, fused, dtype);
  if (dtype == at::kDouble) macs_per_second /= 2;
  // The fused kernel skips the pitch's rows (window_line_starts); BLAS multiplies them.
  double seconds = 30e-6 + g.macs() * (fused ? 1.0 : padded_rows / rows) / macs_per_second;

  const double element_size = problem.input.element_size();
  const double input_bytes = static_cast<double>(g.batch) * g.in_channels * g.in[0] * g.in[1] * g.in[2] * element_size;
  const double grad_output_bytes = g.data_bytes(problem.input.element_size()) - input_bytes;
  // The phase planes hold only the input that taps read: a quarter of it for
  // a 1x1 kernel with stride 2.
  double plane_bytes = static_cast<double>(g.batch) * g.in_channels * element_size;
  for (const AxisPlan& axis : layout.plans)
    plane_bytes *= static_cast<double>(axis.phase.size()) * axis.length * axis.interleave;
  // Rows whose last axis stays contiguous in the copy (stride 1, or its
  // phases interleaved) move as whole runs, or through the transposing kernel
  // from channels-first data to channels-last; phase planes of a strided last
  // axis take a pixel at a time, or where they stay channels-first the
  // gathering kernel, which reads every line of the rows it takes (11 GB/s
  // on the Xeon, ResNet's stride-2 1x1 NCX f32, through ATen's copy then).
  // The Xeon's packing and conversion rates stand for every AVX-512 CPU (not
  // measured on the Zen 4). On the Zen 3 a 1-D layer's transposition, each
  // channel's row one run, moved as fast as a channels-last copy: gemm ran
  // a stride-2 layer of 5 taps (64 -> 128 channels, N=8, 4000 positions) in
  // 9.4 ms channels-first and 9.5 channels-last, 1.8x as fast as oneDNN's
  // 17.6, which the model had tied (f32, 2 threads, interleaved in one
  // process, 2026-12-05).
  const bool one_axis = g.one_axis();
  const auto pack_bytes_per_second = [avx512, one_axis](bool channels_last, bool transposes, bool contiguous_rows) {
    if (!avx512) return (transposes && !one_axis) || !(channels_last || contiguous_rows) ? 3e9 : 6e9;
    if (transposes) return contiguous_rows ? 15e9 : 8e9;
    return contiguous_rows ? 25e9 : channels_last ? 16e9 : 11e9;
  };
  // An operand is packed, or where BLAS reads it in place only converted, a
  // block of samples at a time, keeping its layout: 15 GB/s of f16 on the
  // Xeon, and at least a channels-last packing copy's rate elsewhere.
  const double convert_bytes_per_second = avx512 ? 15e9 : 6e9;
  const auto copy_seconds = [&](bool packs, double packed_bytes, double bytes, double bytes_per_second) {
    return packs ? packed_bytes / bytes_per_second : converts ? bytes / convert_bytes_per_second : 0.0;
  };
  const bool input_rows_contiguous = g.stride[2] == 1 || layout.plans[2].interleave > 1;
  const bool planes_first = packs_input_channels_first(problem, layout, g, fused, packs_dy);
  const bool grad_output_channels_last = problem.grad_output.stride(1) == 1;
  seconds += copy_seconds(packs_planes, plane_bytes, input_bytes,
                          pack_bytes_per_second(input_channels_last, !input_channels_last && !planes_first,
                                                input_rows_contiguous)) +
             copy_seconds(packs_dy, grad_output_bytes, grad_output_bytes,
                          pack_bytes_per_second(grad_output_channels_last, !grad_output_channels_last, true));
  if (g.groups > 1) {
    // Each group's product reads whole cache lines of every row, so groups of
    // a few channels read the same lines again: 144 groups of one channel
    // (1x1 depthwise, 16x56x56, f32) took 70-85 ms, as this term says, where
    // the depthwise kernel takes 3.
    constexpr double kLine = 64, kLineBytesPerSecond = 10e9;
    const auto lines = [&](int64_t channels) { return std::ceil(channels * element_size / kLine); };
    const double rows_read = static_cast<double>(g.batch) * g.out[0] * (fused ? rows : padded_rows);
    seconds += g.groups * rows_read * (lines(in_per_group) + lines(out_per_group)) * kLine / kLineBytesPerSecond;
  }
  if (!fused) {
    // Each thread's own samples are multiplied one at a time; other samples
    // whose rows do not flatten together in batches where run() does.
    const bool by_samples = multiplies_by_samples(problem, g, fused, packs_planes || packs_dy);
    const bool samples_flatten = (input_channels_last || packs_input) && !by_samples;
    const double sample_rows = padded_rows * g.out[0];
    const double products_per_tap =
        samples_flatten ? std::ceil(g.batch * sample_rows / kRowsPerProduct)
        : !by_samples && !converts && sample_rows >= kRowsPerBatchedProduct
            ? std::ceil(static_cast<double>(g.batch) / samples_per_batch(in_per_group, out_per_group))
            : g.batch;
    seconds += static_cast<double>(g.taps()) * g.groups * products_per_tap * 4e-6;
  }
  return seconds;
}

}  // namespace

const Algorithm kGemmAlgorithm{"gemm", supports, cost, run};

}  // namespace torch_convgrad
