// Splits tap_products into blocks of the output, one thread each, and runs the
// kernel (tap_gemm_kernel.h) compiled for this CPU's capability on them.
#include "tap_gemm.h"

#include "algorithm.h"

#include "tap_gemm_kernel.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace torch_convgrad {
namespace {

namespace kernel = tap_gemm_kernel;

// A block spans at most this many tiles of m and of o, keeping its chunk of
// A and its slabs of B in L2.
constexpr int64_t kMaxBlockTilesM = 32;
constexpr int64_t kMaxBlockTilesO = 16;

// Rows per pass over a block: a slab of B, a tile's width of its columns,
// stays in L1.
constexpr int64_t kSlabBytes = 16384;

// The kernel build for this CPU and its tile.
struct Build {
  int64_t tile_m, tile_o;
  void (*block)(const kernel::Args&, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
  int64_t chunk_rows() const { return kSlabBytes / (tile_o * static_cast<int64_t>(sizeof(float))); }
};
const Build& build_for_this_cpu() {
  static const Build avx512{kernel::AVX512::kTileM, kernel::AVX512::kTileO, kernel::AVX512::block};
  static const Build avx2{kernel::AVX2::kTileM, kernel::AVX2::kTileO, kernel::AVX2::block};
  return cpu_is_avx512() ? avx512 : avx2;
}

// A's rows are copied per chunk when lda is a multiple of this many floats
// (2 KiB): a chunk of its rows then falls into few cache sets and does not
// stay even in L2 (C = 1024: 60 -> 77 GFLOP/s on one Zen 3 core), while for
// other strides the copy costs more than it saves.
constexpr int64_t kAliasingLda = 512;

// Output blocks: m_parts x o_parts ranges of whole tiles.
struct Split {
  int64_t m_parts, o_parts;
};

// The split with the shortest estimated run on `threads` threads, given that
// at::parallel_for hands each thread a contiguous run of ceil(blocks /
// threads) blocks. A block costs its tiles (tile_m cycles a row each: two
// FMAs a cycle) plus reading its rows of A and B once from L3 (about 16 bytes
// a cycle).
Split choose_split(const Build& build, int64_t tiles_m, int64_t tiles_o, int64_t threads) {
  const int64_t least_m_parts = ceil_div(tiles_m, kMaxBlockTilesM);
  const int64_t least_o_parts = ceil_div(tiles_o, kMaxBlockTilesO);
  Split best{least_m_parts, least_o_parts};
  double best_cost = 1e300;
  for (int64_t m_parts = least_m_parts; m_parts <= std::min(tiles_m, least_m_parts + threads); ++m_parts)
    for (int64_t o_parts = least_o_parts; o_parts <= std::min(tiles_o, least_o_parts + threads); ++o_parts) {
      const double block_m = static_cast<double>(ceil_div(tiles_m, m_parts));
      const double block_o = static_cast<double>(ceil_div(tiles_o, o_parts));
      const double block_cost =
          build.tile_m * block_m * block_o + (block_m * build.tile_m + block_o * build.tile_o) / 4;
      const double cost = static_cast<double>(ceil_div(m_parts * o_parts, threads)) * block_cost;
      if (cost < best_cost) {
        best_cost = cost;
        best = {m_parts, o_parts};
      }
    }
  return best;
}

}  // namespace

void tap_products(TapElement element, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t rows,
                  const int64_t* offsets, int64_t taps, int64_t channels_a, int64_t channels_b, float* out,
                  bool accumulate, int64_t a_channel_stride, int64_t a_positions, int64_t b_channel_stride,
                  const WindowLines& lines) {
  const int64_t m = taps * channels_a;
  if (m == 0 || channels_b == 0) return;
  if (rows == 0) {
    if (!accumulate) std::fill(out, out + m * channels_b, 0.0f);
    return;
  }
  const int64_t from_row_0 = 0;  // without lines, every row as one
  const bool lined = lines.count > 0;
  const kernel::Args args{element, a, lda, b, ldb, offsets, taps, channels_a, channels_b, out, accumulate,
                          a_channel_stride, a_positions, b_channel_stride,
                          lined ? lines.starts : &from_row_0, lined ? lines.count : 1,
                          lined ? lines.length : rows, lined && lines.b_compact};
  TORCH_INTERNAL_ASSERT(cpu_runs_avx2_kernels(), "tap_products runs on AVX2 CPUs only");
  TORCH_INTERNAL_ASSERT(b_channel_stride == 1 || (ldb == 1 && cpu_is_avx512()),
                        "channels-first B: unit rows, on the AVX-512 build");
  const Build& build = build_for_this_cpu();
  const int64_t tiles_m = ceil_div(m, build.tile_m), tiles_o = ceil_div(channels_b, build.tile_o);
  const bool pack_a = lda % kAliasingLda == 0;
  const Split split = choose_split(build, tiles_m, tiles_o, at::get_num_threads());
  // at::parallel_for is inline: it runs in parallel only where this file is
  // compiled with -fopenmp. Fixed shares of blocks: taken one at a time
  // (tasks.h) with another process busy on one of the two cores, ResNet-50's
  // 1x1 2048 -> 512 layer on 7x7 maps ran 1.40-1.48x as fast but its 512 ->
  // 2048 twin 0.69-0.85x (Zen 3, f32 channels-last, interleaved, two runs).
  at::parallel_for(0, split.m_parts * split.o_parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t m_part = index / split.o_parts, o_part = index % split.o_parts;
      const auto range = [](int64_t part, int64_t parts, int64_t tiles, int64_t tile, int64_t size) {
        return std::pair{std::min(size, part * tiles / parts * tile), std::min(size, (part + 1) * tiles / parts * tile)};
      };
      const auto [m_begin, m_end] = range(m_part, split.m_parts, tiles_m, build.tile_m, m);
      const auto [o_begin, o_end] = range(o_part, split.o_parts, tiles_o, build.tile_o, channels_b);
      if (m_begin < m_end && o_begin < o_end)
        build.block(args, m_begin, m_end, o_begin, o_end, build.chunk_rows(), pack_a);
    }
  });
}

void transpose_to_rows(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows,
                       int64_t element_size) {
  const auto transpose = cpu_is_avx512()           ? kernel::AVX512::transpose
                         : cpu_runs_avx2_kernels() ? kernel::AVX2::transpose
                                                   : kernel::DEFAULT::transpose;
  transpose(src, src_ld, dst, dst_ld, columns, rows, element_size);
}

void gather_every(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count,
                  int64_t rows, int64_t element_size) {
  const auto gather = cpu_is_avx512()           ? kernel::AVX512::gather
                      : cpu_runs_avx2_kernels() ? kernel::AVX2::gather
                                                : kernel::DEFAULT::gather;
  gather(src, src_ld, step, dst, dst_ld, count, rows, element_size);
}

void interleave_row_pairs(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs) {
  const auto interleave = cpu_is_avx512() ? kernel::AVX512::interleave : kernel::DEFAULT::interleave;
  interleave(rows, dst, columns, pairs);
}

bool split_half(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low) {
  const auto split = cpu_is_avx512() ? kernel::AVX512::split : kernel::DEFAULT::split;
  return split(half, count, high, low);
}

}  // namespace torch_convgrad
