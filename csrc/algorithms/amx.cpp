// bf16 weight gradients on AMX tiles, through ATen's batch-reduce GEMM
// (at::native::cpublas::brgemm, oneDNN's brgemm ukernel), accumulating in
// float32. Per kernel tap and sample,
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
// Rapids, 2 cores). Channels-last 1x1 layers, which have no such rows, take
// the rows path (run_rows): both operands transformed panel by panel.
#include "algorithm.h"
#include "scratch.h"
#include "tap_gemm.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>

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

// Channels-last operands of a 1x1, stride-1, unpadded layer, which have no
// rows of K contiguous positions: both are (K x channels) matrices of rows
// (K = samples x positions). The one with fewer channels is then A,
// transposed panel by panel; the other is B, its pairs of rows interleaved.
struct Rows {
  bool supported = false;
  bool a_is_grad_output = false;
  int64_t x_ld = 0, dy_ld = 0;  // row strides
};

Rows rows_of(const Geometry& g) {
  Rows rows;
  if (!one_to_one(g)) return rows;
  rows.x_ld = row_stride(g.batch, g.in_channels, g.in, g.input_strides);
  rows.dy_ld = row_stride(g.batch, g.out_channels, g.out, g.grad_output_strides);
  rows.supported = rows.x_ld > 0 && rows.dy_ld > 0;
  rows.a_is_grad_output = g.out_channels < g.in_channels;
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
  const at::Tensor& input = problem.input;
  if (!(input.device().is_cpu() && input.layout() == at::kStrided && input.scalar_type() == at::kBFloat16 &&
        problem.grad_output.layout() == at::kStrided && problem.groups == 1 && cpu_runs_brgemm_bf16()))
    return false;
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

// K rows a panel of the channels-last path: A's transposed panel and B's
// VNNI copy stay in L2.
constexpr int64_t kRowsPanel = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How the channels-last path splits its work: into panels of rows, or, with
// fewer panels than twice the threads, into a block of B's columns a thread,
// each block transposing A's panels again.
struct RowUnits {
  int64_t panels, column_blocks, block_columns;
  RowUnits(int64_t k, int64_t n, int64_t threads) {
    panels = ceil_div(k, kRowsPanel);
    column_blocks = panels < 2 * threads ? std::clamp<int64_t>(threads, 1, ceil_div(n, 32)) : 1;
    block_columns = ceil_div(ceil_div(n, column_blocks), 32) * 32;
    column_blocks = ceil_div(n, block_columns);
  }
};

// The channels-last path's seconds, fitted on the same machine to ResNet-50's
// 1x1 layers (2026-11-24: 64 -> 256 on 56x56 in 0.77 ms, 1024 -> 256 on 14x14
// in 0.82, scaled by 1.23 to the day of the other constants, when oneDNN ran
// that much slower): the tiles as above, A's transposition and B's
// interleaving at about 60 GB/s, and about 0.25 ms a MiB of float32 result.
double rows_cost(const Geometry& g, const Rows& rows) {
  const double k = static_cast<double>(g.batch) * g.out_positions();
  const double m = static_cast<double>(rows.a_is_grad_output ? g.out_channels : g.in_channels);
  const double n = static_cast<double>(rows.a_is_grad_output ? g.in_channels : g.out_channels);
  const auto width = [](double channels) { return std::min(1.0, (channels + 32) / 96); };
  const RowUnits units(static_cast<int64_t>(k), static_cast<int64_t>(n), at::get_num_threads());
  const double units_count = static_cast<double>(units.panels) * units.column_blocks;
  const double operand_bytes = k * (m * units.column_blocks + n) * 2;
  return 20e-6 + g.macs() / (620e9 * width(m) * width(n)) + units_count * m * units.block_columns * 8 / 120e9 +
         operand_bytes / 60e9 + m * n * 4 / 4e9;
}

// Estimated seconds, fitted with torch 2.13 on an Intel Xeon (Sapphire
// Rapids, AMX-BF16, 2 threads) to the benchmark's channels-first layers
// (2026-11-23): the tiles multiply at about 620 GMAC/s from 64 channels a
// side; every unit (sample, tap) loads and stores its C once a panel, at L2
// speed; B's 32-bit transposition copies at about 40 GB/s, and ATen's gather
// of a tap's window at about 20 GB/s with unit stride, half that with a
// stride, plus 4 ns a row.
double cost(const Problem&, const Geometry& g) {
  const Roles roles = roles_of(g);
  if (!roles.supported) return rows_cost(g, rows_of(g));
  const double positions = static_cast<double>(g.out_positions());
  const double m = static_cast<double>(roles.a_channels), n = static_cast<double>(roles.b_channels);
  const auto width = [](double channels) { return std::min(1.0, (channels + 32) / 96); };
  const double units = static_cast<double>(g.batch) * g.taps();
  const double b_bytes = units * n * positions * 2;
  const double panels = std::ceil(positions / kPanelColumns);
  double seconds = 20e-6 + g.macs() / (620e9 * width(m) * width(n)) + units * panels * m * n * 8 / 120e9 +
                   b_bytes / 40e9;
  if (b_needs_staging(g, roles)) {
    const double rows = units * n * g.out[0] * g.out[1];
    seconds += b_bytes / 20e9 * (g.stride[2] == 1 ? 1 : 2) + rows * 4e-9;
  }
  return seconds;
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

at::Tensor run_rows(const Problem& problem, const Geometry& g, const Rows& rows) {
  const bool a_dy = rows.a_is_grad_output;
  const int64_t k_total = g.batch * g.out_positions();
  const int64_t m = a_dy ? g.out_channels : g.in_channels, n = a_dy ? g.in_channels : g.out_channels;
  const BFloat16* a_source = (a_dy ? problem.grad_output : problem.input).const_data_ptr<BFloat16>();
  const BFloat16* b_source = (a_dy ? problem.input : problem.grad_output).const_data_ptr<BFloat16>();
  const int64_t a_ld = a_dy ? rows.dy_ld : rows.x_ld, b_ld = a_dy ? rows.x_ld : rows.dy_ld;
  const int64_t threads = at::get_num_threads();
  const RowUnits units(k_total, n, threads);
  // Split columns: each block is one task over every panel, into the one
  // result. Split panels: each thread sums into its own partial result.
  const bool split_columns = units.column_blocks > 1;
  const at::Tensor partials =
      at::zeros({split_columns ? 1 : threads, m, n}, problem.input.options().dtype(at::kFloat));
  const int64_t tasks = split_columns ? units.column_blocks : units.panels;
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    float* c = partials[split_columns ? 0 : at::get_thread_num()].mutable_data_ptr<float>();
    const at::Tensor staged = scratch_tensor(ScratchSlot::StagedOperand, {m, kRowsPanel}, problem.input.options());
    const at::Tensor panel =
        scratch_tensor(ScratchSlot::VnniPanel, {kRowsPanel / 2, units.block_columns, 2}, problem.input.options());
    auto* staged_data = staged.mutable_data_ptr<BFloat16>();
    auto* panel_data = panel.mutable_data_ptr<BFloat16>();
    for (int64_t task = task_begin; task < task_end; ++task)
      for (int64_t panel_index = split_columns ? 0 : task; panel_index < (split_columns ? units.panels : task + 1);
           ++panel_index) {
        const int64_t k0 = panel_index * kRowsPanel, k = std::min(kRowsPanel, k_total - k0), even = k / 2 * 2;
        const int64_t n0 = split_columns ? task * units.block_columns : 0;
        const int64_t columns = std::min(units.block_columns, n - n0);
        const BFloat16* a = a_source + k0 * a_ld;
        const BFloat16* b = b_source + k0 * b_ld + n0;
        if (even > 0) {
          transpose_to_rows(a, a_ld, staged_data, kRowsPanel, even, m, 2);  // A's panel as (m x K) rows
          interleave_row_pairs(reinterpret_cast<const uint16_t*>(b), b_ld, reinterpret_cast<uint16_t*>(panel_data),
                               columns, even / 2);
          brgemm_bf16_blocks(m, columns, even, kRowsPanel, staged_data, panel_data, c + n0, n);
        }
        if (k % 2 == 1)  // the last row, outside every pair
          for (int64_t row = 0; row < m; ++row) {
            const float a_last = static_cast<float>(a[(k - 1) * a_ld + row]);
            for (int64_t column = 0; column < columns; ++column)
              c[row * n + n0 + column] += a_last * static_cast<float>(b[(k - 1) * b_ld + column]);
          }
      }
    at::native::cpublas::brgemm_release();
  });
  // Partial sums added in thread order: deterministic for a thread count.
  at::Tensor products = split_columns ? partials[0] : partials.sum(0);  // (M, N)
  if (a_dy) products = products.t();  // a view: canonical_from_taps lays it out as (O, C)
  return problem.finish(
      canonical_from_taps(products.view({1, 1, g.in_channels, g.out_channels}), g, problem.spatial_rank()));
}

at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const Roles roles = roles_of(g);
  if (!roles.supported) return run_rows(problem, g, rows_of(g));
  const bool staging = b_needs_staging(g, roles);
  const at::Tensor x5 = lift(problem.input), dy5 = lift(problem.grad_output);
  const at::Tensor& a_operand = roles.a_is_grad_output ? dy5 : x5;
  const int64_t m = roles.a_channels, n_columns = roles.b_channels;
  const int64_t positions = g.out_positions();
  const int64_t even_positions = positions / 2 * 2;
  const int64_t taps = g.taps();
  const int64_t lda = a_operand.stride(1);

  const int64_t threads = at::get_num_threads();
  const at::Tensor partials = at::zeros({threads, taps, m, n_columns}, problem.input.options().dtype(at::kFloat));
  const auto* a_data = a_operand.const_data_ptr<BFloat16>();
  at::parallel_for(0, g.batch * taps, 1, [&](int64_t unit_begin, int64_t unit_end) {
    float* thread_c = partials[at::get_thread_num()].mutable_data_ptr<float>();
    at::Tensor staged;
    if (staging)
      staged = scratch_tensor(ScratchSlot::StagedOperand, {n_columns, even_positions + (positions % 2) * 2},
                              problem.input.options());
    const at::Tensor panel = scratch_tensor(ScratchSlot::VnniPanel, {kPanelColumns / 2, n_columns, 2},
                                            problem.input.options());
    auto* panel_data = panel.mutable_data_ptr<BFloat16>();
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
        b = staged.const_data_ptr<BFloat16>();
        ldb = staged.size(1);
      } else {
        const at::Tensor& source = roles.a_is_grad_output ? x5 : dy5;
        b = source.const_data_ptr<BFloat16>() + n * source.stride(0);
        ldb = source.stride(1);
      }
      const BFloat16* a = a_data + n * a_operand.stride(0);
      float* c = thread_c + tap * m * n_columns;
      for (int64_t k0 = 0; k0 < even_positions; k0 += kPanelColumns) {
        const int64_t k = std::min(kPanelColumns, even_positions - k0);
        // Pairs of bf16 as one 32-bit element: (N x K/2) -> (K/2 x N).
        transpose_to_rows(b + k0, ldb / 2, panel_data, n_columns, n_columns, k / 2, 4);
        brgemm_bf16_blocks(m, n_columns, k, lda, a + k0, panel_data, c, n_columns);
      }
      if (positions % 2 == 1)  // the last position, outside every pair
        for (int64_t row = 0; row < m; ++row) {
          const float a_last = static_cast<float>(a[row * lda + positions - 1]);
          for (int64_t column = 0; column < n_columns; ++column)
            c[row * n_columns + column] += a_last * static_cast<float>(b[column * ldb + positions - 1]);
        }
    }
    at::native::cpublas::brgemm_release();
  });
  // Partial sums added in thread order: deterministic for a thread count.
  at::Tensor products = partials.sum(0);  // (taps, M, N)
  if (roles.a_is_grad_output) products = products.transpose(1, 2);
  return problem.finish(canonical_from_taps(products.unsqueeze(0).contiguous(), g, problem.spatial_rank()));
}
#else
at::Tensor run(const Problem&) {
  TORCH_CHECK(false, "the amx algorithm needs ATen's cpublas::brgemm");
  return {};
}
#endif

}  // namespace

const Algorithm kAmxAlgorithm{"amx", supports, cost, run};

bool cpu_runs_brgemm_bf16() {
#ifdef CPUBLAS_BRGEMM_BF16BF16F32
  static const bool amx = cpu_has_amx_bf16() && at::native::cpublas::could_pack(at::kBFloat16);
  // ATen's brgemm runs oneDNN's ukernel, and refuses while oneDNN is disabled
  // (torch.backends.mkldnn.flags(enabled=False)).
  return amx && at::globalContext().userEnabledMkldnn();
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
