// A direct CPU kernel for depthwise convolutions (groups == channels, one
// filter per channel) and groups of a few channels, which ATen runs slowly on
// CPU (its bf16 channels-last depthwise path by two orders of magnitude, its
// groups of 2-4 channels at a few GMAC/s). The vectorised kernel
// (depthwise_kernel.h) is compiled once per CPU capability; this file picks
// one, splits the work and reduces the partial sums.
#include "algorithm.h"
#include "depthwise.h"
#include "tasks.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

namespace torch_convgrad {
namespace {

namespace kernel = depthwise_kernel;

// Measured on an AMD EPYC (Zen 3, 2 cores, AVX2; x.sum() of 58 MB reads at
// 23-32 GB/s), 2 threads, bytes = input + grad_output: MobileNetV2 3x3
// depthwise (N=16, C=144, 56x56) streams at 16-26 GB/s in f32 and 12-14 in
// bf16, NXC and NCX, strides 1 and 2; ConvNeXt 7x7 (N=8, C=96) is bound by
// its arithmetic at 40-51 GMAC/s. Groups of 2-8 channels ran 3x3 layers (N=8,
// 14x14 to 56x56, 128-512 channels) at 22-40 GMAC/s, less with short rows,
// where a tile's fixed work weighs more. A call on a tiny problem takes about
// 15 us. On an Intel Xeon (Sapphire Rapids, AVX-512, x.sum() at 25 GB/s) the
// same layers streamed at 21-22 GB/s in f32 and 16 in bf16, and 2x64x32x32
// at 21 (2026-11-23); with the AVX-512 build ConvNeXt ran at 78-93 GMAC/s.
// Shorter rows run slower (2026-11-24, bf16, ConvNeXt's 7x7 layers, N=8, 56
// down to 7 windows a row: 101, 74, 36 and 24 GMAC/s; 224 windows, N=1: 97):
// 2.5 times the long rows' rate * windows / (windows + 85), at most that rate.
// On an AMD EPYC (Zen 4, AVX-512 without AMX), MobileNetV2's layers streamed
// at 12-24 GB/s in f32 and 8-21 in bf16 (channels-last ones prefetching the
// next rows at 19-27 and 14-21), and ConvNeXt ran at 58-70 (f32) and 76-79
// GMAC/s (bf16; 2026-11-24); prefetching further ahead, its f32 layers
// streamed at 21-27 GB/s (2026-11-25), where oneDNN's ran the channels-last
// stride-2 layer at 11-17.5 (f16/bf16 streamed at 11-16 GB/s, bound by the
// staging's work, against oneDNN's 5-7 and ATen's f16 paths' far less).
// On an AMD EPYC (Zen 5, x.sum() at 40 GB/s; 2026-12-02) MobileNetV2's
// layers streamed at 26-38 GB/s in f32 and 18-33 in bf16/f16, and ConvNeXt
// ran at 113-159 GMAC/s.
double bytes_per_second() {
  const CpuCalibration calibration = cpu_calibration();
  return calibration == CpuCalibration::Avx512Amx        ? 21e9
         : calibration == CpuCalibration::Avx2           ? 16e9
         : calibration == CpuCalibration::Avx512Bf16Wide ? 30e9
                                                         : 25e9;
}
double depthwise_macs_per_second(double windows) {
  const CpuCalibration calibration = cpu_calibration();
  const double long_rows = calibration == CpuCalibration::Avx512Amx        ? 100e9
                           : calibration == CpuCalibration::Avx2           ? 45e9
                           : calibration == CpuCalibration::Avx512Bf16Wide ? 130e9
                                                                           : 65e9;
  return std::min(long_rows, 2.5 * long_rows * windows / (windows + 85));
}
// Whole planes (Args::whole_planes, AVX2 only) ran at 28-43 GMAC/s
// with 7x7 kernels on rows of 7 to 20 windows, 23 with 5x5 on rows of 14 and
// 11-15 with 3x3 on rows of 7 and 14 (Zen 3, 2026-12-05, 2 threads, N=8):
// their rate grows with the taps, and the zeros after each row's windows
// (K2 - 1 of every windows + K2 - 1 products) are lost.
double planes_macs_per_second(const Geometry& g) {
  const double windows = static_cast<double>(g.out[2]);
  const double taps = static_cast<double>(g.taps());
  return windows / (windows + static_cast<double>(g.kernel[2] - 1)) * (6e9 + 1e9 * taps);
}
constexpr double kGroupedMacsPerSecond = 35e9;
constexpr double kOverheadSeconds = 15e-6;

// The narrowest kernel build's vector (AVX2's and the portable one's): 8
// float32 lanes, 4 float64. Groups that divide it run on every build.
int64_t lanes_of(at::ScalarType dtype) { return dtype == at::kDouble ? 4 : 8; }

kernel::Dtype kernel_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return kernel::Dtype::Double;
    case at::kHalf: return kernel::Dtype::Half;
    case at::kBFloat16: return kernel::Dtype::BFloat16;
    default: return kernel::Dtype::Float;
  }
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t depthwise_group_channels(const Problem& problem) {
  const int64_t channels = problem.input.size(1);
  if (channels != problem.grad_output.size(1) || problem.groups == 0 || channels % problem.groups != 0) return 0;
  const int64_t per_group = channels / problem.groups;
  const int64_t lanes = lanes_of(problem.input.scalar_type());
  return per_group <= lanes && lanes % per_group == 0 ? per_group : 0;
}

kernel::Args depthwise_args(const Problem& problem, const Geometry& geometry) {
  kernel::Args args{};
  args.dtype = kernel_dtype(problem.input.scalar_type());
  args.input = problem.input.const_data_ptr();
  args.input_span = 1;
  for (int64_t dim = 0; dim < problem.input.dim(); ++dim)
    args.input_span += (problem.input.size(dim) - 1) * problem.input.stride(dim);
  args.grad_output = problem.grad_output.const_data_ptr();
  for (int64_t dim = 0; dim < 5; ++dim) {
    args.input_strides[dim] = geometry.input_strides[dim];
    args.grad_output_strides[dim] = geometry.grad_output_strides[dim];
  }
  for (int64_t axis = 0; axis < 3; ++axis) {
    args.in[axis] = geometry.in[axis];
    args.out[axis] = geometry.out[axis];
    args.kernel[axis] = geometry.kernel[axis];
    args.stride[axis] = geometry.stride[axis];
    args.dilation[axis] = geometry.dilation[axis];
    args.pad_begin[axis] = geometry.pad_begin[axis];
  }
  args.group_channels = depthwise_group_channels(problem);
  // Prefetching the next rows in software ran the benchmark's channels-last
  // depthwise layers 1.3-1.55 times as fast on an AMD EPYC (Zen 4: MobileNetV2
  // in f32, bf16 and f16; stride 2 1.2-1.3, ConvNeXt 1.0-1.1; 2 threads,
  // interleaved) and the channels-first ones 1.23-1.61 times in f32 and
  // 0.94-1.29 times in f16/bf16 (1.05-1.1 on average over six runs; rows of a
  // line or two); on a Sapphire Rapids the f32 channels-last layer ran
  // 0.94-1.0 times as fast, and on a Zen 3 prefetching measured slower. Those
  // prefetches went out at once before a block's tiles. On an Intel Xeon
  // (Cascade Lake, 2026-11-27), spread over the tiles' loops (PrefetchQueue),
  // they ran the channels-first layers 1.02-1.75 times as fast as none
  // (MobileNetV2 1.3-1.75 in f32, 1.16-1.36 in bf16/f16) and 1.0-1.3 times as
  // fast as all at once, ConvNeXt's channels-last ones 1.03-1.18 times and
  // MobileNetV2's channels-last ones 0.91-1.05 times (three runs). So spread,
  // on the Zen 3 (2026-12-01, two runs, the order of the two swapped):
  // MobileNetV2's 3x3 layer 1.21-1.50 times as fast channels-last and
  // 1.58-1.73 channels-first, its stride-2 layer 1.0-1.5 and 1.2-1.63,
  // ConvNeXt's 0.98-1.22 and 1.07-1.24. On an AMX CPU of 65 GB/s (Intel
  // Xeon, family 6 model 207, 2026-12-05, 2 threads, interleaved in one
  // process and in alternated processes), channels-last layers without a
  // stride ran 0.98-1.27 times as fast (MobileNetV2's 3x3 layer 1.04x in f32,
  // 1.12-1.2x in bf16, 1.08x in f16; ConvNeXt's 7x7 1.27x in f32, 1.06x in
  // bf16/f16; 3x3, 5x5 and 7x7 on 7x7 to 56x56 maps 1.0-1.22x, grouped 3x3
  // layers 1.0-1.04x, 32 channels on 112x112 0.98-1.0x), while its stride-2
  // layer ran 0.92-0.93x and channels-first data through the transposing
  // kernel 0.96-0.98x (ConvNeXt's).
  const CpuCalibration calibration = cpu_calibration();
  const auto dtype = problem.input.scalar_type();
  const int64_t row_taps = geometry.kernel[2], row_windows = geometry.out[2];
  const bool channels_last_data = args.input_strides[1] == 1 && args.grad_output_strides[1] == 1;
  args.prefetch_next_rows =
      calibration != CpuCalibration::Avx512Amx || (channels_last_data && !geometry.strided());
  // Channels-last input rows read in place at stride 2 along the row, only
  // their border windows' pixels staged, against staging them whole (AMD
  // EPYC, Zen 3, 2026-12-05, 2 threads, switched in one build, interleaved
  // in one process, two runs): MobileNetV2's stride-2 layer 1.09-1.17 times as
  // fast in f32, 1.15-1.41 in bf16 and 1.40-1.63 in f16. At stride 1 the
  // tiles' loads, a cache line a pixel, ran 0.49-0.95 times as fast
  // (MobileNetV2's 3x3 layer and ConvNeXt's 7x7). On an AMX CPU (Intel
  // Xeon, family 6 model 207, 2026-12-05, the same way, one run): bf16 and
  // f16 rows of 3 taps at stride 2 ran 1.08-1.25 times as fast on 56x56 and
  // 112x112 maps (MobileNetV2's stride-2 layer 1.08x in bf16, 1.14x in f16)
  // and 1.0-1.04 on 28x28, 0.96-0.97 on 14x14 and 0.70-0.79 with 5 or 7 taps
  // along the row; f32 0.86-1.19 (MobileNetV2's layer 1.19x, 112x112 maps
  // 0.88x). It reads them in place there on bf16 and f16 rows of 3 taps and
  // 28 windows or more.
  const bool amx_rows_in_place =
      calibration == CpuCalibration::Avx512Amx && dtype != at::kFloat && row_taps == 3 && row_windows >= 28;
  args.strided_rows_in_place = calibration == CpuCalibration::Avx2 || amx_rows_in_place;
  // Channels-first planes of f32, bf16 and f16 on float row tiles
  // (channels_first's float_rows), against the channels-last kernel's
  // transposition. Where AVX-512 has no bf16 products (Intel Xeon, Cascade
  // Lake, 2 threads, interleaved in one process, two runs): MobileNetV2's 3x3
  // layer (N=16, 144 channels, 56x56) 1.40-1.54 times as fast in f32 and
  // 1.62-1.71 in bf16/f16, its stride-2 layer 1.26-1.41, ConvNeXt's 7x7 layer
  // (N=8, 96 channels) 1.07-1.14. On an AMX CPU (2026-11-28, 2 threads,
  // interleaved, two runs), against the transposition and, in bf16, the
  // dot-product planes below: 3 taps along the row 1.3-3.9 times as fast
  // (MobileNetV2 at 56x56 1.36-1.45 in f32, 1.40-1.42 in f16, 1.56-1.64 in
  // bf16, stride 2 0.99-1.35; 112x112 to 7x7 maps and a 1-D layer alike, but
  // f32 at 7x7 0.99); 5 and 7 taps 1.3-2.7 times on rows of 14 windows and, in
  // bf16/f16, 1.06-1.51 on rows of 28, while f32 rows of 28 windows or stride 2
  // ran 0.87-0.97 times and ConvNeXt's rows of 56 0.87 times, which stay on the
  // channels-last kernel. On the Zen 3 (AVX2's tiles, 8 windows a step, rows
  // staged; 2026-12-02, 2 threads, N=16, alternating builds by process, two
  // runs, medians; fastest calls), 3 taps at stride 1: MobileNetV2's layer
  // (144 channels, 56x56) 1.39x; 1.34x in f32, 1.32x; 1.73x in bf16, 1.88x;
  // 1.94x in f16; on 28x28 1.61-2.10x; 1.41-1.75x, 14x14 and 7x7 maps in f32
  // 1.65-1.71x, in bf16/f16 1.17-1.36x; 5x5 kernels 1.16-1.35x in f32 but
  // 0.97-1.56x in bf16/f16. At stride 2: rows of 14 and 7 windows 1.10-1.56x;
  // of 28 in bf16 1.26-1.39x, but in f16 1.01-1.11x; 0.88-1.05x and in f32
  // 0.86-0.99x; 0.76-0.88x; of 56, in f32 1.06-1.15x, in bf16/f16 0.69-0.97x.
  // ConvNeXt's 7x7 layer ran 0.64-0.76x (one row of taps a tile in 16
  // registers). Those that did not win stay on the transposition. With the
  // stride-2 rows staged in whole vectors (RowLayout::stage_row; 2026-12-02,
  // switched in one build, interleaved in one process, medians of four runs),
  // MobileNetV2's stride-2 layer (rows of 28) ran 1.13-1.32 times as fast in
  // f16, but 0.86-1.16 in f32, and rows of 56 (112x112 maps, three runs)
  // 0.84-1.09 in all three dtypes: those stay on the transposition. On an
  // AMD EPYC (Zen 5, 2026-12-02, 2 threads, switched in one build,
  // interleaved in one process), against the transposition and, in bf16 at
  // stride 1, the dot-product planes below: 3 taps along the row 1.2-2.1
  // times as fast (MobileNetV2's layer at 56x56 1.9 in f32 and f16, 1.2 in
  // bf16; its stride-2 layer 1.5-1.95; 112x112 to 7x7 maps 1.19-4.7), 5 taps
  // 1.3-3.5 in bf16/f16 but 0.81-0.97 in f32, 7 taps 1.0-1.33 in f32 and on
  // rows of up to 28 windows 1.05-2.45 in bf16/f16, where ConvNeXt's rows of
  // 56 ran 0.72-0.9 times and stay there. On an AMD EPYC (Zen 4, 2026-12-04,
  // 2 threads, switched in one build, interleaved in one process, two runs)
  // against the same: 3 taps along the row 1.17-6.0 times as fast in every
  // dtype and stride (MobileNetV2's layer 1.87-1.96 in f32, 1.20 in bf16,
  // 1.93-2.14 in f16, its stride-2 layer 1.56-2.48; 112x112 to 7x7 maps and a
  // 1-D layer alike); 5 and 7 taps at stride 1 on rows of up to 28 windows
  // 1.06-3.96, and in f32 on rows of 56 (5x5 1.25-1.32, ConvNeXt 1.07-1.16),
  // where bf16 rows of 56 ran 0.73-0.92 (the window pairs below win) and f16
  // 0.98-1.03; 5 taps at stride 2 ran 0.79-1.02 and stay there.
  const bool avx2_rows_win =
      geometry.stride[2] == 1 ? row_taps == 3 || (row_taps == 5 && dtype == at::kFloat)
                              : row_taps == 3 && (row_windows <= 14 || (row_windows <= 28 && dtype != at::kFloat));
  const bool float_rows_win =
      calibration == CpuCalibration::Avx512 ||
      (calibration == CpuCalibration::Avx2 && cpu_runs_avx2_kernels() && avx2_rows_win) ||
      (calibration == CpuCalibration::Avx512Amx &&
       (row_taps == 3 ||
        (row_windows <= 32 && (dtype != at::kFloat || (row_windows <= 16 && geometry.stride[2] == 1))))) ||
      (calibration == CpuCalibration::Avx512Bf16Wide &&
       (row_taps == 3 || (dtype == at::kFloat ? row_taps == 7 : row_taps == 5 || row_windows <= 28))) ||
      (calibration == CpuCalibration::Avx512Bf16 &&
       (row_taps == 3 || (geometry.stride[2] == 1 && (row_windows <= 28 || dtype == at::kFloat))));
  args.float_rows = float_rows_win && dtype != at::kDouble && args.group_channels == 1 &&
                    kernel::float_row_taps(row_taps) && geometry.stride[2] <= 2 && geometry.dilation[2] == 1 &&
                    args.input_strides[1] != 1 && args.grad_output_strides[1] != 1 &&
                    args.grad_output_strides[4] == 1;
  // Depthwise channels-first planes on AVX512_BF16 dot products, output row
  // by output row, where the channels-last kernel would transpose them:
  // against that, MobileNetV2's 3x3 layers (N=16, stride 1) ran 1.37-1.59
  // times as fast at 56x56 (144 channels), 1.39-1.63 at 112x112 and 28x28,
  // 1.71-1.83 at 14x14 and 1.09-1.19 at 7x7 (Zen 4, 2 threads,
  // interleaved). With stride 2 along the row they ran 0.83-1.18 times as
  // fast, and with 7 taps along it 0.77 times, and stay there.
  // bf16 rows read in place on the float row tiles, loaded as pairs of
  // elements (depthwise_kernel.h, bf16_pair_steps, on the rows that
  // pair_steps_fit) rather than 16 elements a tap: on the Zen 4 (2026-12-04,
  // 2 threads, switched in one build, interleaved in one process, two or
  // three runs, medians and fastest calls), 3x3 layers ran 1.04-1.12 times as
  // fast on rows of 56 windows (MobileNetV2's layer), 1.09-1.19 on rows of 28
  // and a 1-D layer of 4000 windows 1.16-1.26; rows of 14 ran 0.82 and of 112
  // 0.90-0.96 times as fast, and stay on 16 elements a tap. On an AMX CPU
  // (Intel Xeon, family 6 model 207, 2026-12-05, the same way): 56x56 maps
  // 1.22x (MobileNetV2's layer), 28x28 1.36x, 64x64 1.21x, the 1-D layer
  // 1.07x; rows of 14, 112 and 7 and 7x7 kernels, which pair_steps_fit or
  // the tiles leave on 16 elements a tap, 0.99-1.0x.
  args.bf16_pair_loads = calibration == CpuCalibration::Avx512Bf16 || calibration == CpuCalibration::Avx512Amx;
  // Whole planes in the channels-last kernel (channels_last_planes: one tile
  // call a block's rows of taps over all its output rows) against row by row,
  // on the Zen 3 (2026-12-05, 2 threads, N=8, switched in one build,
  // interleaved in one process, one to three runs): channels-last rows of 7 to
  // 14 windows 1.19-1.59 times as fast with 3x3 kernels (12x12 maps in f32
  // 0.93-0.97), 1.70-1.89 with 5x5 and 1.60-2.12 with 7x7; rows of 20 0.80-1.06
  // and of 28 and 56 0.70-0.96 times. Channels-first data, which the kernel
  // transposes as it stages it (the f32, bf16 and f16 layers whose rows of 3
  // taps, and 5 in f32, go to the float row tiles aside), with 5 or 7 taps
  // along the row: 7x7 maps to 56x56 1.02-2.20 times as fast (ConvNeXt's
  // 56x56 layer 1.02-1.47 in f32, 1.09-1.72 in bf16, 1.13 in f16), 112x112
  // 0.97-1.11. Not measured on AVX-512.
  args.whole_planes = calibration == CpuCalibration::Avx2 && kernel::runs_as_planes(args) &&
                      (row_windows <= 14 || (!channels_last_data && row_taps >= 5 && row_windows <= 56));
  const bool bf16_products = dtype == at::kBFloat16 && cpu_has_avx512_bf16();
  args.bf16_planes = !args.float_rows && bf16_products && cpu_is_avx512() && kernel::AVX512::bf16_planes_built() &&
                     row_taps < 5 && geometry.stride[2] == 1 && args.group_channels == 1 &&
                     args.input_strides[1] != 1 && args.grad_output_strides[1] != 1 &&
                     args.grad_output_strides[4] == 1;
  // Elsewhere, pairs of windows on the same products, for 3 taps or more
  // along the row, against the float tiles (Zen 4, 2 threads, interleaved,
  // pairs staged straight from the data where they can be): ConvNeXt's 7x7
  // layer 1.25-1.44 times as fast channels-last and 1.27-1.3 times
  // channels-first before that staging (which adds 1.1-1.15), channels-last
  // 3x3 layers 0.95-1.38 times (MobileNetV2's at 56x56 1.17-1.2, 14x14
  // layers 0.95-1.01), 4-wide 1.13-1.24; 2-wide 0.98-1.10 times, so those
  // stay on the float tiles. On an AMX CPU the float tiles were the faster
  // (2026-11-28, 2 threads, interleaved, two runs): bf16 channels-last layers
  // 1.16-1.75 times as fast as on the pairs (MobileNetV2 at 56x56 1.32-1.35,
  // ConvNeXt 1.36-1.37, 14x14 maps 1.16-1.21, 112x112 1.30-1.31, 1-D 1.75;
  // stride 2 0.99-1.08), ConvNeXt channels-first 1.28-1.31.
  // On the Zen 5 (2026-12-02, switched in one build, interleaved) the float
  // tiles ran channels-last bf16 layers with 3 taps along the row 1.2-1.42
  // times as fast as the pairs (MobileNetV2's at 56x56 1.22-1.26, 112x112 to
  // 14x14 maps; 7x7 maps and its stride-2 layer 0.97-1.02), 5 taps 1.14-1.21,
  // 7 taps on rows of up to 28 windows 0.95-1.36, but ConvNeXt's rows of 56
  // 0.85-0.88 (channels-first, transposed, 0.8-0.82). So too on the Zen 4
  // now (2026-12-04, switched in one build, interleaved in one process,
  // channels-last, one or two runs): 3 taps along the row 1.07-2.1 times as
  // fast on the float tiles (MobileNetV2's layer at 56x56 1.07-1.35, 112x112
  // to 14x14 maps 1.15-1.32, a 1-D layer 1.68-2.1), 5 taps on rows of 28
  // 1.06-1.12 and 7 taps on rows of 14 1.05-1.06; the pairs ran 7 taps on
  // rows of 28 0.96-1.14 times as fast (two runs), 5x5 on rows of 56 1.1-1.22
  // and ConvNeXt 1.25-1.36 (one run each).
  const bool zen4_pairs_win = row_taps >= 7 ? row_windows > 14 : row_taps >= 5 && row_windows > 28;
  const bool pairs_win = calibration == CpuCalibration::Avx512Bf16Wide ? row_taps >= 7 && row_windows > 28
                         : calibration == CpuCalibration::Avx512Bf16   ? zen4_pairs_win
                                                                       : calibration != CpuCalibration::Avx512Amx &&
                                                                             row_taps >= 3;
  args.bf16_pairs = bf16_products && pairs_win && !args.bf16_planes;
  args.dense_planes = spatial_flattens(geometry.in, geometry.input_strides) &&
                      spatial_flattens(geometry.out, geometry.grad_output_strides);
  return args;
}

// Tasks a thread, at least, where samples can be split further (below).
constexpr int64_t kTasksPerThread = 4;

at::Tensor run_depthwise_tasks(const Problem& problem, const Geometry& geometry, const kernel::Args& args,
                               DepthwiseKernel kernel_fn, int64_t block_channels, int64_t line_channels) {
  const int64_t samples = geometry.batch;
  const int64_t channels = geometry.in_channels;
  // Each output channel's weights: its group's input channels times the taps.
  const int64_t weights = depthwise_group_channels(problem) * geometry.taps();
  const auto acc_dtype = accumulation_dtype(problem.input.scalar_type());
  const auto acc_options = problem.input.options().dtype(acc_dtype);

  const bool no_windows = geometry.out[0] == 0 || geometry.out[1] == 0 || geometry.out[2] == 0;
  at::Tensor partials;  // (sample groups, channels, weights)
  if (samples == 0 || channels == 0 || no_windows) {
    partials = at::zeros({1, channels, weights}, acc_options);
  } else {
    // Samples are split into groups, each summing into its own partial
    // result, which are then added in a fixed order: deterministic for a
    // given thread count. One group a thread, and with fewer samples than
    // threads, channels are split too; where that leaves fewer than
    // kTasksPerThread tasks a thread (channels-last data), more groups, up
    // to one a sample, so that a faster core can take more of them. With
    // another process busy on one of the two cores, that ran MobileNetV2's
    // and ConvNeXt's channels-last layers 1.08-2.5x as fast in f32 and bf16
    // (once 0.71x, 1.8x when measured again); with no load 0.94-1.06x
    // (the stride-2 f32 layer 1.22-1.28x once, with the cores at unequal
    // speeds) (Zen 3, 2 threads, interleaved in one process).
    const int64_t threads = at::get_num_threads();
    int64_t sample_groups = std::min(samples, threads);
    const int64_t wanted_blocks = (threads + sample_groups - 1) / sample_groups;
    if (block_channels == 0) block_channels = round_up((channels + wanted_blocks - 1) / wanted_blocks, line_channels);
    const int64_t channel_blocks = (channels + block_channels - 1) / block_channels;
    if (sample_groups * channel_blocks < kTasksPerThread * threads)
      sample_groups = std::min(samples, (kTasksPerThread * threads + channel_blocks - 1) / channel_blocks);

    partials = at::empty({sample_groups, channels, weights}, acc_options);
    auto* partials_data = static_cast<char*>(partials.mutable_data_ptr());
    const int64_t acc_size = partials.element_size();
    // Taken a task at a time (tasks.h): channels-first data's tasks, a
    // vector of channels each, outnumber the threads. Against fixed shares,
    // with another process busy on one of the two cores, MobileNetV2's
    // stride-2 and ConvNeXt's channels-first f32 layers ran 1.11-1.14x as
    // fast and the others 0.98-1.06x; without it, 0.93-1.17x in two runs
    // (Zen 3, 2 threads, interleaved in one process).
    run_tasks(sample_groups * channel_blocks, [&](int64_t task) {
      const int64_t group = task / channel_blocks;
      const int64_t channel_begin = task % channel_blocks * block_channels;
      const int64_t channel_end = std::min(channels, channel_begin + block_channels);
      kernel_fn(args, group * samples / sample_groups, (group + 1) * samples / sample_groups, channel_begin,
                channel_end, partials_data + ((group * channels + channel_begin) * weights) * acc_size);
    });
  }

  std::vector<int64_t> shape{partials.size(0)};  // (sample groups, O, C/g, K...)
  for (const auto& size : problem.canonical_shape()) shape.push_back(size.expect_int());
  return problem.finish_sum(partials.view(shape));
}

namespace {

bool supports(const Problem& problem) {
  const at::Tensor& input = problem.input;
  // Only real CPU tensors reach here: their sizes are concrete (the selector
  // has already read them as integers).
  if (!input.device().is_cpu() || input.layout() != at::kStrided) return false;
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16) return false;
  return problem.spatial_rank() >= 1 && problem.spatial_rank() <= 3 && depthwise_group_channels(problem) > 0;
}

// Channels in lanes when both tensors have channel stride 1, unless the last
// spatial axis is unit-stride too (C == 1, or a single pixel per row). Also
// for depthwise channels-first data with unit-stride rows and a vector of
// channels or more, which the channels-last kernel transposes as it stages
// it: its tiles load aligned vectors and share each between taps, where the
// channels-first tiles load every tap's vector unaligned. Measured against
// the channels-first kernel (2 threads, f32 and bf16): MobileNetV2 3x3
// 1.1-1.3x, stride 2 1.1-1.7x, on 14x14 and 7x7 maps 1.3-2.5x; ConvNeXt 7x7
// 1.2-1.8x.
bool use_channels_last(const kernel::Args& args, int64_t channels, int64_t lanes) {
  const bool channels_unit = args.input_strides[1] == 1 && args.grad_output_strides[1] == 1;
  const bool rows_unit = args.input_strides[4] == 1 && args.grad_output_strides[4] == 1;
  if (channels_unit) return !rows_unit;
  return args.group_channels == 1 && rows_unit && channels >= lanes;
}

// Whether run() gives the problem to the channels-last kernel, else to the
// channels-first one. bf16 planes on dot products (Args::bf16_planes) and
// planes on float row tiles (Args::float_rows) run faster still in the
// channels-first kernel, a sample group's planes in order.
bool runs_channels_last(const kernel::Args& args, int64_t channels, int64_t lanes) {
  return !args.bf16_planes && !args.float_rows && use_channels_last(args, channels, lanes);
}

double cost(const Problem& problem, const Geometry& g) {
  const double windows = static_cast<double>(g.out[2]);
  double macs_per_second = kGroupedMacsPerSecond * windows / (windows + 8);
  if (depthwise_group_channels(problem) == 1) {
    const kernel::Args args = depthwise_args(problem, g);
    const bool planes =
        args.whole_planes && runs_channels_last(args, g.in_channels, lanes_of(problem.input.scalar_type()));
    macs_per_second = planes ? planes_macs_per_second(g) : depthwise_macs_per_second(windows);
  }
  return kOverheadSeconds +
         std::max(g.data_bytes(problem.input.element_size()) / bytes_per_second(), g.macs() / macs_per_second);
}

// A kernel build: its entry points and its vector's float32 lanes (half as
// many float64).
struct Build {
  DepthwiseKernel channels_last, channels_first;
  int64_t float_lanes;
  int64_t lanes(at::ScalarType dtype) const { return dtype == at::kDouble ? float_lanes / 2 : float_lanes; }
};
const Build kAvx512{kernel::AVX512::channels_last, kernel::AVX512::channels_first, 16};
const Build kAvx2{kernel::AVX2::channels_last, kernel::AVX2::channels_first, 8};
const Build kPortable{kernel::DEFAULT::channels_last, kernel::DEFAULT::channels_first, 8};

// The build for this CPU and problem. Measured on an Intel Xeon (Sapphire
// Rapids), 2 threads, against the AVX2 build: the AVX-512 build's
// channels-last kernel ran depthwise layers 1.2-1.6x as fast (ConvNeXt 7x7,
// MobileNetV2 3x3, f32, bf16 and f16, both layouts) and groups of 2 and 4
// channels 1.3-1.6x, but groups that fill the AVX2 build's vector (8 f32
// channels), which that build broadcasts lane by lane, at 0.8x, and its
// channels-first kernel at 0.5-0.9x. Planes on bf16 dot products or float
// row tiles (Args::bf16_planes, Args::float_rows: set only where the CPU
// runs the AVX2 kernels) take the AVX-512 build's wherever the CPU has it.
const Build& build_for(const kernel::Args& args, int64_t channels, at::ScalarType dtype) {
  if (!cpu_runs_avx2_kernels()) return kPortable;
  const bool planes = args.bf16_planes || args.float_rows;
  if (cpu_is_avx512() && (planes || (use_channels_last(args, channels, kAvx512.lanes(dtype)) &&
                                     args.group_channels != kAvx2.lanes(dtype))))
    return kAvx512;
  return kAvx2;
}

at::Tensor run(const Problem& problem) {
  const Geometry geometry = geometry_of(problem);
  const kernel::Args args = depthwise_args(problem, geometry);
  const int64_t channels = geometry.in_channels;
  const Build& build = build_for(args, channels, problem.input.scalar_type());
  const int64_t lanes = build.lanes(problem.input.scalar_type());
  const bool channels_last = runs_channels_last(args, channels, lanes);
  const bool transposes = channels_last && (args.input_strides[1] != 1 || args.grad_output_strides[1] != 1);
  // Channels-first data the channels-last kernel transposes goes one vector
  // of channels a task, so that a thread reads a few planes at a time rather
  // than a row of every plane (1.5x on MobileNetV2 3x3 against whole sample
  // groups); otherwise blocks of whole cache lines.
  const int64_t line_channels = channels_last ? 64 / problem.input.element_size() : 1;
  return run_depthwise_tasks(problem, geometry, args, channels_last ? build.channels_last : build.channels_first,
                             transposes ? lanes : 0, line_channels);
}

}  // namespace

const Algorithm kDepthwiseAlgorithm{"depthwise", supports, cost, run};

}  // namespace torch_convgrad
