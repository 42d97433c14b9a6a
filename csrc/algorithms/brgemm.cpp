// bf16 (and f16, below) weight gradients through ATen's batch-reduce GEMM
// (at::native::cpublas::brgemm, oneDNN's brgemm ukernel), accumulating in
// float32: on AMX tiles where the CPU has them, else on AVX-512 BF16's dot
// products. Per kernel tap and sample,
//
//     C[tap] (M x N) += A (M x K) @ B[tap] (K x N),   K = the output's positions,
//
// where A is one operand read in place, rows of K contiguous elements (NCX
// data: the output gradient, or the input of a 1x1 stride-1 unpadded layer),
// and B is the other, gathered per tap (zero where a window reads padding)
// and packed in pairs of K (VNNI) by a 32-bit transposition, panel by panel.
// A is the operand with more channels where either could be, since B is the
// one copied. oneDNN's own bf16 weight gradient on channels-first data ran at
// 105-305 GMAC/s on the benchmark's 1x1 layers, this at 400-610 (Sapphire
// Rapids, 2 cores). Channels-last 1x1 layers, which have no such rows, and
// layers whose windows along the last axis fold into B's rows take the rows
// path (Rows, run_rows). On a Zen 4 (AVX-512 BF16, no AMX) the same products
// ran the benchmark's bf16 1-D and U-Net layers 1.55-2.45 times as fast as the
// best of oneDNN's convolution, its matmul and gemm, its channels-first 1x1
// layers 1.0-1.6 times and its channels-last ones 0.94-1.14 (cost, below).
//
// f16 runs on the same products: each element splits exactly into a high and
// a low bf16 (split_half), and one product over three times K sums high *
// high + high * low + low * high, every term exact in float32
// (SplitOperands); only low * low, below 2^-16 of a product, is left out. On
// Sapphire Rapids, which has no AMX-FP16, that ran the benchmark's f16 1x1,
// transposed 2x2 and 1-D layers 1.25-2.05 times faster than gemm's float32
// products.
#include "algorithm.h"
#include "scratch.h"
#include "tap_gemm.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace torch_convgrad {
namespace {

// Which operand is A, the one read in place (`supported` false where neither
// can be), and the channels of A (C's rows) and B (its columns).
struct Roles {
  bool supported = false;
  bool a_is_grad_output = false;
  int64_t a_channels = 0, b_channels = 0;
};

// Whether the one tap reads the whole input, position for position (1x1,
// stride 1, unpadded).
bool one_to_one(const Geometry& g) {
  bool whole = g.taps() == 1;
  for (int64_t axis = 0; axis < 3; ++axis)
    whole &= g.stride[axis] == 1 && g.pad_begin[axis] == 0 && g.in[axis] == g.out[axis];
  return whole;
}

// ... through unit-stride flattened spatial axes.
bool input_read_whole(const Geometry& g) { return one_to_one(g) && spatial_flattens(g.in, g.input_strides); }

// The row stride of a (N, C, X0, X1, X2) tensor with these sizes and strides
// (Geometry's) read as one (N * X0 * X1 * X2) x C matrix of rows with
// unit-stride channels, as channels-last data is; 0 where it is not one.
int64_t row_stride(int64_t batch, int64_t channels, const int64_t (&spatial)[3], const int64_t (&strides)[5]) {
  if (channels > 1 && strides[1] != 1) return 0;
  const int64_t sizes[4] = {batch, spatial[0], spatial[1], spatial[2]};
  const int64_t dims[4] = {0, 2, 3, 4};
  int64_t ld = 0, next = 0;  // the innermost row axis's stride, and the next one's expected
  for (int64_t i = 3; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (ld == 0) ld = next = strides[dims[i]];
    if (strides[dims[i]] != next) return 0;
    next *= sizes[i];
  }
  if (ld == 0) ld = channels;  // one row
  return ld >= channels ? ld : 0;
}

// The rows path, for layers whose operands have no rows of contiguous
// positions (channels-last data) or whose taps fold into B's rows:
//
//     C[t] (m x n) += A (m x k) @ B[t] (k x n) for every sample and outer tap t,
//
// where B[t]'s k rows of n elements lie anywhere (pairs of them are
// interleaved through a list of their addresses), in place or, for a
// channels-first input, in a channels-last copy of the sample; A is read in
// place as m rows of k contiguous elements, or transposed panel by panel
// from k rows of m channels (f16: always copied, split).
//   - A channels-last 1x1, stride-1, unpadded layer: both operands are
//     (samples x positions) x channels rows, one sample; the one with fewer
//     channels is A.
//   - A layer whose windows along the last axis read no padding, dilation 1
//     (an audio front end, a transposed convolution whose kernel equals its
//     stride, a strided 1x1 layer): the window of output position (j0, j1,
//     j2) and taps (t0, t1) reads input pixels (j0 * s0 + t0 * d0 - p0, j1 *
//     s1 + t1 * d1 - p1, [j2 * s2, j2 * s2 + K2)), K2 * C contiguous elements
//     of channels-last data: B[t]'s row for that position (zeros where the
//     pixel lies in the padding of the first two axes). The taps of the last
//     axis fold into one product, a column block of C[t] = grad_output^T (O x
//     Y) @ B[t] each; the outer taps (t0, t1) are K0 * K1 products sharing A.
struct Rows {
  bool supported = false;
  bool a_is_grad_output = false;
  bool a_transposed = true;  // A as k rows of m channels (else m rows of k)
  bool b_staged = false;     // B from a channels-last copy of a channels-first input
  bool windows = false;      // B's rows are windows (else position r's row is r * b_ld in)
  int64_t folded_taps = 1;   // taps along the last axis side by side in B's rows
  int64_t outer_taps = 1;    // taps along the other axes: a product each
  int64_t samples = 1, k = 0, m = 0, n = 0;
  int64_t a_ld = 0, a_sample = 0, b_ld = 0, b_sample = 0;
  int64_t b_pixel[3] = {0, 0, 0};  // windows: elements between B's input pixels along each axis
};

Rows rows_of(const Geometry& g) {
  Rows rows;
  const int64_t* xs = g.input_strides;
  const int64_t* dys = g.grad_output_strides;
  if (one_to_one(g)) {
    const int64_t x_ld = row_stride(g.batch, g.in_channels, g.in, g.input_strides);
    const int64_t dy_ld = row_stride(g.batch, g.out_channels, g.out, g.grad_output_strides);
    rows.supported = x_ld > 0 && dy_ld > 0;
    rows.a_is_grad_output = g.out_channels < g.in_channels;
    rows.k = g.batch * g.out_positions();
    rows.m = rows.a_is_grad_output ? g.out_channels : g.in_channels;
    rows.n = rows.a_is_grad_output ? g.in_channels : g.out_channels;
    rows.a_ld = rows.a_is_grad_output ? dy_ld : x_ld;
    rows.b_ld = rows.a_is_grad_output ? x_ld : dy_ld;
    return rows;
  }
  const bool contiguous_windows = g.dilation[2] == 1 && g.pad_begin[2] == 0 &&
                                  (g.out[2] - 1) * g.stride[2] + g.kernel[2] <= g.in[2];
  const bool x_pixels = xs[1] == 1 && (g.in[2] == 1 || xs[4] == g.in_channels);  // channels-last, pixels adjacent
  const bool x_rows = spatial_flattens(g.in, g.input_strides);                     // channels-first
  const int64_t dy_pixel_stride = row_stride(1, g.out_channels, g.out, g.grad_output_strides);
  const bool dy_rows = spatial_flattens(g.out, g.grad_output_strides);
  if (!contiguous_windows || !(x_pixels || x_rows) || !(dy_pixel_stride > 0 || dy_rows)) return rows;
  rows.supported = true;
  rows.a_is_grad_output = true;
  rows.a_transposed = !dy_rows;
  rows.b_staged = !x_pixels;
  rows.windows = true;
  rows.folded_taps = g.kernel[2];
  rows.outer_taps = g.kernel[0] * g.kernel[1];
  rows.samples = g.batch;
  rows.k = g.out_positions();
  rows.m = g.out_channels;
  rows.n = g.kernel[2] * g.in_channels;
  rows.a_ld = dy_rows ? dys[1] : dy_pixel_stride;
  rows.a_sample = dys[0];
  rows.b_sample = rows.b_staged ? 0 : xs[0];
  for (int64_t axis = 0; axis < 3; ++axis)  // a staged sample's pixels are (X0, X1, X2) rows of C
    rows.b_pixel[axis] = rows.b_staged ? (axis < 1 ? g.in[1] : 1) * (axis < 2 ? g.in[2] : 1) * g.in_channels
                                       : xs[2 + axis];
  return rows;
}

Roles roles_of(const Geometry& g) {
  const bool grad_output_in_place = spatial_flattens(g.out, g.grad_output_strides);
  const bool input_in_place = input_read_whole(g);
  Roles roles;
  roles.supported = grad_output_in_place || input_in_place;
  roles.a_is_grad_output = grad_output_in_place && (!input_in_place || g.out_channels >= g.in_channels);
  roles.a_channels = roles.a_is_grad_output ? g.out_channels : g.in_channels;
  roles.b_channels = roles.a_is_grad_output ? g.in_channels : g.out_channels;
  return roles;
}

bool supports(const Problem& problem) {
  if (!runs_brgemm_bf16(problem)) return false;
  const Geometry g = geometry_of(problem);
  return roles_of(g).supported || rows_of(g).supported;
}

// K columns a panel: its VNNI copy (K/2 x N pairs) stays in L2 next to A's
// rows. Panels of 512 to 4096 columns measured within noise of each other.
constexpr int64_t kPanelColumns = 2048;

// Whether B is gathered into a staging copy first: read in place it needs K
// contiguous, whole pairs in every channel's row and an even K.
bool b_needs_staging(const Geometry& g, const Roles& roles) {
  const int64_t positions = g.out_positions();
  const int64_t b_channel_stride = roles.a_is_grad_output ? g.input_strides[1] : g.grad_output_strides[1];
  const bool b_in_place =
      roles.a_is_grad_output ? input_read_whole(g) : spatial_flattens(g.out, g.grad_output_strides);
  return !(b_in_place && b_channel_stride % 2 == 0 && positions % 2 == 0);
}

// K rows a panel of the rows path: A's transposed panel and B's VNNI copy
// stay in L2.
constexpr int64_t kRowsPanel = 1024;

// Positions a panel, given bf16's: f16's (SplitOperands), whose K is three
// times that, take an eighth of them. On the benchmark's 1x1, transposed 2x2
// and 1-D layers, panels of a half, a third, a quarter, a sixth and an eighth
// of bf16's ran faster the smaller (strided 1x1 NXC: 3.3, 3.5, 2.7, 3.1 and
// 2.5 ms, and 4.2 with bf16's; noisy).
int64_t panel_positions(int64_t bf16_positions, bool half) { return half ? bf16_positions / 8 : bf16_positions; }

// f16 (SplitOperands): the split's bytes read and written a second, and the
// tiles' time against bf16's on the same layer.
constexpr double kSplitBytesPerSecond = 60e9;
constexpr double kSplitTileFactor = 2.0;

// Multiply-adds a second of the products from 64 channels a side
// (tile_width). AMX tiles: fitted on a Sapphire Rapids (roles_cost). AVX-512
// BF16's dot products, on a Zen 4 (2026-12-04, 2 threads, every layer of the
// benchmark but depthwise forced in one process): a third of that, 205 G,
// with the other terms as they are, put the 1x1, strided 1x1, U-Net and 1-D
// layers at 0.93-1.08 times their measured time (the channels-last 1x1 64 ->
// 256 layer at 0.74) and the channels-first 3x3, 4x4 and 3-D ones at
// 0.90-1.35. 0 where not measured, which leaves the algorithm to run only
// when forced: other calibrations (the Zen 5's whole 512-bit units), and f16
// on dot products, whose three products a split took 1.1-1.8 times gemm's
// float32 time on every layer of the Zen 4 that they take.
double product_macs_per_second(bool half) {
  switch (cpu_calibration()) {
    case CpuCalibration::Avx512Amx: return 620e9;
    case CpuCalibration::Avx512Bf16: return half ? 0 : 205e9;
    default: return 0;
  }
}

// Columns of B a block at most: its VNNI panel stays in L2.
constexpr int64_t kMaxBlockColumns = 512;

// How the rows path splits its work: into panels of rows (every sample's
// own), each over every outer tap and block of B's columns; or, with fewer
// panels than twice the threads, into a block of B's columns a thread (over
// every outer tap), each block transposing A's panels (and staging B's
// samples) again.
struct RowUnits {
  int64_t panel;  // K rows a panel
  int64_t panels_per_sample, panels, column_blocks, block_columns;
  bool split_columns;
  RowUnits(const Rows& rows, int64_t threads, bool half) {
    panel = panel_positions(kRowsPanel, half);
    panels_per_sample = ceil_div(rows.k, panel);
    panels = rows.samples * panels_per_sample;
    split_columns = panels < 2 * threads;
    const int64_t blocks = std::min(std::max(ceil_div(rows.n, kMaxBlockColumns), split_columns ? threads : 1),
                                    ceil_div(rows.n, 32));
    block_columns = ceil_div(ceil_div(rows.n, blocks), 32) * 32;
    column_blocks = ceil_div(rows.n, block_columns);
    split_columns = split_columns && column_blocks > 1;
  }
};

// A channels-first input's sample staged channels-last that L2 keeps while
// the panels read it back costs about what reading channels-last data in
// place does. Measured (2026-11-24, bf16, 2 threads), NCX against NXC: the
// U-Net layer's samples of 0.1 and 0.4 MB -0.03 and 0.00 ms, the 1-D layer's
// of 0.26 MB 0.01; samples of 1.0, 1.6 and 4.1 MB 0.12, 0.16 and 0.26 ms,
// about 20-30 GB/s of staged bytes.
constexpr double kStagedInL2Bytes = 512 * 1024;

// The rows path's seconds, fitted on the same machine to ResNet-50's 1x1
// layers and the 1-D layer (2026-11-24: 64 -> 256 on 56x56 in 0.77 ms,
// 1024 -> 256 on 14x14 in 0.82, the 1-D layer in 0.53 (NXC) and 0.68 (NCX),
// scaled by 1.23 to the day of the other constants, when oneDNN ran that
// much slower): the products (product_macs_per_second), A's transposition
// and B's interleaving at about 60 GB/s, a channels-first input's
// transposition at 20 where its sample outgrows kStagedInL2Bytes, and about
// 0.25 ms a MiB of float32 result.
double rows_cost(const Geometry& g, const Rows& rows, bool half) {
  const RowUnits units(rows, at::get_num_threads(), half);
  const double m = static_cast<double>(rows.m), n = static_cast<double>(rows.n);
  const double k = static_cast<double>(rows.samples) * rows.k;
  const double taps = static_cast<double>(rows.outer_taps);
  const double a_copies = units.split_columns ? units.column_blocks : 1;
  const double units_count = static_cast<double>(units.panels) * units.column_blocks * taps;
  const double operand_bytes = k * n * 2 * taps + (rows.a_transposed ? k * m * 2 * a_copies : 0);
  const double staged_sample = static_cast<double>(g.in[0] * g.in[1] * g.in[2] * g.in_channels * 2);
  const double staged_bytes =
      rows.b_staged && staged_sample > kStagedInL2Bytes ? rows.samples * staged_sample * a_copies : 0;
  const double split_bytes = half ? (k * m * a_copies + k * n * taps) * 8 : 0;
  const double seconds = 20e-6 +
                         g.macs() * (half ? kSplitTileFactor : 1) /
                             (product_macs_per_second(half) * tile_width(m) * tile_width(n)) +
                         units_count * m * units.block_columns * 8 / 120e9 + operand_bytes / 60e9 +
                         staged_bytes / 20e9 + split_bytes / kSplitBytesPerSecond + taps * m * n * 4 / 4e9;
  // Windows over more than one output row (U-Net's transposed 2x2 layer in
  // 0.48 ms both layouts, ResNet-50's strided 1x1 in 1.67 NXC and 1.89 NCX,
  // 2026-11-24) took 0.9-1.0 times these terms where the layers above took
  // 0.7-0.8: scaled by 1.23 likewise. On the Zen 4's dot products 1.1: there
  // the channels-last layers took 1.22-1.31 ms (U-Net) and 4.7-5.1 (stride-2
  // 1x1) in settled processes (2026-12-04), 0.86-0.94 times the estimate
  // with 1.23.
  const double windows_factor = cpu_calibration() == CpuCalibration::Avx512Bf16 ? 1.1 : 1.23;
  return rows.windows && g.out[0] * g.out[1] > 1 ? seconds * windows_factor : seconds;
}

// Estimated seconds, fitted with torch 2.13 on an Intel Xeon (Sapphire
// Rapids, AMX-BF16, 2 threads) to the benchmark's channels-first layers
// (2026-11-23): the tiles multiply at about 620 GMAC/s from 64 channels a
// side (product_macs_per_second); every unit (sample, tap) loads and stores
// its C once a panel, at L2 speed; B's 32-bit transposition copies at about
// 40 GB/s, and ATen's gather of a tap's window at about 20 GB/s with unit
// stride, half that with a stride, plus 4 ns a row.
double roles_cost(const Geometry& g, bool half) {
  const Roles roles = roles_of(g);
  const double positions = static_cast<double>(g.out_positions());
  const double m = static_cast<double>(roles.a_channels), n = static_cast<double>(roles.b_channels);
  const double units = static_cast<double>(g.batch) * g.taps();
  const double b_bytes = units * n * positions * 2;
  const double panels = std::ceil(positions / panel_positions(kPanelColumns, half));
  const double split_bytes = half ? units * (m + n) * positions * 8 : 0;
  double seconds = 20e-6 +
                   g.macs() * (half ? kSplitTileFactor : 1) /
                       (product_macs_per_second(half) * tile_width(m) * tile_width(n)) +
                   units * panels * m * n * 8 / 120e9 + b_bytes / 40e9 + split_bytes / kSplitBytesPerSecond;
  if (b_needs_staging(g, roles)) {
    const double rows = units * n * g.out[0] * g.out[1];
    seconds += b_bytes / 20e9 * (g.stride[2] == 1 ? 1 : 2) + rows * 4e-9;
  }
  return seconds;
}

// Whether the rows path runs: where it folds taps into B's rows (one copy
// of the input, not one a tap), where nothing else can, or where the models
// say it is faster.
bool prefers_rows(const Geometry& g, const Rows& rows, bool half) {
  return rows.supported &&
         (rows.folded_taps > 1 || !roles_of(g).supported || rows_cost(g, rows, half) < roles_cost(g, half));
}

double cost(const Problem& problem, const Geometry& g) {
  const bool half = problem.input.scalar_type() == at::kHalf;
  if (product_macs_per_second(half) == 0) return 1e30;
  const Rows rows = rows_of(g);
  return prefers_rows(g, rows, half) ? rows_cost(g, rows, half) : roles_cost(g, half);
}

#ifdef CPUBLAS_BRGEMM_BF16BF16F32
using at::BFloat16;

// B for sample n and tap (k0, k1, k2) into the first Y0 * Y1 * Y2 columns of
// `staged` (channels x an even count): the output gradient, or the input that
// the tap reads for every output position, zero where the window is in the
// padding.
void stage_b(const at::Tensor& x5, const at::Tensor& dy5, bool b_is_input, int64_t n, const int64_t (&tap)[3],
             const Geometry& g, const at::Tensor& staged) {
  const int64_t positions = g.out_positions();
  at::Tensor target = staged.narrow(1, 0, positions).view({staged.size(0), g.out[0], g.out[1], g.out[2]});
  if (!b_is_input) {
    target.copy_(dy5[n]);
    return;
  }
  at::Tensor source = x5[n];
  bool covers = true;
  for (int64_t axis = 0; axis < 3; ++axis) {
    const int64_t s = g.stride[axis], shift = tap[axis] * g.dilation[axis] - g.pad_begin[axis];
    // Windows j with 0 <= j * s + shift < in.
    const int64_t first = shift >= 0 ? 0 : (-shift + s - 1) / s;
    const int64_t end = std::min(g.out[axis], g.in[axis] - shift <= 0 ? 0 : (g.in[axis] - shift + s - 1) / s);
    if (end <= first) {
      staged.zero_();
      return;
    }
    covers &= first == 0 && end == g.out[axis];
    target = target.narrow(1 + axis, first, end - first);
    source = source.slice(1 + axis, first * s + shift, (end - 1) * s + shift + 1, s);
  }
  if (!covers) staged.zero_();
  target.copy_(source);
}

// c[row * ldc + column] += a[row * a_step] * b[column * b_step] for row < m,
// column < n: the product over a last K position left outside every pair,
// of bf16 or f16 (`half`) elements.
void add_last_position(bool half, int64_t m, int64_t n, const BFloat16* a, int64_t a_step, const BFloat16* b,
                       int64_t b_step, float* c, int64_t ldc) {
  const auto value = [half](const BFloat16* element) {
    return half ? static_cast<float>(c10::Half(element->x, c10::Half::from_bits())) : static_cast<float>(*element);
  };
  for (int64_t row = 0; row < m; ++row) {
    const float a_last = value(a + row * a_step);
    for (int64_t column = 0; column < n; ++column) c[row * ldc + column] += a_last * value(b + column * b_step);
  }
}

// f16 operands on the bf16 products (split_half): A's rows as [high | high |
// low] and B's VNNI panel as [high; low; high] along K, so that one product
// over three times K sums high * high + high * low + low * high, touching C
// once.
struct SplitOperands {
  std::atomic<bool>* non_finite;
  // m rows of k f16 elements, lda apart, into rows of 3 * k elements, ld
  // apart (`split` may be `rows` itself, with lda == ld).
  void split_rows(const BFloat16* rows, int64_t lda, int64_t m, int64_t k, BFloat16* split, int64_t ld) const {
    bool finite = true;
    for (int64_t row = 0; row < m; ++row) {
      auto* high = reinterpret_cast<uint16_t*>(split + row * ld);
      finite &= split_half(reinterpret_cast<const uint16_t*>(rows + row * lda), k, high, high + 2 * k);
      std::memcpy(high + k, high, k * sizeof(uint16_t));
    }
    if (!finite) non_finite->store(true, std::memory_order_relaxed);
  }
  // A VNNI panel of `count` f16 elements into 3 * count, in place.
  void split_panel(BFloat16* panel, int64_t count) const {
    auto* high = reinterpret_cast<uint16_t*>(panel);
    if (!split_half(high, count, high, high + count)) non_finite->store(true, std::memory_order_relaxed);
    std::memcpy(high + 2 * count, high, count * sizeof(uint16_t));
  }
};

// The addresses of B[tap]'s rows for positions [k0, k0 + k) of a sample
// (`b` is the sample's data, or its staged copy), `column` elements in.
void b_rows_of(const Geometry& g, const Rows& rows, const BFloat16* b, int64_t tap, int64_t k0, int64_t k,
               int64_t column, const BFloat16* zeros, const uint16_t** out) {
  if (!rows.windows) {
    for (int64_t r = 0; r < k; ++r) out[r] = reinterpret_cast<const uint16_t*>(b + (k0 + r) * rows.b_ld + column);
    return;
  }
  const int64_t t0 = tap / g.kernel[1], t1 = tap % g.kernel[1];
  // Output position k0 + r is (j0, j1, j2), counted up row by row.
  int64_t j2 = k0 % g.out[2], j1 = k0 / g.out[2] % g.out[1], j0 = k0 / g.out[2] / g.out[1];
  for (int64_t r = 0; r < k; ++r) {
    const int64_t x0 = j0 * g.stride[0] + t0 * g.dilation[0] - g.pad_begin[0];
    const int64_t x1 = j1 * g.stride[1] + t1 * g.dilation[1] - g.pad_begin[1];
    const bool padding = x0 < 0 || x0 >= g.in[0] || x1 < 0 || x1 >= g.in[1];
    out[r] = reinterpret_cast<const uint16_t*>(
        padding ? zeros
                : b + x0 * rows.b_pixel[0] + x1 * rows.b_pixel[1] + j2 * g.stride[2] * rows.b_pixel[2] + column);
    if (++j2 == g.out[2]) {
      j2 = 0;
      if (++j1 == g.out[1]) j1 = 0, ++j0;
    }
  }
}

at::Tensor run_rows(const Problem& problem, const Geometry& g, const Rows& rows) {
  const auto data = [](const at::Tensor& tensor) { return static_cast<const BFloat16*>(tensor.const_data_ptr()); };
  const BFloat16* a_source = data(rows.a_is_grad_output ? problem.grad_output : problem.input);
  const BFloat16* b_source = data(rows.a_is_grad_output ? problem.input : problem.grad_output);
  const bool half = problem.input.scalar_type() == at::kHalf;
  const int64_t m = rows.m, n = rows.n;
  const int64_t threads = at::get_num_threads();
  const RowUnits units(rows, threads, half);
  // Split columns: each block is one task over every panel, into the one
  // result. Split panels: each thread sums into its own partial result.
  ThreadPartials partials({rows.outer_taps, m, n}, problem.input.options(), /*shared=*/units.split_columns);
  // B's row where a window lies in the padding.
  const std::vector<BFloat16> zeros(units.block_columns, BFloat16(0.0f));
  // A channels-first input's sample as channels-last rows.
  const int64_t staged_pixels = rows.b_staged ? g.in[0] * g.in[1] * g.in[2] : 0;
  const int64_t tasks = units.split_columns ? units.column_blocks : units.panels;
  std::atomic<bool> non_finite{false};
  const SplitOperands split{&non_finite};
  const int64_t parts = half ? 3 : 1;  // K's copies (SplitOperands)
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    float* c = partials.take();
    const at::TensorOptions options = problem.input.options();
    const at::Tensor staged_a = scratch_tensor(ScratchSlot::StagedOperand, {m, parts * units.panel}, options);
    const at::Tensor panel =
        scratch_tensor(ScratchSlot::VnniPanel, {parts * units.panel / 2, units.block_columns, 2}, options);
    const at::Tensor staged_b = scratch_tensor(ScratchSlot::PackedInput, {staged_pixels, g.in_channels}, options);
    auto* staged_a_data = static_cast<BFloat16*>(staged_a.data_ptr());
    auto* panel_data = static_cast<BFloat16*>(panel.data_ptr());
    auto* staged_b_data = static_cast<BFloat16*>(staged_b.data_ptr());
    std::vector<const uint16_t*> b_rows(units.panel);
    int64_t staged_sample = -1;
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t first_panel = units.split_columns ? 0 : task;
      const int64_t end_panel = units.split_columns ? units.panels : task + 1;
      for (int64_t panel_index = first_panel; panel_index < end_panel; ++panel_index) {
        const int64_t sample = panel_index / units.panels_per_sample;
        const int64_t k0 = panel_index % units.panels_per_sample * units.panel;
        const int64_t k = std::min(units.panel, rows.k - k0), even = k / 2 * 2;
        if (rows.b_staged && sample != staged_sample) {
          transpose_to_rows(b_source + sample * g.input_strides[0], g.input_strides[1], staged_b_data,
                            g.in_channels, g.in_channels, staged_pixels, 2);
          staged_sample = sample;
        }
        const BFloat16* a = a_source + sample * rows.a_sample + k0 * (rows.a_transposed ? rows.a_ld : 1);
        const BFloat16* b = rows.b_staged ? staged_b_data : b_source + sample * rows.b_sample;
        // A as (m x K) rows for the products: in place, or this panel transposed
        // (and for f16 split).
        const BFloat16* a_rows = a;
        int64_t lda = rows.a_ld;
        if ((rows.a_transposed || half) && even > 0) {
          const int64_t ld = parts * units.panel;
          if (rows.a_transposed) transpose_to_rows(a, rows.a_ld, staged_a_data, ld, even, m, 2);
          if (half)
            split.split_rows(rows.a_transposed ? staged_a_data : a, rows.a_transposed ? ld : rows.a_ld, m, even,
                             staged_a_data, ld);
          a_rows = staged_a_data;
          lda = ld;
        }
        const int64_t first_block = units.split_columns ? task : 0;
        const int64_t end_block = units.split_columns ? task + 1 : units.column_blocks;
        for (int64_t tap = 0; tap < rows.outer_taps; ++tap)
          for (int64_t block = first_block; block < end_block; ++block) {
            const int64_t n0 = block * units.block_columns, columns = std::min(units.block_columns, n - n0);
            float* c_block = c + tap * m * n + n0;
            b_rows_of(g, rows, b, tap, k0, k, n0, zeros.data(), b_rows.data());
            if (even > 0) {
              interleave_row_pairs(b_rows.data(), reinterpret_cast<uint16_t*>(panel_data), columns, even / 2);
              if (half) split.split_panel(panel_data, even * columns);
              brgemm_bf16_blocks(m, columns, parts * even, lda, a_rows, panel_data, c_block, n);
            }
            if (k % 2 == 1)  // the last row, outside every pair
              add_last_position(half, m, columns, rows.a_transposed ? a + (k - 1) * rows.a_ld : a + k - 1,
                                rows.a_transposed ? 1 : rows.a_ld, reinterpret_cast<const BFloat16*>(b_rows[k - 1]),
                                1, c_block, n);
          }
      }
    }
    at::native::cpublas::brgemm_release();
  });
  // An infinity or NaN splits into a NaN low part (SplitOperands).
  if (non_finite) return kAtenAlgorithm.run(problem);
  // Per part (a thread's, or the one of split columns): products (outer taps, m, n).
  at::Tensor taps = partials.sums();  // (parts, 1 tap, C, O) where A is the input
  if (rows.a_is_grad_output)          // (parts, K0, K1, O, K2, C) -> (parts, K0, K1, K2, C, O)
    taps = taps.view({taps.size(0), g.kernel[0], g.kernel[1], g.out_channels, g.kernel[2], g.in_channels})
               .permute({0, 1, 2, 4, 5, 3});
  return problem.finish_sum(canonical_from_taps(taps, g, problem.spatial_rank()));
}

at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const Rows rows = rows_of(g);
  const bool half = problem.input.scalar_type() == at::kHalf;
  if (prefers_rows(g, rows, half)) return run_rows(problem, g, rows);
  const Roles roles = roles_of(g);
  const bool staging = b_needs_staging(g, roles);
  const at::Tensor x5 = lift(problem.input), dy5 = lift(problem.grad_output);
  const at::Tensor& a_operand = roles.a_is_grad_output ? dy5 : x5;
  const int64_t m = roles.a_channels, n_columns = roles.b_channels;
  const int64_t positions = g.out_positions();
  const int64_t even_positions = positions / 2 * 2;
  const int64_t taps = g.taps();
  const int64_t lda = a_operand.stride(1);

  const int64_t parts = half ? 3 : 1;  // K's copies (SplitOperands)
  const int64_t panel_columns = panel_positions(kPanelColumns, half);
  std::atomic<bool> non_finite{false};
  const SplitOperands split{&non_finite};
  ThreadPartials partials({taps, m, n_columns}, problem.input.options());
  const auto* a_data = static_cast<const BFloat16*>(a_operand.const_data_ptr());
  at::parallel_for(0, g.batch * taps, 1, [&](int64_t unit_begin, int64_t unit_end) {
    float* thread_c = partials.take();
    const at::TensorOptions options = problem.input.options();
    at::Tensor staged;
    if (staging)
      staged = scratch_tensor(ScratchSlot::StagedOperand, {n_columns, even_positions + (positions % 2) * 2}, options);
    const at::Tensor panel = scratch_tensor(ScratchSlot::VnniPanel, {parts * panel_columns / 2, n_columns, 2}, options);
    auto* panel_data = static_cast<BFloat16*>(panel.data_ptr());
    // f16: A's panel split (A is read in place otherwise).
    BFloat16* split_a = nullptr;
    if (half)
      split_a = static_cast<BFloat16*>(
          scratch_tensor(ScratchSlot::PackedGradOutput, {m, parts * panel_columns}, options).data_ptr());
    for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
      // Tap-major: a thread's consecutive units add into the same C, which
      // then stays in L2 (3x3 layers with 256 channels: C is 256 KiB a tap).
      const int64_t tap = unit / g.batch, n = unit % g.batch;
      const int64_t tap_index[3] = {tap / (g.kernel[1] * g.kernel[2]), tap / g.kernel[2] % g.kernel[1],
                                    tap % g.kernel[2]};
      // B's source: channel c's K positions from b[c * ldb], pairs aligned.
      const BFloat16* b;
      int64_t ldb;
      if (staging) {
        stage_b(x5, dy5, roles.a_is_grad_output, n, tap_index, g, staged);
        b = static_cast<const BFloat16*>(staged.const_data_ptr());
        ldb = staged.size(1);
      } else {
        const at::Tensor& source = roles.a_is_grad_output ? x5 : dy5;
        b = static_cast<const BFloat16*>(source.const_data_ptr()) + n * source.stride(0);
        ldb = source.stride(1);
      }
      const BFloat16* a = a_data + n * a_operand.stride(0);
      float* c = thread_c + tap * m * n_columns;
      for (int64_t k0 = 0; k0 < even_positions; k0 += panel_columns) {
        const int64_t k = std::min(panel_columns, even_positions - k0);
        // Pairs of 16-bit elements as one 32-bit element: (N x K/2) -> (K/2 x N).
        transpose_to_rows(b + k0, ldb / 2, panel_data, n_columns, n_columns, k / 2, 4);
        if (half) {
          split.split_rows(a + k0, lda, m, k, split_a, parts * panel_columns);
          split.split_panel(panel_data, k * n_columns);
          brgemm_bf16_blocks(m, n_columns, parts * k, parts * panel_columns, split_a, panel_data, c, n_columns);
        } else {
          brgemm_bf16_blocks(m, n_columns, k, lda, a + k0, panel_data, c, n_columns);
        }
      }
      if (positions % 2 == 1)  // the last position, outside every pair
        add_last_position(half, m, n_columns, a + positions - 1, lda, b + positions - 1, ldb, c, n_columns);
    }
    at::native::cpublas::brgemm_release();
  });
  // An infinity or NaN splits into a NaN low part (SplitOperands).
  if (non_finite) return kAtenAlgorithm.run(problem);
  // (threads, taps, C, O)
  const at::Tensor products = roles.a_is_grad_output ? partials.sums().transpose(2, 3) : partials.sums();
  return problem.finish_sum(canonical_from_taps(products, g, problem.spatial_rank()));
}
#else
at::Tensor run(const Problem&) {
  TORCH_CHECK(false, "the brgemm algorithm needs ATen's cpublas::brgemm");
  return {};
}
#endif

}  // namespace

const Algorithm kBrgemmAlgorithm{"brgemm", supports, cost, run};

bool runs_brgemm_bf16(const Problem& problem) {
  const at::Tensor& input = problem.input;
  const bool bf16_or_f16 = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  return input.device().is_cpu() && input.layout() == at::kStrided && bf16_or_f16 &&
         problem.grad_output.layout() == at::kStrided && problem.groups == 1 && cpu_runs_brgemm_bf16();
}

bool cpu_runs_brgemm_bf16() {
#ifdef CPUBLAS_BRGEMM_BF16BF16F32
  // ATen's brgemm runs oneDNN's ukernel, and refuses while oneDNN is disabled
  // (torch.backends.mkldnn.flags(enabled=False)).
  if (!at::globalContext().userEnabledMkldnn()) return false;
  // On AMX, where ATen packs for the tiles (could_pack), it runs. Whether it
  // runs on AVX-512 BF16 too is the torch release's choice (elsewhere it
  // refuses VNNI operands): one 2x2x2 product asks, {1, 2; 3, 4} @ {5, 6;
  // 7, 8} with B in VNNI pairs.
  static const bool tiles = cpu_has_amx_bf16() && at::native::cpublas::could_pack(at::kBFloat16);
  static const bool runs = tiles || (cpu_has_avx512_bf16() && [] {
    const at::BFloat16 a[4] = {1.0f, 2.0f, 3.0f, 4.0f}, vnni_b[4] = {5.0f, 7.0f, 6.0f, 8.0f};
    float c[4] = {0, 0, 0, 0};
    try {
      at::native::cpublas::brgemm(2, 2, 2, 2, 2, 2, /*add_C=*/true, a, vnni_b, c);
      at::native::cpublas::brgemm_release();
    } catch (const c10::Error&) {
      return false;
    }
    return c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50;
  }());
  return runs;
#else
  return false;
#endif
}

void brgemm_bf16_blocks(int64_t m, int64_t n, int64_t k, int64_t lda, const at::BFloat16* a,
                        const at::BFloat16* vnni_b, float* c, int64_t ldc) {
#ifdef CPUBLAS_BRGEMM_BF16BF16F32
  // Blocks of 64 to 256 rows and columns measured within noise of each other.
  constexpr int64_t kBlockRows = 128, kBlockColumns = 128;
  for (int64_t row = 0; row < m; row += kBlockRows)
    for (int64_t column = 0; column < n; column += kBlockColumns)
      at::native::cpublas::brgemm(std::min(kBlockRows, m - row), std::min(kBlockColumns, n - column), k, lda, n, ldc,
                                  /*add_C=*/true, a + row * lda, vnni_b + 2 * column, c + row * ldc + column);
#else
  (void)m, (void)n, (void)k, (void)lda, (void)a, (void)vnni_b, (void)c, (void)ldc;
  TORCH_CHECK(false, "brgemm_bf16_blocks needs ATen's cpublas::brgemm");
#endif
}

}  // namespace torch_convgrad
