// The depthwise weight-gradient kernel, and its generalisation to groups of a
// few channels each (`group_channels` input and output channels a group):
//
//   dW[c, i, k] = sum_n sum_j input[n, g(c) + i, j*s - pb + k*d] * grad_output[n, c, j]
//
// over three spatial axes, where g(c) is the first channel of c's group and
// i < group_channels (depthwise: group_channels = 1). The first part of this
// header is the plain interface that depthwise.cpp calls; the second,
// compiled only by the per-capability translation units
// (depthwise_kernel_avx512.cpp, depthwise_kernel_avx2.cpp,
// depthwise_kernel_default.cpp, which define CPU_CAPABILITY), is the kernel.
#pragma once

#include <atomic>
#include <cstdint>

namespace torch_convgrad::depthwise_kernel {

enum class Dtype { Float, Double, Half, BFloat16 };

// Sizes in elements; the data tensors are (N, C, X0, X1, X2) and (N, C, Y0, Y1, Y2).
struct Args {
  Dtype dtype;
  const void* input;
  const void* grad_output;
  // Elements from the input's first one past its last one (the kernels may
  // load any of them).
  int64_t input_span;
  int64_t input_strides[5];
  int64_t grad_output_strides[5];
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], pad_begin[3];
  // Channels a group, input and output alike: 1, 2, 4 or 8, at most one
  // vector of lanes (depthwise.cpp checks).
  int64_t group_channels;
  // Whether channels_last prefetches a coming output row's grad_output row
  // and the input rows it stages first while its tiles run (depthwise.cpp
  // decides by the CPU).
  bool prefetch_next_rows = false;
  // Whether channels_last reads channels-last input rows in place, converted
  // as its tiles load them, at strides of 2 or more along the row, instead of
  // staging them (depthwise.cpp decides by the CPU).
  bool strided_rows_in_place = false;
  // Whether channels_last may sum bf16 data on AVX512_BF16 dot products
  // (depthwise.cpp decides by the CPU).
  bool bf16_pairs = false;
  // Whether channels_first sums depthwise bf16 planes on AVX512_BF16 dot
  // products (the AVX-512 build where it has them: bf16_planes_built();
  // grad_output rows of unit stride), and whether both tensors' planes are
  // contiguous (it then prefetches the next ones).
  bool bf16_planes = false;
  bool dense_planes = false;
  // Whether channels_first runs depthwise f32/bf16/f16 planes on the AVX-512
  // or AVX2 build's float row tiles (float_row_taps along the row, stride 1
  // or 2 and dilation 1 along it, grad_output rows of unit stride).
  bool float_rows = false;
  // Whether channels_last runs the problem on whole planes
  // (channels_last_planes), which it can where runs_as_planes (depthwise.cpp
  // decides by the CPU, the layout and the rows' length).
  bool whole_planes = false;
  // Whether the AVX-512 float row tiles load bf16 rows read in place at
  // stride 1 as pairs of elements (depthwise.cpp decides by the CPU; the
  // tiles by the row, pair_steps_fit).
  bool bf16_pair_loads = false;
  // amx_bf16 sets it where a sum came out infinite or NaN (as any infinity
  // or NaN in the data that it loads makes some sum).
  std::atomic<bool>* non_finite = nullptr;
};

// Both write the gradient of output channels [channel_begin, channel_end)
// summed over samples [sample_begin, sample_end) to `result`, laid out
// [channel - channel_begin][i][tap], as float (double for Dtype::Double).
//
// channels_last vectorises over channels. It is fast on channel stride 1
// (NXC); depthwise channels-first data (NCX) it transposes as it stages it,
// fast where the last spatial axis has stride 1. Groups of several channels
// need channel stride 1. channels_first vectorises along the last spatial
// axis; it takes any strides and is fast when that axis has stride 1 (NCX).
#define TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS                                                      \
  void channels_last(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,  \
                     int64_t channel_end, void* result);                                                \
  void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin, \
                      int64_t channel_end, void* result);

namespace AVX512 {
TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS
// Whether this build's channels_first has the bf16 planes (Args::bf16_planes).
bool bf16_planes_built();
}
namespace AVX2 {
TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS
}
namespace DEFAULT {
TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS
}
#undef TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS

// The taps along the row that Args::float_rows takes.
inline bool float_row_taps(int64_t taps_along_row) {
  return taps_along_row == 3 || taps_along_row == 5 || taps_along_row == 7;
}

// Whether channels_last can take a problem on whole planes
// (Args::whole_planes): depthwise, 2-D (a single slice of output and
// of kernel, reading the input's first), stride 1 along rows and columns and
// dilation 1 along the row.
inline bool runs_as_planes(const Args& args) {
  return args.group_channels == 1 && args.out[0] == 1 && args.kernel[0] == 1 && args.pad_begin[0] == 0 &&
         args.out[1] > 1 && args.stride[1] == 1 && args.stride[2] == 1 && args.dilation[2] == 1 &&
         args.pad_begin[1] >= 0 && args.pad_begin[2] >= 0;
}

// amx_bf16's pitch of grad_output pair rows, in pairs, for rows of `chunks`
// chunks of 32 positions: the last chunk's B reads pairs up to (chunks - 1) *
// 32 + 2 * 15 + 7; on cache lines.
inline int64_t amx_pair_pitch(int64_t chunks) { return (chunks * 32 + 8 + 15) / 16 * 16; }
// Whether amx_bf16 makes channels-last grad_output rows of `width` positions
// into their pair rows as it transposes them: where those take at most 4
// times the row's bytes (ConvNeXt's rows of 56 and 28 positions; rows of 14
// and 7, whose pair rows are mostly zeros, would take L2's space).
inline bool amx_makes_pair_rows(int64_t chunks, int64_t width) { return amx_pair_pitch(chunks) <= 2 * width; }

// Whether this compiler and OS give the AVX-512 build the AMX kernel below
// (GCC 11 and Clang 12 have the tile intrinsics; Linux grants the tile state).
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define TORCH_CONVGRAD_DEPTHWISE_AMX 1
// bf16 depthwise 2-D layers with stride 1, no dilation, at most 8 taps
// along the row and 15 rows of taps, on AMX tiles (amx_depthwise.cpp
// checks). Writes the result as channels_last and channels_first do. Only
// where the CPU has AMX-BF16 and amx_tiles_granted().
namespace AVX512 {
void amx_bf16(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin, int64_t channel_end,
              void* result);
}
// Asks Linux once for this process's permission to use the AMX tile state.
bool amx_tiles_granted();
#endif

}  // namespace torch_convgrad::depthwise_kernel

#ifdef CPU_CAPABILITY

#include "float_lanes.h"
#include "line_aligned_buffer.h"
#include "register_transpose.h"

#include <ATen/cpu/vec/vec.h>
#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace torch_convgrad::depthwise_kernel::CPU_CAPABILITY {

using ::torch_convgrad::CPU_CAPABILITY::LineAlignedBuffer;
#if defined(CPU_CAPABILITY_AVX512)
using ::torch_convgrad::CPU_CAPABILITY::first_lanes;
using ::torch_convgrad::CPU_CAPABILITY::load_transposed;
using ::torch_convgrad::CPU_CAPABILITY::transpose_registers;
#elif defined(CPU_CAPABILITY_AVX2)
using ::torch_convgrad::CPU_CAPABILITY::EvenOdd;
using ::torch_convgrad::CPU_CAPABILITY::first_lanes;
using ::torch_convgrad::CPU_CAPABILITY::float_of;
using ::torch_convgrad::CPU_CAPABILITY::load_even_odd_floats;
using ::torch_convgrad::CPU_CAPABILITY::load_first_floats;
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
using ::torch_convgrad::CPU_CAPABILITY::load_floats;
#endif

// f16/bf16 accumulate in float32, f64 in float64.
template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
using AccVec = at::vec::Vectorized<acc_type<T>>;

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// AccVec<T>::size() elements of `data` as accumulation-type lanes.
template <typename T>
AccVec<T> load_lanes(const T* data) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    AccVec<T> lanes;
    at::vec::load_fp32_from_bf16(data, lanes);
    return lanes;
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    AccVec<T> lanes;
    at::vec::load_fp32_from_fp16(data, lanes);
    return lanes;
  } else {
    return AccVec<T>::loadu(data);
  }
}

// `count` taps split into tiles of at most `most`, as evenly as possible
// (9 = 5 + 4 for tiles of 8, not 8 + 1).
struct TapRange {
  int64_t first, count;
};
inline std::vector<TapRange> tap_tiles(int64_t count, int64_t most) {
  const int64_t tiles = (count + most - 1) / most;
  std::vector<TapRange> ranges;
  for (int64_t tile = 0, first = 0; tile < tiles; ++tile) {
    const int64_t size = count / tiles + (tile < count % tiles ? 1 : 0);
    ranges.push_back({first, size});
    first += size;
  }
  return ranges;
}

// Calls kernel.template operator()<kCount>() with kCount = count (1..kMost).
template <int kMost, int kCount = 1, typename Kernel>
void with_count(int64_t count, Kernel&& kernel) {
  if constexpr (kCount < kMost)
    if (count > kCount) return with_count<kMost, kCount + 1>(count, kernel);
  kernel.template operator()<kCount>();
}

// Copies one row of `size` elements along an axis of `stride` into `stride`
// phases `phase_pitch` apart: element w goes to phase (w + pad) % stride at
// index (w + pad) / stride, for the indices below `phase_length`. Other
// positions are left as they are.
template <typename T, typename A = acc_type<T>>
void stage_phases(const T* source, int64_t element_stride, int64_t size, int64_t stride, int64_t pad,
                  int64_t phase_length, int64_t phase_pitch, A* phases) {
  constexpr int64_t kLanes = AccVec<T>::size();
  size = std::clamp<int64_t>(stride * phase_length - pad, 0, size);
  int64_t w = 0;
  if (element_stride == 1 && stride == 1) {
    for (; w + kLanes <= size; w += kLanes) load_lanes(source + w).store(phases + pad + w);
  } else if (element_stride == 1 && stride == 2) {
    if (pad % 2 == 1 && w < size) {
      phases[phase_pitch + pad / 2] = static_cast<A>(source[0]);
      w = 1;
    }
    for (; w + 2 * kLanes <= size; w += 2 * kLanes) {
      const auto [even, odd] = at::vec::deinterleave2(load_lanes(source + w), load_lanes(source + w + kLanes));
      even.store(phases + (w + pad) / 2);
      odd.store(phases + phase_pitch + (w + pad) / 2);
    }
  }
  // The rest one by one, stepping phase and index without dividing per element.
  int64_t phase = (w + pad) % stride, index = (w + pad) / stride;
  for (; w < size; ++w) {
    phases[phase * phase_pitch + index] = static_cast<A>(source[w * element_stride]);
    if (++phase == stride) {
      phase = 0;
      ++index;
    }
  }
}

// Lines to prefetch (into L2) while the tiles run: sets of `count`
// byte ranges `pitch` apart (a channel's row each on channels-first data, a
// single piece of whole rows on channels-last data), issued a few lines at a
// time from inside the tiles' loops. Issued all at once before the tiles,
// they stall the core: a prefetch that misses holds one of the few line-fill
// buffers, and the next waits for a free one while no FMA retires behind it.
class PrefetchQueue {
 public:
  // channels_last: a grad_output row and up to 4 input rows; amx_bf16: two a slice.
  static constexpr int kMostRanges = 5;
  void clear() { ranges_ = 0, range_ = 0, item_ = 0, lines_ = 0, per_step_ = 0, next_ = nullptr; }
  void add(const void* begin, int64_t bytes, int64_t count = 1, int64_t pitch = 0) {
    if (bytes <= 0 || count <= 0 || ranges_ == kMostRanges) return;
    const auto first = reinterpret_cast<std::uintptr_t>(begin) & ~std::uintptr_t{kLine - 1};
    ranges_list_[ranges_++] = {reinterpret_cast<const char*>(first),
                               static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(begin) + bytes - first), count,
                               pitch};
    lines_ += count * ((ranges_list_[ranges_ - 1].bytes + kLine - 1) / kLine);
    if (ranges_ == 1) start_item();
  }
  // Spreads the queued lines over `steps` calls of step().
  void spread_over(int64_t steps) { per_step_ = steps > 0 ? (lines_ + steps - 1) / steps : lines_; }
  void step() {
    for (int64_t k = 0; k < per_step_ && next_; ++k) issue();
  }
  void drain() {
    while (next_) issue();
    clear();
  }

 private:
  static constexpr int64_t kLine = 64;
  struct Range {
    const char* begin;
    int64_t bytes, count, pitch;
  };
  void start_item() {
    const Range& range = ranges_list_[range_];
    next_ = range.begin + item_ * range.pitch;
    end_ = next_ + range.bytes;
  }
  void issue() {
    __builtin_prefetch(next_, 0, 1);
    next_ += kLine;
    if (next_ < end_) return;
    if (++item_ == ranges_list_[range_].count) {
      item_ = 0;
      if (++range_ == ranges_) {
        next_ = nullptr;
        return;
      }
    }
    start_item();
  }
  Range ranges_list_[kMostRanges];
  int ranges_ = 0, range_ = 0;
  int64_t item_ = 0, lines_ = 0, per_step_ = 0;
  const char* next_ = nullptr;
  const char* end_ = nullptr;
};

// ---------------------------------------------------------------------------
// channels_last: lanes are channels, one vector of them (a block) at a time.
// Input and grad_output rows are staged block by block, staged[block][pixel]
// [lane] (transposed from channels-first data), converted to the
// accumulation type and with the input's padding as zero pixels: a block's
// rows are then short contiguous runs that stay in L1
// across all its taps, no window needs a bounds check, and memory is read
// once, in address order. Each input row is staged once and kept in a ring
// while the output rows that read it pass; the hardware prefetchers follow
// the staging's reads, and on some CPUs software prefetches of the coming
// rows help them (Args::prefetch_next_rows). A grad_output row that needs no
// padding or transposition (channels-last, whole vectors of channels) is
// read in place, converted as the tiles load it. A tile keeps the sums
// of up to kMaxTileTaps taps (several input rows times several taps along
// the row) in registers, so one grad_output load serves them all.
// ---------------------------------------------------------------------------

// The tile's sums, the grad_output vector and an input vector fill the
// registers: 14 + 2 of AVX2's 16 (a 7x7 kernel runs two rows at a time), 28
// + 2 of AVX-512's 32.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kMaxTileRows = 4, kMaxTileCols = 8, kMaxTileTaps = 28;
#else
constexpr int kMaxTileRows = 3, kMaxTileCols = 8, kMaxTileTaps = 14;
#endif

// channels_last_tile takes a prefetch step every kPrefetchWindows windows.
constexpr int64_t kPrefetchWindows = 8;

// acc[r][c][lane] += sum_{j < windows} x_r[j * x_step + c * tap_step][lane] * dy[j * dy_step][lane]
// for r < kRows input rows and c < kCols taps along the row; with kBroadcast,
// x_r[...][0] in every lane. x and dy hold the accumulation type or the data's.
template <int kRows, int kCols, bool kBroadcast, typename X, typename D, typename A>
void channels_last_tile(const X* const* rows, int64_t x_step, int64_t tap_step, const D* dy, int64_t dy_step,
                        int64_t windows, A* const* acc, PrefetchQueue& prefetch) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t kLanes = Vec::size();
  // Few taps sum alternate windows apart, for enough independent FMA chains.
  constexpr int kChains = kRows * kCols <= 4 ? 2 : 1;
  const X* x[kRows];
  Vec sums[kChains][kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    x[r] = rows[r];
    for (int c = 0; c < kCols; ++c) {
      sums[0][r][c] = Vec::loadu(acc[r] + c * kLanes);
      for (int chain = 1; chain < kChains; ++chain) sums[chain][r][c] = Vec(A(0));
    }
  }
  const auto add_window = [&](Vec(&chain_sums)[kRows][kCols], const D* dy_window) {
    const Vec dy_lanes = load_lanes(dy_window);
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kCols; ++c) {
        const X* source = x[r] + c * tap_step;
        chain_sums[r][c] = at::vec::fmadd(kBroadcast ? Vec(static_cast<A>(*source)) : load_lanes(source), dy_lanes,
                                          chain_sums[r][c]);
      }
      x[r] += x_step;
    }
  };
  int64_t j = 0;
  for (; j + kChains <= windows; j += kChains) {
    if (j % kPrefetchWindows == 0) prefetch.step();
    for (int chain = 0; chain < kChains; ++chain) add_window(sums[chain], dy + (j + chain) * dy_step);
  }
  for (; j < windows; ++j) add_window(sums[0], dy + j * dy_step);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      for (int chain = 1; chain < kChains; ++chain) sums[0][r][c] = sums[0][r][c] + sums[chain][r][c];
      sums[0][r][c].store(acc[r] + c * kLanes);
    }
}

// The shared tile's vector operations: at::vec, except float on AVX-512,
// where they are the raw registers. GCC allocates the registers of 3 x 7
// tiles of at::vec wrappers less well there (a register copy for every other
// FMA, competing for the FMA ports): on one Sapphire Rapids core they ran at
// 62-67 GMAC/s, on raw registers at 77-82. (The AVX2 build measured the same
// either way.)
template <typename A>
struct TileVector {
  using Register = at::vec::Vectorized<A>;
  static Register load(const A* source) { return Register::loadu(source); }
  template <typename T>
  static Register load_lanes(const T* source) {
    return ::torch_convgrad::depthwise_kernel::CPU_CAPABILITY::load_lanes(source);
  }
  static void store(A* target, Register value) { value.store(target); }
  static Register fmadd(Register a, Register b, Register c) { return at::vec::fmadd(a, b, c); }
};
#if defined(CPU_CAPABILITY_AVX512)
template <>
struct TileVector<float> {
  using Register = __m512;
  static Register load(const float* source) { return _mm512_loadu_ps(source); }
  template <typename T>
  static Register load_lanes(const T* source) {
    return ::torch_convgrad::depthwise_kernel::CPU_CAPABILITY::load_lanes(source);
  }
  static void store(float* target, Register value) { _mm512_storeu_ps(target, value); }
  static Register fmadd(Register a, Register b, Register c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

// Where stride equals dilation, tap c of window j reads the pixel that tap
// c - 1 of window j + 1 reads. The shared tile takes kSharedWindows windows
// at a time and loads each pixel they reach once, for every (window, tap)
// pair that reads it: kSharedWindows + kCols - 1 loads a row for
// kSharedWindows * kCols FMAs, where channels_last_tile loads one a FMA,
// which leaves AVX-512's two loads a cycle as the bound. Its sums, the
// windows' grad_output vectors and a pixel fill the registers: 21 + 8 + 1
// of AVX-512's 32 (8 windows measured 82 GMAC/s a core on 3 x 7 tiles, 4
// windows 66), 9 + 4 + 1 of AVX2's 16. Each sum takes kSharedWindows
// dependent FMAs a step, so a tile of one row of 3 taps had 3 chains for
// FMAs of 4-5 cycles' latency; three rows of a 3x3 kernel at once ran
// MobileNetV2's channels-last layer 1.18x as fast in f32 and 1.4x in
// f16/bf16, its channels-first one 1.19-1.31x (AMD EPYC, Zen 3, 2 threads,
// builds alternated by process; 2026-12-01).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kSharedWindows = 8, kMaxSharedRows = 3, kMaxSharedTaps = 21;
#else
constexpr int kSharedWindows = 4, kMaxSharedRows = 3, kMaxSharedTaps = 9;
#endif
static_assert(kMaxSharedRows <= kMaxTileRows, "shared tiles fill the same row arrays");

// acc[r][c][lane] += sum_{j < windows} x_r[(j + c) * step][lane] * dy[j * dy_step][lane]
// for r < kRows input rows and c < kCols taps along the row; `windows` is a
// multiple of kSharedWindows. x and dy hold the accumulation type or the
// data's.
template <int kRows, int kCols, typename X, typename D, typename A>
void channels_last_shared_tile(const X* const* rows, int64_t step, const D* dy, int64_t dy_step, int64_t windows,
                               A* const* acc, PrefetchQueue& prefetch) {
  using V = TileVector<A>;
  using Register = typename V::Register;
  constexpr int64_t kLanes = at::vec::Vectorized<A>::size();
  constexpr int kPixels = kSharedWindows + kCols - 1;
  Register sums[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) sums[r][c] = V::load(acc[r] + c * kLanes);
  for (int64_t j = 0; j < windows; j += kSharedWindows) {
    prefetch.step();
    Register dy_lanes[kSharedWindows];
#pragma GCC unroll 16
    for (int u = 0; u < kSharedWindows; ++u) dy_lanes[u] = V::load_lanes(dy + (j + u) * dy_step);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const X* x = rows[r] + j * step;
#pragma GCC unroll 16
      for (int p = 0; p < kPixels; ++p) {
        Register pixel;
        if constexpr (std::is_same_v<X, A>)
          pixel = V::load(x + p * step);
        else
          pixel = V::load_lanes(x + p * step);
#pragma GCC unroll 16
        for (int u = 0; u < kSharedWindows; ++u)
          if (p - u >= 0 && p - u < kCols) sums[r][p - u] = V::fmadd(pixel, dy_lanes[u], sums[r][p - u]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) V::store(acc[r] + c * kLanes, sums[r][c]);
}

// Calls kernel.template operator()<kRows, kCols>() with the given counts
// (rows <= kMaxRows, cols <= kMaxTileCols, rows * cols <= kMaxTaps).
template <int kMaxRows, int kMaxTaps, int kRows = 1, int kCols = 1, typename Kernel>
void with_tile_shape(int64_t rows, int64_t cols, Kernel&& kernel) {
  if constexpr (kRows < kMaxRows && (kRows + 1) * kCols <= kMaxTaps)
    if (rows > kRows) return with_tile_shape<kMaxRows, kMaxTaps, kRows + 1, kCols>(rows, cols, kernel);
  if constexpr (kCols < kMaxTileCols && kRows * (kCols + 1) <= kMaxTaps)
    if (cols > kCols) return with_tile_shape<kMaxRows, kMaxTaps, kRows, kCols + 1>(rows, cols, kernel);
  kernel.template operator()<kRows, kCols>();
}

// Words of a pair of 16-lane bf16 rows: (first[lane], second[lane]) per lane.
constexpr int64_t kPairWords = 32;

#if defined(CPU_CAPABILITY_AVX512) && defined(__x86_64__) && \
    (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS 1
// bf16 on AVX512_BF16: VDPBF16PS multiplies pairs of bf16 and adds both
// products to a float lane, 32 multiply-adds an instruction where an FMA on
// float lanes does 16. A pair is two windows: each staged input row is staged
// again as pairs of pixels a stride apart, x2[p] = (x[p], x[p + s]) lane by
// lane, and grad_output as pairs of consecutive windows, dy2[i] = (dy[2i],
// dy[2i + 1]); then tap c of windows 2i and 2i + 1 is one product of
// x2[2i * s + c * d] and dy2[i]. The instruction rounds to float after each
// product and flushes denormal inputs and results to zero, as oneDNN's bf16
// kernels do.
#define TORCH_CONVGRAD_BF16_PAIRS_TARGET \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// The words of a pair of rows in order: words 0-15 the first row's lanes,
// 16-31 the second's.
alignas(64) inline constexpr uint16_t kPairInterleave[kPairWords] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                     21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                     11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// pairs[p] = (first[p * step], second[p * step]) for p < count, interleaved
// lane by lane, where first and second are float vectors holding bf16 values
// (converted back exactly).
TORCH_CONVGRAD_BF16_PAIRS_TARGET inline void stage_pairs(const float* first, const float* second, int64_t step,
                                                         int64_t count, uint16_t* pairs) {
  const __m512i interleave = _mm512_load_si512(kPairInterleave);
  for (int64_t p = 0; p < count; ++p) {
    // Words 0-15 the first row's lanes, 16-31 the second's.
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(second + p * step), _mm512_loadu_ps(first + p * step));
    _mm512_storeu_si512(pairs + p * kPairWords, _mm512_permutexvar_epi16(interleave, (__m512i)both));
  }
}

// The shared tile on pairs, one input row: kSharedPairs pairs of windows at
// a time, each pixel pair loaded once for every (pair, tap) that reads it (2
// * kSharedPairs + kCols - 2 loads for kSharedPairs * kCols products). Rows
// one at a time: 2 x 7 and 3 x 7 tiles measured no faster.
constexpr int kSharedPairs = 4;

// acc[c][lane] += sum_{i < pairs} x2[(2i + c) * step] . dy2[i] (both lanes of
// each pair) for c < kCols taps along the row, where stride equals dilation;
// `pairs` is a multiple of kSharedPairs.
template <int kCols>
TORCH_CONVGRAD_BF16_PAIRS_TARGET void channels_last_pair_tile(const uint16_t* x2, int64_t step, const uint16_t* dy2,
                                                              int64_t pairs, float* acc, PrefetchQueue& prefetch) {
  constexpr int kPixels = 2 * kSharedPairs + kCols - 2;
  __m512 sums[kCols];
  for (int c = 0; c < kCols; ++c) sums[c] = _mm512_loadu_ps(acc + c * 16);
  for (int64_t i = 0; i < pairs; i += kSharedPairs) {
    prefetch.step();
    __m512 dy_pairs[kSharedPairs];
#pragma GCC unroll 8
    for (int u = 0; u < kSharedPairs; ++u) dy_pairs[u] = _mm512_loadu_ps(dy2 + (i + u) * kPairWords);
    const uint16_t* x = x2 + 2 * i * step;
#pragma GCC unroll 16
    for (int p = 0; p < kPixels; ++p) {
      const __m512 pixel = _mm512_loadu_ps(x + p * step);
#pragma GCC unroll 8
      for (int u = 0; u < kSharedPairs; ++u)
        if (p - 2 * u >= 0 && p - 2 * u < kCols)
          sums[p - 2 * u] = _mm512_dpbf16_ps(sums[p - 2 * u], (__m512bh)pixel, (__m512bh)dy_pairs[u]);
    }
  }
  for (int c = 0; c < kCols; ++c) _mm512_storeu_ps(acc + c * 16, sums[c]);
}
#endif

// Lane l of `lanes` takes lane (l / group_channels) * group_channels + i:
// each group's lanes all hold the group's i-th input channel.
template <typename A>
at::vec::Vectorized<A> group_channel(const at::vec::Vectorized<A>& lanes, int64_t group_channels, int64_t i) {
  using Vec = at::vec::Vectorized<A>;
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<A, float>) {
    const __m256i first_of_group = _mm256_and_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                    _mm256_set1_epi32(static_cast<int>(-group_channels)));
    return _mm256_permutevar8x32_ps(lanes, _mm256_add_epi32(first_of_group, _mm256_set1_epi32(static_cast<int>(i))));
  }
#elif defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<A, float>) {
    const __m512i first_of_group = _mm512_and_si512(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(static_cast<int>(-group_channels)));
    return _mm512_permutexvar_ps(_mm512_add_epi32(first_of_group, _mm512_set1_epi32(static_cast<int>(i))), lanes);
  }
#endif
  A source[Vec::size()], target[Vec::size()];
  lanes.store(source);
  for (int64_t lane = 0; lane < Vec::size(); ++lane) target[lane] = source[lane / group_channels * group_channels + i];
  return Vec::loadu(target);
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i, j < kLanes. ATen's
// AVX-512 float transpose takes its sizes at run time and is not inlined: it
// took half of MobileNetV2's channels-first f32 time here; with an
// unpack-and-shuffle sequence in registers (register_transpose.h) the layer
// ran 1.9x as fast (3.19 -> 1.67 ms), and with its 128-bit lane moves done by
// the loads (load_transposed) MobileNetV2's channels-first layers ran
// 1.02-1.05x faster still (Cascade Lake, f32, bf16 and f16 through
// transpose_pixel_pairs; medians of 8 pairs of processes, two runs).
template <typename A, int kLanes>
void transpose_square(const A* src, int64_t ld_src, A* dst, int64_t ld_dst) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<A, float> && kLanes == 16) {
    __m512 columns[16];
    load_transposed(src, ld_src * 4, columns);
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(dst + j * ld_dst, columns[j]);
    return;
  }
#endif
  at::vec::transpose_mxn<A, kLanes, kLanes>(src, ld_src, dst, ld_dst);
}

#if defined(CPU_CAPABILITY_AVX512)
// 16 channels' rows of 32 2-byte pixels (channel c's at rows + c *
// channel_stride) as 32 pixels of 16 float lanes at `block`: a 16 x 16
// transpose of pixel pairs (32-bit units), then each pair split into its
// pixels' float lanes (bf16 by a shift or a mask, f16 by conversion). Half
// the shuffles of converting 16 pixels and transposing their floats.
template <typename T>
void transpose_pixel_pairs(const T* rows, int64_t channel_stride, float* block) {
  __m512 columns[16];
  load_transposed(rows, channel_stride * 2, columns);  // columns[u] lane c: channel c's pixels 2u, 2u + 1
  for (int u = 0; u < 16; ++u) {
    const __m512i pair = _mm512_castps_si512(columns[u]);
    __m512 even, odd;
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      even = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
      odd = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    } else {
      even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pair));
      odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pair, 16)));
    }
    _mm512_storeu_ps(block + 2 * u * 16, even);
    _mm512_storeu_ps(block + (2 * u + 1) * 16, odd);
  }
}
#endif

// Stages channels-first data the same way: channel c of pixel w is
// source[c * channel_stride + w * pixel_stride]. Whole vectors of channels
// along unit-stride rows of at least kLanes pixels go through kLanes x kLanes
// register transposes (on AVX-512, 2-byte rows of 2 * kLanes pixels or more
// through transpose_pixel_pairs); the rest element by element. Depthwise
// only (no group copies).
template <typename T, typename A = acc_type<T>>
void stage_transposed(const T* source, int64_t channel_stride, int64_t pixel_stride, int64_t channels,
                      int64_t pixels, A* staged, int64_t block_pitch) {
  constexpr int kLanes = AccVec<T>::size();
  int64_t c0 = 0;  // the channels staged by transposes
  if (pixel_stride == 1 && pixels >= kLanes)
    for (; c0 + kLanes <= channels; c0 += kLanes) {
      const T* rows = source + c0 * channel_stride;
      A* block = staged + c0 / kLanes * block_pitch;
      const auto transpose = [&](int64_t w) {  // pixels [w, w + kLanes)
        if constexpr (std::is_same_v<T, A>) {
          transpose_square<A, kLanes>(rows + w, channel_stride, block + w * kLanes, kLanes);
        } else {
          alignas(64) A converted[kLanes * kLanes];
          for (int i = 0; i < kLanes; ++i) load_lanes(rows + i * channel_stride + w).store(converted + i * kLanes);
          transpose_square<A, kLanes>(converted, kLanes, block + w * kLanes, kLanes);
        }
      };
      int64_t w = 0;
#if defined(CPU_CAPABILITY_AVX512)
      if constexpr (sizeof(T) == 2 && kLanes == 16)
        if (pixels >= 2 * kLanes) {
          for (; w + 2 * kLanes <= pixels; w += 2 * kLanes)
            transpose_pixel_pairs(rows + w, channel_stride, block + w * kLanes);
          // A partial last step is the row's last 2 * kLanes pixels again, overlapping.
          const int64_t last = pixels - 2 * kLanes;
          if (w < pixels) transpose_pixel_pairs(rows + last, channel_stride, block + last * kLanes);
          continue;
        }
#endif
      for (; w + kLanes <= pixels; w += kLanes) transpose(w);
      // A partial last tile is the row's last kLanes pixels again, overlapping.
      if (w < pixels) transpose(pixels - kLanes);
    }
  for (int64_t c = c0; c < channels; ++c)
    for (int64_t w = 0; w < pixels; ++w)
      staged[c / kLanes * block_pitch + w * kLanes + c % kLanes] =
          static_cast<A>(source[c * channel_stride + w * pixel_stride]);
}

// Stages `pixels` pixels of `channels` channels from `source` (channel c of
// pixel w at source[c * channel_stride + w * pixel_stride]) into blocks
// `block_pitch` apart, starting at pixel `first_pixel` of each block. With
// groups of several channels (channel_stride 1 only), copy i (`copy_pitch`
// after the first) holds in each channel's lane the i-th input channel of
// its group.
template <typename T, typename A = acc_type<T>>
void stage_channels(const T* source, int64_t channel_stride, int64_t pixel_stride, int64_t channels, int64_t pixels,
                    int64_t first_pixel, int64_t block_pitch, A* staged, int64_t group_channels = 1,
                    int64_t copy_pitch = 0) {
  constexpr int64_t kLanes = AccVec<T>::size();
  if (channel_stride != 1) {
    stage_transposed(source, channel_stride, pixel_stride, channels, pixels, staged + first_pixel * kLanes,
                     block_pitch);
    return;
  }
  for (int64_t w = 0; w < pixels; ++w, source += pixel_stride) {
    A* pixel = staged + (first_pixel + w) * kLanes;
    int64_t c = 0;
    for (; c + kLanes <= channels; c += kLanes) {
      const AccVec<T> lanes = load_lanes(source + c);
      A* block = pixel + c * (block_pitch / kLanes);
      if (group_channels == 1)
        lanes.store(block);
      else
        for (int64_t i = 0; i < group_channels; ++i)
          group_channel(lanes, group_channels, i).store(block + i * copy_pitch);
    }
    for (; c < channels; ++c)
      for (int64_t i = 0; i < group_channels; ++i)
        pixel[i * copy_pitch + c / kLanes * block_pitch + c % kLanes] =
            static_cast<A>(source[c / group_channels * group_channels + i]);
  }
}

#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
// Whether stage_pair_row takes a row's `count` pairs `spacing` (1 or 2)
// apart: channels-last data, or channels-first rows of unit stride (the only
// channels-first rows this kernel reads) with step 1 and at least a
// transposition's pairs.
inline bool stages_pairs_directly(int64_t channel_stride, int64_t pixel_stride, int64_t step, int64_t spacing,
                                  int64_t count) {
  return channel_stride == 1 || (pixel_stride == 1 && step == 1 && count >= 32 / spacing);
}

// pairs[i] = (x[i * spacing], x[i * spacing + step]) for i < count, 16
// channels interleaved lane by lane (channels_last_pair_tile's operands),
// where x[q] is pixel q - pad of a row of bf16 data (channel c of pixel w at
// source[c * channel_stride + w * pixel_stride]), zero outside [0, size) and
// for channels from `channels` on; where stages_pairs_directly. Straight
// from the data: a pixel's channels where they are contiguous, and where a
// channel's pixels are 16 x 16 transposes of 32-bit units, whose columns are
// pairs of adjacent pixels. Against the float staging and stage_pairs,
// ConvNeXt's 7x7 layer (N=8, 96 channels, 56x56) ran 1.15 times as fast
// channels-last and 1.1-1.15 channels-first (Zen 4, 2 threads, interleaved);
// channels-first rows of fewer pairs than a transposition yields ran slower.
TORCH_CONVGRAD_BF16_PAIRS_TARGET inline void stage_pair_row(const uint16_t* source, int64_t channel_stride,
                                                            int64_t pixel_stride, int64_t size, int64_t pad,
                                                            int64_t channels, int64_t spacing, int64_t step,
                                                            int64_t count, uint16_t* pairs) {
  if (channel_stride == 1) {
    const __m512i interleave = _mm512_load_si512(kPairInterleave);
    const __mmask16 lanes = channels >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << channels) - 1);
    const auto pixel = [&](int64_t w) {
      return w >= 0 && w < size ? _mm256_maskz_loadu_epi16(lanes, source + w * pixel_stride) : _mm256_setzero_si256();
    };
    for (int64_t i = 0; i < count; ++i) {
      const int64_t w = i * spacing - pad;
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(pixel(w)), pixel(w + step), 1);
      _mm512_storeu_si512(pairs + i * kPairWords, _mm512_permutexvar_epi16(interleave, both));
    }
    return;
  }
  // A transpose of the 32 positions from q yields the pairs at q, q + 2, ...,
  // q + 30; for spacing 1 a second one from q + 1 the pairs between. The
  // row's pixels among the positions are loaded under a mask. A partial last
  // run is the last whole one again, overlapping.
  const int64_t run = 32 / spacing;
  for (int64_t i = 0;; i += run) {
    i = std::min(i, count - run);
    for (int64_t shift = 0; shift < 3 - spacing; ++shift) {
      const int64_t q = i * spacing + shift;
      const int64_t begin = std::clamp<int64_t>(pad - q, 0, 32), end = std::clamp<int64_t>(pad + size - q, begin, 32);
      const auto inside = static_cast<__mmask32>(((uint64_t{1} << end) - 1) & ~((uint64_t{1} << begin) - 1));
      // Position q of channel c's row, formed as an integer: before the row
      // where q < pad (those lanes are not read).
      const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(source) + (q - pad) * std::intptr_t{2};
      __m512 rows[16], columns[16];
      for (int64_t c = 0; c < 16; ++c)
        rows[c] = c < channels ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(
                                     inside, reinterpret_cast<const void*>(first + c * channel_stride * 2)))
                               : _mm512_setzero_ps();
      transpose_registers(rows, columns);
      for (int u = 0; u < 16; ++u)
        _mm512_storeu_ps(pairs + (i + (spacing == 1 ? 2 * u + shift : u)) * kPairWords, columns[u]);
    }
    if (i + run >= count) return;
  }
}
#endif

// The input rows that output row (y0, y1) reads: (iz, iy) inside the input,
// with the first tap, (kz * K1 + ky) * K2, that each serves.
struct RowRead {
  int64_t iz, iy, tap;
};
inline void input_rows_of(const Args& args, int64_t y0, int64_t y1, std::vector<RowRead>& reads) {
  reads.clear();
  for (int64_t kz = 0; kz < args.kernel[0]; ++kz) {
    const int64_t iz = y0 * args.stride[0] - args.pad_begin[0] + kz * args.dilation[0];
    if (iz < 0 || iz >= args.in[0]) continue;
    for (int64_t ky = 0; ky < args.kernel[1]; ++ky) {
      const int64_t iy = y1 * args.stride[1] - args.pad_begin[1] + ky * args.dilation[1];
      if (iy >= 0 && iy < args.in[1]) reads.push_back({iz, iy, (kz * args.kernel[1] + ky) * args.kernel[2]});
    }
  }
}

// The channels [channel_begin, channel_end) that a channels_last call sums,
// in vector blocks, from the data's first elements of them.
template <typename T>
struct ChannelBlocks {
  const T* input;
  const T* grad_output;
  int64_t channels, blocks;
  ChannelBlocks(const Args& args, int64_t channel_begin, int64_t channel_end)
      : input(static_cast<const T*>(args.input) + channel_begin * args.input_strides[1]),
        grad_output(static_cast<const T*>(args.grad_output) + channel_begin * args.grad_output_strides[1]),
        channels(channel_end - channel_begin),
        blocks((channels + AccVec<T>::size() - 1) / AccVec<T>::size()) {}
  // Writes sums laid out [block][weight][lane] to result[channel][weight];
  // returns whether all are finite.
  bool write(const acc_type<T>* sums, int64_t weights, acc_type<T>* result) const {
    constexpr int64_t kLanes = AccVec<T>::size();
    bool finite = true;
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t weight = 0; weight < weights; ++weight) {
        const acc_type<T> sum = sums[(c / kLanes * weights + weight) * kLanes + c % kLanes];
        finite &= std::isfinite(sum);
        result[c * weights + weight] = sum;
      }
    return finite;
  }
};

// channels_last on whole planes (Args::whole_planes): a block's input plane
// is staged whole, each row padded to P = windows + K2 - 1 pixels, and its
// grad_output plane with the same row pitch, zeros in the K2 - 1 positions
// after each row's windows. A tap (ky, kx) then reads the staged input at a
// constant offset from each staged grad_output position, and one tile call
// sums all the block's rows of windows as a single row of out1 * P - (K2 -
// 1) positions, where channels_last_impl takes a call per output row (whose
// fixed work dominates short rows). The zeros cost (K2 - 1) / P more
// products, and an inf or NaN in an input position that a tap does not read
// meets a zero there and makes its sum NaN: returns false where a sum came
// out infinite or NaN (the result is then to be computed row by row).
template <typename T>
bool channels_last_planes(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                          int64_t channel_end, acc_type<T>* result) {
  using A = acc_type<T>;
  constexpr int64_t kLanes = AccVec<T>::size();
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const ChannelBlocks<T> range(args, channel_begin, channel_end);
  const int64_t channels = range.channels, blocks = range.blocks;
  const int64_t rows_of_taps = args.kernel[1], row_taps = args.kernel[2], taps = rows_of_taps * row_taps;
  const int64_t windows = args.out[2], out_rows = args.out[1];
  const int64_t pitch = windows + row_taps - 1;  // pixels a staged row
  const int64_t staged_rows = out_rows + (rows_of_taps - 1) * args.dilation[1];
  const int64_t input_pixels = std::clamp<int64_t>(pitch - args.pad_begin[2], 0, args.in[2]);
  // The positions the tiles sum: every staged grad_output position up to the
  // last row's last window.
  const int64_t positions = out_rows * pitch - (row_taps - 1);
  // Zeroed once: the padding and the positions after each row's windows are
  // never written.
  LineAlignedBuffer<A> x_plane(staged_rows * pitch * kLanes);
  LineAlignedBuffer<A> dy_plane(out_rows * pitch * kLanes);
  std::vector<A> acc(blocks * taps * kLanes, A(0));
  const std::vector<TapRange> cols = tap_tiles(row_taps, kMaxTileCols);
  std::vector<std::vector<TapRange>> row_tiles;
  for (const TapRange& col : cols)
    row_tiles.push_back(tap_tiles(rows_of_taps, std::min<int64_t>(kMaxSharedRows, kMaxSharedTaps / col.count)));
  const int64_t shared_positions = positions / kSharedWindows * kSharedWindows;
  const A* tile_rows[kMaxTileRows];
  A* tile_acc[kMaxTileRows];
  PrefetchQueue no_prefetch;
  for (int64_t n = sample_begin; n < sample_end; ++n)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t block_channels = std::min(kLanes, channels - block * kLanes);
      const T* x = range.input + n * x_strides[0] + block * kLanes * x_strides[1];
      const T* dy = range.grad_output + n * dy_strides[0] + block * kLanes * dy_strides[1];
      for (int64_t iy = 0; iy < args.in[1] && iy + args.pad_begin[1] < staged_rows; ++iy)
        stage_channels(x + iy * x_strides[3], x_strides[1], x_strides[4], block_channels, input_pixels,
                       args.pad_begin[2], pitch * kLanes, x_plane.data() + (iy + args.pad_begin[1]) * pitch * kLanes);
      for (int64_t y = 0; y < out_rows; ++y)
        stage_channels(dy + y * dy_strides[3], dy_strides[1], dy_strides[4], block_channels, windows, 0,
                       pitch * kLanes, dy_plane.data() + y * pitch * kLanes);
      A* block_acc = acc.data() + block * taps * kLanes;
      for (size_t col = 0; col < cols.size(); ++col)
        for (const TapRange& row_tile : row_tiles[col]) {
          for (int64_t r = 0; r < row_tile.count; ++r) {
            const int64_t ky = row_tile.first + r;
            tile_rows[r] = x_plane.data() + (ky * args.dilation[1] * pitch + cols[col].first) * kLanes;
            tile_acc[r] = block_acc + (ky * row_taps + cols[col].first) * kLanes;
          }
          with_tile_shape<kMaxSharedRows, kMaxSharedTaps>(row_tile.count, cols[col].count, [&]<int kRows, int kCols>() {
            channels_last_shared_tile<kRows, kCols>(tile_rows, kLanes, dy_plane.data(), kLanes, shared_positions,
                                                    tile_acc, no_prefetch);
          });
          if (shared_positions == positions) continue;
          for (int64_t r = 0; r < row_tile.count; ++r) tile_rows[r] += shared_positions * kLanes;
          with_tile_shape<kMaxTileRows, kMaxTileTaps>(row_tile.count, cols[col].count, [&]<int kRows, int kCols>() {
            channels_last_tile<kRows, kCols, false>(tile_rows, kLanes, kLanes, dy_plane.data() + shared_positions * kLanes,
                                                    kLanes, positions - shared_positions, tile_acc, no_prefetch);
          });
        }
    }
  return range.write(acc.data(), taps, result);
}

template <typename T>
void channels_last_impl(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                        int64_t channel_end, acc_type<T>* result) {
  using A = acc_type<T>;
  constexpr int64_t kLanes = AccVec<T>::size();
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const ChannelBlocks<T> range(args, channel_begin, channel_end);
  const T* input = range.input;
  const T* grad_output = range.grad_output;
  const int64_t channels = range.channels, blocks = range.blocks;
  const int64_t taps = args.kernel[0] * args.kernel[1] * args.kernel[2];
  const int64_t group_channels = args.group_channels;
  const int64_t windows = args.out[2], stride = args.stride[2], dilation = args.dilation[2];
  // A staged input row covers the padded positions the windows reach.
  const int64_t row_pixels = (windows - 1) * stride + (args.kernel[2] - 1) * dilation + 1;
  const int64_t input_pixels = std::clamp<int64_t>(row_pixels - args.pad_begin[2], 0, args.in[2]);
  const int64_t input_block_pitch = row_pixels * kLanes;
  const int64_t dy_block_pitch = windows * kLanes;

  // Staged input rows, cached in a ring: the rows one output row reads are
  // distinct modulo the ring sizes, and consecutive output rows share most.
  // With groups of several channels, a row is staged once per input channel
  // of a group (stage_channels) and each copy is read as a row of its own;
  // where a group fills the vector, the tiles instead broadcast lane i of a
  // single copy. Padding pixels and the lanes past `channels` are zeroed
  // once: every row writes the same positions.
  const int64_t ring[2] = {(args.kernel[0] - 1) * args.dilation[0] + 1, (args.kernel[1] - 1) * args.dilation[1] + 1};
  const bool broadcast = group_channels > 1 && group_channels == kLanes;
  const int64_t copies = broadcast ? 1 : group_channels;
  // staged_input[slot][block][copy][pixel][lane]: a block's copies lie together.
  const int64_t block_pitch = copies * input_block_pitch, slot_pitch = blocks * block_pitch;
  LineAlignedBuffer<A> staged_input(ring[0] * ring[1] * slot_pitch);
  std::vector<int64_t> staged_row_of_slot(ring[0] * ring[1]);
  // acc[block][i][tap][lane]
  const int64_t block_taps = group_channels * taps;
  std::vector<A> acc(blocks * block_taps * kLanes, A(0));

  // Windows that the shared tile takes, kSharedWindows at a time, after the
  // paired ones below; the rest go through channels_last_tile.
  const bool shared = stride == dilation && !broadcast;
  // bf16 windows summed in pairs (channels_last_pair_tile), 2 * kSharedPairs
  // at a time from the row's start, the rest by the float tiles. A paired
  // input row holds the pixel pairs they read: paired_input[slot][block][p],
  // paired_grad_output[block][i].
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
  const bool paired = std::is_same_v<T, c10::BFloat16> && args.bf16_pairs && shared && group_channels == 1;
  const int64_t pairs = paired ? windows / (2 * kSharedPairs) * kSharedPairs : 0;
#else
  const int64_t pairs = 0;
#endif
  const int64_t paired_windows = 2 * pairs;
  const int64_t pair_pixels = pairs > 0 ? (paired_windows - 2) * stride + (args.kernel[2] - 1) * dilation + 1 : 0;
  const int64_t paired_slot_pitch = blocks * pair_pixels * kPairWords;
  LineAlignedBuffer<uint16_t> paired_input(ring[0] * ring[1] * paired_slot_pitch);
  LineAlignedBuffer<uint16_t> paired_grad_output(blocks * pairs * kPairWords);
  // Channels-last grad_output whose channels fill whole vectors is read in
  // place (converted as the tiles load it), a window's vector every dy_step,
  // unless bf16 pairs read it. Against staged rows on the Cascade Lake (2
  // threads, interleaved): MobileNetV2's layers 1.02-1.16x as fast in f32,
  // 1.17-1.19x in bf16/f16 (stride 2: 1.03-1.16x), ConvNeXt's 0.99-1.07x.
  const bool dy_in_place = dy_strides[1] == 1 && channels % kLanes == 0 && pairs == 0;
  const int64_t dy_step = dy_in_place ? dy_strides[4] : kLanes;
  // Staged grad_output rows, staged_grad_output[block][window][lane], where
  // they are not read in place.
  LineAlignedBuffer<A> staged_grad_output(dy_in_place ? 0 : blocks * dy_block_pitch);
  // Pairs staged straight from the data (stage_pair_row) where it takes
  // them, else from the float staging of the whole row (stage_pairs). The
  // float tiles then read only the input pixels and windows after the paired
  // windows' (none where every window is paired), at least a vector's worth
  // of pixels where there are: channels-first data is transposed a vector of
  // pixels at a time, and element by element in shorter rows.
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
  const bool direct_x_pairs = pairs > 0 && stages_pairs_directly(x_strides[1], x_strides[4], stride, 1, pair_pixels);
  const bool direct_dy_pairs = pairs > 0 && stages_pairs_directly(dy_strides[1], dy_strides[4], 1, 2, pairs);
#else
  const bool direct_x_pairs = false, direct_dy_pairs = false;
#endif
  const int64_t float_pixels_from =
      !direct_x_pairs ? 0
      : paired_windows == windows
          ? input_pixels
          : std::clamp<int64_t>(std::min(paired_windows * stride - args.pad_begin[2], input_pixels - kLanes), 0,
                                input_pixels);
  const int64_t float_windows_from = !direct_dy_pairs ? 0
                                     : paired_windows == windows
                                         ? windows
                                         : std::max<int64_t>(0, std::min(paired_windows, windows - kLanes));
  // Where Args::strided_rows_in_place, channels-last input rows of whole
  // vectors of channels are read in place (converted as the tiles load them)
  // by the windows that reach no padding, [inner_begin, inner_end), at
  // strides of 2 or more along the row: only the pixels that the border
  // windows read are staged.
  const int64_t reach = (args.kernel[2] - 1) * dilation;
  const int64_t inner_begin = std::min(windows, (args.pad_begin[2] + stride - 1) / stride);
  // The last padded position from which a window's taps all lie in the row.
  const int64_t last_inner_start = args.in[2] - 1 + args.pad_begin[2] - reach;
  const int64_t inner_end = last_inner_start < 0 ? inner_begin
                                                 : std::clamp<int64_t>(last_inner_start / stride + 1, inner_begin, windows);
  const bool x_in_place = args.strided_rows_in_place && stride >= 2 && !shared && x_strides[1] == 1 &&
                          group_channels == 1 && channels % kLanes == 0 && pairs == 0 && inner_end > inner_begin;
  // The input pixels staged: [0, left_pixels) and [right_pixels, input_pixels).
  const int64_t left_pixels =
      !x_in_place ? input_pixels
      : inner_begin == 0
          ? 0
          : std::clamp<int64_t>((inner_begin - 1) * stride + reach + 1 - args.pad_begin[2], 0, input_pixels);
  const int64_t right_pixels =
      !x_in_place || inner_end == windows
          ? input_pixels
          : std::clamp<int64_t>(inner_end * stride - args.pad_begin[2], left_pixels, input_pixels);
  // The windows that the float tiles take, in runs read from the staged rows
  // or in place; the shared tile takes each run's first windows,
  // kSharedWindows at a time, channels_last_tile the rest.
  struct WindowRun {
    int64_t first, count;
    bool in_place;
  };
  std::vector<WindowRun> window_runs;
  if (x_in_place)
    window_runs = {{0, inner_begin, false},
                   {inner_begin, inner_end - inner_begin, true},
                   {inner_end, windows - inner_end, false}};
  else
    window_runs = {{paired_windows, windows - paired_windows, false}};
  // Taps along the row in tiles.
  const std::vector<TapRange> cols = tap_tiles(args.kernel[2], kMaxTileCols);
  std::vector<std::vector<TapRange>> row_tiles(cols.size());
  int64_t row_tiles_of = -1;  // the count of input rows that row_tiles splits
  // A tile's prefetch steps, and a block's (over which its prefetches spread).
  const auto shared_windows_of = [&](int64_t count) { return shared ? count / kSharedWindows * kSharedWindows : 0; };
  int64_t tile_steps = 0;
  for (const WindowRun& run : window_runs) {
    const int64_t shared_windows = shared_windows_of(run.count);
    tile_steps +=
        shared_windows / kSharedWindows + (run.count - shared_windows + kPrefetchWindows - 1) / kPrefetchWindows;
  }
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
  const int64_t pair_steps = pairs / kSharedPairs;
#else
  const int64_t pair_steps = 0;
#endif
  int64_t block_steps = 0;

  struct StagedRow {
    const A* staged;
    const T* source;  // the row in place (channels from channel_begin)
    const uint16_t* paired;
    int64_t tap;  // the row's first tap in a block's sums: i * taps + (kz * K1 + ky) * K2
  };
  std::vector<RowRead> reads;
  std::vector<StagedRow> staged_rows;
  const A* tile_rows[kMaxTileRows];
  const T* source_rows[kMaxTileRows];
  A* tile_acc[kMaxTileRows];
  PrefetchQueue prefetch;

  const auto grad_output_row = [&](int64_t n, int64_t y0, int64_t y1) {
    return grad_output + n * dy_strides[0] + y0 * dy_strides[2] + y1 * dy_strides[3];
  };
  const auto input_row = [&](int64_t n, const RowRead& read) {
    return input + n * x_strides[0] + read.iz * x_strides[2] + read.iy * x_strides[3];
  };
  const bool channels_last_data = dy_strides[1] == 1 && x_strides[1] == 1;
  // (32-bit divisions where the rows fit: 64-bit ones took a few percent of
  // MobileNetV2's channels-first time.)
  const bool small_rows = std::max(args.in[0], args.in[1]) <= INT32_MAX;
  const auto modulo = [&](int64_t value, int64_t divisor) {
    return small_rows ? static_cast<int64_t>(static_cast<uint32_t>(value) % static_cast<uint32_t>(divisor))
                      : value % divisor;
  };
  const auto slot_of = [&](const RowRead& read) {
    return (ring[0] == 1 ? 0 : modulo(read.iz, ring[0])) * ring[1] + modulo(read.iy, ring[1]);
  };
  const auto row_index = [&](const RowRead& read) { return read.iz * args.in[1] + read.iy; };
  for (int64_t n = sample_begin; n < sample_end; ++n) {
    std::fill(staged_row_of_slot.begin(), staged_row_of_slot.end(), -1);
    for (int64_t y0 = 0; y0 < args.out[0]; ++y0) {
      for (int64_t y1 = 0; y1 < args.out[1]; ++y1) {
        if (float_windows_from < windows && !dy_in_place)
          stage_channels(grad_output_row(n, y0, y1) + float_windows_from * dy_strides[4], dy_strides[1],
                         dy_strides[4], channels, windows - float_windows_from, float_windows_from, dy_block_pitch,
                         staged_grad_output.data());
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
        if constexpr (std::is_same_v<T, c10::BFloat16>)
          for (int64_t block = 0; block < blocks && pairs > 0; ++block) {
            uint16_t* dy2 = paired_grad_output.data() + block * pairs * kPairWords;
            const float* dy = staged_grad_output.data() + block * dy_block_pitch;
            if (direct_dy_pairs)
              stage_pair_row(reinterpret_cast<const uint16_t*>(grad_output_row(n, y0, y1) + block * kLanes * dy_strides[1]),
                             dy_strides[1], dy_strides[4], windows, 0, std::min(kLanes, channels - block * kLanes), 2,
                             1, pairs, dy2);
            else
              stage_pairs(dy, dy + kLanes, 2 * kLanes, pairs, dy2);
          }
#endif
        input_rows_of(args, y0, y1, reads);
        staged_rows.clear();
        for (const RowRead& read : reads) {
          const int64_t slot = slot_of(read);
          A* staged = staged_input.data() + slot * slot_pitch;
          uint16_t* paired_row = paired_input.data() + slot * paired_slot_pitch;
          if (staged_row_of_slot[slot] != row_index(read)) {
            const auto stage_pixels = [&](int64_t first, int64_t end) {
              if (first < end)
                stage_channels(input_row(n, read) + first * x_strides[4], x_strides[1], x_strides[4], channels,
                               end - first, args.pad_begin[2] + first, block_pitch, staged, copies, input_block_pitch);
            };
            stage_pixels(float_pixels_from, left_pixels);
            stage_pixels(std::max(float_pixels_from, right_pixels), input_pixels);
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
            if constexpr (std::is_same_v<T, c10::BFloat16>)
              for (int64_t block = 0; block < blocks && pairs > 0; ++block) {
                uint16_t* x2 = paired_row + block * pair_pixels * kPairWords;
                const float* x = staged + block * block_pitch;
                if (direct_x_pairs)
                  stage_pair_row(reinterpret_cast<const uint16_t*>(input_row(n, read) + block * kLanes * x_strides[1]),
                                 x_strides[1], x_strides[4], args.in[2], args.pad_begin[2],
                                 std::min(kLanes, channels - block * kLanes), 1, stride, pair_pixels, x2);
                else
                  stage_pairs(x, x + stride * kLanes, kLanes, pair_pixels, x2);
              }
#endif
            staged_row_of_slot[slot] = row_index(read);
          }
          for (int64_t i = 0; i < group_channels; ++i)
            staged_rows.push_back(
                {staged + (broadcast ? i : i * input_block_pitch), input_row(n, read), paired_row, i * taps + read.tap});
        }
        const int64_t input_rows = static_cast<int64_t>(staged_rows.size());
        // A coming output row's grad_output row and the input rows it stages
        // first (its last taps' rows, as many as it newly reads: up to the row
        // stride), fetched while the tiles run. Channels-first data is fetched
        // two output rows ahead (measured on MobileNetV2's layers,
        // Zen 4, against one row ahead: 1.15-1.35x channels-first, 1.0x
        // channels-last; fetching every new row of stride 2 1.1-1.3x both).
        constexpr int64_t kMostPrefetchedRows = 4;
        const T* next_dy = nullptr;
        const T* next_x[kMostPrefetchedRows] = {};
        int64_t dy_span = 0, x_span = 0;  // bytes: whole rows channels-last, a channel's row channels-first
        if (args.prefetch_next_rows) {
          int64_t nn = n, n0 = y0, n1 = y1;
          for (int64_t ahead = channels_last_data ? 1 : 2; ahead > 0; --ahead) {
            if (++n1 == args.out[1]) { n1 = 0; ++n0; }
            if (n0 == args.out[0]) { n0 = 0; ++nn; }
          }
          if (nn < sample_end) {
            next_dy = grad_output_row(nn, n0, n1);
            dy_span = ((channels_last_data ? channels - 1 : 0) + (windows - 1) * dy_strides[4] + 1) * sizeof(T);
            x_span = ((channels_last_data ? channels - 1 : 0) + (input_pixels - 1) * x_strides[4] + 1) * sizeof(T);
            const int64_t iz = n0 * args.stride[0] - args.pad_begin[0] + (args.kernel[0] - 1) * args.dilation[0];
            const int64_t first_iy = n1 * args.stride[1] - args.pad_begin[1];
            const int64_t last_iy = first_iy + (args.kernel[1] - 1) * args.dilation[1];
            const int64_t new_rows = std::min({kMostPrefetchedRows, args.stride[1], last_iy - first_iy + 1});
            for (int64_t k = 0; k < new_rows; ++k) {
              const int64_t iy = last_iy - k;
              if ((iy - first_iy) % args.dilation[1] == 0 && iz >= 0 && iz < args.in[0] && iy >= 0 && iy < args.in[1])
                next_x[k] = input_row(nn, {iz, iy, 0});
            }
          }
        }
        // Each tile of taps along the row takes the input rows in groups its
        // registers allow (the same until the count of rows read changes, at
        // the borders).
        if (input_rows != row_tiles_of) {
          block_steps = 0;
          for (size_t col = 0; col < cols.size(); ++col) {
            const int64_t most_rows = shared ? std::min<int64_t>(kMaxSharedRows, kMaxSharedTaps / cols[col].count)
                                             : std::min<int64_t>(kMaxTileRows, kMaxTileTaps / cols[col].count);
            row_tiles[col] = tap_tiles(input_rows, most_rows);
            // The pair tiles take a row each, a step every kSharedPairs pairs.
            block_steps += static_cast<int64_t>(row_tiles[col].size()) * tile_steps + input_rows * pair_steps;
          }
          row_tiles_of = input_rows;
        }
        // Whole rows on channels-last data, every channel's row on
        // channels-first data, spread over all the blocks' tiles.
        prefetch.clear();
        const int64_t rows_of = channels_last_data ? 1 : channels;
        if (next_dy) prefetch.add(next_dy, dy_span, rows_of, dy_strides[1] * sizeof(T));
        for (const T* x : next_x)
          if (x) prefetch.add(x, x_span, rows_of, x_strides[1] * sizeof(T));
        prefetch.spread_over(block_steps * blocks);
        for (int64_t block = 0; block < blocks; ++block) {
          const T* dy_row = dy_in_place ? grad_output_row(n, y0, y1) + block * kLanes : nullptr;
          const A* dy_staged =
              dy_in_place ? nullptr : staged_grad_output.data() + block * dy_block_pitch + paired_windows * kLanes;
          A* block_acc = acc.data() + block * block_taps * kLanes;
          for (const TapRange& tile : cols) {
#if defined(TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS)
            if constexpr (std::is_same_v<T, c10::BFloat16>)
              for (int64_t r = 0; r < input_rows && pairs > 0; ++r) {
                const StagedRow& row = staged_rows[r];
                const uint16_t* x2 = row.paired + (block * pair_pixels + tile.first * dilation) * kPairWords;
                const uint16_t* dy2 = paired_grad_output.data() + block * pairs * kPairWords;
                A* row_acc = block_acc + (row.tap + tile.first) * kLanes;
                with_count<kMaxTileCols>(tile.count, [&]<int kCols>() {
                  channels_last_pair_tile<kCols>(x2, stride * kPairWords, dy2, pairs, row_acc, prefetch);
                });
              }
#endif
            if (paired_windows == windows) continue;
            const auto float_tiles = [&](const auto* dy) {
              for (const WindowRun& run : window_runs) {
                if (run.count == 0) continue;
                const auto* run_dy = dy + (run.first - paired_windows) * dy_step;
                const int64_t shared_windows = shared_windows_of(run.count);
                // rows: tile_rows, or source_rows (16-bit ones neither shared
                // nor broadcast), their pixels pixel_step elements apart.
                const auto run_tiles = [&](auto* rows, int64_t row_count, int64_t cols_count, int64_t pixel_step) {
                  constexpr bool kAccType = std::is_same_v<std::remove_pointer_t<decltype(rows)>, const A*>;
                  if constexpr (kAccType)
                    if (shared_windows > 0) {
                      with_tile_shape<kMaxSharedRows, kMaxSharedTaps>(
                          row_count, cols_count, [&]<int kRows, int kCols>() {
                            channels_last_shared_tile<kRows, kCols>(rows, stride * pixel_step, run_dy, dy_step,
                                                                    shared_windows, tile_acc, prefetch);
                          });
                      // The last windows, fewer than kSharedWindows.
                      for (int64_t r = 0; r < row_count; ++r) rows[r] += shared_windows * stride * pixel_step;
                    }
                  if (shared_windows == run.count) return;
                  with_tile_shape<kMaxTileRows, kMaxTileTaps>(row_count, cols_count, [&]<int kRows, int kCols>() {
                    const auto* tile_dy = run_dy + shared_windows * dy_step;
                    const int64_t tile_windows = run.count - shared_windows;
                    if constexpr (kAccType)
                      if (broadcast)
                        return channels_last_tile<kRows, kCols, true>(rows, stride * pixel_step, dilation * pixel_step,
                                                                      tile_dy, dy_step, tile_windows, tile_acc,
                                                                      prefetch);
                    channels_last_tile<kRows, kCols, false>(rows, stride * pixel_step, dilation * pixel_step, tile_dy,
                                                            dy_step, tile_windows, tile_acc, prefetch);
                  });
                };
                for (const TapRange& row_tile : row_tiles[&tile - cols.data()]) {
                  for (int64_t r = 0; r < row_tile.count; ++r) {
                    const StagedRow& row = staged_rows[row_tile.first + r];
                    tile_acc[r] = block_acc + (row.tap + tile.first) * kLanes;
                    if (run.in_place)
                      source_rows[r] = row.source + block * kLanes +
                                       (run.first * stride - args.pad_begin[2] + tile.first * dilation) * x_strides[4];
                    else
                      tile_rows[r] =
                          row.staged + block * block_pitch + (tile.first * dilation + run.first * stride) * kLanes;
                  }
                  if (run.in_place)
                    run_tiles(source_rows, row_tile.count, tile.count, x_strides[4]);
                  else
                    run_tiles(tile_rows, row_tile.count, tile.count, kLanes);
                }
              }
            };
            if (dy_in_place)
              float_tiles(dy_row);
            else
              float_tiles(dy_staged);
          }
        }
        prefetch.drain();
      }
    }
  }
  range.write(acc.data(), block_taps, result);
}

// ---------------------------------------------------------------------------
// channels_first: lanes run along the flattened spatial positions of one
// (sample, channel) plane. The input plane is staged with every axis split
// into `stride` phases and zero-padded, and grad_output with the same row and
// slice pitches, zero between rows: then each tap is one dot product of
// grad_output with the staged input shifted by a constant, over the whole
// plane, with no bounds checks and long vector loops. (The zeros between rows
// meet input elements that the tap does not reach: an inf or NaN there turns
// into NaN, where the exact sum would skip it.)
// ---------------------------------------------------------------------------

// A tile sums up to kMaxPlaneTaps taps at once, one vector each, so that one
// grad_output load serves them all (a 3x3 kernel in one pass).
constexpr int kMaxPlaneTaps = 9;

// sums[b] = sum_{t < vectors * lanes} x[offsets[b] + t] * dy[t], b < kTaps;
// `vectors` is even.
template <int kTaps, typename A>
void channels_first_tile(const A* x, const int64_t* offsets, const A* dy, int64_t vectors, A* sums_out) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t kLanes = Vec::size();
  // Few taps sum alternate vectors apart, for enough independent FMA chains.
  constexpr int kChains = kTaps <= 4 ? 2 : 1;
  const A* tap_x[kTaps];
  Vec sums[kChains][kTaps];
  for (int b = 0; b < kTaps; ++b) {
    tap_x[b] = x + offsets[b];
    for (int chain = 0; chain < kChains; ++chain) sums[chain][b] = Vec(A(0));
  }
  for (int64_t t = 0; t < vectors * kLanes; t += kChains * kLanes)
    for (int chain = 0; chain < kChains; ++chain) {
      const Vec dy_lanes = Vec::loadu(dy + t + chain * kLanes);
      for (int b = 0; b < kTaps; ++b)
        sums[chain][b] = at::vec::fmadd(Vec::loadu(tap_x[b] + t + chain * kLanes), dy_lanes, sums[chain][b]);
    }
  for (int b = 0; b < kTaps; ++b) {
    for (int chain = 1; chain < kChains; ++chain) sums[0][b] = sums[0][b] + sums[chain][b];
    A lanes[kLanes];
    sums[0][b].store(lanes);
    A total = 0;
    for (int64_t lane = 0; lane < kLanes; ++lane) total += lanes[lane];
    sums_out[b] = total;
  }
}

// Where channels_first stages an input plane: every axis split into `stride`
// phases, each `length` positions (the windows plus the largest tap shift)
// with the padding as zeros, and where each tap reads from a window's
// position.
struct PlaneLayout {
  int64_t length[3];
  int64_t row_pitch, slice_pitch, phase_pitch, plane_pitch;
  std::vector<int64_t> offsets;  // per tap
  // Where input rows go, per axis (divisions done once, not per row): the
  // phase's offset plus the index's, or -1 past the last index any window reads.
  std::vector<int64_t> row_target[2];

  // `slack` elements after each phase keep loads past a phase's end inside the plane.
  PlaneLayout(const Args& args, int64_t slack) {
    const int64_t* s = args.stride;
    for (int axis = 0; axis < 3; ++axis)
      length[axis] = args.out[axis] + (args.kernel[axis] - 1) * args.dilation[axis] / s[axis];
    row_pitch = length[2];
    slice_pitch = length[1] * length[2];
    phase_pitch = length[0] * slice_pitch + slack;
    plane_pitch = s[0] * s[1] * s[2] * phase_pitch;
    for (int64_t kz = 0; kz < args.kernel[0]; ++kz)
      for (int64_t ky = 0; ky < args.kernel[1]; ++ky)
        for (int64_t kx = 0; kx < args.kernel[2]; ++kx) {
          const int64_t shift[3] = {kz * args.dilation[0], ky * args.dilation[1], kx * args.dilation[2]};
          const int64_t phase = ((shift[0] % s[0]) * s[1] + shift[1] % s[1]) * s[2] + shift[2] % s[2];
          offsets.push_back(phase * phase_pitch + shift[0] / s[0] * slice_pitch + shift[1] / s[1] * row_pitch +
                            shift[2] / s[2]);
        }
    for (int axis = 0; axis < 2; ++axis) {
      const int64_t pitch = axis == 0 ? slice_pitch : row_pitch;
      const int64_t phase_scale = axis == 0 ? s[1] * s[2] * phase_pitch : s[2] * phase_pitch;
      for (int64_t i = 0; i < args.in[axis]; ++i) {
        const int64_t u = i + args.pad_begin[axis];
        row_target[axis].push_back(u / s[axis] >= length[axis] ? -1
                                                                : u % s[axis] * phase_scale + u / s[axis] * pitch);
      }
    }
  }

  // Calls stage_row(source row, its first phase's row) for every input row of
  // the plane that a window reads.
  template <typename T, typename StageRow>
  void for_each_row(const Args& args, const T* plane, StageRow&& stage_row) const {
    const int64_t* x_strides = args.input_strides;
    for (int64_t iz = 0; iz < args.in[0] && row_target[0][iz] >= 0; ++iz)
      for (int64_t iy = 0; iy < args.in[1] && row_target[1][iy] >= 0; ++iy)
        stage_row(plane + iz * x_strides[2] + iy * x_strides[3], row_target[0][iz] + row_target[1][iy]);
  }
};

template <typename T>
void channels_first_impl(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                         int64_t channel_end, acc_type<T>* result) {
  using A = acc_type<T>;
  constexpr int64_t kLanes = AccVec<T>::size();
  const T* input = static_cast<const T*>(args.input);
  const T* grad_output = static_cast<const T*>(args.grad_output);
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const int64_t* s = args.stride;
  const int64_t taps = args.kernel[0] * args.kernel[1] * args.kernel[2];
  const int64_t group_channels = args.group_channels;

  // The slack keeps the last taps' final vectors inside the allocation.
  const PlaneLayout layout(args, 2 * kLanes);
  const int64_t span = (args.out[0] - 1) * layout.slice_pitch + (args.out[1] - 1) * layout.row_pitch + args.out[2];
  const int64_t vectors = round_up(span, 2 * kLanes) / kLanes;

  // Zeroed once: every plane writes the same positions. The input planes of
  // a group are staged together, when its first output channel comes.
  LineAlignedBuffer<A> staged_input(group_channels * layout.plane_pitch);
  LineAlignedBuffer<A> staged_grad_output(vectors * kLanes);

  const std::vector<TapRange> tiles = tap_tiles(taps, kMaxPlaneTaps);
  std::fill(result, result + (channel_end - channel_begin) * group_channels * taps, A(0));

  // Stages one input plane into its phases.
  const auto stage_plane = [&](const T* x_plane, A* staged) {
    layout.for_each_row(args, x_plane, [&](const T* row, int64_t target) {
      stage_phases(row, x_strides[4], args.in[2], s[2], args.pad_begin[2], layout.length[2], layout.phase_pitch,
                   staged + target);
    });
  };

  for (int64_t n = sample_begin; n < sample_end; ++n) {
    int64_t staged_group = -1;  // of this sample
    for (int64_t c = channel_begin; c < channel_end; ++c) {
      const int64_t group = c / group_channels;
      if (staged_group != group) {
        staged_group = group;
        for (int64_t i = 0; i < group_channels; ++i)
          stage_plane(input + n * x_strides[0] + (group * group_channels + i) * x_strides[1],
                      staged_input.data() + i * layout.plane_pitch);
      }
      const T* dy_plane = grad_output + n * dy_strides[0] + c * dy_strides[1];
      for (int64_t y0 = 0; y0 < args.out[0]; ++y0)
        for (int64_t y1 = 0; y1 < args.out[1]; ++y1)
          stage_phases(dy_plane + y0 * dy_strides[2] + y1 * dy_strides[3], dy_strides[4], args.out[2], 1, 0,
                       layout.length[2], 0,
                       staged_grad_output.data() + y0 * layout.slice_pitch + y1 * layout.row_pitch);
      A* channel_result = result + (c - channel_begin) * group_channels * taps;
      for (int64_t i = 0; i < group_channels; ++i)
        for (const TapRange& tile : tiles) {
          A sums[kMaxPlaneTaps];
          with_count<kMaxPlaneTaps>(tile.count, [&]<int kTaps>() {
            channels_first_tile<kTaps>(staged_input.data() + i * layout.plane_pitch,
                                       layout.offsets.data() + tile.first, staged_grad_output.data(), vectors, sums);
          });
          for (int64_t b = 0; b < tile.count; ++b) channel_result[i * taps + tile.first + b] += sums[b];
        }
    }
  }
}

// Where the input and grad_output planes after plane (n, c) begin, in
// elements, in the order a task visits them (its channels, a sample at a
// time), to prefetch them; false after its last.
inline bool next_plane(const Args& args, int64_t n, int64_t c, int64_t channel_begin, int64_t channel_end,
                       int64_t sample_end, int64_t (&offsets)[2]) {
  if (c + 1 == channel_end && n + 1 == sample_end) return false;
  const int64_t next_n = c + 1 < channel_end ? n : n + 1, next_c = c + 1 < channel_end ? c + 1 : channel_begin;
  offsets[0] = next_n * args.input_strides[0] + next_c * args.input_strides[1];
  offsets[1] = next_n * args.grad_output_strides[0] + next_c * args.grad_output_strides[1];
  return true;
}

#ifdef TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS
// ---------------------------------------------------------------------------
// channels_first on bf16 pairs (Args::bf16_planes: depthwise, stride 1 along
// the row, grad_output rows of unit stride): lanes run along an output row,
// 32 windows at a time, and VDPBF16PS sums tap t of windows 2i and 2i + 1 at
// once, from the pair of their grad_output values and the pair of input
// values the tap reads, adjacent in the staged plane too. The input plane is
// staged as it is (bf16); grad_output rows are read in place. Lanes past a
// row's last window load as zero on both sides, so every product is one the
// sum has (infinities and NaN stay in the taps that read them). The next
// planes are prefetched a few lines an output row, so that memory reads
// overlap the products.
// ---------------------------------------------------------------------------

// A tile's sums, the grad_output pair and an input pair fill 26 of the 32
// registers.
constexpr int kMaxPlanePairTaps = 24;

// What a tile prefetches (into L1; into L2 measured 1.0-1.06 times slower,
// planes of 28x28 to 224x224): the lines from `begin` (line-aligned) up to
// `end`, spread over the output rows.
struct PlanePrefetch {
  const char* begin[2];
  const char* end[2];
};

// 32 16-bit elements from `row`, zero where `valid` has no bit (not read).
TORCH_CONVGRAD_BF16_PAIRS_TARGET inline __m512 load_pairs(const uint16_t* row, __mmask32 valid) {
  return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(valid, row));
}

// sums[b] = sum over windows j of x[offsets[b] + row(j) + j2] * dy[row(j) + j2],
// b < kTaps, rows of the staged plane `x` (layout) and of grad_output
// (dy_pitch: its strides along the first two spatial axes) alike.
template <int kTaps>
TORCH_CONVGRAD_BF16_PAIRS_TARGET void channels_first_pair_tile(const uint16_t* x, const PlaneLayout& layout,
                                                              const int64_t* offsets, const uint16_t* dy,
                                                              const int64_t* dy_pitch, const int64_t* out,
                                                              const PlanePrefetch& prefetch, float* sums_out) {
  constexpr int64_t kLine = 64;
  __m512 sums[kTaps];
#pragma GCC unroll 32
  for (int b = 0; b < kTaps; ++b) sums[b] = _mm512_setzero_ps();
  const int64_t rows = out[0] * out[1];
  const char* next_line[2] = {prefetch.begin[0], prefetch.begin[1]};
  int64_t lines_a_row[2];
  for (int i = 0; i < 2; ++i) lines_a_row[i] = (prefetch.end[i] - prefetch.begin[i] + kLine * rows - 1) / (kLine * rows);
  for (int64_t y0 = 0; y0 < out[0]; ++y0)
    for (int64_t y1 = 0; y1 < out[1]; ++y1) {
      for (int i = 0; i < 2; ++i)
        for (int64_t line = 0; line < lines_a_row[i] && next_line[i] < prefetch.end[i]; ++line, next_line[i] += kLine)
          _mm_prefetch(next_line[i], _MM_HINT_T0);
      const uint16_t* x_row = x + y0 * layout.slice_pitch + y1 * layout.row_pitch;
      const uint16_t* dy_row = dy + y0 * dy_pitch[0] + y1 * dy_pitch[1];
      for (int64_t j = 0; j < out[2]; j += 32) {
        const __mmask32 valid = out[2] - j >= 32 ? ~__mmask32(0) : (__mmask32(1) << (out[2] - j)) - 1;
        const __m512 dy_pairs = load_pairs(dy_row + j, valid);
#pragma GCC unroll 32
        for (int b = 0; b < kTaps; ++b)
          sums[b] = _mm512_dpbf16_ps(sums[b], (__m512bh)load_pairs(x_row + offsets[b] + j, valid),
                                     (__m512bh)dy_pairs);
      }
    }
#pragma GCC unroll 32
  for (int b = 0; b < kTaps; ++b) sums_out[b] = _mm512_reduce_add_ps(sums[b]);
}

// One input row of 16-bit elements into its staged row, as they are (stride
// 1 along it): element w at w + pad, up to the row's `length`.
inline void stage_row_16(const uint16_t* source, int64_t element_stride, int64_t size, int64_t pad, int64_t length,
                         uint16_t* row) {
  size = std::clamp<int64_t>(length - pad, 0, size);
  if (element_stride == 1)
    std::copy(source, source + size, row + pad);
  else
    for (int64_t w = 0; w < size; ++w) row[pad + w] = source[w * element_stride];
}

void channels_first_pairs(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                          int64_t channel_end, float* result) {
  const auto* input = static_cast<const uint16_t*>(args.input);
  const auto* grad_output = static_cast<const uint16_t*>(args.grad_output);
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const int64_t taps = args.kernel[0] * args.kernel[1] * args.kernel[2];
  const PlaneLayout layout(args, 0);
  LineAlignedBuffer<uint16_t> staged_input(layout.plane_pitch);  // zeroed once, as above
  const std::vector<TapRange> tiles = tap_tiles(taps, kMaxPlanePairTaps);
  std::fill(result, result + (channel_end - channel_begin) * taps, 0.0f);
  const int64_t x_plane_bytes = args.in[0] * args.in[1] * args.in[2] * 2;
  const int64_t dy_plane_bytes = args.out[0] * args.out[1] * args.out[2] * 2;
  for (int64_t n = sample_begin; n < sample_end; ++n)
    for (int64_t c = channel_begin; c < channel_end; ++c) {
      layout.for_each_row(args, input + n * x_strides[0] + c * x_strides[1], [&](const uint16_t* row, int64_t target) {
        stage_row_16(row, x_strides[4], args.in[2], args.pad_begin[2], layout.length[2], staged_input.data() + target);
      });
      // The next (sample, channel)'s planes, where planes are contiguous, a
      // part a tile.
      int64_t next[2];
      const bool prefetch_next =
          args.dense_planes && next_plane(args, n, c, channel_begin, channel_end, sample_end, next);
      const char* next_planes[2] = {prefetch_next ? reinterpret_cast<const char*>(input + next[0]) : nullptr,
                                    prefetch_next ? reinterpret_cast<const char*>(grad_output + next[1]) : nullptr};
      const int64_t plane_bytes[2] = {x_plane_bytes, dy_plane_bytes};
      const uint16_t* dy_plane = grad_output + n * dy_strides[0] + c * dy_strides[1];
      const int64_t parts = static_cast<int64_t>(tiles.size());
      for (const TapRange& tile : tiles) {
        const int64_t part = &tile - tiles.data();
        PlanePrefetch prefetch{{nullptr, nullptr}, {nullptr, nullptr}};
        for (int i = 0; prefetch_next && i < 2; ++i) {
          const auto first = reinterpret_cast<std::uintptr_t>(next_planes[i] + plane_bytes[i] * part / parts);
          prefetch.begin[i] = reinterpret_cast<const char*>(first & ~std::uintptr_t{63});
          prefetch.end[i] = next_planes[i] + plane_bytes[i] * (part + 1) / parts;
        }
        float sums[kMaxPlanePairTaps];
        with_count<kMaxPlanePairTaps>(tile.count, [&]<int kTaps>() {
          channels_first_pair_tile<kTaps>(staged_input.data(), layout, layout.offsets.data() + tile.first, dy_plane,
                                          dy_strides + 2, args.out, prefetch, sums);
        });
        float* channel_result = result + (c - channel_begin) * taps;
        for (int64_t b = 0; b < tile.count; ++b) channel_result[tile.first + b] += sums[b];
      }
    }
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// ---------------------------------------------------------------------------
// channels_first on float rows (Args::float_rows: depthwise f32, bf16 or
// f16, 3, 5 or 7 taps along the row, stride 1 or 2 and dilation 1 along it,
// grad_output rows of unit stride): lanes run along an output row, 16
// windows at a time (8 in the AVX2 build, described after the AVX-512
// tile), as in the bf16 pairs above, but on float FMAs. The
// input plane is staged as float with its padding rows and columns, stride 2
// in two phases along the row (RowLayout), or rows of small kernels read in
// place with the padding masked (InPlaceRows; at stride 2,
// InPlaceStride2); grad_output rows are read in place and converted as they
// load. A tile keeps the sums of up to four rows of
// taps in registers; where output rows are as many input rows apart as
// windows are along the row (and rows of taps one), it runs several output
// rows at once, and each input vector it loads serves every (output row,
// row of taps) pair that reads it: 30 loads for 72 FMAs in a 3x3 kernel (8
// output rows), where one output row at a time takes 10 for 9. Lanes past a
// row's last window load as zero on both sides, so every product is one the
// sum has.
// ---------------------------------------------------------------------------

// Where channels_first_rows stages an input plane (stride 1 or 2 and
// dilation 1 along the row): `slices` x `rows` rows (every padded row some
// window reads), `row_pitch` floats apart, each of `stride` phases of
// `length` positions `phase_pitch` apart (element w of the padded row in
// phase w % stride at w / stride). Stride 1 starts each row at `lead`, so
// that the input row's first element lands on a cache line (aligned stores
// where the rows are copied). The AVX2 build reads and writes whole vectors
// up to one past a phase's `length` (masked stores are slow on AMD's cores;
// what it writes there is zero): its phases have a vector more.
#ifdef CPU_CAPABILITY_AVX512
constexpr int64_t kRowLanes = 16;  // windows a float row tile's step takes
constexpr int64_t kPhaseSlack = 0;
#else
constexpr int64_t kRowLanes = 8;
constexpr int64_t kPhaseSlack = kRowLanes;
#endif
struct RowLayout {
  int64_t stride, slices, rows, length, lead, phase_pitch, row_pitch, slice_pitch, plane_pitch;
  // The elements of a unit-stride input row that stage() reads: those below
  // stride * length - pad.
  int64_t staged_elements;
#ifdef CPU_CAPABILITY_AVX512
  // How a contiguous input row is staged, the same for every row: from
  // element `first` on, vectors of `stride` x 16 elements from `w`, the
  // lanes of `load` loaded, the lanes of `store` stored into each phase.
  struct Chunk {
    int64_t w;
    __mmask16 load[2], store[2];
  };
  int64_t first = 0;
  std::vector<Chunk> chunks;
#endif

  explicit RowLayout(const Args& args) : stride(args.stride[2]) {
    slices = (args.out[0] - 1) * args.stride[0] + (args.kernel[0] - 1) * args.dilation[0] + 1;
    rows = (args.out[1] - 1) * args.stride[1] + (args.kernel[1] - 1) * args.dilation[1] + 1;
    length = args.out[2] + (args.kernel[2] - 1) / stride;
    const int64_t pad = args.pad_begin[2];
    lead = stride == 1 ? (kRowLanes - pad % kRowLanes) % kRowLanes : 0;
    phase_pitch = round_up(lead + length, kRowLanes) + kPhaseSlack;
    row_pitch = stride * phase_pitch;
    slice_pitch = rows * row_pitch;
    plane_pitch = slices * slice_pitch;
    staged_elements = std::clamp<int64_t>(stride * length - pad, 0, args.in[2]);
#ifdef CPU_CAPABILITY_AVX512
    // With stride 2, an odd first element alone, so that the vectors start in phase 0.
    first = stride == 2 && pad % 2 == 1 ? std::min<int64_t>(1, staged_elements) : 0;
    for (int64_t w = first; w < staged_elements; w += 16 * stride) {
      const int64_t count = std::min<int64_t>(16 * stride, staged_elements - w);
      Chunk chunk{w, {first_lanes(std::min<int64_t>(16, count)), first_lanes(std::clamp<int64_t>(count - 16, 0, 16))},
                  {first_lanes((count + stride - 1) / stride), first_lanes(count / stride)}};
      chunks.push_back(chunk);
    }
#endif
  }

  // The staged row (slice uz, row uy) of `staged`.
  template <typename F>  // float or const float
  F* row(F* staged, int64_t uz, int64_t uy) const {
    return staged + uz * slice_pitch + uy * row_pitch + lead;
  }

#ifndef CPU_CAPABILITY_AVX512
  // AVX2: the first `size` elements of a unit-stride row into the phases of
  // `target`. Stride 1: 8 at a time, the last few loaded masked, with zeros
  // after them. Stride 2: 16 at a time and the last 16 ending at the row's
  // end (writing some again), into whichever phase each lands; rows shorter
  // than 16 loaded masked, an odd last 16-bit element alone. Against loading
  // the last few masked and converting an odd padding's first element and an
  // odd last one alone, MobileNetV2's stride-2 layer ran 1.06-1.08 times as
  // fast in f32, bf16 and f16 (Zen 3, 2 threads, interleaved in one process).
  // (stage_phases' loop at stride 2, with its remainder element by element,
  // took as long as MobileNetV2's stride-2 tiles; masked stores of the last
  // few, 40% of the staging on the Zen 3.)
  template <typename T>
  void stage_row(const T* source, int64_t size, int64_t pad, float* target) const {
    if (stride == 1) {
      int64_t w = 0;
      for (; w + 8 <= size; w += 8) _mm256_storeu_ps(target + pad + w, load_floats(source + w));
      if (w < size) _mm256_storeu_ps(target + pad + w, load_first_floats(source + w, size - w));
      return;
    }
    // Padded position p lies in phase p % 2 at p / 2.
    const auto at_position = [&](int64_t position) { return target + position % 2 * phase_pitch + position / 2; };
    // Elements from `at` on: the even lanes to positions at + pad, + 2, ...,
    // the odd ones to the positions after them (either phase first).
    const auto store_phases = [&](int64_t at, const EvenOdd& phases) {
      _mm256_storeu_ps(at_position(at + pad), phases.even);
      _mm256_storeu_ps(at_position(at + pad + 1), phases.odd);
    };
    if (size >= 16) {
      // Vectors an even count of elements on land in the same phases, half
      // that count further along: the loop's stores take no divisions, which
      // had taken most of its instructions (MobileNetV2's stride-2 layer,
      // channels-first, ran 1.13-1.31x as fast in bf16 and 1.14-1.17x in f16,
      // f32 0.98-0.99x; Zen 3, 2 threads, interleaved in one process, two runs).
      float* const even = at_position(pad);
      float* const odd = at_position(pad + 1);
      int64_t w = 0;
      for (; w + 16 < size; w += 16) {
        const EvenOdd phases = load_even_odd_floats(source + w);
        _mm256_storeu_ps(even + w / 2, phases.even);
        _mm256_storeu_ps(odd + w / 2, phases.odd);
      }
      store_phases(size - 16, load_even_odd_floats(source + size - 16));
      return;
    }
    if (size <= 0) return;
    const int64_t count = std::is_same_v<T, float> ? size : size / 2 * 2;
    store_phases(0, load_even_odd_floats(source, count));
    if (count < size) *at_position(size - 1 + pad) = float_of(source + size - 1);
  }
#endif

  // Stages the input plane `x` (as float) into `staged`, whose padding stays as it is (zero).
  template <typename T>
  void stage(const Args& args, const T* x, float* staged) const {
    const int64_t* x_strides = args.input_strides;
    const int64_t pad = args.pad_begin[2];
#ifndef CPU_CAPABILITY_AVX512
    for (int64_t iz = 0; iz < args.in[0] && iz + args.pad_begin[0] < slices; ++iz)
      for (int64_t iy = 0; iy < args.in[1] && iy + args.pad_begin[1] < rows; ++iy) {
        const T* source = x + iz * x_strides[2] + iy * x_strides[3];
        float* target = row(staged, iz + args.pad_begin[0], iy + args.pad_begin[1]);
        if (x_strides[4] != 1)
          stage_phases(source, x_strides[4], args.in[2], stride, pad, length, phase_pitch, target);
        else
          stage_row(source, staged_elements, pad, target);
      }
#else
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t iz = 0; iz < args.in[0]; ++iz) {
      const int64_t uz = iz + args.pad_begin[0];
      if (uz >= slices) break;
      for (int64_t iy = 0; iy < args.in[1]; ++iy) {
        const int64_t uy = iy + args.pad_begin[1];
        if (uy >= rows) break;
        const T* source = x + iz * x_strides[2] + iy * x_strides[3];
        float* target = row(staged, uz, uy);
        if (x_strides[4] != 1) {
          stage_phases(source, x_strides[4], args.in[2], stride, pad, length, phase_pitch, target);
        } else if (stride == 1) {
          for (const Chunk& chunk : chunks)
            _mm512_mask_storeu_ps(target + pad + chunk.w, chunk.store[0],
                                  load_floats(source + chunk.w, chunk.load[0]));
        } else {
          if (first) target[phase_pitch + pad / 2] = static_cast<float>(source[0]);
          for (const Chunk& chunk : chunks) {
            const __m512 low = load_floats(source + chunk.w, chunk.load[0]);
            const __m512 high = load_floats(source + chunk.w + 16, chunk.load[1]);
            float* phases = target + (chunk.w + pad) / 2;
            _mm512_mask_storeu_ps(phases, chunk.store[0], _mm512_permutex2var_ps(low, even, high));
            _mm512_mask_storeu_ps(phases + phase_pitch, chunk.store[1], _mm512_permutex2var_ps(low, odd, high));
          }
        }
      }
    }
#endif
  }
};

// Output rows a tile runs at once where they share input rows: the sums
// (kKH x kKW), the output rows' grad_output vectors and an input vector fit
// the 32 registers, and their rows' addresses most of the 16 general ones
// (stride 2 reads twice the rows).
// AVX2's 16 registers: a tile of three rows of 3 taps shares 4 output rows
// (3 at stride 2), two rows of 5 taps 3 (2); a tile of one row of taps reads
// each input row for one output row only.
constexpr int shared_rows(int taps, int stride) {
#ifdef CPU_CAPABILITY_AVX512
  return stride == 1 ? (taps <= 9 ? 8 : taps <= 15 ? 6 : taps <= 21 ? 4 : 3) : (taps <= 9 ? 4 : taps <= 15 ? 3 : 2);
#else
  return taps == 3 || taps == 5 || taps == 7 ? 1 : stride == 1 ? (taps <= 9 ? 4 : 3) : (taps <= 9 ? 3 : 2);
#endif
}

// Prefetches (into L2) the next plane of each tensor while the tiles run,
// a few lines a step of 16 windows, so that memory reads overlap the
// products (bursts of 16-32 lines before each block of rows held the
// line-fill buffers and stalled the tiles). Each plane has its own share of
// lines a step, issued in one short loop: a loop over both planes' lines
// that checked its range at each line took as many instructions a step as
// the 3x3 tile's 72 FMAs, and MobileNetV2's f32 layer ran 1.15-1.16 times as
// fast without it, ConvNeXt's 1.03-1.09 (Cascade Lake, 2 threads,
// interleaved, two runs). Lines past a plane's end may be prefetched too:
// the next plane's.
class NextPlanes {
 public:
  // Ranges of bytes, spread over `steps` calls of step().
  void start(const void* x, int64_t x_bytes, const void* dy, int64_t dy_bytes, int64_t steps) {
    const void* begin[2] = {x, dy};
    const int64_t bytes[2] = {x_bytes, dy_bytes};
    for (int i = 0; i < 2; ++i) {
      const auto first = reinterpret_cast<std::uintptr_t>(begin[i]) & ~std::uintptr_t{kLine - 1};
      next_[i] = reinterpret_cast<const char*>(first);
      end_[i] = static_cast<const char*>(begin[i]) + bytes[i];
      const int64_t lines = (end_[i] - next_[i] + kLine - 1) / kLine;
      per_step_[i] = (lines + steps - 1) / std::max<int64_t>(steps, 1);
    }
  }
  void step() {
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
      if (next_[i] < end_[i]) {
        for (int64_t k = 0; k < per_step_[i]; ++k) __builtin_prefetch(next_[i] + k * kLine, 0, 1);
        next_[i] += per_step_[i] * kLine;
      }
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* next_[2] = {nullptr, nullptr};
  const char* end_[2] = {nullptr, nullptr};
  int64_t per_step_[2] = {0, 0};
};

// Masked steps of kRowLanes windows a float row tile takes along a row read
// in place at most: the first ones, whose taps read left of the row, and the
// last ones.
constexpr int kMostMaskedSteps = 4;

// Where a float row tile reads its input rows: row(uz, uy) is padded row
// (slice uz, row uy) such that row[w] is padded position w along it. Steps of
// 16 windows from whole_steps_begin() to whole_steps_end() read 16 whole
// windows within the row; the others, below `width` windows, read the lanes
// columns_read(j, kx) of tap kx at window j (and no window past the last).
// (The AVX2 build's tiles take steps of 8 windows and 8-lane masks: staged
// rows, f32 and f16 rows at stride 1 in place, InPlaceRows, and bf16 rows at
// stride 2, InPlaceStride2.)
//
// StagedRows: the plane staged as float with its padding (RowLayout).
struct StagedRows {
  const float* staged;
  const RowLayout& layout;
  int64_t width;  // windows along the row
  const float* row(int64_t uz, int64_t uy) const { return layout.row(staged, uz, uy); }
#ifdef CPU_CAPABILITY_AVX512
  int64_t whole_steps_begin() const { return 0; }
  int64_t whole_steps_end() const { return width / 16 * 16; }
  // Padding is staged as zeros: every lane reads.
  __mmask16 columns_read(int64_t, int64_t) const { return 0xFFFF; }
#endif
};

// A plane's rows of unit stride read where they are (f16/bf16 converted as
// they load): padding rows read a row of zeros, and padding columns are
// masked off (by the masks of the Rows types below), so that the tiles see
// what the staged plane holds. Staging took a sixth to a quarter of a 3x3
// layer's time (MobileNetV2, Cascade Lake).
template <typename T>
struct InPlacePlane {
  const T* plane;
  int64_t stride_z, stride_y, pad_z, pad_y, pad_x, in_z, in_y, in_x;
  int64_t width, taps;  // windows and taps along the row
  const T* zeros;  // as many as a row's loads read

  InPlacePlane(const Args& args, const T* plane_, const T* zeros_)
      : plane(plane_), stride_z(args.input_strides[2]), stride_y(args.input_strides[3]),
        pad_z(args.pad_begin[0]), pad_y(args.pad_begin[1]), pad_x(args.pad_begin[2]), in_z(args.in[0]),
        in_y(args.in[1]), in_x(args.in[2]), width(args.out[2]), taps(args.kernel[2]), zeros(zeros_) {}
  const T* row(int64_t uz, int64_t uy) const {
    const int64_t iz = uz - pad_z, iy = uy - pad_y;
    if (iz < 0 || iz >= in_z || iy < 0 || iy >= in_y) return zeros;
    return plane + iz * stride_z + iy * stride_y - pad_x;
  }
  // Whether the masked steps before whole step `first` and from `last` on fit
  // kMostMaskedSteps.
  bool masked_steps_fit(int64_t first, int64_t last) const {
    return first / kRowLanes + (width - last + kRowLanes - 1) / kRowLanes <= kMostMaskedSteps;
  }
  static int64_t floor_half(int64_t value) { return value >= 0 ? value / 2 : -((-value + 1) / 2); }
#ifdef CPU_CAPABILITY_AVX512
  // The first `count` lanes (none below 0, all above 16).
  static __mmask16 lanes_below(int64_t count) { return first_lanes(std::clamp<int64_t>(count, 0, 16)); }
#endif
};

// InPlaceRows: at stride 1 along the row; `zeros` holds zeros_needed(args).
// Tap kx's vector at window j is the row's elements from j + kx. The
// AVX-512 tiles load them masked by element; the AVX2 build's load through
// load(): f32 masked by 32-bit lanes, 16-bit 8 whole elements (AVX2 masks
// loads by 32 bits) with the lanes outside the row masked after their
// conversion, where loads_in_tensor (else the plane is staged).
template <typename T>
struct InPlaceRows : InPlacePlane<T> {
  using InPlacePlane<T>::InPlacePlane;
  using InPlacePlane<T>::pad_x;
  using InPlacePlane<T>::in_x;
  using InPlacePlane<T>::width;
  using InPlacePlane<T>::taps;
  static int64_t zeros_needed(const Args& args) {
    return round_up(args.out[2], kRowLanes) + args.kernel[2] + kRowLanes;
  }
  // Whether some loads may leave the row's tensor (the AVX2 build's 16-bit
  // ones), so that planes where they would are staged.
#ifdef CPU_CAPABILITY_AVX512
  static constexpr bool kStagesSomePlanes = false;
#else
  static constexpr bool kStagesSomePlanes = !std::is_same_v<T, float>;
#endif
  // Whether the loads of `plane`'s rows stay inside the tensor at `input`
  // (Args::input_span): from the first step's first element to the last
  // step's last tap's end.
  static bool loads_in_tensor(const Args& args, const T* plane, const T* input) {
    if constexpr (!kStagesSomePlanes) return true;
    const int64_t pad = args.pad_begin[2], last_step = (args.out[2] - 1) / kRowLanes * kRowLanes;
    const T* last_row = plane + (args.in[0] - 1) * args.input_strides[2] + (args.in[1] - 1) * args.input_strides[3];
    return plane - pad >= input &&
           last_row - pad + last_step + args.kernel[2] + kRowLanes - 1 <= input + args.input_span;
  }
  // Whether a tile's masked steps fit kMostMaskedSteps (at stride 1 along
  // the row, unit-stride rows).
  static bool fits(const Args& args) {
    const InPlaceRows probe(args, nullptr, nullptr);
    const int64_t first = probe.whole_steps_begin(), last = probe.whole_steps_end();
    return args.stride[2] == 1 && args.dilation[2] == 1 && args.input_strides[4] == 1 &&
           probe.masked_steps_fit(first, last);
  }
  // From the first step whose windows read no column left of the row (or
  // past the last window: padding wider than the windows).
  int64_t whole_steps_begin() const { return std::min(round_up(pad_x, kRowLanes), round_up(width, kRowLanes)); }
  // Up to the first step whose windows pass the last window or the row's end.
  int64_t whole_steps_end() const {
    const int64_t begin = whole_steps_begin();
    // Step j is whole when j + kRowLanes <= width and j + kRowLanes - 1 + taps - 1 - pad_x < in_x.
    const int64_t last = std::min(width - kRowLanes, in_x + pad_x - taps - kRowLanes + 1);
    return last < begin ? begin : (last / kRowLanes + 1) * kRowLanes;
  }
#ifdef CPU_CAPABILITY_AVX512
  __mmask16 columns_read(int64_t j, int64_t kx) const {
    // Lanes l with 0 <= j + l + kx - pad_x < in_x.
    return this->lanes_below(in_x + pad_x - kx - j) & static_cast<__mmask16>(~this->lanes_below(pad_x - kx - j));
  }
#else
  static constexpr bool kLoadsLanes = true;  // float_row_tile loads through load()
  __m256i columns_read(int64_t j, int64_t kx) const {
    // Lanes l with 0 <= j + l + kx - pad_x < in_x.
    return _mm256_andnot_si256(first_lanes(std::clamp<int64_t>(pad_x - kx - j, 0, 8)),
                               first_lanes(std::clamp<int64_t>(in_x + pad_x - kx - j, 0, 8)));
  }
  // Tap kx's 8 elements for windows j..j + 7 of `row`, as float lanes;
  // masked, those of `mask` only (the others zero).
  template <bool kMasked, bool>
  static __m256 load(const T* row, int64_t kx, int64_t j, __m256i mask) {
    if constexpr (std::is_same_v<T, float>) {
      return kMasked ? _mm256_maskload_ps(row + j + kx, mask) : _mm256_loadu_ps(row + j + kx);
    } else {
      const __m256 lanes = load_floats(row + j + kx);
      return kMasked ? _mm256_and_ps(lanes, _mm256_castsi256_ps(mask)) : lanes;
    }
  }
#endif
};

// InPlaceStride2: at stride 2 along the row; `zeros` holds zeros_needed(args)
// from one before it. Lane l of tap kx's vector at window j is element
// 2 * (j + l) + kx. f32 loads the 32 elements from the lane-0 one and keeps
// the even ones (one permutation); f16/bf16 load each as a 32-bit pair with
// a neighbour and widen it. Whole steps and those left of them pair an
// element with the next one, those right of them (16-bit only: their loads
// are masked by 32-bit pair) with the one before, so that every pair read
// lies in the row. The AVX2 build reads bf16 rows only (one shift or one
// mask a load), 8 windows a step, masked by 32-bit lanes: f16 there takes a
// shuffle, a permutation and a conversion a load, and ran 0.99-1.06 times as
// fast as staged (Zen 3), so it stays staged, as do f32 rows.
template <typename T>
struct InPlaceStride2 : InPlacePlane<T> {
  static constexpr bool kLoadsLanes = true;  // float_row_tile loads through load()
#ifdef CPU_CAPABILITY_AVX512
  static constexpr bool kLoadsType = true;
#else
  static constexpr bool kLoadsType = std::is_same_v<T, c10::BFloat16>;  // load() takes bf16 only
#endif
  using InPlacePlane<T>::InPlacePlane;
  using InPlacePlane<T>::pad_x;
  using InPlacePlane<T>::in_x;
  using InPlacePlane<T>::width;
  using InPlacePlane<T>::taps;
  using InPlacePlane<T>::floor_half;
  static int64_t zeros_needed(const Args& args) {
    return 2 * round_up(args.out[2], kRowLanes) + args.kernel[2] + 2 * kRowLanes;
  }
  static bool fits(const Args& args) {
    if (args.stride[2] != 2 || args.dilation[2] != 1 || args.input_strides[4] != 1) return false;
    const InPlaceStride2 probe(args, nullptr, nullptr);
    const int64_t first = probe.whole_steps_begin(), last = probe.whole_steps_end();
    // The 16-bit pairs of the steps left of the whole ones end within the
    // row, and those right of them start within it.
    const bool left_pairs_in_row = first == 0 || 2 * (first - 1) + probe.taps - probe.pad_x < probe.in_x;
    const bool right_pairs_in_row = last >= probe.width || 2 * last - probe.pad_x >= 1;
    return (std::is_same_v<T, float> || (left_pairs_in_row && right_pairs_in_row)) &&
           probe.masked_steps_fit(first, last);
  }
  // From the first step whose windows read no column left of the row.
  int64_t whole_steps_begin() const {
    return std::min(round_up((pad_x + 1) / 2, kRowLanes), round_up(width, kRowLanes));
  }
  // Up to the first step whose windows (or their pairs) pass the last window or the row's end.
  int64_t whole_steps_end() const {
    const int64_t begin = whole_steps_begin();
    // Step j is whole when j + kRowLanes <= width and 2 * (j + kRowLanes - 1) + taps - pad_x < in_x.
    const int64_t last = std::min(width - kRowLanes, floor_half(in_x + pad_x - taps - 2 * kRowLanes + 1));
    return last < begin ? begin : (last / kRowLanes + 1) * kRowLanes;
  }
#ifdef CPU_CAPABILITY_AVX512
  __mmask16 columns_read(int64_t j, int64_t kx) const {
    // Lanes l with 0 <= 2 * (j + l) + kx - pad_x < in_x.
    return this->lanes_below(floor_half(in_x + pad_x - kx + 1) - j) &
           static_cast<__mmask16>(~this->lanes_below(floor_half(pad_x - kx + 1) - j));
  }
  // The mask that load() takes for the lanes `lanes`: for f32, lane l's bit
  // at element 2l of the 32 it loads.
  static uint32_t load_mask(__mmask16 lanes) {
    if constexpr (!std::is_same_v<T, float>) return lanes;
    uint32_t spread = lanes;
    spread = (spread | (spread << 8)) & 0x00FF00FFu;
    spread = (spread | (spread << 4)) & 0x0F0F0F0Fu;
    spread = (spread | (spread << 2)) & 0x33333333u;
    return (spread | (spread << 1)) & 0x55555555u;
  }
  // Tap kx's 16 elements for windows j..j + 15 of `row`, as float lanes;
  // masked, those of load_mask(lanes) only (the others zero).
  template <bool kMasked, bool kRightOfWhole>
  static __m512 load(const T* row, int64_t kx, int64_t j, uint32_t mask) {
    const T* element = row + 2 * j + kx;
    if constexpr (std::is_same_v<T, float>) {
      const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512 low = kMasked ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), element) : _mm512_loadu_ps(element);
      const __m512 high = kMasked ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask >> 16), element + 16)
                                  : _mm512_loadu_ps(element + 16);
      return _mm512_permutex2var_ps(low, evens, high);
    } else {
      const T* pair = kRightOfWhole ? element - 1 : element;
      const __m512i words =
          kMasked ? _mm512_maskz_loadu_epi32(static_cast<__mmask16>(mask), pair) : _mm512_loadu_si512(pair);
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        const __m512i high_halves = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
        return _mm512_castsi512_ps(kRightOfWhole ? _mm512_and_si512(words, high_halves)
                                                 : _mm512_slli_epi32(words, 16));
      } else {
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(kRightOfWhole ? _mm512_srli_epi32(words, 16) : words));
      }
    }
  }
#else
  __m256i columns_read(int64_t j, int64_t kx) const {
    // Lanes l with 0 <= 2 * (j + l) + kx - pad_x < in_x.
    const int64_t begin = floor_half(pad_x - kx + 1) - j, end = floor_half(in_x + pad_x - kx + 1) - j;
    return _mm256_andnot_si256(first_lanes(std::clamp<int64_t>(begin, 0, 8)),
                               first_lanes(std::clamp<int64_t>(end, 0, 8)));
  }
  // Tap kx's 8 elements for windows j..j + 7 of `row`, as float lanes;
  // masked, those of `mask` only (the others zero).
  template <bool kMasked, bool kRightOfWhole>
  static __m256 load(const T* row, int64_t kx, int64_t j, __m256i mask) {
    static_assert(kLoadsType);
    const T* pair = row + 2 * j + kx - (kRightOfWhole ? 1 : 0);
    const __m256i words = kMasked ? _mm256_maskload_epi32(reinterpret_cast<const int*>(pair), mask)
                                  : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair));
    const __m256i high_halves = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    return _mm256_castsi256_ps(kRightOfWhole ? _mm256_and_si256(words, high_halves) : _mm256_slli_epi32(words, 16));
  }
#endif
};

// Steps of kRowLanes windows a float row tile takes over a plane.
inline int64_t float_row_tile_steps(const Args& args, int64_t taps, bool share_rows) {
  const int64_t shared = share_rows ? shared_rows(static_cast<int>(taps), static_cast<int>(args.stride[2])) : 1;
  const int64_t rows = args.out[1] / shared + args.out[1] % shared;
  return args.out[0] * rows * ((args.out[2] + kRowLanes - 1) / kRowLanes);
}

// How a float row tile walks a plane: kShared output rows at a time where
// they share input rows (share_rows), the rest one by one. For kRows output
// rows from row y of slice z, visit<kRows>(dy_rows, x_rows) gets their
// grad_output rows (`dy_pitch` apart: slices, rows) and the input rows they
// read through `x` from tap row ky_first of tap slice kz: input row u of the
// group (output row i reads u = i * kStride + ky where rows are shared, else
// u = ky). Inlined, with `visit`, so that the tile's sums stay in registers.
template <int kShared, int kKH, int kStride, typename T, typename Rows, typename Visit>
__attribute__((always_inline)) inline void for_each_row_group(const Rows& x, const Args& args, int64_t kz,
                                                              int64_t ky_first, bool share_rows, const T* dy,
                                                              const int64_t* dy_pitch, Visit&& visit) {
  const auto rows_at = [&]<int kRows>(int64_t z, int64_t y) __attribute__((always_inline)) {
    const int64_t uz = z * args.stride[0] + kz * args.dilation[0];
    const int64_t uy = y * args.stride[1] + ky_first * args.dilation[1];
    const T* dy_rows[kRows];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) dy_rows[i] = dy + z * dy_pitch[0] + (y + i) * dy_pitch[1];
    constexpr int kInputRows = (kRows - 1) * kStride + kKH;
    decltype(x.row(0, 0)) x_rows[kInputRows];
#pragma GCC unroll 16
    for (int u = 0; u < kInputRows; ++u) x_rows[u] = x.row(uz, uy + u * args.dilation[1]);
    visit.template operator()<kRows>(dy_rows, x_rows);
  };
  for (int64_t z = 0; z < args.out[0]; ++z) {
    int64_t y = 0;
    if (share_rows)
      for (; y + kShared <= args.out[1]; y += kShared) rows_at.template operator()<kShared>(z, y);
    for (; y < args.out[1]; ++y) rows_at.template operator()<1>(z, y);
  }
}

#ifdef CPU_CAPABILITY_AVX512

// Whether the float row tiles' bf16 pair loads (Args::bf16_pair_loads) take
// rows of `width` windows: an even count, in steps of 32 windows that leave
// no more lanes idle than steps of 16 (rows of 28, 56 or 64, not of 14 or 112).
inline bool pair_steps_fit(int64_t width) { return width % 2 == 0 && (width % 32 == 0 || width % 32 > 16); }

// A float row tile's steps over kRows output rows on bf16 rows read in
// place at stride 1 (Args::bf16_pair_loads), 32 windows a step: 16 even
// ones and 16 odd ones. A 64-byte load of 32 elements from position b holds
// row[b + 2l] in the low half of 32-bit lane l and row[b + 2l + 1] in the
// high half, which one shift or one mask makes float lanes (E(b) and O(b));
// loading 16 elements a tap takes a widening shuffle and a shift each. Even
// window j + 2l reads tap kx at row[j + 2l + kx], odd window j + 2l + 1 at
// row[j + 2l + 1 + kx]: so the loads from b = j + 2m serve even tap 2m
// (E) and 2m + 1 (O), odd tap 2m - 1 (E) and 2m (O). A step's lanes hold
// windows in pairs, both below `width` or neither (pair_steps_fit), so one
// mask a load (the pairs that exist, elements inside the row) gives each use
// the lanes it may read. On an AMD EPYC (Zen 4) a core ran 16 FMAs at 1.8
// G/s with a 16-element bf16 load converted for each, 2.9 G/s with one for
// every two, and 3.5-3.6 G/s with a 64-byte load and two conversions for every
// four, as with no loads at all.
template <int kKH, int kKW, int kRows, int kInputRows>
__attribute__((always_inline)) inline void bf16_pair_steps(const InPlaceRows<c10::BFloat16>& x, int64_t width,
                                                            const c10::BFloat16* const (&dy_rows)[kRows],
                                                            const c10::BFloat16* const (&x_row)[kInputRows],
                                                            NextPlanes& next_planes, __m512 (&sums)[kKH][kKW]) {
  static_assert(kKW % 2 == 1, "the loads from j, j + 2, ..., j + kKW - 1 serve an odd count of taps");
  constexpr int kLoads = kKW / 2 + 1;
  const __m512i high_halves = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // Elements [begin, end) of 32, as a mask.
  const auto elements = [](int64_t begin, int64_t end) {
    begin = std::clamp<int64_t>(begin, 0, 32);
    end = std::clamp<int64_t>(end, begin, 32);
    return static_cast<__mmask32>(((uint64_t{1} << end) - 1) & ~((uint64_t{1} << begin) - 1));
  };
  const auto step = [&]<bool kMasked>(int64_t j) __attribute__((always_inline)) {
    next_planes.step();
    next_planes.step();
    // Windows below `width`; a load's elements also inside the row.
    const __mmask32 windows = kMasked ? elements(0, width - j) : __mmask32(~0u);
    __mmask32 x_masks[kLoads];
#pragma GCC unroll 8
    for (int m = 0; m < kLoads; ++m)
      x_masks[m] = kMasked ? windows & elements(x.pad_x - j - 2 * m, x.pad_x + x.in_x - j - 2 * m) : windows;
    __m512 dy_even[kRows], dy_odd[kRows];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const __m512i words =
          kMasked ? _mm512_maskz_loadu_epi16(windows, dy_rows[i] + j) : _mm512_loadu_si512(dy_rows[i] + j);
      dy_even[i] = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
      dy_odd[i] = _mm512_castsi512_ps(_mm512_and_si512(words, high_halves));
    }
#pragma GCC unroll 16
    for (int u = 0; u < kInputRows; ++u)
#pragma GCC unroll 8
      for (int m = 0; m < kLoads; ++m) {
        const c10::BFloat16* base = x_row[u] + j + 2 * m;
        const __m512i words = kMasked ? _mm512_maskz_loadu_epi16(x_masks[m], base) : _mm512_loadu_si512(base);
        __m512 low = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
        __m512 high = _mm512_castsi512_ps(_mm512_and_si512(words, high_halves));
        asm("" : "+v"(low), "+v"(high));
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) {
          const int ky = u - i;
          if (ky < 0 || ky >= kKH) continue;
          if (2 * m < kKW) sums[ky][2 * m] = _mm512_fmadd_ps(low, dy_even[i], sums[ky][2 * m]);
          if (2 * m - 1 >= 0) sums[ky][2 * m - 1] = _mm512_fmadd_ps(low, dy_odd[i], sums[ky][2 * m - 1]);
          if (2 * m + 1 < kKW) sums[ky][2 * m + 1] = _mm512_fmadd_ps(high, dy_even[i], sums[ky][2 * m + 1]);
          if (2 * m < kKW) sums[ky][2 * m] = _mm512_fmadd_ps(high, dy_odd[i], sums[ky][2 * m]);
        }
      }
  };
  for (int64_t j = 0; j < width; j += 32) {
    // Whole steps: every window below `width`, every element inside the row.
    if (j >= x.pad_x && j + 32 <= width && j + 31 + kKW - 1 < x.pad_x + x.in_x)
      step.template operator()<false>(j);
    else
      step.template operator()<true>(j);
  }
}

// sums[ky][kx] = sum over output slices z, rows y and windows j of
//   x[(z * s0 + kz * d0) slice][(y * s1 + (ky_first + ky) * d1) row][kStride * j + kx] * dy[z][y][j]
// for ky < kKH, kx < kKW, x's rows read through `x` (StagedRows: staged as
// `layout`, stride kStride along the row; InPlaceRows, stride 1; or
// InPlaceStride2, stride 2, which loads its own lanes), dy rows `dy_pitch`
// apart (slices, rows). `share_rows`: s1 = kStride, d1 = 1.
template <typename T, int kKH, int kKW, int kStride, typename Rows>
void float_row_tile(const Rows& x, const RowLayout& layout, const Args& args, int64_t kz, int64_t ky_first,
                    bool share_rows, const T* dy, const int64_t* dy_pitch, NextPlanes& next_planes, float* sums_out) {
  constexpr int kShared = shared_rows(kKH * kKW, kStride);
  __m512 sums[kKH][kKW];
#pragma GCC unroll 16
  for (int ky = 0; ky < kKH; ++ky)
#pragma GCC unroll 16
    for (int kx = 0; kx < kKW; ++kx) sums[ky][kx] = _mm512_setzero_ps();
  const int64_t width = args.out[2];
  const int64_t phase_pitch = layout.phase_pitch;
  // Steps of 16 windows from j: whole ones in [whole_begin, whole_end),
  // masked ones before and after, whose lanes (masks[0..kKW - 1] for tap kx,
  // masks[kKW] for grad_output) hold windows below `width` that read the row.
  // Computed once: at most kMostMaskedSteps of them (Rows::fits).
  const int64_t whole_begin = x.whole_steps_begin(), whole_end = x.whole_steps_end();
  uint32_t step_masks[kMostMaskedSteps][kKW + 1];
  int masked_steps = 0;
  const auto add_masks = [&](int64_t j) {
    uint32_t* masks = step_masks[masked_steps++];
    const __mmask16 windows = first_lanes(std::min<int64_t>(16, width - j));
    for (int kx = 0; kx < kKW; ++kx) {
      const __mmask16 lanes = windows & x.columns_read(j, kx);
      if constexpr (requires { Rows::kLoadsLanes; })
        masks[kx] = Rows::load_mask(lanes);
      else
        masks[kx] = lanes;
    }
    masks[kKW] = windows;
  };
  for (int64_t j = 0; j < whole_begin; j += 16) add_masks(j);
  for (int64_t j = whole_end; j < width; j += 16) add_masks(j);
  // kRows output rows (for_each_row_group): tap kx reads phase kx % kStride
  // of input row u from window kx / kStride on.
  const auto rows_at = [&]<int kRows>(const T* const (&dy_rows)[kRows], const auto& x_row)
                           __attribute__((always_inline)) {
    constexpr int kInputRows = (kRows - 1) * kStride + kKH;
    const auto step = [&]<bool kMasked, bool kRightOfWhole>(int64_t j, const uint32_t* masks)
                          __attribute__((always_inline)) {
      next_planes.step();
      __m512 dy_lanes[kRows];
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i)
        dy_lanes[i] =
            kMasked ? load_floats(dy_rows[i] + j, static_cast<__mmask16>(masks[kKW])) : load_floats(dy_rows[i] + j);
#pragma GCC unroll 16
      for (int u = 0; u < kInputRows; ++u)
#pragma GCC unroll 16
        for (int kx = 0; kx < kKW; ++kx) {
          __m512 x_lanes;
          if constexpr (requires { Rows::kLoadsLanes; }) {
            x_lanes = Rows::template load<kMasked, kRightOfWhole>(x_row[u], kx, j, kMasked ? masks[kx] : 0);
          } else {
            const auto* p = x_row[u] + kx % kStride * phase_pitch + kx / kStride + j;
            x_lanes = kMasked ? load_floats(p, static_cast<__mmask16>(masks[kx])) : load_floats(p);
          }
          // One load for all its products: GCC would fold it into each FMA.
          asm("" : "+v"(x_lanes));
#pragma GCC unroll 16
          for (int i = 0; i < kRows; ++i) {
            const int ky = u - i * kStride;
            if (ky >= 0 && ky < kKH) sums[ky][kx] = _mm512_fmadd_ps(x_lanes, dy_lanes[i], sums[ky][kx]);
          }
        }
    };
    if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<Rows, InPlaceRows<T>>) {
      if (args.bf16_pair_loads && pair_steps_fit(width)) {
        bf16_pair_steps<kKH, kKW, kRows>(x, width, dy_rows, x_row, next_planes, sums);
        return;
      }
    }
    int64_t j = 0;
    int masked = 0;
    for (; j < whole_begin; j += 16) step.template operator()<true, false>(j, step_masks[masked++]);
    for (; j < whole_end; j += 16) step.template operator()<false, false>(j, nullptr);
    for (; j < width; j += 16) step.template operator()<true, true>(j, step_masks[masked++]);
  };
  for_each_row_group<kShared, kKH, kStride>(x, args, kz, ky_first, share_rows, dy, dy_pitch, rows_at);
#pragma GCC unroll 16
  for (int ky = 0; ky < kKH; ++ky)
#pragma GCC unroll 16
    for (int kx = 0; kx < kKW; ++kx) sums_out[ky * kKW + kx] = _mm512_reduce_add_ps(sums[ky][kx]);
}

// Rows of taps a float row tile sums at most: ConvNeXt's 7 rows of 7 taps in
// tiles of 4 + 3 rows ran 1.03-1.07 times as fast as in 3 + 2 + 2 (Cascade
// Lake, 2 threads, interleaved, two runs), fewer loads a product.
constexpr int64_t kMostTapRows = 4;
constexpr int64_t most_tap_rows(int64_t) { return kMostTapRows; }
#else
// The AVX2 build's tile: the sums as above in 16 registers, 8 windows a
// step, the input rows staged (StagedRows) or read in place (f32 and f16 at
// stride 1, InPlaceRows; bf16 at stride 2, InPlaceStride2). On staged rows
// the last step, of fewer windows, zeroes the lanes past the row's last
// window in both tensors' vectors: the input elements there are real ones
// (another window's, or the next row's) and may be infinite. In place,
// masks take those lanes and the padding.
template <typename T, int kKH, int kKW, int kStride, typename Rows>
void float_row_tile(const Rows& x, const RowLayout& layout, const Args& args, int64_t kz, int64_t ky_first,
                    bool share_rows, const T* dy, const int64_t* dy_pitch, NextPlanes& next_planes, float* sums_out) {
  constexpr int kShared = shared_rows(kKH * kKW, kStride);
  constexpr bool kInPlace = !std::is_same_v<Rows, StagedRows>;
  __m256 sums[kKH][kKW];
#pragma GCC unroll 16
  for (int ky = 0; ky < kKH; ++ky)
#pragma GCC unroll 16
    for (int kx = 0; kx < kKW; ++kx) sums[ky][kx] = _mm256_setzero_ps();
  const int64_t width = args.out[2];
  // Staged rows: whole steps of 8 windows, then a tail step. Rows read in
  // place: whole steps in [whole_begin, whole_end), masked ones before and
  // after, whose lanes (masks[0..kKW - 1] for tap kx, masks[kKW] the windows
  // below `width`) read the row; computed once.
  int64_t whole_begin = 0, whole_end = width / 8 * 8;
  __m256i step_masks[kMostMaskedSteps][kKW + 1];
  if constexpr (kInPlace) {
    whole_begin = x.whole_steps_begin(), whole_end = x.whole_steps_end();
    int masked = 0;
    const auto add_masks = [&](int64_t j) {
      const __m256i windows = first_lanes(std::min<int64_t>(8, width - j));
      for (int kx = 0; kx < kKW; ++kx) step_masks[masked][kx] = _mm256_and_si256(windows, x.columns_read(j, kx));
      step_masks[masked++][kKW] = windows;
    };
    for (int64_t j = 0; j < whole_begin; j += 8) add_masks(j);
    for (int64_t j = whole_end; j < width; j += 8) add_masks(j);
  }
  const int64_t tail = width - whole_end;
  const __m256 tail_lanes = _mm256_castsi256_ps(first_lanes(tail));
  const int64_t phase_pitch = layout.phase_pitch;
  // As in the AVX-512 tile: kRows output rows (for_each_row_group).
  const auto rows_at = [&]<int kRows>(const T* const (&dy_rows)[kRows], const auto& x_row)
                           __attribute__((always_inline)) {
    constexpr int kInputRows = (kRows - 1) * kStride + kKH;
    // kMasked: a tail step of staged rows, or a masked step in place.
    const auto step = [&]<bool kMasked, bool kRightOfWhole>(int64_t j, const __m256i* masks)
                          __attribute__((always_inline)) {
      next_planes.step();
      __m256 dy_lanes[kRows];
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i)
        dy_lanes[i] = kMasked ? load_first_floats(dy_rows[i] + j, std::min<int64_t>(8, width - j))
                              : load_floats(dy_rows[i] + j);
#pragma GCC unroll 16
      for (int u = 0; u < kInputRows; ++u)
#pragma GCC unroll 16
        for (int kx = 0; kx < kKW; ++kx) {
          __m256 x_lanes;
          if constexpr (kInPlace) {
            x_lanes = Rows::template load<kMasked, kRightOfWhole>(x_row[u], kx, j,
                                                                  kMasked ? masks[kx] : _mm256_setzero_si256());
          } else {
            x_lanes = _mm256_loadu_ps(x_row[u] + kx % kStride * phase_pitch + kx / kStride + j);
            if constexpr (kMasked) x_lanes = _mm256_and_ps(x_lanes, tail_lanes);
          }
          // One load for all its products: GCC would fold it into each FMA.
          asm("" : "+x"(x_lanes));
#pragma GCC unroll 16
          for (int i = 0; i < kRows; ++i) {
            const int ky = u - i * kStride;
            if (ky >= 0 && ky < kKH) sums[ky][kx] = _mm256_fmadd_ps(x_lanes, dy_lanes[i], sums[ky][kx]);
          }
        }
    };
    if constexpr (kInPlace) {
      int64_t j = 0;
      int masked = 0;
      for (; j < whole_begin; j += 8) step.template operator()<true, false>(j, step_masks[masked++]);
      for (; j < whole_end; j += 8) step.template operator()<false, false>(j, nullptr);
      for (; j < width; j += 8) step.template operator()<true, true>(j, step_masks[masked++]);
    } else {
      for (int64_t j = 0; j < whole_end; j += 8) step.template operator()<false, false>(j, nullptr);
      if (tail) step.template operator()<true, false>(whole_end, nullptr);
    }
  };
  for_each_row_group<kShared, kKH, kStride>(x, args, kz, ky_first, share_rows, dy, dy_pitch, rows_at);
#pragma GCC unroll 16
  for (int ky = 0; ky < kKH; ++ky)
#pragma GCC unroll 16
    for (int kx = 0; kx < kKW; ++kx) {
      const __m256 lanes = sums[ky][kx];
      __m128 half = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
      half = _mm_add_ps(half, _mm_movehl_ps(half, half));
      sums_out[ky * kKW + kx] = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
    }
}

// Rows of taps a tile sums at most in the AVX2 build: its sums, an output
// row's grad_output vector and an input vector fit 16 registers.
constexpr int64_t kMostTapRows = 3;
constexpr int64_t most_tap_rows(int64_t row_taps) { return row_taps == 3 ? 3 : row_taps == 5 ? 2 : 1; }
#endif

template <typename T>
void channels_first_rows(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                         int64_t channel_end, float* result) {
  const T* input = static_cast<const T*>(args.input);
  const T* grad_output = static_cast<const T*>(args.grad_output);
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const int64_t* kernel = args.kernel;
  const int64_t taps = kernel[0] * kernel[1] * kernel[2];
  const RowLayout layout(args);
#ifdef CPU_CAPABILITY_AVX512
  // Rows of kernels up to 3x3 are read in place (InPlaceRows), others
  // staged. In place, against staged (Cascade Lake, 2 threads, interleaved,
  // two runs or more), f32: MobileNetV2's 3x3 layer 1.17-1.30x, 3x3 on
  // 112x112 maps 1.22-1.27x and on 14x14 1.07-1.08x, a 1-D layer of 3 taps
  // 1.23-1.24x; but 3x3 on 7x7 maps 0.91-0.98x, and 0.93-1.0x with 5x5 and
  // 7x7 kernels (ConvNeXt's included) and 3x3x3, whose products outweigh the
  // staging, where every row's first step is masked in place. f16/bf16,
  // converted as they load, with the prefetch below: MobileNetV2's layer
  // 1.08-1.30x, 3x3 on 112x112 1.38-1.46x, on 14x14 to 56x56 0.99-1.26x, 1x3
  // on 56x56 1.23-1.42x, the 1-D layer 1.26-1.28x; ConvNeXt's 7x7
  // 0.77-0.92x.
  const bool in_place = taps <= 9 && args.out[2] >= 14 && InPlaceRows<T>::fits(args);
  // Rows at stride 2 too (InPlaceStride2), against staged (same runs; f32 in
  // two more), with the prefetch below: MobileNetV2's stride-2 layer 1.47x
  // (bf16), 1.28x (f16) and 1.11-1.26x (f32); 1.34x, 1.20x and 0.96-1.09x
  // without it. On 112x112 1.74x, 1.48x and 1.35-1.47x, unpadded on 57x57
  // 1.59x, 1.27x and 1.24-1.27x; a 1-D layer (not prefetching) 1.66x, 1.47x
  // and 1.24-1.31x; f32 on 28x28 (not prefetching) 1.0-1.07x.
  const bool in_place_stride2 = taps <= 9 && args.out[2] >= 14 && InPlaceStride2<T>::fits(args);
  LineAlignedBuffer<T> zero_row(in_place           ? InPlaceRows<T>::zeros_needed(args)
                                : in_place_stride2 ? InPlaceStride2<T>::zeros_needed(args) + 1
                                                   : 0);
#else
  // bf16 rows at stride 2 in place (InPlaceStride2), against staged (AMD
  // EPYC, Zen 3, 2026-12-05, 2 threads, switched in one build, interleaved
  // in one process): MobileNetV2's stride-2 layer 1.51-1.75x, 3x3 at stride 2
  // on 28x28 1.46x, on 57x57 unpadded 1.63x, on 14x14 1.02x.
  // f32 and f16 rows of 3 taps (9 in all) at stride 1 in place
  // (InPlaceRows), against staged (AMD EPYC, Zen 3, 2026-12-05, 2 threads,
  // switched in one build, interleaved in one process, two runs). f32:
  // MobileNetV2's 3x3 layer 1.21-1.28x (unpadded 1.24-1.30x), on 28x28 maps
  // 1.13-1.16x, on 112x112 1.12-1.19x, on 20x20 and 40x40 1.14x and 1.19x,
  // 1-D rows of 4000 and 1000 windows 1.46x and 1.21x; on 14x14 maps
  // 0.87-1.11x, 16x16 0.96x, 7x7 0.88x (every step masked) and 5x5 kernels
  // 0.96-0.98x, which stay staged. f16 (one conversion a tap's load):
  // MobileNetV2's layer 1.06-1.21x (unpadded 1.20-1.26x), 28x28 1.03-1.16x,
  // 112x112 1.31-1.36x, 1-D rows of 400 to 4000 windows 1.04-1.38x; 20x20
  // and 24x24 0.99-1.01x, 1-D rows of 200 0.89-0.91x. bf16 (a widening and a
  // shift a load) ran MobileNetV2's layer 0.94x and stays staged.
  const int64_t plane_windows = args.out[0] * args.out[1] * args.out[2];
  const bool in_place = taps <= 9 && kernel[2] == 3 && InPlaceRows<T>::fits(args) &&
                        (std::is_same_v<T, float>       ? args.out[2] > 16
                         : std::is_same_v<T, c10::Half> ? args.out[2] >= 28 && plane_windows >= 400
                                                        : false);
  const bool in_place_stride2 = std::is_same_v<T, c10::BFloat16> && InPlaceStride2<T>::fits(args);
  LineAlignedBuffer<T> zero_row(in_place           ? InPlaceRows<T>::zeros_needed(args)
                                : in_place_stride2 ? InPlaceStride2<T>::zeros_needed(args) + 1
                                                   : 0);
#endif
  // Zeroed once: every plane writes the same positions. Planes read in
  // place whose loads would leave the tensor are staged
  // (InPlaceRows::loads_in_tensor).
  const bool stages = !in_place_stride2 && (!in_place || InPlaceRows<T>::kStagesSomePlanes);
  LineAlignedBuffer<float> staged_input(stages ? layout.plane_pitch : 0);
  const bool share_rows = args.stride[1] == args.stride[2] && args.dilation[1] == 1;
  // Tiles: (slice of taps, first row of taps, rows of taps), the rows of
  // taps split as evenly as possible.
  std::vector<std::array<int64_t, 3>> tiles;
  for (int64_t kz = 0; kz < kernel[0]; ++kz)
    for (const TapRange& range : tap_tiles(kernel[1], most_tap_rows(kernel[2])))
      tiles.push_back({kz, range.first, range.count});
  int64_t steps = 0;
  for (const auto& tile : tiles) steps += float_row_tile_steps(args, tile[2] * kernel[2], share_rows);
  // Only planes read at stride 1, f32 or in place, or in place at stride 2
  // (MobileNetV2's stride-2 layer 1.06-1.13x in f16/bf16 and 1.16-1.25x in
  // f32, on 112x112 1.35x and 1.40x), of several
  // rows and a page (4 KiB) or more gain from it (Cascade Lake, 2 threads,
  // interleaved, three runs): MobileNetV2's f32 3x3 layer 1.18-1.20x; its stride-2 layer
  // 0.92-0.98x (bf16 0.87-0.89x), ConvNeXt's 7x7 one 0.95-1.14x (bf16
  // staged 0.93-0.95x, MobileNetV2's 0.99-1.07x). In place, 16-bit planes of
  // 56x56 and 112x112 1.02-1.5x, but 3x3 on 14x14 and 28x28 0.89-0.95x (f32
  // 0.89), and a 1-D layer's rows of 4000 0.84 (f32 0.97): the planes that
  // follow one another within a page, the hardware prefetches.
  const int64_t plane_bytes = args.in[0] * args.in[1] * args.in[2] * static_cast<int64_t>(sizeof(T));
#ifdef CPU_CAPABILITY_AVX512
  const bool prefetch = args.dense_planes &&
                        ((layout.stride == 1 && (std::is_same_v<T, float> || in_place)) || in_place_stride2) &&
                        args.out[0] * args.out[1] > 1 && plane_bytes >= 4096;
#else
  // AVX2 (staged): without it MobileNetV2's layer ran 0.77-0.95x in f32 and
  // 0.88-0.90x in bf16, on 112x112 0.52-0.76x, on 14x14 0.87-1.05x (Zen 3,
  // 2 threads, switched in one build).
  const bool prefetch = args.dense_planes && args.out[0] * args.out[1] > 1 && plane_bytes >= 4096;
#endif
  NextPlanes next_planes;
  std::fill(result, result + (channel_end - channel_begin) * taps, 0.0f);
  for (int64_t n = sample_begin; n < sample_end; ++n)
    for (int64_t c = channel_begin; c < channel_end; ++c) {
      const T* x_plane = input + n * x_strides[0] + c * x_strides[1];
      const bool plane_in_place = in_place && InPlaceRows<T>::loads_in_tensor(args, x_plane, input);
      if (!plane_in_place && !in_place_stride2) layout.stage(args, x_plane, staged_input.data());
      const T* dy_plane = grad_output + n * dy_strides[0] + c * dy_strides[1];
      int64_t next[2];
      if (prefetch && next_plane(args, n, c, channel_begin, channel_end, sample_end, next))
        next_planes.start(input + next[0], args.in[0] * args.in[1] * args.in[2] * sizeof(T), grad_output + next[1],
                          args.out[0] * args.out[1] * args.out[2] * sizeof(T), steps);
      for (const auto& tile : tiles) {
        const auto [kz, ky_first, tap_rows] = tile;
        float sums[kMostTapRows * 7];
        const auto run = [&]<int kKH, int kKW>() {
          if (plane_in_place) {
            const InPlaceRows<T> rows(args, x_plane, zero_row.data());
            float_row_tile<T, kKH, kKW, 1>(rows, layout, args, kz, ky_first, share_rows, dy_plane, dy_strides + 2,
                                           next_planes, sums);
            return;
          }
          if constexpr (InPlaceStride2<T>::kLoadsType)
            if (in_place_stride2) {
              const InPlaceStride2<T> rows(args, x_plane, zero_row.data() + 1);
              float_row_tile<T, kKH, kKW, 2>(rows, layout, args, kz, ky_first, share_rows, dy_plane, dy_strides + 2,
                                             next_planes, sums);
              return;
            }
          const StagedRows rows{staged_input.data(), layout, args.out[2]};
          if (layout.stride == 1)
            float_row_tile<T, kKH, kKW, 1>(rows, layout, args, kz, ky_first, share_rows, dy_plane, dy_strides + 2,
                                           next_planes, sums);
          else
            float_row_tile<T, kKH, kKW, 2>(rows, layout, args, kz, ky_first, share_rows, dy_plane, dy_strides + 2,
                                           next_planes, sums);
        };
        const auto with_rows = [&]<int kKW>() {
          with_count<most_tap_rows(kKW)>(tap_rows, [&]<int kKH>() { run.template operator()<kKH, kKW>(); });
        };
        if (kernel[2] == 3) with_rows.template operator()<3>();
        else if (kernel[2] == 5) with_rows.template operator()<5>();
        else with_rows.template operator()<7>();
        float* tap_sums = result + (c - channel_begin) * taps + (kz * kernel[1] + ky_first) * kernel[2];
        for (int64_t b = 0; b < tap_rows * kernel[2]; ++b) tap_sums[b] += sums[b];
      }
    }
}
#endif

template <template <typename> class Kernel>
void dispatch(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
              int64_t channel_end, void* result) {
  switch (args.dtype) {
    case Dtype::Float:
      return Kernel<float>::run(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<float*>(result));
    case Dtype::Double:
      return Kernel<double>::run(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<double*>(result));
    case Dtype::Half:
      return Kernel<c10::Half>::run(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<float*>(result));
    case Dtype::BFloat16:
      return Kernel<c10::BFloat16>::run(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<float*>(result));
  }
}

// On whole planes where depthwise.cpp chose so, unless a sum came out
// infinite or NaN there: then row by row, which keeps infinities and NaN in
// the taps that read them.
template <typename T>
void channels_last_rows_or_planes(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                                  int64_t channel_end, acc_type<T>* result) {
  if (args.whole_planes &&
      channels_last_planes<T>(args, sample_begin, sample_end, channel_begin, channel_end, result))
    return;
  channels_last_impl<T>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

template <typename T>
struct ChannelsLast {
  static constexpr auto run = channels_last_rows_or_planes<T>;
};
template <typename T>
struct ChannelsFirst {
  static constexpr auto run = channels_first_impl<T>;
};

// This capability's entry points (declared above).
void channels_last(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                   int64_t channel_end, void* result) {
  dispatch<ChannelsLast>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

#ifdef CPU_CAPABILITY_AVX512
bool bf16_planes_built() {
#ifdef TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS
  return true;
#else
  return false;
#endif
}
#endif

void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                    int64_t channel_end, void* result) {
#ifdef TORCH_CONVGRAD_DEPTHWISE_BF16_PAIRS
  if (args.bf16_planes)
    return channels_first_pairs(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<float*>(result));
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if (args.float_rows) {
    float* sums = static_cast<float*>(result);
    if (args.dtype == Dtype::Float)
      return channels_first_rows<float>(args, sample_begin, sample_end, channel_begin, channel_end, sums);
    if (args.dtype == Dtype::Half)
      return channels_first_rows<c10::Half>(args, sample_begin, sample_end, channel_begin, channel_end, sums);
    return channels_first_rows<c10::BFloat16>(args, sample_begin, sample_end, channel_begin, channel_end, sums);
  }
#endif
  dispatch<ChannelsFirst>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

#if defined(CPU_CAPABILITY_AVX512) && defined(TORCH_CONVGRAD_DEPTHWISE_AMX)
// ---------------------------------------------------------------------------
// amx_bf16: one plane (sample, channel) at a time on AMX tiles, for bf16
// depthwise 2-D layers with stride 1 and no dilation. The FMA tiles above
// stop at the FMA ports' rate; a tile product multiplies 16 x 16 x 32 at once.
// Per pair of output rows (o, o + 1) and chunk of 32 positions c along the
// padded input row (positions c = iw + pad_w), two products, b = 0 and 1:
//
//   A[m][k]      = input[o + m - pad_h][c0 + k - pad_w]             (KH + 1 rows)
//   B_b[k][n]    = grad_output[o + b][c0 + k - (KW - 1 - n)]       (8 columns)
//   C_b[m][n]   += sum_k A[m][k] * B_b[k][n],  tap (m - b, KW - 1 - n)
//
// so the tap each C element sums is the same for every product, and C stays
// in its tile across the plane. A's rows are rows of the input plane, copied
// (channels-last: transposed) once per plane onto cache lines with zeros
// around them (the padding), and loaded in place: a tile load of rows that
// straddle lines ran 5x slower. B's rows are pairs along k (VNNI): row j
// holds grad_output positions (s, s + 1) for s = c0 + 2j - (KW - 1) + n, n
// < 8, so with each grad_output row written once as its overlapping pairs,
// P[t] = (row[t - KW + 1], row[t - KW + 2]) (zero outside the plane), B_b is
// the 16 rows of 8 pairs at P + c0 + 2j: a tile load with a row stride of 8
// bytes. Against building each B in registers (a permutation per B row, 16
// columns for both output rows), which held the products at about 5x the
// tiles' own time: ConvNeXt's 7x7 layer 1.1x as fast channels-first and
// 1.03x channels-last, 7x7 on 14x14 maps 1.35x and 1.16x (AMX CPU, 2
// threads); the planes' reading (copy, transposition) now bounds them.
// ---------------------------------------------------------------------------

#define TORCH_CONVGRAD_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// The layout ldtilecfg reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
  uint8_t reserved_end[16];
};

constexpr int64_t kAmxChunk = 32;           // positions along the row a product sums (bf16 per 64-byte row)
constexpr int64_t kAmxRowTaps = 8;          // B's and C's columns: taps along the row
constexpr int64_t kAmxTileSums = 16 * kAmxRowTaps;  // a C tile's float32 sums
constexpr int64_t kAmxSums = 2 * kAmxTileSums;      // a channel's two C tiles
constexpr int64_t kAmxPairsAhead = 2;       // pairs of grad_output rows written ahead of their products
// Channels-last planes transposed at once: whole slices (samples' planes of
// the task's channels) while they fit kAmxPlanesElements, about 1 MB of L2;
// a larger slice in bands of kAmxBandRows output rows (fewer where those
// exceed it).
constexpr int64_t kAmxPlanesElements = int64_t{1} << 19;
constexpr int64_t kAmxBandRows = 16;

struct AmxPlan {
  int64_t H, W, OH, OW, KH, KW, pad_h, pad_w;
  int64_t chunks;          // of kAmxChunk positions along the padded row
  int64_t x_rows;          // the padded input plane: rows o .. o + KH for every pair o
  int64_t x_pitch;         // and its row pitch, chunks * kAmxChunk
  int64_t w_begin, w_end;  // the input positions it holds (a negative pad_w crops)
  int64_t pair_rows;       // grad_output rows written as pairs, OH rounded up to even (the last one zero)
  int64_t pair_pitch;      // and their pitch in pairs: every B's 16 rows of 8 pairs, on cache lines
  std::vector<uint32_t> pair_masks;  // per 16 pairs of a row: the grad_output positions inside the row
  // transpose_pair_rows's permutations of two blocks of 16 pixels' channel
  // pairs into 16 pair rows, of channel 2k and of 2k + 1; the blocks for pair
  // rows t0 .. t0 + 15 start at pixel t0 - pair_offset.
  uint16_t pair_index[2][32];
  int64_t pair_offset;
};

inline AmxPlan amx_plan(const Args& args) {
  AmxPlan plan{args.in[1], args.in[2], args.out[1], args.out[2], args.kernel[1], args.kernel[2],
               args.pad_begin[1], args.pad_begin[2], 0, 0, 0, 0, 0, 0, 0, {}, {}, 0};
  plan.chunks = (plan.W + plan.pad_w + kAmxChunk - 1) / kAmxChunk;
  plan.x_rows = round_up(plan.OH, 2) + plan.KH;
  plan.x_pitch = plan.chunks * kAmxChunk;
  plan.w_begin = std::max<int64_t>(0, -plan.pad_w);
  plan.w_end = std::min(plan.W, plan.x_pitch - plan.pad_w);
  plan.pair_rows = round_up(plan.OH, 2);
  plan.pair_pitch = amx_pair_pitch(plan.chunks);
  // Pairs t .. t + 15 take positions t - KW + 1 .. t - KW + 17 (32 loaded).
  for (int64_t t = 0; t < plan.pair_pitch; t += 16) {
    const int64_t first = std::clamp<int64_t>(plan.KW - 1 - t, 0, 32);
    const int64_t last = std::clamp<int64_t>(plan.OW + plan.KW - 1 - t, first, 32);
    plan.pair_masks.push_back(static_cast<uint32_t>(((uint64_t{1} << (last - first)) - 1) << first));
  }
  // Pair rows t0 .. t0 + 15 take pixels s0 = t0 - KW + 1 to s0 + 16: of the
  // blocks of 16 from s0 - offset and the next, offset the same for every t0.
  const int64_t offset = (16 - (plan.KW - 1) % 16) % 16;
  plan.pair_offset = plan.KW - 1 + offset;
  for (int64_t j = 0; j < 2; ++j)  // channel 2k + j
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t e = 0; e < 2; ++e) plan.pair_index[j][2 * i + e] = static_cast<uint16_t>(2 * (offset + i + e) + j);
  return plan;
}

// The pitch of transpose_pair_rows's units: 16 pixels before a row's first
// pair row and 16 after its last.
inline int64_t amx_units_pitch(const AmxPlan& plan) { return plan.pair_pitch + 32; }

// Per-thread buffers, zero where never written: the padded input plane and
// the grad_output plane's pairs.
struct AmxBuffers {
  explicit AmxBuffers(const AmxPlan& plan)
      : x(plan.x_rows * plan.x_pitch), pairs(plan.pair_rows * plan.pair_pitch) {}
  LineAlignedBuffer<uint16_t> x;
  LineAlignedBuffer<uint32_t> pairs;
};

// pairs[t] = (row[t - KW + 1], row[t - KW + 2]) for t < plan.pair_pitch, each
// zero outside the row's OW positions.
TORCH_CONVGRAD_AMX_TARGET inline void amx_pair_row(const AmxPlan& plan, const uint16_t* row, uint32_t* pairs) {
  // Pair i of 16 takes elements i and i + 1 of the 32 loaded from t - KW + 1.
  alignas(64) static constexpr uint16_t kOverlapping[32] = {0, 1, 1, 2,  2,  3,  3,  4,  4,  5,  5,  6,  6,  7,  7,  8,
                                                            8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15, 16};
  const __m512i overlapping = _mm512_load_si512(kOverlapping);
  const uint32_t* masks = plan.pair_masks.data();
  row -= plan.KW - 1;
  for (int64_t t = 0; t < plan.pair_pitch; t += 16, ++masks) {
    const __m512i values = _mm512_maskz_loadu_epi16(*masks, row + t);
    _mm512_store_si512(pairs + t, _mm512_permutexvar_epi16(overlapping, values));
  }
}

// pairs[k] lane i = channels 2k and 2k + 1 of pixel i of channels-last
// 16-bit data (zero from pixel `left` or channel `channels` on, at most 32):
// 16 pixels transposed in 32-bit units. Whole blocks of 16 pixels and 32
// channels transpose as they load (load_transposed): the transposition alone
// ran 1.17x as fast so (AMX CPU, one thread, ConvNeXt's layer, data in L3).
TORCH_CONVGRAD_AMX_TARGET inline void load_channel_pairs(const uint16_t* source, int64_t pixel_stride, int64_t left,
                                                         int64_t channels, __m512 (&pairs)[16]) {
  if (left >= 16 && channels == 32) {
    load_transposed(source, pixel_stride * 2, pairs);
    return;
  }
  const __mmask32 channel_mask = channels >= 32 ? ~__mmask32{0} : (__mmask32{1} << channels) - 1;
  __m512 rows[16];
  for (int64_t i = 0; i < 16; ++i)
    rows[i] = _mm512_castsi512_ps(i < left ? _mm512_maskz_loadu_epi16(channel_mask, source + i * pixel_stride)
                                           : _mm512_setzero_si512());
  transpose_registers(rows, pairs);
}

// planes[c * plane_pitch + p] = source[p * pixel_stride + c] for c <
// channels (at most 32), p < count: channels-last 16-bit data as a plane per
// channel, 16 pixels at a time, each pair of channels separated. Through a
// buffer, as two transposes of 16 pixels and then 32 pixels a store, it ran
// ConvNeXt's 7x7 channels-last layer 1-7% slower.
TORCH_CONVGRAD_AMX_TARGET inline void transpose_channels(const uint16_t* source, int64_t pixel_stride, int64_t count,
                                                         int64_t channels, uint16_t* planes, int64_t plane_pitch) {
  // A pair's 16 pixels (c, c + 1 interleaved) as channel c's, then c + 1's.
  alignas(64) static constexpr uint16_t kSeparate[32] = {0, 2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                         22, 24, 26, 28, 30, 1,  3,  5,  7,  9,  11,
                                                         13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i separate = _mm512_load_si512(kSeparate);
  for (int64_t p0 = 0; p0 < count; p0 += 16) {
    const int64_t left = count - p0;
    __m512 pairs[16];
    load_channel_pairs(source + p0 * pixel_stride, pixel_stride, left, channels, pairs);
    const __mmask16 pixel_mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    for (int64_t pair = 0; 2 * pair < channels; ++pair) {
      const __m512i both = _mm512_permutexvar_epi16(separate, _mm512_castps_si512(pairs[pair]));
      _mm256_mask_storeu_epi16(planes + 2 * pair * plane_pitch + p0, pixel_mask, _mm512_castsi512_si256(both));
      if (2 * pair + 1 < channels)
        _mm256_mask_storeu_epi16(planes + (2 * pair + 1) * plane_pitch + p0, pixel_mask,
                                 _mm512_extracti64x4_epi64(both, 1));
    }
  }
}

// amx_pair_row's pair rows of a channels-last grad_output row, channels c <
// channels (at most 32): pair_rows[c * plane_pitch + t] = (row[t - KW + 1],
// row[t - KW + 2]) for t < plan.pair_pitch, zero outside the row's OW
// positions, made from the row's transposed pairs of channels with no plane
// of each channel in between. `units` (amx_units_pitch apart) takes those
// pairs, pair k's pixel p at [k][16 + p], zero where never written (before
// the row, after it). Against planes of each channel whose pair rows
// amx_plane writes between the products (skipping those writes alone made
// ConvNeXt's channels-last layer 1.2-1.4x as fast: the tile loads wait on
// them), it ran that layer 1.05-1.07x as fast, 7x7 and 5x5 layers on 28x28
// maps 1.04-1.07x and 1.05-1.14x, and 7x7 on 96x96 and 112x112 maps
// 0.91-0.97x (smaller bands; see amx_bf16_impl's prefetch) (AMX CPU, 2
// threads, processes alternated).
TORCH_CONVGRAD_AMX_TARGET inline void transpose_pair_rows(const AmxPlan& plan, const uint16_t* source,
                                                          int64_t pixel_stride, int64_t channels, uint32_t* units,
                                                          uint32_t* pair_rows, int64_t plane_pitch) {
  const int64_t units_pitch = amx_units_pitch(plan);
  // Pixels past the last pair row's are not read.
  const int64_t count = std::min(plan.OW, plan.pair_pitch + 16);
  for (int64_t p0 = 0; p0 < count; p0 += 16) {
    __m512 pairs[16];
    load_channel_pairs(source + p0 * pixel_stride, pixel_stride, count - p0, channels, pairs);
    for (int64_t k = 0; 2 * k < channels; ++k) _mm512_store_ps(units + k * units_pitch + 16 + p0, pairs[k]);
  }
  const __m512i even = _mm512_loadu_si512(plan.pair_index[0]), odd = _mm512_loadu_si512(plan.pair_index[1]);
  for (int64_t k = 0; 2 * k < channels; ++k) {
    const uint32_t* pair_units = units + k * units_pitch + 16;
    uint32_t* even_rows = pair_rows + 2 * k * plane_pitch;
    for (int64_t t0 = 0; t0 < plan.pair_pitch; t0 += 16) {
      const int64_t block = t0 - plan.pair_offset;
      const __m512i low = _mm512_load_si512(pair_units + block), high = _mm512_load_si512(pair_units + block + 16);
      _mm512_store_si512(even_rows + t0, _mm512_permutex2var_epi16(low, even, high));
      if (2 * k + 1 < channels)
        _mm512_store_si512(even_rows + plane_pitch + t0, _mm512_permutex2var_epi16(low, odd, high));
    }
  }
}

// Copies a plane of the input, pad_h rows down and pad_w in, into `padded`
// (plan.x_rows rows of plan.x_pitch, on cache lines), where the zeros around
// it were never written.
TORCH_CONVGRAD_AMX_TARGET inline void amx_pad_plane(const AmxPlan& plan, const uint16_t* x, int64_t x_row,
                                                    uint16_t* padded) {
  const int64_t x_pitch = plan.x_pitch, w_begin = plan.w_begin, w_end = plan.w_end;
  for (int64_t h = 0; h < std::min(plan.H, plan.x_rows - plan.pad_h); ++h)
    for (int64_t w0 = w_begin; w0 < w_end; w0 += 32) {
      const int64_t left = w_end - w0;
      const __mmask32 mask = left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
      _mm512_mask_storeu_epi16(padded + (h + plan.pad_h) * x_pitch + plan.pad_w + w0, mask,
                               _mm512_maskz_loadu_epi16(mask, x + h * x_row + w0));
    }
}

// Output rows o_begin (even) to o_end of a plane.
struct AmxRows {
  int64_t o_begin, o_end;
};

// Adds the products of a plane's output rows `rows` to the sums in C tiles 2
// * set and 2 * set + 1; `padded` is the input plane as amx_pad_plane writes
// it from padded row o_begin on, `pairs` the output gradient's pair rows
// (amx_pair_row's) from row o_begin on. Given the output gradient's rows
// (`dy`: row o_begin, the next dy_row elements apart), it writes them, except
// row OH (after an odd count), which stays zero; given nullptr, they are
// written already. Calls between(p, steps) after step p (a pair of output
// rows and a chunk: two products).
template <typename Dy, typename Between>
TORCH_CONVGRAD_AMX_TARGET inline void amx_plane(const AmxPlan& plan, AmxRows rows, const uint16_t* padded,
                                                uint32_t* pairs, Dy dy, int64_t dy_row, int set, Between&& between) {
  // Locals: the compiler cannot keep plan's fields in registers across the
  // vector stores, which may alias anything.
  const int64_t OH = plan.OH, chunks = plan.chunks, x_pitch = plan.x_pitch, pair_pitch = plan.pair_pitch;
  const int64_t o_begin = rows.o_begin, o_end = rows.o_end;
  // A pair of output rows written kAmxPairsAhead pairs before its products:
  // a tile load right after the stores that wrote its data stalls.
  const auto write_pairs = [&](int64_t o) {
    if constexpr (!std::is_null_pointer_v<Dy>) {
      amx_pair_row(plan, dy + (o - o_begin) * dy_row, pairs + (o - o_begin) * pair_pitch);
      if (o + 1 < OH) amx_pair_row(plan, dy + (o + 1 - o_begin) * dy_row, pairs + (o + 1 - o_begin) * pair_pitch);
    }
  };
  for (int64_t o = o_begin; o < std::min(o_end, o_begin + 2 * kAmxPairsAhead); o += 2) write_pairs(o);
  const int64_t steps = (o_end - o_begin + 1) / 2 * chunks;
  for (int64_t o = o_begin, p = 0; o < o_end; o += 2) {
    if (o + 2 * kAmxPairsAhead < o_end) write_pairs(o + 2 * kAmxPairsAhead);
    for (int64_t chunk = 0; chunk < chunks; ++chunk, ++p) {
      const uint16_t* a = padded + (o - o_begin) * x_pitch + chunk * kAmxChunk;
      const uint32_t* b = pairs + (o - o_begin) * pair_pitch + chunk * kAmxChunk;
      // A step's two products: A (tile a_tile) times B for output row o
      // (tile 6) into C tile c0, and for row o + 1 (tile 7) into c1. Tile
      // numbers are literal tokens (GCC's intrinsics paste them into the
      // assembly), hence a macro; alternate steps load A into tiles 4 and 5.
#define TORCH_CONVGRAD_AMX_STEP(c0, c1, a_tile) \
  _tile_loadd(a_tile, a, 2 * x_pitch);          \
  _tile_loadd(6, b, 8);                         \
  _tile_loadd(7, b + pair_pitch, 8);            \
  _tile_dpbf16ps(c0, a_tile, 6);                \
  _tile_dpbf16ps(c1, a_tile, 7)
      switch (set * 2 + (p & 1)) {
        case 0: TORCH_CONVGRAD_AMX_STEP(0, 1, 4); break;
        case 1: TORCH_CONVGRAD_AMX_STEP(0, 1, 5); break;
        case 2: TORCH_CONVGRAD_AMX_STEP(2, 3, 4); break;
        default: TORCH_CONVGRAD_AMX_STEP(2, 3, 5);
      }
#undef TORCH_CONVGRAD_AMX_STEP
      between(p, steps);
    }
  }
}

TORCH_CONVGRAD_AMX_TARGET inline void amx_bf16_impl(const Args& args, int64_t sample_begin, int64_t sample_end,
                                                    int64_t channel_begin, int64_t channel_end, float* result) {
  const AmxPlan plan = amx_plan(args);
  AmxBuffers buffers(plan);
  const int64_t channels = channel_end - channel_begin;
  std::vector<float> sums(channels * kAmxSums, 0.0f);
  TileConfig config{};
  config.palette = 1;
  for (int tile = 0; tile < 8; ++tile) {
    // C and A: a row per tap row and one more; B: a row per pair of
    // positions. C and B: a column per tap along the row.
    config.rows[tile] = static_cast<uint8_t>(tile < 6 ? plan.KH + 1 : kAmxChunk / 2);
    config.bytes_per_row[tile] = tile == 4 || tile == 5 ? 64 : kAmxRowTaps * 4;
  }
  _tile_loadconfig(&config);

  const int64_t* xs = args.input_strides;
  const int64_t* dys = args.grad_output_strides;
  const auto* input = static_cast<const uint16_t*>(args.input);
  const auto* grad_output = static_cast<const uint16_t*>(args.grad_output);
  const bool channels_first = xs[4] == 1 && dys[4] == 1;
  // A channel's sums live in one set of two C tiles across its planes; the
  // channels take turns between the two sets. While a channel's last plane
  // runs, the other set's sums (the channel before) are stored and the next
  // channel's loaded: at a switch a tile store waits for the products still
  // summing into it, which cost 15% channels-last (a switch a plane).
  const auto load_sums = [&](int set, const float* tiles) {
    if (set == 0) {
      _tile_loadd(0, tiles, kAmxRowTaps * 4);
      _tile_loadd(1, tiles + kAmxTileSums, kAmxRowTaps * 4);
    } else {
      _tile_loadd(2, tiles, kAmxRowTaps * 4);
      _tile_loadd(3, tiles + kAmxTileSums, kAmxRowTaps * 4);
    }
  };
  const auto store_sums = [&](int set, float* tiles) {
    if (set == 0) {
      _tile_stored(0, tiles, kAmxRowTaps * 4);
      _tile_stored(1, tiles + kAmxTileSums, kAmxRowTaps * 4);
    } else {
      _tile_stored(2, tiles, kAmxRowTaps * 4);
      _tile_stored(3, tiles + kAmxTileSums, kAmxRowTaps * 4);
    }
  };
  // Visits of channels in order (each a run of its planes): `previous` and
  // `next` are the visits' channels around this one, -1 at the ends and for
  // a single channel, whose visits all sum in one set.
  int set = 0, last_set = 0;
  load_sums(set, sums.data());
  // Channels-last data's next band, prefetched between the products of
  // visits whose `prefetching` (a bool_constant) is true.
  PrefetchQueue ahead;
  const auto visit = [&](int64_t previous, int64_t next, AmxRows rows, int64_t planes, const auto& plane_at,
                         auto prefetching) {
    for (int64_t i = 0; i < planes; ++i) {
      const auto [padded, pairs, dy, dy_row] = plane_at(i);
      const bool last = i + 1 == planes;
      amx_plane(plan, rows, padded, pairs, dy, dy_row, set, [&](int64_t p, int64_t steps) {
        if constexpr (decltype(prefetching)::value) ahead.step();
        if (!last || p != std::min<int64_t>(2, steps - 1)) return;
        if (previous >= 0) store_sums(1 - set, sums.data() + previous * kAmxSums);
        if (next >= 0) load_sums(1 - set, sums.data() + next * kAmxSums);
      });
    }
    last_set = set;
    if (previous >= 0 || next >= 0) set = 1 - set;
  };
  const auto x_plane_at = [&](int64_t n, int64_t c, int64_t z) {
    return input + n * xs[0] + (channel_begin + c) * xs[1] + z * xs[2];
  };
  const auto dy_plane_at = [&](int64_t n, int64_t c, int64_t z) {
    return grad_output + n * dys[0] + (channel_begin + c) * dys[1] + z * dys[2];
  };
  if (channels_first) {  // a channel's planes one after another
    const int64_t depth = args.out[0], planes = (sample_end - sample_begin) * depth;
    for (int64_t c = 0; c < channels; ++c)
      visit(c - 1, c + 1 < channels ? c + 1 : -1, AmxRows{0, plan.OH}, planes, [&](int64_t i) {
        const int64_t n = sample_begin + i / depth, z = i % depth;
        amx_pad_plane(plan, x_plane_at(n, c, z), xs[3], buffers.x.data());
        return std::make_tuple(static_cast<const uint16_t*>(buffers.x.data()), buffers.pairs.data(),
                               dy_plane_at(n, c, z), dys[3]);
      }, std::false_type{});
  } else {
    // Channels-last data: planes of the task's channels transposed at once
    // into about 1 MB (L2), the input's straight into its padded layout, then
    // a channel's planes one after another. Planes of a batch of samples
    // (slices) while they fit kAmxPlanesElements; a larger slice a band of
    // output rows at a time, each band's input rows below the next band's
    // first carried over to it. Against whole slices beyond L2 (AMX CPU, 2
    // threads, alternated processes): ConvNeXt's 56x56 7x7 layer 1.05-1.1x as
    // fast, 7x7 and 5x5 kernels on 112x112 maps 1.3-1.45x and 1.05-1.15x (the
    // products read planes that stay in L2); a 28x28 layer whose slice fits
    // ran 0.87x in bands. The transposes take a row's pixels a block of
    // 32 channels at a time, all blocks in turn, so that each pixel's
    // channels are read from memory once, together (a block of a pixel is a
    // cache line; one block per pass over the data read lines the
    // prefetchers had fetched for nothing).
    //
    // The output gradient's rows go straight into their pair rows
    // (transpose_pair_rows) where amx_makes_pair_rows, else into planes whose
    // pair rows amx_plane writes between the products.
    const int64_t depth = args.out[0];
    const bool made_pairs = amx_makes_pair_rows(plan.chunks, plan.OW);
    // A grad_output row's elements in the planes (a pair row's two a position).
    const int64_t dy_row_elements = made_pairs ? 2 * plan.pair_pitch : plan.OW;
    const int64_t slice_elements =
        channels * (plan.x_rows * plan.x_pitch + (made_pairs ? plan.pair_rows : plan.OH) * dy_row_elements);
    const int64_t batch = std::max<int64_t>(1, kAmxPlanesElements / slice_elements);
    // A band's planes: the input's rows of its output rows (even) and KH more.
    const auto band_elements = [&](int64_t rows) {
      return channels * ((rows + plan.KH) * plan.x_pitch + rows * dy_row_elements);
    };
    int64_t band = round_up(plan.OH, 2);
    if (slice_elements > kAmxPlanesElements) {
      band = std::min(band, kAmxBandRows);
      while (band > 2 && band_elements(band) > kAmxPlanesElements) band -= 2;
    }
    const int64_t band_x = (band + plan.KH) * plan.x_pitch, band_dy = band * plan.OW,
                  band_pairs = band * plan.pair_pitch, planes = batch * depth * channels;
    LineAlignedBuffer<uint16_t> x_planes(planes * band_x);
    LineAlignedBuffer<uint16_t> dy_planes(made_pairs ? 0 : planes * band_dy);
    LineAlignedBuffer<uint32_t> dy_pairs(made_pairs ? planes * band_pairs : 0);
    LineAlignedBuffer<uint32_t> units(made_pairs ? 16 * amx_units_pitch(plan) : 0);
    const int64_t carried = plan.KH - 1;
    // The padded input rows that the band from output row o0 transposes:
    // from its first, less those carried over from the band before, to the
    // last its products read.
    const auto band_rows = [&](int64_t o0) {
      const int64_t o1 = std::min(plan.OH, o0 + band);
      return std::make_pair(o0 > 0 ? o0 + carried : o0, o0 + round_up(o1 - o0, 2) + plan.KH - 1);
    };
    // A band's steps (products of its planes, all slices).
    const auto band_steps = [&](int64_t o0, int64_t slices) {
      return channels * slices * ((std::min(plan.OH - o0, band) + 1) / 2) * plan.chunks;
    };
    // Queues the data of the band of samples n0 .. n1 - 1 from output row o0
    // for prefetch into L2 during `steps` of the products before it: the
    // transposition waits on memory, the products read none. With the pair
    // rows made in the transposition, it ran ConvNeXt's 7x7 channels-last
    // layer 1.04x as fast, 7x7 on 96x96 and 112x112 maps 1.06x and 1.09x, a
    // 5x5 layer on 28x28 maps 0.97x; both together, against the transposition
    // before them: that layer 1.13x, the others 0.99-1.05x, 7x7 on 14x14 and
    // 7x7 maps (planes) 1.0x and 1.04x (AMX CPU, 2 threads, processes
    // alternated). Only the first slices' rows where the queue's ranges run
    // out (two a slice: batches of 3 samples or more, 3-D data). A task of
    // some of the channels (samples fewer than threads) prefetches all of each
    // pixel's.
    const auto prefetch_band = [&](int64_t n0, int64_t n1, int64_t o0, int64_t steps) {
      ahead.clear();
      const auto [first_row, rows_end] = band_rows(o0);
      const int64_t h0 = std::max<int64_t>(0, first_row - plan.pad_h), h1 = std::min(plan.H, rows_end - plan.pad_h);
      const int64_t o1 = std::min(plan.OH, o0 + band);
      const auto bytes = [&](int64_t pixels, int64_t pixel_stride) {
        return ((pixels - 1) * pixel_stride + channels) * 2;
      };
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t z = 0; z < depth; ++z) {
          if (h1 > h0)
            ahead.add(x_plane_at(n, 0, z) + h0 * xs[3] + plan.w_begin * xs[4],
                      bytes(plan.w_end - plan.w_begin, xs[4]), h1 - h0, xs[3] * 2);
          ahead.add(dy_plane_at(n, 0, z) + o0 * dys[3], bytes(plan.OW, dys[4]), o1 - o0, dys[3] * 2);
        }
      ahead.spread_over(steps);
    };
    for (int64_t n0 = sample_begin; n0 < sample_end; n0 += batch) {
      const int64_t n1 = std::min(sample_end, n0 + batch), slices = (n1 - n0) * depth;
      for (int64_t o0 = 0; o0 < plan.OH; o0 += band) {
        const int64_t o1 = std::min(plan.OH, o0 + band);
        // x_planes[slice][channel]: padded input rows o0 .. rows_end - 1.
        const auto [first_row, rows_end] = band_rows(o0);
        const auto x_row = [&](int64_t slice, int64_t c, int64_t row) {
          return x_planes.data() + (slice * channels + c) * band_x + (row - o0) * plan.x_pitch;
        };
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t z = 0; z < depth; ++z) {
            const int64_t slice = (n - n0) * depth + z;
            if (o0 > 0)
              for (int64_t c = 0; c < channels; ++c)
                std::memmove(x_row(slice, c, o0), x_row(slice, c, o0 + band), carried * plan.x_pitch * 2);
            for (int64_t row = first_row; row < rows_end; ++row) {
              const int64_t h = row - plan.pad_h;
              if (h < 0 || h >= plan.H) {
                // Padding: zero from the start, unless an earlier band left rows there.
                if (band < plan.OH)
                  for (int64_t c = 0; c < channels; ++c) std::fill_n(x_row(slice, c, row), plan.x_pitch, 0);
                continue;
              }
              for (int64_t c0 = 0; c0 < channels; c0 += 32)
                transpose_channels(x_plane_at(n, c0, z) + h * xs[3] + plan.w_begin * xs[4], xs[4],
                                   plan.w_end - plan.w_begin, std::min<int64_t>(32, channels - c0),
                                   x_row(slice, c0, row) + plan.pad_w + plan.w_begin, band_x);
            }
            if (!made_pairs) {
              for (int64_t oh = o0; oh < o1; ++oh)
                for (int64_t c0 = 0; c0 < channels; c0 += 32)
                  transpose_channels(dy_plane_at(n, c0, z) + oh * dys[3], dys[4], plan.OW,
                                     std::min<int64_t>(32, channels - c0),
                                     dy_planes.data() + (slice * channels + c0) * band_dy + (oh - o0) * plan.OW,
                                     band_dy);
              continue;
            }
            uint32_t* slice_pairs = dy_pairs.data() + slice * channels * band_pairs;
            for (int64_t oh = o0; oh < o1; ++oh)
              for (int64_t c0 = 0; c0 < channels; c0 += 32)
                transpose_pair_rows(plan, dy_plane_at(n, c0, z) + oh * dys[3], dys[4],
                                    std::min<int64_t>(32, channels - c0), units.data(),
                                    slice_pairs + c0 * band_pairs + (oh - o0) * plan.pair_pitch, band_pairs);
            // After an odd count of rows, the pair's second row zero.
            if ((o1 - o0) % 2 == 1)
              for (int64_t c = 0; c < channels; ++c)
                std::fill_n(slice_pairs + c * band_pairs + (o1 - o0) * plan.pair_pitch, plan.pair_pitch, 0);
          }
        if (o1 < plan.OH)
          prefetch_band(n0, n1, o1, band_steps(o0, slices));
        else if (n1 < sample_end)
          prefetch_band(n1, std::min(sample_end, n1 + batch), 0, band_steps(o0, slices));
        for (int64_t c = 0; c < channels; ++c) {
          // A single channel keeps its sums in one set across its visits.
          const bool first = n0 == sample_begin && o0 == 0 && c == 0;
          const bool last = n1 == sample_end && o1 == plan.OH && c + 1 == channels;
          const auto visit_channel = [&](const auto& plane_at) {
            visit(first || channels == 1 ? -1 : (c + channels - 1) % channels,
                  last || channels == 1 ? -1 : (c + 1) % channels, AmxRows{o0, o1}, slices, plane_at,
                  std::true_type{});
          };
          const auto x_plane = [&](int64_t slice) {
            return static_cast<const uint16_t*>(x_planes.data() + (slice * channels + c) * band_x);
          };
          if (made_pairs) {
            visit_channel([&](int64_t slice) {
              return std::make_tuple(x_plane(slice), dy_pairs.data() + (slice * channels + c) * band_pairs, nullptr,
                                     int64_t{0});
            });
          } else {
            // Pair rows written to buffers.pairs's rows from o0 on (so that
            // row OH there stays zero).
            visit_channel([&](int64_t slice) {
              return std::make_tuple(x_plane(slice), buffers.pairs.data() + o0 * plan.pair_pitch,
                                     static_cast<const uint16_t*>(dy_planes.data() + (slice * channels + c) * band_dy),
                                     plan.OW);
            });
          }
        }
      }
    }
  }
  // The last channel's sums.
  store_sums(last_set, sums.data() + (channels - 1) * kAmxSums);
  _tile_release();
  bool finite = true;
  for (int64_t c = 0; c < channels; ++c) {
    const float* tiles = sums.data() + c * kAmxSums;
    for (int64_t kh = 0; kh < plan.KH; ++kh)
      for (int64_t kw = 0; kw < plan.KW; ++kw) {
        // C_0 row kh, C_1 row kh + 1.
        const float sum = tiles[kh * kAmxRowTaps + plan.KW - 1 - kw] +
                          tiles[kAmxTileSums + (kh + 1) * kAmxRowTaps + plan.KW - 1 - kw];
        result[(c * plan.KH + kh) * plan.KW + kw] = sum;
        finite &= std::isfinite(sum);
      }
  }
  if (!finite) args.non_finite->store(true);
}

void amx_bf16(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin, int64_t channel_end,
              void* result) {
  amx_bf16_impl(args, sample_begin, sample_end, channel_begin, channel_end, static_cast<float*>(result));
}
#endif  // CPU_CAPABILITY_AVX512 && TORCH_CONVGRAD_DEPTHWISE_AMX

}  // namespace torch_convgrad::depthwise_kernel::CPU_CAPABILITY

#endif  // CPU_CAPABILITY
