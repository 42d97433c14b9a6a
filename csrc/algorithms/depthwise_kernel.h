// The depthwise (groups == channels) weight-gradient kernel:
//
//   dW[c, k] = sum_n sum_j input[n, c, j*s - pb + k*d] * grad_output[n, c, j]
//
// over three spatial axes. The first part of this header is the plain
// interface that depthwise.cpp calls; the second, compiled only by the
// per-capability translation units (depthwise_kernel_avx2.cpp,
// depthwise_kernel_default.cpp, which define CPU_CAPABILITY), is the kernel.
#pragma once

#include <cstdint>

namespace torch_convgrad::depthwise_kernel {

enum class Dtype { Float, Double, Half, BFloat16 };

// Sizes in elements; the data tensors are (N, C, X0, X1, X2) and (N, C, Y0, Y1, Y2).
struct Args {
  Dtype dtype;
  const void* input;
  const void* grad_output;
  int64_t input_strides[5];
  int64_t grad_output_strides[5];
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], pad_begin[3];
  // channels_last: read whole blocks of channels where the rows lie rather
  // than through staged copies (see channels_last_in_place).
  bool rows_in_place;
};

// Both write the gradient of channels [channel_begin, channel_end) summed over
// samples [sample_begin, sample_end) to `result`, laid out
// [channel - channel_begin][tap], as float (double for Dtype::Double).
//
// channels_last vectorises over channels and needs channel stride 1 in both
// tensors (NXC). channels_first vectorises along the last spatial axis; it
// takes any strides and is fast when that axis has stride 1 (NCX).
#define TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS                                                      \
  void channels_last(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,  \
                     int64_t channel_end, void* result);                                                \
  void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin, \
                      int64_t channel_end, void* result);

namespace AVX2 {
TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS
}
namespace DEFAULT {
TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS
}
#undef TORCH_CONVGRAD_DEPTHWISE_DECLARE_KERNELS

}  // namespace torch_convgrad::depthwise_kernel

#ifdef CPU_CAPABILITY

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace torch_convgrad::depthwise_kernel::CPU_CAPABILITY {

// f16/bf16 accumulate in float32, f64 in float64.
template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
using AccVec = at::vec::Vectorized<acc_type<T>>;

// A tile sums up to kMaxTaps kernel taps at once, in two vectors each: 8
// independent FMA chains cover the FMA latency within the 16 AVX2 registers.
constexpr int kMaxTaps = 4;

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

// `count` taps split into tiles of at most kMaxTaps, as evenly as possible
// (9 = 3 + 3 + 3, not 4 + 4 + 1).
struct TapRange {
  int64_t first, count;
};
inline std::vector<TapRange> tap_tiles(int64_t count) {
  const int64_t tiles = (count + kMaxTaps - 1) / kMaxTaps;
  std::vector<TapRange> ranges;
  for (int64_t tile = 0, first = 0; tile < tiles; ++tile) {
    const int64_t size = count / tiles + (tile < count % tiles ? 1 : 0);
    ranges.push_back({first, size});
    first += size;
  }
  return ranges;
}

// Calls kernel.template operator()<kTaps>() with kTaps = taps (1..kMaxTaps).
template <typename Kernel>
void with_tap_count(int64_t taps, Kernel&& kernel) {
  switch (taps) {
    case 1: return kernel.template operator()<1>();
    case 2: return kernel.template operator()<2>();
    case 3: return kernel.template operator()<3>();
    default: return kernel.template operator()<4>();
  }
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
  for (; w < size; ++w) {
    const int64_t u = w + pad;
    phases[(u % stride) * phase_pitch + u / stride] = static_cast<A>(source[w * element_stride]);
  }
}

// Prefetches (into L2) part `part` of `parts` of the bytes [begin, begin + bytes):
// the kernels stage data in bursts and fetch the next burst's data piecewise
// while computing on the current one, so that memory reads overlap the FMAs.
inline void prefetch_part(const void* begin, int64_t bytes, int64_t part, int64_t parts) {
  constexpr int64_t kLine = 64;
  const char* data = static_cast<const char*>(begin);
  for (int64_t offset = bytes * part / parts / kLine * kLine; offset < bytes * (part + 1) / parts; offset += kLine)
    __builtin_prefetch(data + offset, 0, 1);
}

// ---------------------------------------------------------------------------
// channels_last: lanes are channels. Rows are staged in blocks of two vectors
// of channels (one 64-byte line), staged[block][pixel][lane], with the
// input's padding as zero pixels: a block's rows stay in L1 across all taps
// and no window needs a bounds check. Staging also converts f16/bf16 once per
// input row rather than once per tap.
// ---------------------------------------------------------------------------

// acc[b][lane] += sum_{j < windows} x[j*s + b*d][lane] * dy[j][lane] for the
// taps b < kTaps; `x_step` and `tap_step` are s and d in elements, `dy_step`
// is dy's pixel stride.
template <int kTaps, typename T, typename A = acc_type<T>>
void channels_last_tile(const T* x, int64_t x_step, int64_t tap_step, const T* dy, int64_t dy_step, int64_t windows,
                        A* acc) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t kLanes = Vec::size();
  Vec sums[kTaps][2];
  for (int b = 0; b < kTaps; ++b)
    for (int v = 0; v < 2; ++v) sums[b][v] = Vec::loadu(acc + (2 * b + v) * kLanes);
  for (int64_t j = 0; j < windows; ++j, x += x_step, dy += dy_step) {
    const Vec dy_lanes[2] = {load_lanes(dy), load_lanes(dy + kLanes)};
    for (int b = 0; b < kTaps; ++b)
      for (int v = 0; v < 2; ++v)
        sums[b][v] = at::vec::fmadd(load_lanes(x + b * tap_step + v * kLanes), dy_lanes[v], sums[b][v]);
  }
  for (int b = 0; b < kTaps; ++b)
    for (int v = 0; v < 2; ++v) sums[b][v].store(acc + (2 * b + v) * kLanes);
}

// Stages `pixels` pixels of `channels` channels from `source` into blocks
// `block_pitch` apart, starting at pixel `first_pixel` of each block.
template <typename T, typename A = acc_type<T>>
void stage_channels(const T* source, int64_t pixel_stride, int64_t channels, int64_t pixels, int64_t first_pixel,
                    int64_t block_pitch, A* staged) {
  constexpr int64_t kLanes = AccVec<T>::size();
  constexpr int64_t kBlock = 2 * kLanes;
  for (int64_t w = 0; w < pixels; ++w, source += pixel_stride) {
    A* pixel = staged + (first_pixel + w) * kBlock;
    int64_t c = 0;
    for (; c + kLanes <= channels; c += kLanes) load_lanes(source + c).store(pixel + c / kBlock * block_pitch + c % kBlock);
    for (; c < channels; ++c) pixel[c / kBlock * block_pitch + c % kBlock] = static_cast<A>(source[c]);
  }
}

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

// The rows of sample n that the next output row, (y0, y1 + 1), reads first:
// its grad_output row and the input rows past this row's last, to prefetch
// while this row computes.
template <typename T>
void next_row_reads(const Args& args, const T* input, const T* grad_output, int64_t n, int64_t y0, int64_t y1,
                    std::vector<const T*>& rows) {
  rows.clear();
  if (y1 + 1 >= args.out[1]) return;
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  rows.push_back(grad_output + n * dy_strides[0] + y0 * dy_strides[2] + (y1 + 1) * dy_strides[3]);
  const int64_t last_iy = y1 * args.stride[1] - args.pad_begin[1] + (args.kernel[1] - 1) * args.dilation[1];
  for (int64_t kz = 0; kz < args.kernel[0]; ++kz) {
    const int64_t iz = y0 * args.stride[0] - args.pad_begin[0] + kz * args.dilation[0];
    if (iz < 0 || iz >= args.in[0]) continue;
    for (int64_t iy = std::max<int64_t>(last_iy + 1, 0); iy < std::min(last_iy + 1 + args.stride[1], args.in[1]); ++iy)
      rows.push_back(input + n * x_strides[0] + iz * x_strides[2] + iy * x_strides[3]);
  }
}

// Whole blocks of channels: the tiles read the rows where they lie (a
// block's channels of a pixel are one or half a cache line), converting
// f16/bf16 as they load, instead of through a staged copy. Where the data
// comes from cache, the copy costs as much as the arithmetic; streamed from
// memory, copying each input row once, in order, is the faster way to read
// it (depthwise.cpp chooses). A tile runs over the windows where all its
// taps fall inside the row; each tap then adds the windows at the edges on
// its own.
template <typename T, typename A = acc_type<T>>
void channels_last_in_place(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                            int64_t channel_end, A* result) {
  constexpr int64_t kBlock = 2 * AccVec<T>::size();
  const T* input = static_cast<const T*>(args.input) + channel_begin;
  const T* grad_output = static_cast<const T*>(args.grad_output) + channel_begin;
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const int64_t blocks = (channel_end - channel_begin) / kBlock;
  const int64_t taps = args.kernel[0] * args.kernel[1] * args.kernel[2];
  const int64_t windows = args.out[2], stride = args.stride[2], dilation = args.dilation[2], pad = args.pad_begin[2];
  const int64_t x_pixel = x_strides[4], dy_pixel = dy_strides[4];
  const std::vector<TapRange> tiles = tap_tiles(args.kernel[2]);
  // Per tap along the row: the windows [first, end) that read inside it.
  std::vector<int64_t> first(args.kernel[2]), end(args.kernel[2]);
  for (int64_t kx = 0; kx < args.kernel[2]; ++kx) {
    const int64_t shift = kx * dilation - pad;  // window j reads pixel j * stride + shift
    const int64_t last_pixel = args.in[2] - 1 - shift;
    first[kx] = std::min(windows, shift >= 0 ? 0 : (-shift + stride - 1) / stride);
    end[kx] = std::clamp<int64_t>(last_pixel < 0 ? 0 : last_pixel / stride + 1, first[kx], windows);
  }
  // acc[block][tap][lane]
  std::vector<A> acc(blocks * taps * kBlock, A(0));
  std::vector<RowRead> reads;
  std::vector<const T*> next_rows;
  const int64_t row_bytes = ((std::max(args.in[2], windows) - 1) * std::max(x_pixel, dy_pixel) + blocks * kBlock) *
                            static_cast<int64_t>(sizeof(T));
  for (int64_t n = sample_begin; n < sample_end; ++n)
    for (int64_t y0 = 0; y0 < args.out[0]; ++y0)
      for (int64_t y1 = 0; y1 < args.out[1]; ++y1) {
        const T* dy_row = grad_output + n * dy_strides[0] + y0 * dy_strides[2] + y1 * dy_strides[3];
        next_row_reads(args, input, grad_output, n, y0, y1, next_rows);
        input_rows_of(args, y0, y1, reads);
        for (const RowRead& read : reads) {
          const bool first_row = &read == reads.data();
          const T* x_row = input + n * x_strides[0] + read.iz * x_strides[2] + read.iy * x_strides[3];
          for (int64_t block = 0; block < blocks; ++block) {
            if (first_row)
              for (const T* row : next_rows) prefetch_part(row, row_bytes, block, blocks);
            const T* x_block = x_row + block * kBlock;
            const T* dy_block = dy_row + block * kBlock;
            A* block_acc = acc.data() + (block * taps + read.tap) * kBlock;
            // Window j, tap kx reads pixel j * stride + kx * dilation - pad.
            const auto tile_run = [&]<int kTaps>(int64_t tap, int64_t from, int64_t to) {
              if (from >= to) return;
              channels_last_tile<kTaps>(x_block + (from * stride + tap * dilation - pad) * x_pixel,
                                        stride * x_pixel, dilation * x_pixel, dy_block + from * dy_pixel,
                                        dy_pixel, to - from, block_acc + tap * kBlock);
            };
            for (const TapRange& tile : tiles) {
              int64_t common_first = 0, common_end = windows;
              for (int64_t kx = tile.first; kx < tile.first + tile.count; ++kx) {
                common_first = std::max(common_first, first[kx]);
                common_end = std::min(common_end, end[kx]);
              }
              common_end = std::max(common_end, common_first);
              with_tap_count(tile.count, [&]<int kTaps>() {
                tile_run.template operator()<kTaps>(tile.first, common_first, common_end);
              });
              for (int64_t kx = tile.first; kx < tile.first + tile.count; ++kx) {
                tile_run.template operator()<1>(kx, first[kx], std::min(end[kx], common_first));
                tile_run.template operator()<1>(kx, std::max(first[kx], common_end), end[kx]);
              }
            }
          }
        }
      }
  const int64_t channels = channel_end - channel_begin;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t tap = 0; tap < taps; ++tap)
      result[c * taps + tap] = acc[(c / kBlock * taps + tap) * kBlock + c % kBlock];
}

template <typename T>
void channels_last_impl(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                        int64_t channel_end, acc_type<T>* result) {
  if (args.rows_in_place && (channel_end - channel_begin) % (2 * AccVec<T>::size()) == 0)
    return channels_last_in_place<T>(args, sample_begin, sample_end, channel_begin, channel_end, result);
  using A = acc_type<T>;
  constexpr int64_t kBlock = 2 * AccVec<T>::size();
  const T* input = static_cast<const T*>(args.input) + channel_begin;
  const T* grad_output = static_cast<const T*>(args.grad_output) + channel_begin;
  const int64_t* x_strides = args.input_strides;
  const int64_t* dy_strides = args.grad_output_strides;
  const int64_t channels = channel_end - channel_begin;
  const int64_t blocks = (channels + kBlock - 1) / kBlock;
  const int64_t taps = args.kernel[0] * args.kernel[1] * args.kernel[2];
  const int64_t windows = args.out[2], stride = args.stride[2], dilation = args.dilation[2];
  // A staged input row covers the padded positions the windows reach.
  const int64_t row_pixels = (windows - 1) * stride + (args.kernel[2] - 1) * dilation + 1;
  const int64_t input_pixels = std::clamp<int64_t>(row_pixels - args.pad_begin[2], 0, args.in[2]);
  const int64_t input_block_pitch = row_pixels * kBlock;
  const int64_t dy_block_pitch = windows * kBlock;

  // Staged input rows, cached in a ring: the rows one output row reads are
  // distinct modulo the ring sizes, and consecutive output rows share most.
  // Padding pixels and the lanes past `channels` are zeroed once: every row
  // writes the same positions.
  const int64_t ring[2] = {(args.kernel[0] - 1) * args.dilation[0] + 1, (args.kernel[1] - 1) * args.dilation[1] + 1};
  std::vector<A> staged_input(ring[0] * ring[1] * blocks * input_block_pitch, A(0));
  std::vector<int64_t> staged_row_of_slot(ring[0] * ring[1]);
  std::vector<A> staged_grad_output(blocks * dy_block_pitch, A(0));
  // acc[block][tap][lane]
  std::vector<A> acc(blocks * taps * kBlock, A(0));
  const std::vector<TapRange> tiles = tap_tiles(args.kernel[2]);

  struct InputRow {
    const A* staged;
    int64_t tap;  // the row's first tap: (kz * K1 + ky) * K2
  };
  std::vector<RowRead> reads;
  std::vector<InputRow> rows;
  rows.reserve(args.kernel[0] * args.kernel[1]);
  std::vector<const T*> prefetch_rows;
  const int64_t row_bytes = ((std::max(args.in[2], windows) - 1) * x_strides[4] + channels) * sizeof(T);

  for (int64_t n = sample_begin; n < sample_end; ++n) {
    std::fill(staged_row_of_slot.begin(), staged_row_of_slot.end(), -1);
    for (int64_t y0 = 0; y0 < args.out[0]; ++y0) {
      for (int64_t y1 = 0; y1 < args.out[1]; ++y1) {
        stage_channels(grad_output + n * dy_strides[0] + y0 * dy_strides[2] + y1 * dy_strides[3], dy_strides[4],
                       channels, windows, 0, dy_block_pitch, staged_grad_output.data());
        input_rows_of(args, y0, y1, reads);
        rows.clear();
        for (const RowRead& read : reads) {
          const int64_t slot = (read.iz % ring[0]) * ring[1] + read.iy % ring[1];
          A* staged = staged_input.data() + slot * blocks * input_block_pitch;
          if (staged_row_of_slot[slot] != read.iz * args.in[1] + read.iy) {
            stage_channels(input + n * x_strides[0] + read.iz * x_strides[2] + read.iy * x_strides[3], x_strides[4],
                           channels, input_pixels, args.pad_begin[2], input_block_pitch, staged);
            staged_row_of_slot[slot] = read.iz * args.in[1] + read.iy;
          }
          rows.push_back({staged, read.tap});
        }
        next_row_reads(args, input, grad_output, n, y0, y1, prefetch_rows);
        for (int64_t block = 0; block < blocks; ++block) {
          for (const T* row : prefetch_rows) prefetch_part(row, row_bytes, block, blocks);
          const A* dy = staged_grad_output.data() + block * dy_block_pitch;
          A* block_acc = acc.data() + block * taps * kBlock;
          for (const InputRow& row : rows) {
            for (const TapRange& tile : tiles) {
              with_tap_count(tile.count, [&]<int kTaps>() {
                channels_last_tile<kTaps>(row.staged + block * input_block_pitch + tile.first * dilation * kBlock,
                                          stride * kBlock, dilation * kBlock, dy, kBlock, windows,
                                          block_acc + (row.tap + tile.first) * kBlock);
              });
            }
          }
        }
      }
    }
  }
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t tap = 0; tap < taps; ++tap)
      result[c * taps + tap] = acc[(c / kBlock * taps + tap) * kBlock + c % kBlock];
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

// sums[b] = sum_{t < vectors * lanes} x[offsets[b] + t] * dy[t], b < kTaps;
// `vectors` is even.
template <int kTaps, typename A>
void channels_first_tile(const A* x, const int64_t* offsets, const A* dy, int64_t vectors, A* sums_out) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t kLanes = Vec::size();
  const A* tap_x[kTaps];
  Vec sums[2][kTaps];
  for (int b = 0; b < kTaps; ++b) {
    tap_x[b] = x + offsets[b];
    sums[0][b] = sums[1][b] = Vec(A(0));
  }
  for (int64_t t = 0; t < vectors * kLanes; t += 2 * kLanes) {
    const Vec dy0 = Vec::loadu(dy + t);
    const Vec dy1 = Vec::loadu(dy + t + kLanes);
    for (int b = 0; b < kTaps; ++b) {
      sums[0][b] = at::vec::fmadd(Vec::loadu(tap_x[b] + t), dy0, sums[0][b]);
      sums[1][b] = at::vec::fmadd(Vec::loadu(tap_x[b] + t + kLanes), dy1, sums[1][b]);
    }
  }
  for (int b = 0; b < kTaps; ++b) {
    A lanes[kLanes];
    (sums[0][b] + sums[1][b]).store(lanes);
    A total = 0;
    for (int64_t lane = 0; lane < kLanes; ++lane) total += lanes[lane];
    sums_out[b] = total;
  }
}

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

  // Per phase, an axis holds the windows plus the largest tap shift.
  int64_t length[3];
  for (int axis = 0; axis < 3; ++axis)
    length[axis] = args.out[axis] + (args.kernel[axis] - 1) * args.dilation[axis] / s[axis];
  const int64_t row_pitch = length[2];
  const int64_t slice_pitch = length[1] * length[2];
  const int64_t span = (args.out[0] - 1) * slice_pitch + (args.out[1] - 1) * row_pitch + args.out[2];
  const int64_t vectors = round_up(span, 2 * kLanes) / kLanes;
  // The slack keeps the last taps' final vectors inside the allocation.
  const int64_t phase_pitch = length[0] * slice_pitch + 2 * kLanes;

  // Zeroed once: every plane writes the same positions.
  std::vector<A> staged_input(s[0] * s[1] * s[2] * phase_pitch, A(0));
  std::vector<A> staged_grad_output(vectors * kLanes, A(0));

  std::vector<int64_t> offsets(taps);
  for (int64_t kz = 0, tap = 0; kz < args.kernel[0]; ++kz)
    for (int64_t ky = 0; ky < args.kernel[1]; ++ky)
      for (int64_t kx = 0; kx < args.kernel[2]; ++kx, ++tap) {
        const int64_t shift[3] = {kz * args.dilation[0], ky * args.dilation[1], kx * args.dilation[2]};
        const int64_t phase = ((shift[0] % s[0]) * s[1] + shift[1] % s[1]) * s[2] + shift[2] % s[2];
        offsets[tap] = phase * phase_pitch + shift[0] / s[0] * slice_pitch + shift[1] / s[1] * row_pitch +
                       shift[2] / s[2];
      }
  const std::vector<TapRange> tiles = tap_tiles(taps);
  std::fill(result, result + (channel_end - channel_begin) * taps, A(0));
  const bool dense_planes = x_strides[4] == 1 && x_strides[3] == args.in[2] && x_strides[2] == args.in[1] * args.in[2] &&
                            dy_strides[4] == 1 && dy_strides[3] == args.out[2] &&
                            dy_strides[2] == args.out[1] * args.out[2];
  const int64_t x_plane_bytes = args.in[0] * args.in[1] * args.in[2] * sizeof(T);
  const int64_t dy_plane_bytes = args.out[0] * args.out[1] * args.out[2] * sizeof(T);

  for (int64_t n = sample_begin; n < sample_end; ++n) {
    for (int64_t c = channel_begin; c < channel_end; ++c) {
      const T* x_plane = input + n * x_strides[0] + c * x_strides[1];
      for (int64_t iz = 0; iz < args.in[0]; ++iz) {
        const int64_t uz = iz + args.pad_begin[0];
        if (uz / s[0] >= length[0]) break;
        for (int64_t iy = 0; iy < args.in[1]; ++iy) {
          const int64_t uy = iy + args.pad_begin[1];
          if (uy / s[1] >= length[1]) break;
          const int64_t phase = ((uz % s[0]) * s[1] + uy % s[1]) * s[2];
          stage_phases(x_plane + iz * x_strides[2] + iy * x_strides[3], x_strides[4], args.in[2], s[2],
                       args.pad_begin[2], length[2], phase_pitch,
                       staged_input.data() + phase * phase_pitch + uz / s[0] * slice_pitch + uy / s[1] * row_pitch);
        }
      }
      const T* dy_plane = grad_output + n * dy_strides[0] + c * dy_strides[1];
      for (int64_t y0 = 0; y0 < args.out[0]; ++y0)
        for (int64_t y1 = 0; y1 < args.out[1]; ++y1)
          stage_phases(dy_plane + y0 * dy_strides[2] + y1 * dy_strides[3], dy_strides[4], args.out[2], 1, 0,
                       length[2], 0, staged_grad_output.data() + y0 * slice_pitch + y1 * row_pitch);

      // The next plane of this sample, when planes are dense.
      const T* next_x_plane = c + 1 < channel_end && dense_planes ? x_plane + x_strides[1] : nullptr;
      const T* next_dy_plane = c + 1 < channel_end && dense_planes ? dy_plane + dy_strides[1] : nullptr;
      A* channel_result = result + (c - channel_begin) * taps;
      for (const TapRange& tile : tiles) {
        const int64_t part = &tile - tiles.data();
        if (next_x_plane) {
          prefetch_part(next_x_plane, x_plane_bytes, part, static_cast<int64_t>(tiles.size()));
          prefetch_part(next_dy_plane, dy_plane_bytes, part, static_cast<int64_t>(tiles.size()));
        }
        A sums[kMaxTaps];
        with_tap_count(tile.count, [&]<int kTaps>() {
          channels_first_tile<kTaps>(staged_input.data(), offsets.data() + tile.first, staged_grad_output.data(),
                                     vectors, sums);
        });
        for (int64_t b = 0; b < tile.count; ++b) channel_result[tile.first + b] += sums[b];
      }
    }
  }
}

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

template <typename T>
struct ChannelsLast {
  static constexpr auto run = channels_last_impl<T>;
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

void channels_first(const Args& args, int64_t sample_begin, int64_t sample_end, int64_t channel_begin,
                    int64_t channel_end, void* result) {
  dispatch<ChannelsFirst>(args, sample_begin, sample_end, channel_begin, channel_end, result);
}

}  // namespace torch_convgrad::depthwise_kernel::CPU_CAPABILITY

#endif  // CPU_CAPABILITY
