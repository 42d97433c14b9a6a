// Products of row-shifted views of one matrix with another, for every kernel
// tap at once, computed directly on the strided operands (no BLAS packing of
// the long row axis), and the transposition that lays channels-first data out
// as such rows. The gemm algorithm's inner loop and its copy.
#pragma once

#include <cstdint>

namespace torch_convgrad {

// What a and b hold; the products are computed in float32 whatever it is.
enum class TapElement { Float, Half, BFloat16 };

// The rows a product sums over where not all of them hold windows (a pitched
// layout's rows between lines of windows hold zeros): `count` lines of
// `length` rows, line k from row starts[k] (increasing, at least `length`
// apart). The default, no lines, stands for all rows.
// With `b_compact`, b holds those rows only, one after another: its row v
// is the v-th of the lines' rows (the output gradient read in place, a
// window a row, where a has the planes' pitch).
struct WindowLines {
  const int64_t* starts = nullptr;
  int64_t count = 0, length = 0;
  bool b_compact = false;
};

// out[t][c][o] (+)= sum_{r < rows} a[offsets[t] + r * lda + c * a_channel_stride]
//                                  * b[r * ldb + o * b_channel_stride]
// for t < taps, c < channels_a, o < channels_b: a is row-major with row stride
// lda >= channels_a (a_channel_stride 1), or channels-first, and taps start
// `offsets` elements in (>= 0; their rows may overlap). With a_positions > 0
// a is channels-first rows of that many positions, read as zero outside
// them (offsets may be negative: padding). b is row-major with
// ldb >= channels_b (b_channel_stride 1), or channels-first with unit rows
// (ldb 1; AVX-512 CPUs only), out is contiguous (taps, channels_a,
// channels_b). `accumulate` false overwrites out, true adds to it. With
// `lines`, r runs over their rows only (all below `rows`), skipping the rest.
// Each element is summed over r in increasing order, so the result does not
// depend on the thread count. a and b hold `element`s, read as float32; out
// is float32. AVX2 CPUs only (cpu_runs_avx2_kernels()).
void tap_products(TapElement element, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t rows,
                  const int64_t* offsets, int64_t taps, int64_t channels_a, int64_t channels_b, float* out,
                  bool accumulate, int64_t a_channel_stride = 1, int64_t a_positions = 0,
                  int64_t b_channel_stride = 1, const WindowLines& lines = {});

// dst[r * dst_ld + c] = src[c * src_ld + r] for c < columns, r < rows:
// channels-first data laid out as the rows tap_products reads. Elements of
// `element_size` 2 or 4 bytes, copied as they are.
void transpose_to_rows(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows,
                       int64_t element_size);

// dst[r * dst_ld + i] = src[r * src_ld + i * step] for i < count, r < rows:
// every step-th element of strided rows, of `element_size` 2 or 4 bytes,
// copied as it is (one phase of a strided axis). step >= 1.
void gather_every(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count,
                  int64_t rows, int64_t element_size);

// dst[(p * columns + j) * 2 + i] = rows[2 * p + i][j] for i < 2, j < columns,
// p < pairs: pairs of rows of 16-bit elements interleaved, the VNNI layout of
// a bf16 product's operand ((2 * pairs) x columns, row-major). The rows lie
// anywhere (a window's pixels, or a row of zeros for padding).
void interleave_row_pairs(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs);

// high[i] + low[i] == half[i] exactly, for i < count: each f16 split into two
// bf16 (high rounded to nearest even, low the remainder, at most 3
// significant bits), so that a bf16 product of f16 data is the sum of three
// exact products, high * high + low * high + high * low, short of low * low
// (below 2^-16 of the product). Whether every element was finite (an
// infinity's or NaN's low part is NaN). high may be half.
bool split_half(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low);

}  // namespace torch_convgrad
