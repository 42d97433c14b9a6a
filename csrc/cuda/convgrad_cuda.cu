// CUDA kernels: the device-generic algorithm on the tensors' device and the
// current stream (ATen launches there), under a device guard; and the layout
// copy of the aten_channels_last/aten_channels_first algorithms as one tiled
// transposition, where ATen's strided copy moves 0.4-1 TB/s on an H100.
#include "../entry_points.h"
#include "../weight_gradient.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace torch_convgrad {
namespace {

struct CudaBackend {
  static at::Tensor run(const Problem& problem) {
    const c10::cuda::CUDAGuard device_guard(problem.input.device());
    return weight_gradient(problem);
  }
};

// A block transposes kTile x kTile tiles: 32 x 8 threads read a tile's rows
// along the unit-strided columns into shared memory, then write its columns
// as rows of the output, so both sides move whole runs of kTile elements.
constexpr int kTile = 64;
constexpr int kBlockColumns = 32, kBlockRows = 8;

// Elements are moved as unsigned integers of their size: a bit copy.
// output[b][s][r] = input[b * batch_stride + r * row_stride + s], for
// `tiles` = B * row_tiles * column_tiles tiles.
template <typename Bits>
__global__ void __launch_bounds__(kBlockColumns* kBlockRows)
    batched_transpose_kernel(const Bits* __restrict__ input, Bits* __restrict__ output, int64_t rows,
                             int64_t columns, int64_t batch_stride, int64_t row_stride, int64_t row_tiles,
                             int64_t column_tiles, int64_t tiles) {
  // Rows of 4-byte multiples plus one word: a column's reads fall in 32 banks.
  constexpr int kPad = sizeof(Bits) < 4 ? 4 / sizeof(Bits) : 1;
  constexpr int kReads = kTile / kBlockRows, kColumnsPerThread = kTile / kBlockColumns;
  __shared__ Bits tile[kTile][kTile + kPad];
  const int x = threadIdx.x, y = threadIdx.y;
  for (int64_t index = blockIdx.x; index < tiles; index += gridDim.x) {
    const int64_t column0 = index % column_tiles * kTile;
    const int64_t row0 = index / column_tiles % row_tiles * kTile;
    const int64_t batch = index / column_tiles / row_tiles;
    const Bits* source = input + batch * batch_stride;
    // All loads first, so that each thread has them in flight together.
    Bits values[kReads][kColumnsPerThread];
#pragma unroll
    for (int i = 0; i < kReads; ++i)
#pragma unroll
      for (int j = 0; j < kColumnsPerThread; ++j) {
        const int64_t row = row0 + y + i * kBlockRows, column = column0 + x + j * kBlockColumns;
        values[i][j] = row < rows && column < columns ? source[row * row_stride + column] : Bits(0);
      }
#pragma unroll
    for (int i = 0; i < kReads; ++i)
#pragma unroll
      for (int j = 0; j < kColumnsPerThread; ++j) tile[y + i * kBlockRows][x + j * kBlockColumns] = values[i][j];
    __syncthreads();
    Bits* target = output + batch * rows * columns;
#pragma unroll
    for (int i = 0; i < kReads; ++i)
#pragma unroll
      for (int j = 0; j < kColumnsPerThread; ++j) {
        const int64_t column = column0 + y + i * kBlockRows, row = row0 + x + j * kBlockColumns;
        if (column < columns && row < rows) target[column * rows + row] = tile[x + j * kBlockColumns][y + i * kBlockRows];
      }
    __syncthreads();  // before the next tile overwrites this one
  }
}

template <typename Bits>
void launch_batched_transpose(const at::Tensor& matrices, at::Tensor& output) {
  const int64_t batch = matrices.size(0), rows = matrices.size(1), columns = matrices.size(2);
  const int64_t row_tiles = (rows + kTile - 1) / kTile, column_tiles = (columns + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * column_tiles;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, std::numeric_limits<int32_t>::max()));
  batched_transpose_kernel<Bits><<<blocks, dim3(kBlockColumns, kBlockRows), 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const Bits*>(matrices.const_data_ptr()), static_cast<Bits*>(output.mutable_data_ptr()), rows,
      columns, matrices.stride(0), matrices.stride(1), row_tiles, column_tiles, tiles);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor batched_transpose(const at::Tensor& matrices) {
  const c10::cuda::CUDAGuard device_guard(matrices.device());
  at::Tensor output = at::empty_symint(batched_transpose_shape(matrices), matrices.options());
  if (output.numel() == 0) return output;
  // The kernel copies bits, reading rows along unit-strided columns; other
  // layouts, and lazily conjugated or negated views, are ATen's copy.
  if ((matrices.size(2) > 1 && matrices.stride(2) != 1) || matrices.is_conj() || matrices.is_neg())
    return output.copy_(matrices.transpose(1, 2));
  switch (matrices.element_size()) {
    case 1: launch_batched_transpose<uint8_t>(matrices, output); break;
    case 2: launch_batched_transpose<uint16_t>(matrices, output); break;
    case 4: launch_batched_transpose<uint32_t>(matrices, output); break;
    case 8: launch_batched_transpose<uint64_t>(matrices, output); break;
    default: output.copy_(matrices.transpose(1, 2));
  }
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convgrad, CUDA, m) {
  EntryPoints<CudaBackend>::register_all(m);
  m.impl("_batched_transpose", &batched_transpose);
}

}  // namespace torch_convgrad
