// The tap-product kernel behind tap_products (tap_gemm.h):
//
//   out[t][c][o] (+)= sum_r a[offsets[t] + r * lda + c * a_channel_stride]
//                           * b[r * ldb + o * b_channel_stride]
//
// over the rows r of the product's lines of windows (WindowLines, tap_gemm.h).
//
// Taps and channels of A flatten into one axis m = t * channels_a + c, so out
// is one (m, o) matrix and every tap shares the loads of B. A and B hold
// float32, float16 or bfloat16 (TapElement); the kernel converts them to
// float32 as it copies them into its panels, so low precision costs no extra
// pass and accumulates in float32. The first part of this header is the plain
// interface that tap_gemm.cpp calls; the second, compiled only by the
// per-capability translation units (tap_gemm_kernel_avx2.cpp,
// tap_gemm_kernel_avx512.cpp, tap_gemm_kernel_default.cpp, which define
// CPU_CAPABILITY), is the kernel.
#pragma once

#include "tap_gemm.h"

#include <cstdint>

namespace torch_convgrad::tap_gemm_kernel {

struct Args {
  TapElement element;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  const int64_t* offsets;
  int64_t taps, channels_a, channels_b;
  float* out;  // (taps * channels_a, channels_b), row stride channels_b
  bool accumulate;
  int64_t a_channel_stride;  // between A's channels (1: row-major)
  int64_t a_positions;       // channels-first rows' positions, zero outside (0: unbounded)
  int64_t b_channel_stride;  // between B's channels (1: row-major; else channels-first, ldb 1)
  // The rows summed over: line_count lines of line_length rows, line k from
  // row line_starts[k] (WindowLines, tap_gemm.h; all rows as one line).
  const int64_t* line_starts;
  int64_t line_count, line_length;
  bool b_compact;  // B holds the lines' rows only, one after another
};

// Computes out[m][o] for m in [m_begin, m_end), o in [o_begin, o_end) (m_begin
// and o_begin multiples of the build's tile, kTileM values of m by kTileO of
// o) over the lines' rows, `chunk_rows` of them at a time (a chunk's slabs
// and packed A hold only those rows), reading A through a float32 copy with
// `pack_a` (always for f16/bf16). Every element is summed over r in
// increasing order, one fused multiply-add per row, whatever the block and
// the build.
//
// transpose lays channels-first data out as the kernel's rows:
// dst[r * dst_ld + c] = src[c * src_ld + r] for c < columns, r < rows, for
// elements of `element_size` 2 or 4 bytes (copied, not converted).
//
// gather copies every step-th element of rows (gather_every, tap_gemm.h),
// interleave pairs of rows (interleave_row_pairs), split f16 into two bf16
// (split_half).
//
// The products run on AVX2 and AVX-512 CPUs (gemm uses BLAS elsewhere); the
// transposition and the gather have an AVX-512, an AVX2 and a portable build,
// the interleave and the split an AVX-512 and a portable one.
#define TORCH_CONVGRAD_TAP_GEMM_DECLARE_BLOCK                                                                    \
  void block(const Args& args, int64_t m_begin, int64_t m_end, int64_t o_begin, int64_t o_end, int64_t chunk_rows, \
             bool pack_a);
#define TORCH_CONVGRAD_TAP_GEMM_DECLARE_TRANSPOSE                                                              \
  void transpose(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows, \
                 int64_t element_size);
#define TORCH_CONVGRAD_TAP_GEMM_DECLARE_GATHER                                                               \
  void gather(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count,        \
              int64_t rows, int64_t element_size);                                                              \
  void interleave(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs);          \
  bool split(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low);

// Each tile keeps kTileM x 2 vectors of accumulators in registers: 12 of
// AVX2's 16, 24 of AVX-512's 32.
namespace AVX2 {
constexpr int64_t kTileM = 6;
constexpr int64_t kTileO = 16;
TORCH_CONVGRAD_TAP_GEMM_DECLARE_BLOCK
TORCH_CONVGRAD_TAP_GEMM_DECLARE_TRANSPOSE
void gather(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count, int64_t rows,
            int64_t element_size);
}  // namespace AVX2
namespace AVX512 {
constexpr int64_t kTileM = 12;
constexpr int64_t kTileO = 32;
TORCH_CONVGRAD_TAP_GEMM_DECLARE_BLOCK
TORCH_CONVGRAD_TAP_GEMM_DECLARE_TRANSPOSE
TORCH_CONVGRAD_TAP_GEMM_DECLARE_GATHER
}  // namespace AVX512
namespace DEFAULT {
TORCH_CONVGRAD_TAP_GEMM_DECLARE_TRANSPOSE
TORCH_CONVGRAD_TAP_GEMM_DECLARE_GATHER
}
#undef TORCH_CONVGRAD_TAP_GEMM_DECLARE_BLOCK
#undef TORCH_CONVGRAD_TAP_GEMM_DECLARE_TRANSPOSE
#undef TORCH_CONVGRAD_TAP_GEMM_DECLARE_GATHER

}  // namespace torch_convgrad::tap_gemm_kernel

#ifdef CPU_CAPABILITY

#include "float_lanes.h"
#include "line_aligned_buffer.h"
#include "register_transpose.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif
// The AVX-512 build holds only the products: at::vec's 512-bit headers need
// the ISA macros that a target pragma does not define.
#ifndef CPU_CAPABILITY_AVX512
#include <ATen/cpu/vec/vec.h>
#endif

namespace torch_convgrad::tap_gemm_kernel::CPU_CAPABILITY {

using ::torch_convgrad::CPU_CAPABILITY::LineAlignedBuffer;
#ifdef CPU_CAPABILITY_AVX512
using ::torch_convgrad::CPU_CAPABILITY::transpose_registers;
#endif
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
using ::torch_convgrad::CPU_CAPABILITY::first_lanes;
using ::torch_convgrad::CPU_CAPABILITY::load_floats;
#endif
#ifdef CPU_CAPABILITY_AVX2
using ::torch_convgrad::CPU_CAPABILITY::load_first_floats;
#endif

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)

// The build's vector of float32 lanes; a tile's row of B is two of them.
#ifdef CPU_CAPABILITY_AVX512
using Vector = __m512;
using LaneMask = __mmask16;
constexpr int64_t kLanes = 16;
inline Vector zero_vector() { return _mm512_setzero_ps(); }
inline Vector load(const float* p) { return _mm512_loadu_ps(p); }
inline Vector load(const float* p, LaneMask mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline void store(float* p, Vector v) { _mm512_storeu_ps(p, v); }
inline void store(float* p, LaneMask mask, Vector v) { _mm512_mask_storeu_ps(p, mask, v); }
inline Vector broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vector fma(Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); }
// The first `count` halves only (the others are not read, and are 0).
template <typename T>
inline Vector load_as_float(const T* p, int64_t count) { return load_floats(p, first_lanes(count)); }
#else
using Vector = __m256;
using LaneMask = __m256i;
constexpr int64_t kLanes = 8;
inline Vector zero_vector() { return _mm256_setzero_ps(); }
inline Vector load(const float* p) { return _mm256_loadu_ps(p); }
inline Vector load(const float* p, LaneMask mask) { return _mm256_maskload_ps(p, mask); }
inline void store(float* p, Vector v) { _mm256_storeu_ps(p, v); }
inline void store(float* p, LaneMask mask, Vector v) { _mm256_maskstore_ps(p, mask, v); }
inline Vector broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vector fma(Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); }
// The first `count` halves only (the others are not read, and are 0).
template <typename T>
inline Vector load_as_float(const T* p, int64_t count) { return load_first_floats(p, count); }
#endif
// kLanes elements as float32 (float_lanes.h).
template <typename T>
inline Vector load_as_float(const T* p) { return load_floats(p); }
static_assert(kTileO == 2 * kLanes, "a tile's row of B is two vectors");
// Whether A that block_of would pack is converted a region a chunk instead
// wherever that converts no more elements (the AVX2 build), or only f16/bf16
// where it converts fewer (the AVX-512 build).
constexpr bool kConvertsRegion = kLanes == 8;

// Rows of A that a tile reads in a row of its slab, `length` of them from
// row `offset` (of A's rows from a[i]).
struct Segment {
  int64_t offset, length;
};

// out[i][j] (+)= sum_r a[i][row(r) * lda] * slab[r][j] for i < kM, j < width
// (<= kTileO), where slab row r is A's row row(r): the segments' rows in
// order; `zero` starts from 0 instead of out. B is read from
// a copy, slab[r][j] = B's element (r, o0 + j) for j < width and 0 beyond,
// kTileO floats a row: contiguous rows, so a chunk of them stays in L1 (rows
// of b itself, ldb apart, collide in L1's sets) while the tiles of every m
// pass over it, and a tile needs no masked loads.
using TileFn = void (*)(const float* const* a, int64_t lda, const float* slab, const Segment* segments,
                        int64_t segment_count, float* out, int64_t ldo, int64_t width, bool zero);

// How a tile finds its rows of A. Twelve row pointers do not fit x86-64's
// registers beside the loop's own: GCC spilled them to vector registers and
// the stack, four extra instructions in a loop of 42 that the 4-wide front
// end issues in about the 12 cycles its 24 FMAs take. So rows laid out
// regularly are addressed from fewer registers. Consecutive: row i is
// a[0] + i (channels of one tap, or a packed tile), at fixed displacements
// from one pointer (the benchmark's gemm layers 1.0-1.11x, Cascade Lake, two
// interleaved runs). Spaced: row i is a[0] + i * (a[1] - a[0]) (channels
// of channels-first data read in place, or their float32 runs), from four
// pointers three rows apart and three offsets (the 1-D layer's channels-first
// rows 1.01-1.04x in two steady interleaved runs; two under a neighbour's
// changing load read 0.89-1.22x). Listed: anything else.
enum class RowsOfA { Listed, Consecutive, Spaced };

// kM x kVectors accumulators, enough independent FMA chains to hide the FMA
// latency, with registers left for B and the broadcast. kPartial: out's last
// vector has fewer than kLanes columns and is read and written under a mask.
template <int kM, int kVectors, bool kPartial, RowsOfA kRows>
void tile(const float* const* a, int64_t lda, const float* slab, const Segment* segments, int64_t segment_count,
          float* out, int64_t ldo, int64_t width, bool zero) {
  const LaneMask mask = first_lanes(kPartial ? width - kLanes * (kVectors - 1) : kLanes);
  Vector acc[kM][kVectors];
  const float* rows_a[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) {
    rows_a[i] = a[i];
#pragma GCC unroll 2
    for (int v = 0; v < kVectors; ++v)
      acc[i][v] = zero                               ? zero_vector()
                  : kPartial && v == kVectors - 1 ? load(out + i * ldo + kLanes * v, mask)
                                                  : load(out + i * ldo + kLanes * v);
  }
  // Spaced: every third row's pointer; the others a spacing or two on.
  constexpr int kBases = (kM + 2) / 3;
  const int64_t spacing = kRows == RowsOfA::Spaced && kM > 1 ? a[1] - a[0] : 0;
  for (const Segment* segment = segments; segment != segments + segment_count; ++segment) {
    const int64_t start = segment->offset * lda;
    const float* bases[kBases];
#pragma GCC unroll 4
    for (int k = 0; k < kBases; ++k) bases[k] = a[0] + 3 * k * spacing + start;
    const float* row_a = a[0] + start;
    for (int64_t r = 0, ar = start; r < segment->length; ++r, ar += lda, row_a += lda, slab += kTileO) {
      Vector bv[kVectors];
#pragma GCC unroll 2
      for (int v = 0; v < kVectors; ++v) bv[v] = load(slab + kLanes * v);
#pragma GCC unroll 16
      for (int i = 0; i < kM; ++i) {
        const float* element = kRows == RowsOfA::Consecutive ? row_a + i
                               : kRows == RowsOfA::Spaced    ? bases[i / 3] + i % 3 * spacing
                                                             : rows_a[i] + ar;
        const Vector x = broadcast(element);
#pragma GCC unroll 2
        for (int v = 0; v < kVectors; ++v) acc[i][v] = fma(x, bv[v], acc[i][v]);
      }
      if constexpr (kRows == RowsOfA::Spaced)
#pragma GCC unroll 4
        for (int k = 0; k < kBases; ++k) bases[k] += lda;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < kVectors; ++v) {
      if (kPartial && v == kVectors - 1)
        store(out + i * ldo + kLanes * v, mask, acc[i][v]);
      else
        store(out + i * ldo + kLanes * v, acc[i][v]);
    }
}

// [kM - 1][variant]: kTileO columns, kLanes + 1 .. kTileO - 1, kLanes, 1 .. kLanes - 1.
template <RowsOfA kRows, int... kHeightsLessOne>
constexpr std::array<std::array<TileFn, 4>, sizeof...(kHeightsLessOne)> tiles_of(
    std::integer_sequence<int, kHeightsLessOne...>) {
  return {{{tile<kHeightsLessOne + 1, 2, false, kRows>, tile<kHeightsLessOne + 1, 2, true, kRows>,
            tile<kHeightsLessOne + 1, 1, false, kRows>, tile<kHeightsLessOne + 1, 1, true, kRows>}...}};
}
// The tile for `height` rows of A at `a` and `width` columns of B.
inline TileFn pick_tile(const float* const* a, int64_t height, int64_t width) {
  static constexpr auto kListed = tiles_of<RowsOfA::Listed>(std::make_integer_sequence<int, kTileM>{});
  static constexpr auto kConsecutive = tiles_of<RowsOfA::Consecutive>(std::make_integer_sequence<int, kTileM>{});
  static constexpr auto kSpaced = tiles_of<RowsOfA::Spaced>(std::make_integer_sequence<int, kTileM>{});
  const int variant = width == kTileO ? 0 : width > kLanes ? 1 : width == kLanes ? 2 : 3;
  bool consecutive = true, spaced = true;
  for (int64_t i = 1; i < height; ++i) {
    consecutive &= a[i] == a[0] + i;
    spaced &= a[i] == a[0] + i * (a[1] - a[0]);
  }
  return (consecutive ? kConsecutive : spaced ? kSpaced : kListed)[height - 1][variant];
}

// One element as float32. F16C converts a half in one instruction where
// c10::Half's portable conversion takes a dozen.
template <typename T>
inline float to_float(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return c10::detail::f32_from_bits(value.x);
  } else {
    return _cvtsh_ss(value.x);
  }
}

// row[j] = source[j] as float32 for j < width, 0 for width <= j < kTileO.
template <typename T>
inline void convert_slab_row(const T* source, int64_t width, float* row) {
  if (width == kTileO) {
    for (int64_t half = 0; half < kTileO; half += kLanes) store(row + half, load_as_float(source + half));
    return;
  }
  // Plain loops: std::copy becomes a memmove call per row.
  for (int64_t j = 0; j < kTileO; ++j) row[j] = j < width ? to_float(source[j]) : 0.0f;
}

#ifdef CPU_CAPABILITY_AVX512
// slab[r * kTileO + j] = b[j * channel_stride + r] as float32 for j < width
// (<= kTileO), r < rows, and 0 for width <= j < kTileO: channels-first B
// (each channel's rows contiguous) transposed into a slab, 16 channels by 16
// rows at a time in registers (the AVX-512 build only).
template <typename T>
inline void transpose_into_slab(const T* b, int64_t channel_stride, int64_t width, int64_t rows, float* slab) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    const int64_t count = std::min(kLanes, rows - r0);
    for (int64_t j0 = 0; j0 < kTileO; j0 += kLanes) {
      Vector lines[kLanes], columns[kLanes];
      for (int64_t c = 0; c < kLanes; ++c) {
        const T* line = b + (j0 + c) * channel_stride + r0;
        lines[c] = j0 + c >= width ? zero_vector() : count == kLanes ? load_as_float(line) : load_as_float(line, count);
      }
      transpose_registers(lines, columns);
      for (int64_t r = 0; r < count; ++r) store(slab + (r0 + r) * kTileO + j0, columns[r]);
    }
  }
}
#endif

// Prefetches rows [row_begin, row_end) of a matrix, columns [begin, end),
// into L1, or with `to_l2` into L2 only. Inline asm: GCC 12 deletes loops of
// __builtin_prefetch here as side-effect free.
template <typename T>
inline void prefetch_rows(const T* data, int64_t ld, int64_t row_begin, int64_t row_end, int64_t begin, int64_t end,
                          bool to_l2 = false) {
  constexpr int64_t kLineElements = 64 / sizeof(T);
  if (begin >= end) return;  // no columns (a channels-first operand's last chunk has no next one)
  // Every line of [begin, end), whatever its alignment: the last step lands on end - 1.
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t c = begin; c < end + kLineElements - 1; c += kLineElements) {
      const T& line = data[r * ld + std::min(c, end - 1)];
      if (to_l2)
        asm volatile("prefetcht1 %0" : : "m"(line));
      else
        asm volatile("prefetcht0 %0" : : "m"(line));
    }
}

// Rows [first, first + count) handed out in `parts` runs, the first count %
// parts of them a row longer: a run per tile without a division per tile
// (64-bit divisions here took 5% of a 3x3 layer's time).
class RowRuns {
 public:
  RowRuns(int64_t first, int64_t count, int64_t parts)
      : next_(first), length_(count / parts), longer_(count % parts) {}
  // The next run's first row; the run ends where the following one begins.
  std::pair<int64_t, int64_t> next() {
    const int64_t begin = next_;
    next_ += length_ + (longer_ > 0);
    longer_ -= longer_ > 0;
    return {begin, next_};
  }

 private:
  int64_t next_, length_, longer_;
};

// Per chunk of rows, the block's columns of B are copied into slabs (one
// pass over B's rows, in order) and every m tile passes over each slab. With
// `pack_a`, the m tiles' rows of A are copied too, kTileM floats a row. While
// a chunk computes, the next chunk's rows of B, and of A at the block's
// largest offset (the rows no earlier chunk has read), are prefetched a few
// lines per tile: long-K operands stream from memory, and the copies would
// stall on it. Rows of B, and of A where the tiles read it in place (not
// packed), go to L2 only where a chunk of them outgrows a slab: in L1 they
// would evict the slabs the tiles are reading (ResNet-50's 1x1 64->256
// layer, channels-last f32, A its output gradient's 256 channels, 128 a
// thread, B its input's 64: 1.08-1.3x as fast with A's rows so in eight
// interleaved runs, and 1.01-1.14x more with B's in four; the benchmark's
// other gemm layers within their noise, 0.95-1.05x; Zen 4, 2 threads; the
// AVX2 build not measured, and left as it was). Channels-first B (the
// AVX-512 build) is transposed into the slabs, 16 channels by 16 rows in
// registers. Channels-first operands are prefetched a few channels' whole
// runs of the next chunk a tile. Prefetching a few rows of every channel a
// tile instead took a prefetch per channel for a line or two each:
// ResNet-50's channels-first 1x1 64->256 layer (f32, A its output
// gradient's 256 channels) ran 1.26x as fast so, f16 1.18x, the 1-D layer
// (whose input is A) 1.0-1.02x (one interleaved run).
//
// f16/bf16 A laid out channels-first (a_channel_stride != 1) is not packed
// but converted a chunk at a time, each channel's run of positions at once,
// and read from that copy (the runs): a channel's element
// converts once for all the taps that read it, in vectors, where packing
// converts it once a tap, element by element. Rows of a_positions
// positions read zero outside them: chunks that reach past either end are
// read from runs in float32 too.
//
// The AVX2 build converts f16/bf16 A laid out channels-last a chunk at a
// time instead of packing it: the block's columns of every row some tap
// reads, once, into a float32 region that the tiles then read as float32 A
// in place. A 3x3 kernel
// reads each element for 9 taps, so packing converted it 9 times (element
// by element, 6 to a tile's row), once for every 4 slabs of B that 64 output
// channels give. float32 A at a row stride that aliases (tap_gemm.cpp's
// kAliasingLda) is copied into such a region too, at a pitch that does not.
// The AVX-512 build does so for f16/bf16 A that several taps read: on the
// Zen 4 (2 threads, three interleaved runs) ResNet-50's 3x3 64-channel layer
// ran 1.02-1.15x as fast so, the stride-2 3x3 one 1.0-1.05x and the 3-D
// layer 1.04-1.09x (one run); 1x1 layers, where the region converts as many
// elements as packing does, 0.94-1.02x, so they keep packing, as float32
// does (not measured).
// target[e] = source[e] as float32 for e in [begin, end), zero elsewhere in [0, count).
template <typename T>
inline void convert_span(const T* source, int64_t begin, int64_t end, int64_t count, float* target) {
  std::fill(target, target + begin, 0.0f);
  int64_t e = begin;
  for (; e + kLanes <= end; e += kLanes) store(target + e, load_as_float(source + e));
  for (; e < end; ++e) target[e] = to_float(source[e]);
  std::fill(target + end, target + count, 0.0f);
}

template <typename T>
void block_of(const Args& args, int64_t m_begin, int64_t m_end, int64_t o_begin, int64_t o_end, int64_t chunk_rows,
              bool pack_a) {
  const bool bounded = args.a_positions > 0;
  const bool always_runs = !std::is_same_v<T, float> && (args.a_channel_stride != 1 || bounded);
  pack_a = pack_a && !always_runs;
  const T* const a_data = static_cast<const T*>(args.a);
  const T* const b_data = static_cast<const T*>(args.b);
  const bool b_channels_first = args.b_channel_stride != 1;
  const int64_t slabs = (o_end - o_begin + kTileO - 1) / kTileO;
  const int64_t tiles = (m_end - m_begin + kTileM - 1) / kTileM;
  // Chunks of chunk_rows of the lines' rows (the last shorter): the chunk from
  // the v-th of them spans the rows from row_of(v) to its last row's.
  const int64_t window_rows = args.line_count * args.line_length;
  const auto row_of = [&](int64_t v) { return args.line_starts[v / args.line_length] + v % args.line_length; };
  const auto span_of = [&](int64_t v) {
    return v >= window_rows ? 0 : row_of(std::min(v + chunk_rows, window_rows) - 1) - row_of(v) + 1;
  };
  int64_t most_span = 0;
  for (int64_t v = 0; v < window_rows; v += chunk_rows) most_span = std::max(most_span, span_of(v));
  LineAlignedBuffer<float> packed_b(slabs * chunk_rows * kTileO);
  std::vector<const T*> a(tiles * kTileM);        // this chunk's first row of each m in A
  std::vector<const float*> a_tiles(tiles * kTileM);  // the same rows as the tiles read them
  const int64_t first_tap = m_begin / args.channels_a, last_tap = (m_end - 1) / args.channels_a;
  const int64_t channel_begin = first_tap == last_tap ? m_begin % args.channels_a : 0;
  const int64_t channel_end = first_tap == last_tap ? (m_end - 1) % args.channels_a + 1 : args.channels_a;
  // The block's taps' least and greatest offsets; from the greatest (the tap
  // that reads furthest into A) it prefetches.
  const int64_t lowest = *std::min_element(args.offsets + first_tap, args.offsets + last_tap + 1);
  const int64_t highest = *std::max_element(args.offsets + first_tap, args.offsets + last_tap + 1);
  const T* const ahead = a_data + std::max<int64_t>(highest, 0);
  // Runs: each channel's positions that a chunk's taps read, as float32.
  const int64_t run_pitch = always_runs || bounded ? (most_span - 1) * args.lda + highest - lowest + 1 : 0;
  LineAlignedBuffer<float> runs((channel_end - channel_begin) * run_pitch);
  // Where each m reads A in the chunk's first row, from the chunk's first
  // row: in A, and in the runs.
  std::vector<int64_t> m_offsets(m_end - m_begin), run_offsets(m_end - m_begin);
  for (int64_t m = m_begin, tap = first_tap, channel = m_begin % args.channels_a; m < m_end; ++m) {
    m_offsets[m - m_begin] = args.offsets[tap] + channel * args.a_channel_stride;
    run_offsets[m - m_begin] = (channel - channel_begin) * run_pitch + args.offsets[tap] - lowest;
    if (++channel == args.channels_a) channel = 0, ++tap;
  }
  // The region: where m's element in the chunk's row 0 lies from A's lowest
  // tap there, as whole rows (q) and a column, for rows [0, rows + most
  // rows) and the columns any m reads. It reads only A between the block's
  // first and last element (one allocation), zero around; where it converts
  // no more elements than packing would (kConvertsRegion), it is used.
  bool converts_region = pack_a && args.a_channel_stride == 1 && !bounded;
  int64_t most_rows = 0, first_column = args.lda, end_column = 0;
  int64_t least_offset = m_offsets[0], most_offset = m_offsets[0];
  for (int64_t i = 0; converts_region && i < m_end - m_begin; ++i) {
    const int64_t from_lowest = m_offsets[i] - lowest;
    most_rows = std::max(most_rows, from_lowest / args.lda);
    first_column = std::min(first_column, from_lowest % args.lda);
    end_column = std::max(end_column, from_lowest % args.lda + 1);
    least_offset = std::min(least_offset, m_offsets[i]);
    most_offset = std::max(most_offset, m_offsets[i]);
  }
  const int64_t region_width = end_column - first_column;
  // Row pitches of a multiple of 2 KiB alias in L1 and L2 (kAliasingLda, tap_gemm.cpp).
  const int64_t region_pitch = region_width % 512 == 0 ? region_width + 16 : region_width;
  const int64_t region_elements = (most_span + most_rows) * region_width;
  const int64_t packed_elements = (m_end - m_begin) * chunk_rows;
  converts_region = converts_region && (kConvertsRegion ? region_elements <= packed_elements
                                                        : !std::is_same_v<T, float> &&
                                                              region_elements < packed_elements);
  pack_a = pack_a && !converts_region;
  LineAlignedBuffer<float> packed_a(pack_a ? tiles * chunk_rows * kTileM + kLanes - kTileM : 0);
  // Whether a chunk's rows of this many columns outgrow a slab (the AVX-512 build only).
  const auto outgrows_slab = [](int64_t columns) {
    return kLanes == 16 && columns * static_cast<int64_t>(sizeof(T)) > kTileO * static_cast<int64_t>(sizeof(float));
  };
  const bool a_to_l2 = !pack_a && !converts_region && !bounded && outgrows_slab(channel_end - channel_begin);
  const bool b_to_l2 = outgrows_slab(o_end - o_begin);
  LineAlignedBuffer<float> region(converts_region ? (most_span + most_rows) * region_pitch : 0);
  // Where each m reads the region in its row 0, the same for every chunk.
  std::vector<int64_t> region_offsets(converts_region ? m_end - m_begin : 0);
  for (size_t i = 0; i < region_offsets.size(); ++i) {
    const int64_t from_lowest = m_offsets[i] - lowest;
    region_offsets[i] = from_lowest / args.lda * region_pitch + from_lowest % args.lda - first_column;
  }
  // The chunk's lines (or parts of them), as rows from its first.
  std::vector<Segment> segments;
  for (int64_t v0 = 0; v0 < window_rows; v0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, window_rows - v0);
    // The chunk spans rows [r0, r0 + span) of A and B.
    const int64_t r0 = row_of(v0), span = span_of(v0);
    segments.clear();
    for (int64_t v = v0; v < v0 + rows;) {
      const int64_t within = v % args.line_length, length = std::min(args.line_length - within, v0 + rows - v);
      segments.push_back({args.line_starts[v / args.line_length] + within - r0, length});
      v += length;
    }
    const bool zero = v0 == 0 && !args.accumulate;
    // B's row of the chunk's r-th row, the segment's i-th.
    const auto b_row = [&](const Segment& segment, int64_t i, int64_t r) {
      return args.b_compact ? v0 + r : r0 + segment.offset + i;
    };
    // The segments' rows of B, one after another in the slabs.
#ifdef CPU_CAPABILITY_AVX512
    if (b_channels_first)
      for (int64_t slab = 0; slab < slabs; ++slab) {
        const int64_t o0 = o_begin + slab * kTileO;
        for (int64_t r = 0; const Segment& segment : segments) {
          transpose_into_slab(b_data + o0 * args.b_channel_stride + b_row(segment, 0, r), args.b_channel_stride,
                              std::min(kTileO, o_end - o0), segment.length,
                              packed_b.data() + (slab * rows + r) * kTileO);
          r += segment.length;
        }
      }
    else
#endif
      for (int64_t r = 0; const Segment& segment : segments)
        for (int64_t i = 0; i < segment.length; ++i, ++r) {
          const T* source = b_data + b_row(segment, i, r) * args.ldb;
          for (int64_t slab = 0; slab < slabs; ++slab) {
            const int64_t o0 = o_begin + slab * kTileO;
            convert_slab_row(source + o0, std::min(kTileO, o_end - o0), packed_b.data() + (slab * rows + r) * kTileO);
          }
        }
    int64_t lda = args.lda;
    // The positions the chunk reads, from `first` on.
    const int64_t first = r0 * args.lda + lowest, count = (span - 1) * args.lda + highest - lowest + 1;
    const bool chunk_runs = always_runs || (bounded && (first < 0 || first + count > args.a_positions));
    if (!chunk_runs)
      for (int64_t i = 0; i < m_end - m_begin; ++i) a[i] = a_data + m_offsets[i] + r0 * args.lda;
    if (chunk_runs) {
      // Elements [begin, end) of a run lie inside the row.
      const int64_t begin = bounded ? std::clamp<int64_t>(-first, 0, count) : 0;
      const int64_t end = bounded ? std::clamp<int64_t>(args.a_positions - first, begin, count) : count;
      for (int64_t channel = channel_begin; channel < channel_end; ++channel) {
        const T* row = a_data + channel * args.a_channel_stride;
        convert_span(row + first, begin, end, count, runs.data() + (channel - channel_begin) * run_pitch);
      }
      for (int64_t i = 0; i < m_end - m_begin; ++i) a_tiles[i] = runs.data() + run_offsets[i];
    } else if (converts_region) {
      // Region element (q, column) is A's element at `from`; elements outside [begin, end) are not read.
      const int64_t from = r0 * args.lda + lowest + first_column;
      const int64_t begin = r0 * args.lda + least_offset, end = (r0 + span - 1) * args.lda + most_offset + 1;
      for (int64_t q = 0; q < span + most_rows; ++q) {
        const int64_t row_from = from + q * args.lda;
        const int64_t lo = std::clamp<int64_t>(begin - row_from, 0, region_width);
        const int64_t hi = std::clamp<int64_t>(end - row_from, lo, region_width);
        convert_span(a_data + row_from, lo, hi, region_width, region.data() + q * region_pitch);
      }
      for (int64_t i = 0; i < m_end - m_begin; ++i) a_tiles[i] = region.data() + region_offsets[i];
      lda = region_pitch;
    } else if (pack_a) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const T* const* source = a.data() + tile * kTileM;
        const int64_t height = std::min(kTileM, m_end - m_begin - tile * kTileM);
        float* target = packed_a.data() + tile * chunk_rows * kTileM;
        // Consecutive elements (channels of one tap): one block copy a row.
        bool contiguous = height == kTileM;
        for (int64_t i = 1; i < height; ++i) contiguous &= source[i] == source[0] + i;
        // f16 and bf16 rows in one masked vector conversion: element by
        // element (F16C's scalar conversion) f16 cost the layers on this path
        // 10-20% (Sapphire Rapids). bf16 measured no faster so there, but on
        // the Cascade Lake the packing's time fell from 31% to 24% of the
        // tiles' in ResNet-50's 3x3 64-channel layer (perf), and 3x3, 1-D and
        // 3-D layers ran 1.04-1.13 times as fast (medians of 8 pairs of
        // alternating processes; the 1x1 64 -> 256 layer 1.0).
        // f32 rows are copied as they are. The AVX2 build stores a row's
        // whole vector: its two lanes past the row land where the next row
        // is stored after it (or in the buffer's slack). Its masked stores
        // had taken most of the packing's time on the Zen 3 (masked stores
        // are slow on AMD's cores): the 16-bit channels-last stems of
        // ResNet-50 (7x7, stride 2, 3 channels), MobileNetV2 and ConvNeXt
        // ran 1.32-1.47x as fast so, the benchmark's gemm layers 0.97-1.08x
        // (bf16 and f16, 2 threads, interleaved).
        static_assert(kTileM <= kLanes && kTileM % 2 == 0, "a row of a tile is one vector's pairs");
        for (const Segment& segment : segments)
          for (int64_t r = segment.offset; r < segment.offset + segment.length; ++r, target += kTileM) {
            if constexpr (!std::is_same_v<T, float>)
              if (contiguous) {
                const Vector row = load_as_float(source[0] + r * args.lda, kTileM);
                if constexpr (kLanes == 8)
                  store(target, row);
                else
                  store(target, first_lanes(kTileM), row);
                continue;
              }
            if (contiguous)
              for (int64_t i = 0; i < kTileM; ++i) target[i] = to_float(source[0][r * args.lda + i]);
            else
              for (int64_t i = 0; i < height; ++i) target[i] = to_float(source[i][r * args.lda]);
          }
        for (int64_t i = 0; i < height; ++i)
          a_tiles[tile * kTileM + i] = packed_a.data() + tile * chunk_rows * kTileM + i;
      }
      lda = kTileM;
    } else if constexpr (std::is_same_v<T, float>) {
      std::copy(a.begin(), a.end(), a_tiles.begin());
    }
    // Packed A holds the segments' rows one after another, as the slabs do.
    const Segment packed_rows{0, rows};
    const Segment* const tile_segments = pack_a ? &packed_rows : segments.data();
    const int64_t tile_segment_count = pack_a ? 1 : static_cast<int64_t>(segments.size());
    // The rows of A, and of B, that the next chunk spans.
    const int64_t next_begin = v0 + rows < window_rows ? row_of(v0 + rows) : 0, next_span = span_of(v0 + rows);
    const int64_t next_end = next_begin + next_span;
    const int64_t next_b_begin = args.b_compact ? v0 + rows : next_begin;
    const int64_t next_b_end = args.b_compact ? std::min(v0 + rows + chunk_rows, window_rows) : next_end;
    RowRuns next_chunk(next_begin, next_span, slabs * tiles);
    RowRuns next_chunk_b(next_b_begin, next_b_end - next_b_begin, slabs * tiles);
    // Channels-first operands: a few channels' whole runs of the next chunk a tile.
    RowRuns next_channels_a(channel_begin, channel_end - channel_begin, slabs * tiles);
    RowRuns next_channels_b(o_begin, o_end - o_begin, slabs * tiles);
    for (int64_t slab = 0; slab < slabs; ++slab) {
      const int64_t o0 = o_begin + slab * kTileO, width = std::min(kTileO, o_end - o0);
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const auto [row_begin, row_end] = next_chunk.next();
        const auto [b_row_begin, b_row_end] = next_chunk_b.next();
        const auto [a_channels_begin, a_channels_end] = next_channels_a.next();
        const auto [b_channels_begin, b_channels_end] = next_channels_b.next();
        if (b_channels_first)
          prefetch_rows(b_data, args.b_channel_stride, b_channels_begin, b_channels_end, next_b_begin, next_b_end,
                        b_to_l2);
        else
          prefetch_rows(b_data, args.ldb, b_row_begin, b_row_end, o_begin, o_end, b_to_l2);
        if (args.a_channel_stride == 1)
          prefetch_rows(ahead, args.lda, row_begin, row_end, channel_begin, channel_end, a_to_l2);
        else
          prefetch_rows(ahead, args.a_channel_stride, a_channels_begin, a_channels_end, next_begin * args.lda,
                        next_end * args.lda, a_to_l2);
        const int64_t m0 = m_begin + tile * kTileM, height = std::min(kTileM, m_end - m0);
        const float* const* tile_a = a_tiles.data() + tile * kTileM;
        pick_tile(tile_a, height, width)(tile_a, lda, packed_b.data() + slab * rows * kTileO, tile_segments,
                                         tile_segment_count, args.out + m0 * args.channels_b + o0, args.channels_b,
                                         width, zero);
      }
    }
  }
}

inline void block_impl(const Args& args, int64_t m_begin, int64_t m_end, int64_t o_begin, int64_t o_end,
                       int64_t chunk_rows, bool pack_a) {
  switch (args.element) {
    case TapElement::Float: return block_of<float>(args, m_begin, m_end, o_begin, o_end, chunk_rows, pack_a);
    case TapElement::Half: return block_of<c10::Half>(args, m_begin, m_end, o_begin, o_end, chunk_rows, true);
    case TapElement::BFloat16:
      return block_of<c10::BFloat16>(args, m_begin, m_end, o_begin, o_end, chunk_rows, true);
  }
}

#endif  // CPU_CAPABILITY_AVX2 || CPU_CAPABILITY_AVX512

// dst[r * dst_ld + i] = src[r * src_ld + i * step] for i in [begin, count),
// element by element: the builds' gathers do so beyond what their vectors take.
template <typename T>
inline void gather_elements(const T* src, int64_t src_ld, int64_t step, T* dst, int64_t dst_ld, int64_t begin,
                            int64_t count, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = begin; i < count; ++i) dst[r * dst_ld + i] = src[r * src_ld + i * step];
}

#ifdef CPU_CAPABILITY_AVX512

// Per block of one vector's outputs (32 16-bit or 16 32-bit elements), lane
// j reads source element j * step: from the source vector p = j * step /
// kBlock, at its lane j * step % kBlock. So `step` vector loads and masked
// permutes make a vector of outputs, where element-by-element copies make
// one a cycle.
template <typename T>
inline void gather_of(const T* src, int64_t src_ld, int64_t step, T* dst, int64_t dst_ld, int64_t count,
                      int64_t rows) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- or 32-bit elements");
  constexpr int64_t kBlock = 64 / sizeof(T);
  if (step > kBlock) return gather_elements(src, src_ld, step, dst, dst_ld, 0, count, rows);
  using Mask = std::conditional_t<sizeof(T) == 2, __mmask32, __mmask16>;
  const auto first = [](int64_t n) {
    return static_cast<Mask>(n >= kBlock ? ~uint32_t{0} : (uint32_t{1} << n) - 1);
  };
  __m512i lane_of[kBlock];
  Mask lanes_from[kBlock];
  for (int64_t p = 0; p < step; ++p) {
    alignas(64) T lane[kBlock];
    uint32_t mask = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      lane[j] = static_cast<T>(j * step % kBlock);
      if (j * step / kBlock == p) mask |= uint32_t{1} << j;
    }
    lane_of[p] = _mm512_load_si512(lane);
    lanes_from[p] = static_cast<Mask>(mask);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i0 = 0; i0 < count; i0 += kBlock) {
      const int64_t outputs = std::min(kBlock, count - i0);
      const T* base = src + r * src_ld + i0 * step;
      const int64_t span = (outputs - 1) * step + 1;  // source elements this block reads
      __m512i out = _mm512_setzero_si512();
      for (int64_t p = 0; p < step && p * kBlock < span; ++p) {
        if constexpr (sizeof(T) == 2)
          out = _mm512_mask_permutexvar_epi16(out, lanes_from[p], lane_of[p],
                                              _mm512_maskz_loadu_epi16(first(span - p * kBlock), base + p * kBlock));
        else
          out = _mm512_mask_permutexvar_epi32(out, lanes_from[p], lane_of[p],
                                              _mm512_maskz_loadu_epi32(first(span - p * kBlock), base + p * kBlock));
      }
      if constexpr (sizeof(T) == 2)
        _mm512_mask_storeu_epi16(dst + r * dst_ld + i0, first(outputs), out);
      else
        _mm512_mask_storeu_epi32(dst + r * dst_ld + i0, first(outputs), out);
    }
}

// 16 elements of each row widened to 32 bits, the second row's shifted into
// the upper halves: one pair a 32-bit lane.
inline void interleave_impl(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs) {
  constexpr int64_t kBlock = 16;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* first = rows[2 * p];
    const uint16_t* second = rows[2 * p + 1];
    uint16_t* out = dst + 2 * p * columns;
    for (int64_t j = 0; j < columns; j += kBlock) {
      const __mmask16 mask = _cvtu32_mask16(columns - j >= kBlock ? 0xffffu : (1u << (columns - j)) - 1);
      const __m512i low = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, first + j));
      const __m512i high = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, second + j)), 16);
      _mm512_mask_storeu_epi32(out + 2 * j, mask, _mm512_or_si512(low, high));
    }
  }
}

// 16 f16 at a time widened to float32 (exact); the high part rounded to
// nearest even on its upper 16 bits, the low part the exact remainder, whose
// lower 16 bits are zero. f16's exponent is all ones only for an infinity or
// NaN.
inline bool split_impl(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low) {
  constexpr int64_t kBlock = 16;
  const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i exponent = _mm256_set1_epi16(0x7c00);
  __mmask16 non_finite = 0;
  for (int64_t i = 0; i < count; i += kBlock) {
    const __mmask16 mask = _cvtu32_mask16(count - i >= kBlock ? 0xffffu : (1u << (count - i)) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(mask, half + i);
    non_finite |= _mm256_mask_cmpeq_epi16_mask(mask, _mm256_and_si256(h, exponent), exponent);
    const __m512 value = _mm512_cvtph_ps(h);
    const __m512i bits = _mm512_castps_si512(value);
    const __m512i rounded = _mm512_and_si512(
        _mm512_add_epi32(bits, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(bits, 16), one))), upper);
    const __m512 rest = _mm512_sub_ps(value, _mm512_castsi512_ps(rounded));
    _mm256_mask_storeu_epi16(high + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
    _mm256_mask_storeu_epi16(low + i, mask,
                             _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rest), 16)));
  }
  return non_finite == 0;
}

#else

#ifdef CPU_CAPABILITY_AVX2
// 32-bit elements as in the AVX-512 build: per block of 8 outputs, lane j
// reads source element j * step from the source vector p = j * step / 8, at
// its lane j * step % 8, through one permute and one blend per vector. A
// block reads whole vectors, up to element 8 * step - 1 from its first, so
// only blocks with an output at or beyond that are gathered so; the rest
// element by element. Rows are prefetched a few ahead: they lie a channel
// apart. ResNet's stride-2 1x1 layer, channels-first f32: the gather's time
// fell by a third, from 16% of the layer's (Zen 3, perf).
inline void gather_words(const uint32_t* src, int64_t src_ld, int64_t step, uint32_t* dst, int64_t dst_ld,
                         int64_t count, int64_t rows) {
  constexpr int64_t kBlock = 8, kPrefetchRows = 4;
  const int64_t blocks = step <= kBlock ? (count - 1) / kBlock : 0;
  if (blocks == 0) return gather_elements(src, src_ld, step, dst, dst_ld, 0, count, rows);
  __m256i lane_of[kBlock], lanes_from[kBlock];
  for (int64_t p = 0; p < step; ++p) {
    alignas(32) int32_t lane[kBlock], from[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) {
      lane[j] = static_cast<int32_t>(j * step % kBlock);
      from[j] = j * step / kBlock == p ? -1 : 0;
    }
    lane_of[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane));
    lanes_from[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(from));
  }
  const auto load_words = [](const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* row = src + r * src_ld;
    uint32_t* out_row = dst + r * dst_ld;
    if (r + kPrefetchRows < rows) prefetch_rows(row + kPrefetchRows * src_ld, 0, 0, 1, 0, (count - 1) * step + 1);
    for (int64_t block = 0; block < blocks; ++block) {
      const uint32_t* base = row + block * kBlock * step;
      __m256i out = _mm256_permutevar8x32_epi32(load_words(base), lane_of[0]);
      for (int64_t p = 1; p < step; ++p)
        out = _mm256_blendv_epi8(out, _mm256_permutevar8x32_epi32(load_words(base + p * kBlock), lane_of[p]),
                                 lanes_from[p]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_row + block * kBlock), out);
    }
  }
  gather_elements(src, src_ld, step, dst, dst_ld, blocks * kBlock, count, rows);
}

// 16-bit elements element by element: gemm converts low precision to float32
// before it gathers on AVX2 CPUs.
template <typename T>
inline void gather_of(const T* src, int64_t src_ld, int64_t step, T* dst, int64_t dst_ld, int64_t count,
                      int64_t rows) {
  if constexpr (sizeof(T) == 4)
    gather_words(src, src_ld, step, dst, dst_ld, count, rows);
  else
    gather_elements(src, src_ld, step, dst, dst_ld, 0, count, rows);
}
#else
template <typename T>
inline void gather_of(const T* src, int64_t src_ld, int64_t step, T* dst, int64_t dst_ld, int64_t count,
                      int64_t rows) {
  gather_elements(src, src_ld, step, dst, dst_ld, 0, count, rows);
}
#endif

inline void interleave_impl(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs) {
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t j = 0; j < columns; ++j)
      for (int64_t i = 0; i < 2; ++i) dst[(p * columns + j) * 2 + i] = rows[2 * p + i][j];
}

inline bool split_impl(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low) {
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t bits = half[i];
    const float value = static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
    const c10::BFloat16 rounded(value);  // to nearest even
    high[i] = rounded.x;
    low[i] = c10::BFloat16(value - static_cast<float>(rounded)).x;  // exact
    finite &= (bits & 0x7c00) != 0x7c00;
  }
  return finite;
}

#endif  // CPU_CAPABILITY_AVX512

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// columns[r] lane c = rows[c] lane r for c < 8, r < 16, 16-bit elements:
// unpacked in pairs, quads and eights within each 128-bit lane, whose two
// lanes hold two 8 x 8 blocks. at::vec's transpose moves 16-bit elements one
// at a time: bf16 channels-last rows for the brgemm algorithm transposed at
// about 6 GB/s so.
inline void transpose_8x16_registers(const __m256i (&rows)[8], __m128i (&columns)[16]) {
  __m256i pairs[8], quads[8];
  for (int i = 0; i < 4; ++i) {
    pairs[2 * i] = _mm256_unpacklo_epi16(rows[2 * i], rows[2 * i + 1]);
    pairs[2 * i + 1] = _mm256_unpackhi_epi16(rows[2 * i], rows[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      quads[4 * i + 2 * j] = _mm256_unpacklo_epi32(pairs[4 * i + j], pairs[4 * i + j + 2]);
      quads[4 * i + 2 * j + 1] = _mm256_unpackhi_epi32(pairs[4 * i + j], pairs[4 * i + j + 2]);
    }
  for (int k = 0; k < 4; ++k) {
    const __m256i even = _mm256_unpacklo_epi64(quads[k], quads[4 + k]);
    const __m256i odd = _mm256_unpackhi_epi64(quads[k], quads[4 + k]);
    columns[2 * k] = _mm256_castsi256_si128(even);
    columns[2 * k + 1] = _mm256_castsi256_si128(odd);
    columns[8 + 2 * k] = _mm256_extracti128_si256(even, 1);
    columns[9 + 2 * k] = _mm256_extracti128_si256(odd, 1);
  }
}
// to[r * dst_ld + c] = from[c * src_ld + r] for c < 8, r < 16.
inline void transpose_8x16(const uint16_t* from, int64_t src_ld, uint16_t* to, int64_t dst_ld) {
  __m256i rows[8];
  __m128i columns[16];
  for (int i = 0; i < 8; ++i) rows[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i * src_ld));
  transpose_8x16_registers(rows, columns);
  for (int r = 0; r < 16; ++r) _mm_storeu_si128(reinterpret_cast<__m128i*>(to + r * dst_ld), columns[r]);
}
#endif

// The blocks transpose_of moves in registers: on AVX-512 16 x 16 float32
// (transpose_registers), on AVX2 8 x 8 float32 (at::vec), on both 8 x 16
// 16-bit elements (transpose_8x16); 8 x 8 through at::vec elsewhere.
// Columns and rows of the source a block spans:
#if defined(CPU_CAPABILITY_AVX512)
template <typename T>
constexpr int64_t kTransposeColumns = sizeof(T) == 4 ? 16 : 8;
template <typename T>
constexpr int64_t kTransposeRows = 16;
#elif defined(CPU_CAPABILITY_AVX2)
template <typename T>
constexpr int64_t kTransposeColumns = 8;
template <typename T>
constexpr int64_t kTransposeRows = sizeof(T) == 2 ? 16 : 8;
#else
template <typename T>
constexpr int64_t kTransposeColumns = 8;
template <typename T>
constexpr int64_t kTransposeRows = 8;
#endif

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// Prefetches a transposition block's source row 8 lines ahead: each
// channel's plane is one of as many streams as there are channels, more than
// the hardware's prefetchers follow, and they left the loads waiting on
// memory.
inline void prefetch_row_ahead(const void* row) {
  constexpr int64_t kPrefetchAhead = 512;
  _mm_prefetch(static_cast<const char*>(row) + kPrefetchAhead, _MM_HINT_T0);
}
#endif

// to[r * dst_ld + c] = from[c * src_ld + r] for one whole block. On the
// Cascade Lake the AVX2 build's 8 x 8 float32 blocks took 29% of the 1-D
// layer's channels-first time (k10 s5, 32 -> 64 channels, 16000 samples, 2
// threads); the AVX-512 build's 16 x 16 ones ran it 1.07-1.2x as fast
// (interleaved, four runs), the other layers' 1.0x.
template <typename T>
inline void transpose_block(const T* from, int64_t src_ld, T* to, int64_t dst_ld) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  if constexpr (sizeof(T) == 2) {
    transpose_8x16(from, src_ld, to, dst_ld);
    return;
  }
#endif
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (sizeof(T) == 4) {
    // Each source row prefetched ahead: the 1-D layer 1.05-1.1x as fast so.
    __m512 lines[16], columns[16];
    for (int c = 0; c < 16; ++c) {
      prefetch_row_ahead(from + c * src_ld);
      lines[c] = _mm512_loadu_ps(from + c * src_ld);
    }
    transpose_registers(lines, columns);
    for (int r = 0; r < 16; ++r) _mm512_storeu_ps(to + r * dst_ld, columns[r]);
  }
#else
#if defined(CPU_CAPABILITY_AVX2)
  // Each source row prefetched ahead, as on AVX-512: U-Net's channels-first
  // layer ran 1.02-1.11x as fast so in f32, the 1-D layer 0.97-1.07x, DCGAN's
  // 1.02-1.03x, the other channels-first layers 0.99-1.02x (Zen 3, 2
  // threads, interleaved, four runs). (16-bit blocks prefetched so measured
  // 0.94-1.12x.)
  for (int c = 0; c < 8; ++c) prefetch_row_ahead(from + c * src_ld);
#endif
  at::vec::transpose_mxn<T, 8, 8>(from, src_ld, to, dst_ld);
#endif
}

// The first `columns` x `rows` of a block, where the edges cut it: on
// AVX-512 in registers, by masked loads and stores, elsewhere by plain loops.
// Rows of 28 or 14 pixels leave most of their blocks at the edge: on the
// Cascade Lake plain loops there took half of the transposition's time in
// U-Net's channels-first layer (f32, 2 threads). With the masks gemm ran it
// 1.13 times as fast in f32 and 1.14 in bf16, ResNet-50's stride-2 3x3
// layer 1.07-1.17 and the 3-D layer 1.07 (medians of 8 pairs of processes).
template <typename T>
inline void transpose_edge_block(const T* from, int64_t src_ld, T* to, int64_t dst_ld, int64_t columns, int64_t rows) {
#if defined(CPU_CAPABILITY_AVX512)
  // Blocks span at most 16 rows and 16 columns: first_lanes' masks cover them.
  if constexpr (sizeof(T) == 4) {
    __m512 lines[16], transposed[16];
    for (int c = 0; c < 16; ++c)
      lines[c] = c < columns ? _mm512_maskz_loadu_ps(first_lanes(rows), from + c * src_ld) : _mm512_setzero_ps();
    transpose_registers(lines, transposed);
    for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(to + r * dst_ld, first_lanes(columns), transposed[r]);
  } else {
    __m256i lines[8];
    __m128i transposed[16];
    for (int c = 0; c < 8; ++c)
      lines[c] = c < columns ? _mm256_maskz_loadu_epi16(first_lanes(rows), from + c * src_ld) : _mm256_setzero_si256();
    transpose_8x16_registers(lines, transposed);
    for (int r = 0; r < rows; ++r) _mm_mask_storeu_epi16(to + r * dst_ld, first_lanes(columns), transposed[r]);
  }
#else
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) to[r * dst_ld + c] = from[c * src_ld + r];
#endif
}

// Whole blocks and the edges' parts of blocks in registers where the build
// has them (transpose_block, transpose_edge_block).
template <typename T>
void transpose_of(const T* src, int64_t src_ld, T* dst, int64_t dst_ld, int64_t columns, int64_t rows) {
  constexpr int64_t kColumnBlock = kTransposeColumns<T>, kRowBlock = kTransposeRows<T>;
  // Along dst's rows first: consecutive blocks fill the same lines of dst.
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock)
    for (int64_t c0 = 0; c0 < columns; c0 += kColumnBlock) {
      const T* from = src + c0 * src_ld + r0;
      T* to = dst + r0 * dst_ld + c0;
      if (c0 + kColumnBlock <= columns && r0 + kRowBlock <= rows)
        transpose_block(from, src_ld, to, dst_ld);
      else
        transpose_edge_block(from, src_ld, to, dst_ld, std::min(kColumnBlock, columns - c0),
                             std::min(kRowBlock, rows - r0));
    }
}

inline void gather_impl(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count,
                        int64_t rows, int64_t element_size) {
  if (element_size == 4)
    gather_of(static_cast<const uint32_t*>(src), src_ld, step, static_cast<uint32_t*>(dst), dst_ld, count, rows);
  else
    gather_of(static_cast<const uint16_t*>(src), src_ld, step, static_cast<uint16_t*>(dst), dst_ld, count, rows);
}

inline void transpose_impl(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows,
                           int64_t element_size) {
  if (element_size == 4)
    transpose_of(static_cast<const float*>(src), src_ld, static_cast<float*>(dst), dst_ld, columns, rows);
  else
    transpose_of(static_cast<const uint16_t*>(src), src_ld, static_cast<uint16_t*>(dst), dst_ld, columns, rows);
}

}  // namespace torch_convgrad::tap_gemm_kernel::CPU_CAPABILITY

#endif  // CPU_CAPABILITY
