// ATen's convolution weight gradient (oneDNN, cuDNN, ...), fed NCX views of
// the caller's data, only the padding that windows reach, and f16/bf16 in
// float32 unless ATen's backend for the problem accumulates in float32 itself.
//
// Three algorithms: "aten" in the caller's layout, "aten_channels_last", which
// first copies both data tensors to channels-last memory, where cuDNN (and
// oneDNN on AVX-512 CPUs) run most weight gradients faster, and
// "aten_channels_first", which copies them to contiguous NCX memory, where
// cuDNN runs float32 depthwise ones with large kernels faster.
#include "algorithm.h"
#include "scratch.h"

#include <ATen/Context.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/Version.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <limits>

namespace torch_convgrad {
namespace {

bool all_zero(c10::ArrayRef<c10::SymInt> values) {
  for (const auto& value : values)
    if (value != 0) return false;
  return true;
}

// `ncx` zero-padded by (begin, end) per spatial axis, in memory ordered by
// `memory_to_ncx` (the caller's layout, or NXC). One copy and zeroed borders,
// where constant_pad_nd would fill the whole buffer first.
at::Tensor zero_padded(const at::Tensor& ncx, c10::IntArrayRef memory_to_ncx, c10::ArrayRef<c10::SymInt> begin,
                       c10::ArrayRef<c10::SymInt> end) {
  auto sizes = ncx.sym_sizes().vec();
  for (size_t axis = 0; axis < begin.size(); ++axis) sizes[2 + axis] += begin[axis] + end[axis];
  std::vector<c10::SymInt> memory_sizes(sizes.size());
  for (size_t dim = 0; dim < sizes.size(); ++dim) memory_sizes[memory_to_ncx[dim]] = sizes[dim];
  const at::Tensor padded = at::empty_symint(memory_sizes, ncx.options()).permute(memory_to_ncx);
  at::Tensor interior = padded;
  for (size_t axis = 0; axis < begin.size(); ++axis) {
    const int64_t dim = 2 + static_cast<int64_t>(axis);
    interior = interior.narrow_symint(dim, begin[axis], ncx.sym_size(dim));
    padded.narrow_symint(dim, 0, begin[axis]).zero_();
    padded.narrow_symint(dim, begin[axis] + ncx.sym_size(dim), end[axis]).zero_();
  }
  interior.copy_(ncx);
  return padded;
}

// Whether some kernel tap on this axis meets only padding in every window.
// ATen's oneDNN bf16 weight gradient leaves such taps' entries uninitialised
// (measured with torch 2.13 on CPU), so problems with one get their padding
// materialised. Kernels too long to scan are treated as having one.
bool has_padding_only_tap(int64_t size, int64_t pad_begin, int64_t windows, int64_t kernel, int64_t stride,
                          int64_t dilation) {
  constexpr int64_t kLongestScanned = 4096;
  if (kernel > kLongestScanned) return true;
  for (int64_t tap = 0; tap < kernel; ++tap) {
    const int64_t first = tap * dilation - pad_begin;  // the tap's input position in window 0
    const int64_t window = first >= 0 ? 0 : (-first + stride - 1) / stride;  // first window inside the input
    if (window >= windows || first + window * stride >= size) return true;
  }
  return false;
}

// Whether an axis of an input `size` long, with `pad` on either side, is one
// oneDNN's CPU weight gradient gets wrong in 3-D problems (materialises_padding):
// its input no longer than the dilated kernel `extent`, or more than half of
// the kernel's reach padded.
bool misread_3d_axis(int64_t size, int64_t pad, int64_t extent) { return size <= extent || 2 * pad > extent - 1; }

// Whether a problem on `input` of `rank` spatial axes gets all its padding
// materialised, ATen given none, where oneDNN's CPU weight gradient gets
// padded problems wrong:
//   - 3-D, every dtype, where some axis is misread (misread_3d_axis; torch
//     2.13, oneDNN 3.12; Sapphire Rapids, 2026-11-28): of 40503 random small
//     padded 3-D problems, float32 and bf16, both layouts, given their
//     padding, 52 returned garbage, infinities or NaN, 8 corrupted the heap
//     (glibc aborted, at once or at a later free) and one did not return; 60
//     of the 61 had an axis no longer than its dilated kernel, the other a
//     kernel of 7 padded by 4 (a 7x2x2 kernel padded (3, 1, 0) with strides
//     (2, 1, 2) on a 7x5x3 input failed every time). None of 20000 without
//     such an axis failed, nor of 8000 with their padding materialised, nor
//     of 20000 1-D and 2-D float32 ones given their padding. Materialised
//     always, the benchmark's 3-D layer (3x3x3, padded by 1) ran 1.2x (NXC)
//     and 1.8x (NCX) as long in bf16: oneDNN ran slower unpadded.
//   - bf16 where some axis's input is no longer than its dilated kernel
//     (`input_within_kernel`): oneDNN's bf16 kernel for AVX-512 CPUs without
//     AMX tiles (jit avx512_core_bf16; torch 2.13, oneDNN 3.12) got 8 of 2965
//     and 10 of 1738 random small padded problems of every rank and layout
//     wrong on an AMD EPYC (Zen 4), with garbage or uninitialised entries,
//     each with such an axis, and 2-D ones on the Sapphire Rapids too (16 of
//     4500, 2026-11-28). Of 6000 random problems whose every axis was longer,
//     none was wrong, nor of 1738 with their padding materialised. On other
//     CPUs oneDNN can fall back to that kernel, and the copy is of the
//     smallest inputs.
bool materialises_padding(const at::Tensor& input, int64_t rank, bool misread_3d, bool input_within_kernel) {
  return input.is_cpu() &&
         ((rank == 3 && misread_3d) || (input_within_kernel && input.scalar_type() == at::kBFloat16));
}

// Whether oneDNN's bf16 weight gradient is trusted with a CPU problem: its
// grouped kernel on channels-last data with a dilated kernel returned garbage
// or NaN (torch 2.13, oneDNN 3.12; Sapphire Rapids, 2026-11-28): a 3x3
// depthwise layer of 16 channels dilated (2, 1) on 28x31 maps every time
// (not on 16x16), 1 of 295 random dilated channels-last depthwise problems,
// none of 288 channels-first ones or of 281 dense or grouped channels-last
// ones. Such problems go to oneDNN as float32 copies, which it got right.
bool onednn_takes_bf16(bool channels_last, int64_t groups, c10::IntArrayRef kernel, c10::IntArrayRef dilation) {
  bool dilated = false;
  for (size_t axis = 0; axis < kernel.size(); ++axis) dilated |= kernel[axis] > 1 && dilation[axis] > 1;
  return !(channels_last && groups > 1 && dilated);
}

// Whether ATen takes the data as channels-last (by its channel stride alone).
bool is_channels_last(const at::Tensor& ncx) { return ncx.dim() < 3 || ncx.stride(1) == 1 || ncx.size(1) == 1; }

// Whether ATen gets a CPU problem's input subsampled by its strides, at
// stride 1: a 1x1 kernel with a stride on channels-last data. oneDNN's weight
// gradient returned wrong entries for such problems now and then, and right
// ones on the next call with the same data (torch 2.13, oneDNN 3.12; Zen 3,
// 2026-12-05): 18 of 465 random small 2-D float32 problems with a stride of 2
// or 3 along some axis, bf16 too, and none of 54 unstrided 1x1 ones or of 902
// with 2x2 or 3x3 kernels, strided or not. Found by `make fuzz`, through the
// channels-first data that `aten_channels_last` copies. On channels-first
// data oneDNN got them right.
bool subsamples_for_onednn(const Problem& problem, const at::Tensor& input) {
  if (!input.is_cpu() || !is_channels_last(input)) return false;
  bool strided = false;
  for (int64_t axis = 0; axis < problem.spatial_rank(); ++axis) {
    if (problem.kernel_size[axis] != 1) return false;
    strided |= problem.stride[axis] > 1;
  }
  return strided;
}

// Whether oneDNN runs bf16 on the CPU's own bf16 products (AVX-512 BF16's
// dot products or AMX tiles). Without them it emulates them: on an Intel
// Xeon without either (Cascade Lake, AVX-512 VNNI; torch 2.13, 2026-11-27)
// its bf16 weight gradient ran at a fifth to a half of its float32 rate on
// the benchmark's layers (3x3 64ch 56x56 NXC: 41.8 ms against 8.6).
bool runs_bf16_natively(const at::Tensor& input) {
  return input.scalar_type() != at::kBFloat16 || cpu_has_avx512_bf16() || cpu_has_amx_bf16();
}

// Whether ATen's backend for this convolution accumulates f16/bf16 in float32
// (cuDNN, oneDNN, MIOpen and the CUDA depthwise kernels do) and is worth
// taking them as they are; its slow paths add each sample's product into the
// low-precision result. oneDNN's f16 weight gradient is not: on a Sapphire
// Rapids (AVX-512 FP16, no AMX-FP16) it ran at 0.1-0.4 GMAC/s, 300 to 1000
// times slower than on float32 copies (torch 2.13, 2026-11-23).
bool accumulates_in_float32(const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef stride,
                            c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, int64_t groups) {
  using at::native::ConvBackend;
  if (input.is_cpu() && (input.scalar_type() == at::kHalf || !runs_bf16_natively(input))) return false;
  if (input.is_cpu() && input.scalar_type() == at::kBFloat16) {
    std::vector<int64_t> dilations;
    for (const c10::SymInt& value : dilation) dilations.push_back(value.expect_int());
    if (!onednn_takes_bf16(is_channels_last(input), groups, weight.sizes().slice(2), dilations)) return false;
  }
  const std::vector<c10::SymInt> no_output_padding(stride.size(), 0);
  switch (at::native::select_conv_backend(input, weight, std::nullopt, stride, padding, dilation,
                                          /*transposed=*/false, no_output_padding, groups, std::nullopt)) {
    case ConvBackend::Cudnn:
    case ConvBackend::Mkldnn:
    case ConvBackend::Miopen:
    case ConvBackend::MiopenDepthwise:
    case ConvBackend::CudaDepthwise2d:
    case ConvBackend::CudaDepthwise3d:
      return true;
    default:
      return false;
  }
}

// The permutation of NXC memory into NCX dims.
std::vector<int64_t> nxc_to_ncx(int64_t dims) {
  std::vector<int64_t> order{0, dims - 1};
  for (int64_t dim = 1; dim < dims - 1; ++dim) order.push_back(dim);
  return order;
}

// The memory layout ATen gets the data in: as the caller gave it, or copied.
enum class DataLayout { Given, ChannelsLast, ChannelsFirst };

// Whether NCX data's memory is dense in `layout`'s order, (N, X..., C) for
// channels-last and (N, C, X...) otherwise, so that LayoutCopy copies nothing.
bool dense_in(const at::Tensor& ncx, DataLayout layout) {
  if (layout != DataLayout::ChannelsLast) return ncx.is_contiguous();
  if (ncx.numel() == 0) return true;
  int64_t expected = 1;  // the stride of the next dim out in NXC memory
  const auto dense_at = [&](int64_t dim) {
    const bool dense = ncx.size(dim) == 1 || ncx.stride(dim) == expected;
    expected *= ncx.size(dim);
    return dense;
  };
  if (!dense_at(1)) return false;
  for (int64_t dim = ncx.dim() - 1; dim >= 2; --dim)
    if (!dense_at(dim)) return false;
  return dense_at(0);
}

// The layout copy as the internal op _batched_transpose (one tiled
// transposition on CUDA), through the dispatcher.
at::Tensor batched_transpose(const at::Tensor& matrices) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torch_convgrad::_batched_transpose", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(matrices);
}

// _batched_transpose's CUDA kernel on an H100, bytes read and written per
// second: 2.7-2.9 TB/s in float32 and 2.2-2.8 in bf16 on the benchmark's
// layers at batch 64 (2.0-4.1 on those of 13-26 MB, partly in L2), against
// 0.5-1.7 for ATen's copy (2026-11-27). Tiles of fewer rows than 32 (e.g. RGB
// images' channels) are taken to slow it in proportion (not measured).
double transposition_bytes_per_second(int64_t element_size, int64_t rows) {
  return (element_size >= 4 ? 2.8e12 : 2.4e12) * std::min<double>(1.0, rows / 32.0);
}

// NCX data copied to channels-last or channels-first memory, as a batch of
// matrix transpositions: of the data's (N, C, X) matrices to channels-last,
// of its NXC memory's (N, X, C) matrices to channels-first.
class LayoutCopy {
 public:
  LayoutCopy(const at::Tensor& ncx, DataLayout layout) : needed_(!dense_in(ncx, layout)) {
    const auto to_ncx = nxc_to_ncx(ncx.dim());
    const at::Tensor nxc = ncx.permute(inverse_permutation(to_ncx));
    const bool channels_last = layout == DataLayout::ChannelsLast;
    const at::Tensor& source = channels_last ? ncx : nxc;
    target_ = channels_last ? nxc : ncx;
    if (channels_last) target_to_ncx_ = to_ncx;
    const auto sizes = source.sizes();
    const auto row_end = sizes.begin() + (channels_last ? 2 : ncx.dim() - 1);
    const std::vector<int64_t> shape{sizes[0], c10::multiply_integers(sizes.begin() + 1, row_end),
                                     c10::multiply_integers(row_end, sizes.end())};
    if (at::detail::computeStride(sizes, source.strides(), shape)) matrices_ = source.view(shape);
  }

  // An NCX view of the data in this layout (the data itself if it is).
  at::Tensor run() const {
    at::Tensor copy = !needed_              ? target_
                      : matrices_.defined() ? batched_transpose(matrices_).view(target_.sizes())
                                            : target_.contiguous();
    return target_to_ncx_.empty() ? copy : copy.permute(target_to_ncx_);
  }

 private:
  bool needed_;  // whether the data is not yet dense in this layout's memory order
  at::Tensor target_;  // the data's dims in the layout's memory order, (N, X..., C) or (N, C, X...)
  std::vector<int64_t> target_to_ncx_;  // empty for the identity
  at::Tensor matrices_;  // (N, R, S) to transpose; undefined where the data's dims do not flatten so
};

// The canonical weight gradient from one ATen call: `input` and `grad_output`
// are NCX views of the problem's data or of a copy, with memory ordered by
// `memory_to_ncx`.
at::Tensor aten_canonical(const Problem& problem, at::Tensor input, at::Tensor grad_output,
                          c10::IntArrayRef memory_to_ncx) {
  // ATen pads both sides alike. Where `pad_begin` on both sides gives the
  // problem's windows, that is its padding, and nothing is copied. Otherwise
  // the part of the pads that is equal on both sides goes to ATen as
  // `padding`, and only an asymmetric excess is materialised.
  //
  // Input that no window reaches is dropped from 1-D problems on CPU: oneDNN
  // reordered a 1-D input with unused trailing elements into a buffer 8 times
  // its size. Elsewhere ATen gets it as given, as from the glue, since a
  // narrowed view costs it a copy: ResNet-50's stride-2 1x1 layer ran at
  // 0.5-0.7x of the glue on an H100, and at 0.45x (NXC) and 0.55x (NCX) on a
  // Sapphire Rapids CPU in float32.
  const bool keep_unreached_input = input.is_cuda() || problem.spatial_rank() > 1;
  auto reach = problem.window_reach();
  auto pad_begins = problem.pad_begin;
  auto stride = symint_vector(problem.stride);
  const int64_t rank = problem.spatial_rank();
  if (subsamples_for_onednn(problem, input)) {
    // A 1x1 kernel's window j reads input position j * s - pad_begin: the
    // windows that read the input, and the positions they read, at stride 1.
    for (int64_t axis = 0; axis < rank; ++axis) {
      const int64_t s = problem.stride[axis], pad = pad_begins[axis].expect_int(), size = input.size(2 + axis);
      const int64_t first = (pad + s - 1) / s;
      const int64_t windows = std::min(grad_output.size(2 + axis), (size - 1 + pad) / s + 1) - first;
      if (windows <= 0) return at::zeros_symint(problem.canonical_shape(), input.options());
      const int64_t from = first * s - pad;
      input = input.slice(2 + axis, from, from + (windows - 1) * s + 1, s);
      grad_output = grad_output.narrow(2 + axis, first, windows);
      reach[axis] = windows;
      pad_begins[axis] = 0;
      stride[axis] = 1;
    }
  }
  std::vector<c10::SymInt> padding(rank), excess_begin(rank), excess_end(rank);
  bool padding_only_tap = false, input_within_kernel = false, misread_3d = false;
  for (int64_t axis = 0; axis < rank; ++axis) {
    const c10::SymInt& pad_begin = pad_begins[axis];
    const c10::SymInt size = input.sym_size(2 + axis);
    const c10::SymInt used = size.min(reach[axis] - pad_begin);  // the input windows read
    // With pad_begin on both sides, ATen makes the problem's windows from
    // reach - 2 * pad_begin input elements, or up to stride - 1 more.
    const c10::SymInt fewest = reach[axis] - pad_begin * 2;
    const c10::SymInt most = fewest + stride[axis] - 1;
    if (size >= fewest && most >= used) {
      const c10::SymInt kept = keep_unreached_input ? size.min(most) : used;
      if (kept != size) input = input.narrow_symint(2 + axis, 0, kept);
      padding[axis] = pad_begin;
      excess_begin[axis] = excess_end[axis] = 0;
    } else {
      if (used != size) input = input.narrow_symint(2 + axis, 0, used);
      const c10::SymInt pad_end = reach[axis] - pad_begin - used;
      padding[axis] = pad_begin.min(pad_end);
      excess_begin[axis] = pad_begin - padding[axis];
      excess_end[axis] = pad_end - padding[axis];
    }
    input_within_kernel |= input.sym_size(2 + axis) <= problem.dilated_kernel_size(axis);
    misread_3d |= misread_3d_axis(input.sym_size(2 + axis).expect_int(), padding[axis].expect_int(),
                                  problem.dilated_kernel_size(axis).expect_int());
    padding_only_tap |= has_padding_only_tap(used.expect_int(), pad_begin.expect_int(),
                                             grad_output.sym_size(2 + axis).expect_int(),
                                             problem.kernel_size[axis].expect_int(), stride[axis].expect_int(),
                                             problem.dilation[axis]);
  }
  if (padding_only_tap || materialises_padding(input, rank, misread_3d, input_within_kernel)) {
    for (int64_t axis = 0; axis < rank; ++axis) {
      excess_begin[axis] += padding[axis];
      excess_end[axis] += padding[axis];
      padding[axis] = 0;
    }
  }
  if (!all_zero(excess_begin) || !all_zero(excess_end))
    input = zero_padded(input, memory_to_ncx, excess_begin, excess_end);

  auto dilation = symint_vector(problem.dilation);
  // A one-tap axis's dilation changes nothing but oneDNN's kernel, whose bf16
  // grouped one it breaks (onednn_takes_bf16, which counts only longer axes).
  for (int64_t axis = 0; axis < rank; ++axis)
    if (problem.kernel_size[axis] == 1) dilation[axis] = 1;
  auto weight_shape = problem.canonical_shape();
  // ATen runs a 1-D convolution as a 2-D one on a contiguous copy of its
  // data; lifting it here as a view keeps channels-last (NXC) data zero-copy.
  const bool lift_to_2d = rank == 1;
  if (lift_to_2d) {
    input = input.unsqueeze(2);
    grad_output = grad_output.unsqueeze(2);
    stride.insert(stride.begin(), 1);
    dilation.insert(dilation.begin(), 1);
    padding.insert(padding.begin(), 0);
    weight_shape.insert(weight_shape.begin() + 2, 1);
  }

  // Only the weight's shape and dtype are read when just its gradient is asked for.
  at::Tensor weight = at::empty_symint(weight_shape, input.options());
  if (at::isReducedFloatingType(input.scalar_type()) &&
      !accumulates_in_float32(input, weight, stride, padding, dilation, problem.groups)) {
    input = float32_copy(input, ScratchSlot::PackedInput);
    grad_output = float32_copy(grad_output, ScratchSlot::PackedGradOutput);
    weight = weight.to(at::kFloat);
  }
  at::Tensor canonical = std::get<1>(at::convolution_backward_symint(
      grad_output, input, weight, std::nullopt, stride, padding, dilation, /*transposed=*/false,
      std::vector<c10::SymInt>(stride.size(), 0), problem.groups, {false, true, false}));
  return lift_to_2d ? canonical.squeeze(2) : canonical;
}

// ATen's CUDA convolutions index a sample's data with 32 bits: they keep such
// problems from cuDNN, and their fallbacks can fault past that
// (pytorch/pytorch#117736). A problem whose sample is larger is computed in
// two pieces of its windows along its longest output axis, recursively, and
// the pieces' gradients summed in float32. Each piece reads the input its
// windows reach, with the padding before it that they meet.
at::Tensor canonical_in_pieces(const Problem& problem, const at::Tensor& input, const at::Tensor& grad_output,
                               c10::IntArrayRef memory_to_ncx) {
  constexpr int64_t kLargestSample = std::numeric_limits<int32_t>::max();
  const int64_t batch = input.size(0);
  const bool too_large = batch > 0 && std::max(input.numel(), grad_output.numel()) / batch > kLargestSample;
  int64_t axis = 0;
  for (int64_t other = 1; other < problem.spatial_rank(); ++other)
    if (grad_output.size(2 + other) > grad_output.size(2 + axis)) axis = other;
  const int64_t windows = grad_output.size(2 + axis);
  if (!too_large || windows < 2) return aten_canonical(problem, input, grad_output, memory_to_ncx);

  const int64_t stride = problem.stride[axis];
  const int64_t pad_begin = problem.pad_begin[axis].expect_int();
  const int64_t window_extent = problem.dilated_kernel_size(axis).expect_int();
  at::Tensor sum;
  for (const int64_t first : {int64_t{0}, windows / 2}) {
    const int64_t count = first == 0 ? windows / 2 : windows - windows / 2;
    const int64_t start = first * stride - pad_begin;  // the piece's first input position
    const int64_t begin = std::max<int64_t>(start, 0);
    const int64_t end = std::min(input.size(2 + axis), start + (count - 1) * stride + window_extent);
    if (end <= begin) continue;  // windows on padding alone add nothing
    Problem piece = problem;
    piece.input = input.narrow(2 + axis, begin, end - begin);
    piece.grad_output = grad_output.narrow(2 + axis, first, count);
    piece.pad_begin[axis] = begin - start;
    const at::Tensor part =
        canonical_in_pieces(piece, piece.input, piece.grad_output, memory_to_ncx).to(at::kFloat);
    sum = sum.defined() ? sum.add_(part) : part;
  }
  return sum.defined() ? sum : at::zeros_symint(problem.canonical_shape(), input.options().dtype(at::kFloat));
}

at::Tensor run_aten(const Problem& problem, const at::Tensor& input, const at::Tensor& grad_output,
                    c10::IntArrayRef memory_to_ncx) {
  return problem.finish(canonical_in_pieces(problem, input, grad_output, memory_to_ncx));
}

bool supports_everything(const Problem&) { return true; }

bool not_yet_channels_last(const Problem& problem) {
  return !dense_in(problem.input, DataLayout::ChannelsLast) ||
         !dense_in(problem.grad_output, DataLayout::ChannelsLast);
}

// Groups of a few channels: oneDNN ran 3x3 layers (N=8, 14x14 to 56x56,
// 128-512 channels) at 3.5 (2 a group), 5-10 (4) and 20-52 GMAC/s (8) on NXC
// data, and at 1.6, 2.2-2.4 and 14-36 on NCX (Zen 3, 2026-11-23); no bound
// from 16 channels a group up.
double few_channel_groups_macs_per_second(const Geometry& g, bool nxc) {
  const double group_channels = static_cast<double>(std::max(g.in_channels, g.out_channels) / g.groups);
  if (g.groups == 1 || group_channels > 8) return std::numeric_limits<double>::infinity();
  return group_channels * group_channels * (nxc ? 0.5e9 : 0.4e9);
}

// 1x1 on NXC data slows down with many channel pairs on AVX2 CPUs: 25-46
// GMAC/s from 256 x 1024 pairs per group up (ResNet-50's 14x14 and 7x7
// bottlenecks, 2 threads), where the gemm algorithm runs at 42-72; at 512 x
// 128 and below both run at 35-56 (measured 2026-11-23, same machine).
constexpr int64_t kManyPairs = 256 * 1024;

// Seconds of oneDNN's float32 weight gradient on an AVX2 CPU. Measured with
// torch 2.13 on an AMD EPYC (Zen 3, 2 threads) over ResNet, U-Net, DCGAN,
// audio and video layers: about 25 GMAC/s on NXC data and 40 on NCX, 1.5
// times that with 256 channels a side, 15% less in 3-D; 1x1 at 60 (NXC) and
// 34 (NCX), 25 with strides; depthwise at about 3 GB/s. With fewer channels
// and strides that divide the kernel, NCX ran at 24-33 GMAC/s (2026-12-01:
// the 1-D layer 8.0-11.0 ms, U-Net's transposed 2x2 6.6-7.1, where gemm took
// 5.1-7.2 and 5.7-6.2; two runs of every algorithm forced). bf16 and f16 run on
// float32 copies (their conversion is counted by the caller), about 15%
// slower, half speed in 3-D NCX. Depthwise layers (2026-12-05, f32, N=8,
// 96-768 channels on 56x56 to 7x7 maps): 3x3 kernels read their data at
// 6.7-21 GB/s on NXC data and 1.9-12 on NCX (MobileNetV2's 56x56 layer, N=16,
// at 8.4 and 8.5; the fastest on maps that stay in the caches); kernels of
// more than 9 taps are bound by their products, 3.8-7.0 GMAC/s on NXC data
// (stride 2: 2.5-5.6) and 0.9-2.1 on NCX, where the depthwise kernel ran
// 9-50.
double avx2_cpu_seconds(const Problem& problem, const Geometry& g, bool nxc) {
  const bool reduced = at::isReducedFloatingType(problem.input.scalar_type());
  if (g.in_channels == g.groups && g.out_channels == g.groups) {
    const double read_seconds = g.data_bytes(problem.input.element_size()) / (nxc ? 12e9 : 8e9);
    return g.taps() > 9 ? std::max(read_seconds, g.macs() / (nxc ? 5e9 : 1.5e9)) : read_seconds;
  }
  const bool strided = g.strided();
  double macs_per_second = nxc ? 25e9 : 40e9;
  if (g.taps() == 1)
    macs_per_second = strided ? 25e9 : (nxc ? (g.in_channels * g.out_channels / (g.groups * g.groups) >= kManyPairs
                                                  ? 40e9
                                                  : 60e9)
                                            : 34e9);
  else if (std::max(g.in_channels, g.out_channels) / g.groups >= 256)
    macs_per_second *= 1.5;
  else if (!nxc && strided && strides_divide_kernel(g))
    macs_per_second *= 0.75;
  macs_per_second = std::min(macs_per_second, few_channel_groups_macs_per_second(g, nxc));
  if (problem.spatial_rank() == 3) macs_per_second *= reduced && !nxc ? 0.5 : 0.85;
  if (reduced) macs_per_second *= 0.85;
  return g.macs() / macs_per_second;
}

// Seconds of oneDNN's weight gradient on an AVX-512 CPU with AMX. Measured with
// torch 2.13 on an Intel Xeon (Sapphire Rapids, 2 threads) over
// the benchmark's layers (2026-11-23), in float32: 3x3 at 135-180 GMAC/s
// (NXC) and 135-155 (NCX), 105-145 with strides (on 2026-11-24, 1.2-1.3 times
// as fast, U-Net's 2x2 and DCGAN's 4x4 with stride 2 ran at 130-170, a 3x3
// with stride 2 at 95-110 NXC and 79-95 NCX, where gemm ran 1.3 times as
// fast); 1x1 at 120-150 (NXC; with 1024 input channels at 118-120, where
// gemm ran 1.07-1.12 times as fast, 2026-11-24) and
// 95-130 (NCX), with strides too; 3-D at 56, and 1-D NXC at 42 where NCX ran
// 97. Depthwise 3x3 read its data at 33-37 GB/s (NXC) and 9 (NCX), 7x7 at a
// twentieth of that, after a setup of about 30 us more than other layers'
// (54 us on 2x8x8x8). bf16 stays bf16 there: on AMX it ran 2.2-3.7 times the
// float32 rate (3.3 typical; 3-D without float32's slowdown, at 700-900
// GMAC/s), but 2.2 times on layers with fewer than 128 input channels that
// have strides (U-Net's transposed 2x2, the 1-D layer: 220-250 GMAC/s
// channels-first; channels-last U-Net 0.58 ms on 2026-11-24, 0.72 on the
// constants' day), 1x1 (64 -> 256 NXC: 2.3 times) or 1-D (NXC: about 2.2,
// 2026-11-24), and 2.5 times on channels-last 1x1 layers with more input
// channels (1024 -> 256 on 14x14: 0.99-1.01 ms, where brgemm took 0.85; the
// model had it at 0.95), 3.5 with strides (256 -> 512 on 56 -> 28: 1.39-1.49
// ms on 2026-11-24, where brgemm took 1.67). f16 runs on float32 copies (see
// accumulates_in_float32).
constexpr double kDepthwiseSetupSeconds = 30e-6;
double avx512_amx_cpu_seconds(const Problem& problem, const Geometry& g, bool nxc) {
  const bool bf16 = problem.input.scalar_type() == at::kBFloat16;
  if (g.in_channels == g.groups && g.out_channels == g.groups) {
    const double bytes_per_second = (bf16 ? (nxc ? 11e9 : 7e9) : (nxc ? 35e9 : 9e9)) / (g.taps() > 9 ? 20 : 1);
    return kDepthwiseSetupSeconds + g.data_bytes(problem.input.element_size()) / bytes_per_second;
  }
  const bool strided = g.strided();
  double macs_per_second;
  if (g.taps() == 1)
    macs_per_second = nxc ? (g.in_channels >= 512 ? 115e9 : 135e9) : 110e9;
  else if (strided)
    macs_per_second = strides_divide_kernel(g) ? 130e9 : (nxc ? 105e9 : 85e9);
  else
    macs_per_second = nxc ? 160e9 : 145e9;
  macs_per_second = std::min(macs_per_second, few_channel_groups_macs_per_second(g, nxc));
  if (bf16)
    macs_per_second *= g.in_channels < 128 && (g.taps() == 1 || strided || problem.spatial_rank() == 1) ? 2.2
                       : g.taps() == 1 && nxc ? (strided ? 3.5 : 2.5)
                                              : 3.3;
  else if (problem.spatial_rank() == 3 || (problem.spatial_rank() == 1 && nxc))
    macs_per_second *= 0.37;
  else if (problem.spatial_rank() == 1)  // the audio layer (k10 s5) on NCX data: 2.7-3.1 ms, 85-97 GMAC/s
    macs_per_second *= 0.65;
  return g.macs() / macs_per_second;
}

// Seconds of oneDNN's float32 1x1 weight gradient with stride 1 on 2-D data
// on an AVX-512 CPU without AMX. Measured on an AMD EPYC (Zen 4, 2 threads,
// N=4-8, ResNet's channel counts, 2026-11-25): channels-last, 90-100 GMAC/s
// on 56x56 and 28x28 maps (N*H*W rows from 6272), but 52-72 with 64 input
// channels or fewer and 192 output channels or more once grad_output passes
// 8 MB (64 -> 256 at 56x56: 2.3-3.2 ms at N=4, by process; at 28x28, N=8: 87
// GMAC/s); channels-first, 85-95 from 128 channels a side, 73 with 64 on one
// side and 53 with 64 on both. On short rows a cost that grows with the
// weights, more with more input channels (at 14x14 and 7x7, N=8: about 4 ns a
// weight from 1024 input channels, 2 from 512, little below; channels-last
// 1024 -> 256 took 5.3 and 2.7 ms where 92 GMAC/s takes 4.5 and 1.1), plus
// about 0.1 ms on rows of 1568 and fewer. The model had 70 GMAC/s throughout,
// and sent ResNet's channels-last 1x1 layers from 128 input channels at 28x28
// and 56x56 to gemm (0.75-0.9 times as fast), and kept channels-first 64 -> 64
// from it (0.6 times).
double avx512_float32_pointwise_seconds(const Geometry& g, bool nxc) {
  const double rows = static_cast<double>(g.batch) * g.out[0] * g.out[1] * g.out[2];
  double macs_per_second = 92e9;
  if (nxc) {
    const double grad_output_bytes = rows * g.out_channels * 4;
    if (g.in_channels <= 64 && g.out_channels >= 192 && grad_output_bytes > 8e6) macs_per_second = 60e9;
  } else {
    macs_per_second *= width_share(static_cast<double>(g.in_channels), 128, 136) *
                       width_share(static_cast<double>(g.out_channels), 128, 136);
  }
  const double seconds_per_weight = g.in_channels >= 1024 ? 4e-9 : g.in_channels >= 512 ? 2e-9 : 0.0;
  const double weights = static_cast<double>(g.in_channels) * g.out_channels;
  return g.macs() / macs_per_second + weights * seconds_per_weight + 100e-6 * std::min(1.0, 1568.0 / rows);
}

// The share of its class's rate at which oneDNN runs a bf16 1-D layer on the
// Zen 4, on average over its two speeds. It runs at one of them by process
// and by what ran before it in the process: 0.65 (NXC) and 0.5 (NCX) of the
// class's rate at the fast one (2026-11-25), about half that at the slow one.
// On 2026-12-04 (2 threads, the benchmark's 1-D layer; ours forced, the
// benchmark's runs and, channels-first, the glue's call) it took 2.0-2.3 or
// 4.2-4.8 ms channels-last (3.83 on average over 10 measurements) and 2.4-2.9
// or 4.2-6.6 channels-first (4.42 over 18), where oneDNN's bf16 matmul took
// 3.43 and 3.70 on average (2.1-4.9) and gemm's fused kernel 3.86 and 3.67
// (3.1-5.8).
double one_axis_bf16_share(bool nxc) { return nxc ? 0.41 : 0.35; }

// oneDNN's rate on channels-first f32 layers with a stride that does not
// divide the kernel on the Zen 4, on average over its two speeds: it ran
// ResNet-50's stride-2 3x3 layer (128 channels, 56x56, N=8) at 75-83 GMAC/s
// in some processes and 47-54 in others, 11.1-12.4 or 17.1-19.6 ms (13.6 on
// average over seven measurements, 2026-12-04, 2 threads), where gemm took
// 10.8-11.9 in each of three. The model had the fast speed, 78 GMAC/s. The
// slow one is that of a process that has not yet freed a block of several MB:
// glibc's malloc then maps oneDNN's temporary buffers afresh on every call,
// and each of their pages faults on first touch (18-25 ms and 5000-7000 more
// page faults a call; 13-15 ms after one 24 MB tensor was allocated and
// freed, benchmark.settle_allocator; 2026-12-04). A training step frees
// larger blocks, but gemm, whose speed does not depend on it, stays the pick
// where the settled speed beat it by 2-7% in pairs of calls (the 64-channel
// layer below: between 4% slower and 16% faster in the benchmark's runs;
// 2026-12-04).
constexpr double kStridedChannelsFirstMacsPerSecond = 68e9;

// The share of the rate below that oneDNN's bf16 products reach on average
// on the Zen 4 where a stride divides a kernel of several taps and a side has
// fewer than 128 channels: U-Net's transposed 2x2 layer (as a convolution, 64
// input channels) took 1.45-3.25 ms across the benchmark's five runs and two
// of benchmarks/forced_algorithms.py (2026-12-04, 2 threads, both layouts;
// 2.2 on average), where the rate had 1.2.
constexpr double kFewChannelStridedBf16Share = 0.54;

// oneDNN's bf16 products on a channels-last strided 1x1 layer against its
// float32 rate on the Zen 4: ResNet-50's stride-2 1x1 layer (256 -> 512,
// 56x56, N=8) took 5.1-6.1 ms in seven settled processes (median 5.6; 4.8-5.3
// in three unsettled ones, 2026-12-04), where twice the float32 rate had 4.8;
// brgemm ran it 6-16% faster than oneDNN in each of ten paired measurements
// (4.7-5.1 ms settled).
constexpr double kStridedPointwiseChannelsLastBf16Gain = 1.75;

// A 2-D or 3-D 1x1 layer with a stride on channels-last data (as measured
// there; 1-D layers have their own share, one_axis_bf16_share).
bool strided_pointwise_channels_last(const Problem& problem, const Geometry& g, bool nxc) {
  return nxc && g.taps() == 1 && g.strided() && problem.spatial_rank() > 1;
}

// A layer of several taps with a stride that divides the kernel and fewer
// than 128 channels a side (U-Net's transposed 2x2 as a convolution).
bool few_channel_strided(const Geometry& g) {
  return g.strided() && g.taps() > 1 && strides_divide_kernel(g) &&
         std::min(g.in_channels, g.out_channels) < 128;
}

// Seconds of oneDNN's weight gradient on an AVX-512 CPU with AVX-512 BF16 but
// without AMX. Measured with torch 2.13 on an AMD EPYC (Zen 4, 2 threads) over the
// benchmark's layers (2026-11-24), in float32: 3x3 at 89 GMAC/s (NXC) and
// 59-83 (NCX), 64-78 with stride 2, 67-104 where the stride divides the
// kernel (U-Net, DCGAN, the 1-D layer); 1x1 at 61-82, with stride 2 at 83
// (NXC) and 76 (NCX); 3-D at 24-27. bf16 runs on the CPU's bf16 dot products
// at 1.3-2.7 times the float32 rate (about twice the NXC one, in either
// layout), in 3-D too (205 GMAC/s), but 1x1 on channels-first data at 0.7
// times the channels-last rate (84-129 GMAC/s against 120-133; with stride 2
// 98-112 against 137-151; 2026-11-25). Depthwise 3x3 read its data at 12 GB/s
// (NXC f32), 7 (NCX f32), 4-7 (bf16), twice that with stride 2 and four times
// for bf16 NXC (21-33), and 7x7 at a tenth to a fortieth of it. The 1-D
// layer ran at 0.5 (NXC) and 0.7 (NCX) times its class's rate in float32,
// 0.65 and 0.5 in bf16 (2026-11-25). Without AVX-512 BF16, bf16 goes to
// oneDNN as float32 copies (runs_bf16_natively). Float32 3x3 layers of 128 to 512
// channels ran as fast channels-first as channels-last (83-98 GMAC/s at
// 28x28 and 14x14, 55-63 at 7x7), 1.05-1.23 times as fast in place as
// copied to channels-last; 64 channels at 56x56 ran at 83-88 or at 56-61,
// by process (2026-11-25: the slower where the process had not yet freed a
// large block, as at kStridedChannelsFirstMacsPerSecond; gemm took 10.5-12.7
// ms in either, oneDNN 10.8-11.8 or 15-18, 2026-12-04).
double avx512_cpu_seconds(const Problem& problem, const Geometry& g, bool nxc) {
  const bool bf16_products = problem.input.scalar_type() == at::kBFloat16 && cpu_has_avx512_bf16();
  const bool strided = g.strided();
  if (!bf16_products && !strided && g.taps() == 1 && g.groups == 1 && problem.spatial_rank() == 2)
    return avx512_float32_pointwise_seconds(g, nxc);
  if (g.in_channels == g.groups && g.out_channels == g.groups) {
    const double stride_gain = strided ? (bf16_products && nxc ? 4 : 2) : 1;
    const double bytes_per_second =
        (bf16_products ? (nxc ? 5e9 : 6e9) : (nxc ? 12e9 : 7e9)) * stride_gain / (g.taps() > 9 ? 15 : 1);
    return kDepthwiseSetupSeconds + g.data_bytes(problem.input.element_size()) / bytes_per_second;
  }
  // bf16 runs channels-first data as fast as channels-last (but 1x1, below).
  const bool channels_last_rate = nxc || bf16_products;
  double macs_per_second;
  if (g.taps() == 1)
    macs_per_second = strided ? (channels_last_rate ? 85e9 : 76e9) : 70e9;
  else if (strided)
    macs_per_second = strides_divide_kernel(g)  ? 85e9
                      : channels_last_rate      ? 64e9
                                                : kStridedChannelsFirstMacsPerSecond;
  else
    macs_per_second = channels_last_rate || std::min(g.in_channels, g.out_channels) >= 128 ? 89e9 : 70e9;
  macs_per_second = std::min(macs_per_second, few_channel_groups_macs_per_second(g, nxc));
  if (problem.spatial_rank() == 1) macs_per_second *= bf16_products ? one_axis_bf16_share(nxc) : (nxc ? 0.5 : 0.7);
  if (bf16_products) {
    macs_per_second *= g.taps() == 1 && !nxc                         ? 1.4
                       : strided_pointwise_channels_last(problem, g, nxc) ? kStridedPointwiseChannelsLastBf16Gain
                                                                          : 2;
    if (problem.spatial_rank() > 1 && few_channel_strided(g)) macs_per_second *= kFewChannelStridedBf16Share;
  } else if (problem.spatial_rank() == 3) {
    macs_per_second *= 0.3;
  }
  return g.macs() / macs_per_second;
}

// How many times as fast as avx512_cpu_seconds's Zen 4 model oneDNN ran the
// benchmark's layers on an AMD EPYC (Zen 5, 2 threads, torch 2.13,
// 2026-12-02, benchmarks/forced_algorithms.py): float32 (and f16 on its
// copies) 1.5-1.7 times with several taps channels-last and 1.8-2.0
// channels-first, 1x1 1.7-1.8 channels-last and 1.3-1.7 channels-first;
// slower than on the Zen 4 channels-last with a stride that does not divide
// the kernel (ResNet-50's stride-2 3x3, 0.89) or 3-D (0.71), 1.35-1.4
// channels-first; bf16 on its dot products 1.2-1.7 (U-Net's 2-D layer, a
// stride that divides the kernel with 64 output channels, 0.76-0.89);
// depthwise 3x3 1.3 channels-first in f32 and 0.87 in bf16, and 2.0-2.1
// channels-last, where its times varied most: on MobileNetV2's stride-2
// layer 0.76-1.49 ms in f32 and 0.42-1.63 in bf16 across the runs of one
// session, against the depthwise kernel's 1.03-1.37 and 0.58-1.27 (faster in
// 6 of 10 interleaved runs). Counted at 1.2, the kernel keeps it.
double avx512_wide_speedup(const Problem& problem, const Geometry& g, bool nxc) {
  const bool bf16_products = problem.input.scalar_type() == at::kBFloat16;
  if (g.in_channels == g.groups && g.out_channels == g.groups) return nxc ? 1.2 : bf16_products ? 0.87 : 1.3;
  const bool strided = g.strided();
  // The Zen 5's bf16 1-D layer ran at 1.4 times the Zen 4's fast speed.
  if (bf16_products && problem.spatial_rank() == 1) return 1.4 * (nxc ? 0.65 : 0.5) / one_axis_bf16_share(nxc);
  // U-Net's at 0.8 times the Zen 4's model before its share
  // (kFewChannelStridedBf16Share).
  if (bf16_products && problem.spatial_rank() > 1 && few_channel_strided(g)) return 0.8 / kFewChannelStridedBf16Share;
  // Its channels-last strided 1x1 layers at 1.4 times the Zen 4's model before
  // kStridedPointwiseChannelsLastBf16Gain.
  if (bf16_products && strided_pointwise_channels_last(problem, g, nxc))
    return 1.4 * 2 / kStridedPointwiseChannelsLastBf16Gain;
  if (bf16_products) return 1.4;
  if (g.taps() == 1) return nxc ? 1.75 : 1.45;
  // The Zen 5 ran channels-first ones at 1.35 times the Zen 4's fast speed (78 GMAC/s).
  if (strided && !strides_divide_kernel(g)) return nxc ? 0.8 : 1.35 * 78e9 / kStridedChannelsFirstMacsPerSecond;
  if (problem.spatial_rank() == 3) return nxc ? 0.8 : 1.35;
  return nxc ? 1.55 : 1.85;
}

bool not_yet_channels_first(const Problem& problem) {
  return !dense_in(problem.input, DataLayout::ChannelsFirst) ||
         !dense_in(problem.grad_output, DataLayout::ChannelsFirst);
}

// Seconds of oneDNN's float32 weight gradient on an AVX-512 CPU without bf16
// products, where bf16 runs on float32 copies too (runs_bf16_natively).
// Measured with torch 2.13 on an Intel Xeon (Cascade Lake, 2 threads) over the
// benchmark's layers (2026-11-27), in GMAC/s: 3x3 at 86-102 in either layout;
// 1x1 channels-last at 67 on 56x56 maps and 53 on 14x14, channels-first at
// 61 from 128 input channels and 40 with 64; the 3x3 with stride 2 at 44
// (NXC) and 56 (NCX), 1x1 with stride 2 at 61 and 54; where the stride
// divides the kernel 73-86 (DCGAN) and with 128 channels or fewer 47-52
// (U-Net); the 1-D layer at 0.46 (NXC) and 0.7 (NCX) times that; 3-D at 25.
// Depthwise 3x3 read its data at 5.3-7.5 GB/s, 7x7 at 1.3 (NXC) and 0.35.
double avx512_without_bf16_cpu_seconds(const Problem& problem, const Geometry& g, bool nxc) {
  if (g.in_channels == g.groups && g.out_channels == g.groups) {
    const double bytes_per_second = g.taps() > 9 ? (nxc ? 1.3e9 : 0.35e9) : (nxc ? 7e9 : 5.5e9);
    return kDepthwiseSetupSeconds + g.data_bytes(problem.input.element_size()) / bytes_per_second;
  }
  const bool strided = g.strided();
  double macs_per_second;
  if (g.taps() == 1 && strided)
    macs_per_second = nxc ? 61e9 : 54e9;
  else if (g.taps() == 1)
    macs_per_second = nxc ? (g.out_positions() >= 1024 ? 67e9 : 53e9) : (g.in_channels >= 128 ? 61e9 : 40e9);
  else if (strided && strides_divide_kernel(g))
    macs_per_second = std::min(g.in_channels, g.out_channels) >= 128 ? (nxc ? 73e9 : 86e9) : (nxc ? 52e9 : 47e9);
  else if (strided)
    macs_per_second = nxc ? 44e9 : 56e9;
  else
    macs_per_second = 95e9;
  macs_per_second = std::min(macs_per_second, few_channel_groups_macs_per_second(g, nxc));
  if (problem.spatial_rank() == 1) macs_per_second *= nxc ? 0.46 : 0.7;
  if (problem.spatial_rank() == 3) macs_per_second = std::min(macs_per_second, 25e9);
  return g.macs() / macs_per_second;
}

// Whether a data tensor's copy to `layout` (LayoutCopy) is one tiled
// transposition, _batched_transpose's CUDA kernel on matrices with
// unit-strided rows, from Geometry's sizes and strides: its spatial axes
// flatten, with unit stride for channels-last, and with channels of unit
// stride between them for channels-first (dense NXC memory).
bool transposes_in_one_pass(const Problem& problem, const int64_t (&sizes)[3], const int64_t (&strides)[5],
                            int64_t channels, DataLayout layout) {
  if (!problem.input.is_cuda()) return false;
  if (layout == DataLayout::ChannelsLast) return spatial_flattens(sizes, strides);
  return (channels == 1 || strides[1] == 1) && spatial_flattens(sizes, strides, channels);
}

double estimated_seconds(const Problem& problem, const Geometry& g, DataLayout layout) {
  const bool reduced = at::isReducedFloatingType(problem.input.scalar_type());
  const bool depthwise = g.in_channels == g.groups && g.out_channels == g.groups;
  const int64_t element_size = problem.input.element_size();
  const bool channels_last = layout == DataLayout::ChannelsLast;
  // The layout copy's bytes (read and written) and, on CUDA, its seconds:
  // one tiled transposition where the data allows, else ATen's copy (on an
  // H100 0.5-1.7 TB/s on dense data, 2026-11-27).
  constexpr double kAtenCopyBytesPerSecond = 0.5e12;
  double copy_bytes = 0, cuda_copy_seconds = 0;
  for (const bool is_input : {true, false}) {
    const at::Tensor& data = is_input ? problem.input : problem.grad_output;
    if (layout == DataLayout::Given || dense_in(data, layout)) continue;
    const double bytes = 2.0 * static_cast<double>(data.numel()) * element_size;
    const bool one_pass = transposes_in_one_pass(problem, is_input ? g.in : g.out,
                                                 is_input ? g.input_strides : g.grad_output_strides,
                                                 is_input ? g.in_channels : g.out_channels, layout);
    copy_bytes += bytes;
    const int64_t rows = channels_last ? (is_input ? g.in_channels : g.out_channels)
                                       : (is_input ? g.in[0] * g.in[1] * g.in[2] : g.out_positions());
    cuda_copy_seconds += bytes / (one_pass ? transposition_bytes_per_second(element_size, rows)
                                  : kAtenCopyBytesPerSecond);
  }
  if (problem.input.is_cuda()) {
    // cuDNN with torch 2.11 on an H100, the benchmark's layers at batch 64,
    // GPU time (2026-11-27): about 5 us plus, on NHWC data, the larger of the
    // products at a rate by dtype and the data at 2.3 TB/s. Products (MAC/s):
    // f16/bf16 145-180 T, a 3x3 kernel with stride 2 58 T; float32 (TF32)
    // 40-80 T, with stride 2 38 T. On NCX data cuDNN took that time plus
    // about one pass over the data (bytes read and written) at 1.7-2.1 TB/s
    // in f16/bf16 and 2.3-2.9 in float32, 1.5 and 1.75 for the 3x3 with
    // stride 2; but 1x1 layers without a stride on 56x56 maps ran as fast as
    // on NHWC. Depthwise 3x3 (MobileNetV2) read its data at 2.4 TB/s on NHWC
    // (bf16: 1.75; stride 2: 1.6, f16 2.2), and on NCX at 0.57 (f32), 0.29
    // (bf16) and 0.77 (f16), with stride 2 at 1.26 (f32) and 0.66 (f16,
    // bf16). Depthwise 7x7 (ConvNeXt) in f16/bf16: NHWC 0.6 TB/s, NCX ten
    // times slower; in float32 the other way round: 0.12 TB/s on NCX data,
    // 0.033 on NHWC. The float32 1x1 layer on 14x14 maps made its NCX pass at
    // about 2.6 TB/s on the H100 and 4.0 on an H200 (2026-12-04), where cuDNN
    // in place ran 4.7% faster than the tiled copy to NHWC and cuDNN's NHWC
    // kernel (1% on the H100): unstrided float32 1x1 is taken at 3.0.
    const bool nhwc = layout == DataLayout::ChannelsLast || (layout == DataLayout::Given && is_channels_last(problem.input));
    const bool strided = g.strided();
    const at::ScalarType dtype = problem.input.scalar_type();
    const double data_bytes = g.data_bytes(element_size);
    double base_seconds;
    if (depthwise) {
      const double bytes_per_second = g.taps() >= 25 ? (reduced ? (nhwc ? 0.6e12 : 0.06e12) : (nhwc ? 0.033e12 : 0.12e12))
                                      : nhwc    ? (strided ? (dtype == at::kHalf ? 2.2e12 : 1.6e12)
                                                           : (dtype == at::kBFloat16 ? 1.75e12 : 2.4e12))
                                      : strided ? (reduced ? 0.66e12 : 1.26e12)
                                                : (dtype == at::kBFloat16 ? 0.29e12 : dtype == at::kHalf ? 0.77e12 : 0.57e12);
      base_seconds = data_bytes / bytes_per_second;
    } else {
      const bool slow_strides = g.taps() > 1 && !strides_divide_kernel(g);
      const double macs_per_second = slow_strides ? (reduced ? 58e12 : 38e12) : (reduced ? 170e12 : 60e12);
      base_seconds = std::max(g.macs() / macs_per_second, data_bytes / 2.3e12);
      const bool pointwise = g.taps() == 1 && !strided;
      const double ncx_pass_bytes_per_second = slow_strides ? (reduced ? 1.5e12 : 1.75e12)
                                               : reduced    ? 1.9e12
                                               : pointwise && dtype == at::kFloat ? 3.0e12
                                                            : 2.6e12;
      if (!nhwc && !(pointwise && g.out_positions() >= 1024))
        base_seconds += 2 * data_bytes / ncx_pass_bytes_per_second;
    }
    return 5e-6 + cuda_copy_seconds + base_seconds;
  }
  // Not measured on CPUs, where it runs only when forced.
  if (layout == DataLayout::ChannelsFirst) return 1e30;
  const bool nxc = channels_last || is_channels_last(problem.input);
  const CpuCalibration calibration = cpu_calibration();
  double onednn_seconds =
      calibration == CpuCalibration::Avx512Amx        ? avx512_amx_cpu_seconds(problem, g, nxc)
      : calibration == CpuCalibration::Avx512Bf16     ? avx512_cpu_seconds(problem, g, nxc)
      : calibration == CpuCalibration::Avx512Bf16Wide ? avx512_cpu_seconds(problem, g, nxc) /
                                                            avx512_wide_speedup(problem, g, nxc)
      : calibration == CpuCalibration::Avx512         ? avx512_without_bf16_cpu_seconds(problem, g, nxc)
                                                      : avx2_cpu_seconds(problem, g, nxc);
  // float64 products at half the float32 rate (depthwise is counted in bytes).
  if (problem.input.scalar_type() == at::kDouble && !depthwise) onednn_seconds *= 2;
  // A 3-D problem's padding materialised (materialises_padding): its input
  // read and written again, about the size it is.
  bool misread_3d = false;
  for (int64_t axis = 0; axis < 3; ++axis)
    misread_3d |= misread_3d_axis(g.in[axis], g.pad_begin[axis], (g.kernel[axis] - 1) * g.dilation[axis] + 1);
  if (problem.spatial_rank() == 3 && misread_3d)
    copy_bytes += 2.0 * g.batch * g.in_channels * g.in[0] * g.in[1] * g.in[2] * element_size;
  double seconds = 25e-6 + copy_bytes / 6e9 + onednn_seconds;
  // The float32 copies of f16 (and of bf16 where oneDNN does not take it):
  // 21-36 GB/s (bytes written, twice) on the Sapphire Rapids; on the Zen 4
  // the f16 layers took 0.1-0.8 ms longer than f32 ones on ResNet's 1x1
  // layers at 56x56 and 28x28 (80-440 GB/s so counted; 2026-11-25), 1.1 ms
  // at 14x14 (15). On the Cascade Lake the f16/bf16 layers took longer than
  // float32 ones by about their copies' bytes at 20 GB/s: 0.5-3.5 ms on the
  // benchmark's ResNet-50, U-Net and 1-D layers against 0.8-3.9 so counted
  // (2 threads, interleaved, 2026-11-27). An earlier calibration's added fifth
  // of oneDNN's time overcounted each by 1-4 ms, and gemm ran in its stead on
  // ResNet-50's 3x3 64-channel layer at 0.82-0.85 times aten's speed.
  const bool converts = problem.input.scalar_type() == at::kHalf || !runs_bf16_natively(problem.input) ||
                        (problem.input.scalar_type() == at::kBFloat16 &&
                         !onednn_takes_bf16(nxc, g.groups, g.kernel, g.dilation));
  // On the Zen 5 (2026-12-02) the f16 layers took 0-1.7 ms longer than
  // float32 ones (ResNet-50's, 20-55 GB/s so counted). On the Zen 4 on
  // 2026-12-04 ResNet-50's 1x1 layers took 1.6-1.7 ms longer (37-46 GB/s so
  // counted, interleaved): at 40 the stride-2 1x1 channels-last f16 layer
  // and U-Net's channels-first f16 one go to gemm, which ran them 1.23-1.30x
  // and 0.97-1.14x as fast (two runs each); no other pick of the benchmark's
  // moves.
  const double convert_bytes_per_second = calibration == CpuCalibration::Avx512Amx        ? 25e9
                                          : calibration == CpuCalibration::Avx512Bf16     ? 40e9
                                          : calibration == CpuCalibration::Avx512Bf16Wide ? 35e9
                                          : calibration == CpuCalibration::Avx512         ? 20e9
                                                                                          : 10e9;
  if (converts) seconds += g.data_bytes(4) * 2 / convert_bytes_per_second;
  return seconds;
}

double aten_cost(const Problem& problem, const Geometry& g) {
  return estimated_seconds(problem, g, DataLayout::Given);
}
double aten_channels_last_cost(const Problem& problem, const Geometry& g) {
  return estimated_seconds(problem, g, DataLayout::ChannelsLast);
}
double aten_channels_first_cost(const Problem& problem, const Geometry& g) {
  return estimated_seconds(problem, g, DataLayout::ChannelsFirst);
}

at::Tensor run_in_caller_layout(const Problem& problem) {
  return run_aten(problem, problem.input, problem.grad_output, problem.data_to_ncx);
}

at::Tensor run_in_channels_last(const Problem& problem) {
  return run_aten(problem, LayoutCopy(problem.input, DataLayout::ChannelsLast).run(),
                  LayoutCopy(problem.grad_output, DataLayout::ChannelsLast).run(),
                  nxc_to_ncx(problem.input.dim()));
}

at::Tensor run_in_channels_first(const Problem& problem) {
  std::vector<int64_t> identity(problem.input.dim());
  for (int64_t dim = 0; dim < problem.input.dim(); ++dim) identity[dim] = dim;
  return run_aten(problem, LayoutCopy(problem.input, DataLayout::ChannelsFirst).run(),
                  LayoutCopy(problem.grad_output, DataLayout::ChannelsFirst).run(), identity);
}

}  // namespace

const Algorithm kAtenAlgorithm{"aten", supports_everything, aten_cost, run_in_caller_layout};
const Algorithm kAtenChannelsLastAlgorithm{"aten_channels_last", not_yet_channels_last, aten_channels_last_cost,
                                           run_in_channels_last};
const Algorithm kAtenChannelsFirstAlgorithm{"aten_channels_first", not_yet_channels_first, aten_channels_first_cost,
                                            run_in_channels_first};

}  // namespace torch_convgrad
