// The weight gradient as one matrix product per group over the (sample, output
// position) rows, through ATen's matmul (cuBLAS on CUDA):
//
//     dW (O/g x C/g * K) = grad_output (O/g x N * Y) @ windows (N * Y x C/g * K)
//
// `windows` is the input's im2col matrix, a strided view of the input, so
// only problems whose windows read no padding qualify. Each operand is
// materialised in the order its data lies in (channels-last: rows (N, Y..),
// columns (K.., C); channels-first: columns first), so a copy reads and writes
// whole runs; where that order is already a matrix (a 1x1 stride-1 input on
// channels-last data, a channels-last output gradient) nothing is copied.
// Windows that tile the input (kernel = stride: 1x1, or U-Net's 2x2 stride 2)
// copy it once; overlapping windows copy each input element once per window
// that reads it, which the cost model charges.
//
// f16/bf16 are multiplied as they are into a float32 product where ATen has
// that product (CUDA: cuBLAS accumulates in float32), bf16 into a bf16 product
// where oneDNN sums it in float32 (CPUs with AVX512_BF16, one product), and
// are copied to float32 elsewhere.
#include "algorithm.h"

#include <ATen/Context.h>
#include <ATen/TensorUtils.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <cstdlib>
#include <limits>
#include <string_view>

namespace torch_convgrad {
namespace {

// Whether every window lies inside the input on every axis.
bool reads_no_padding(const Geometry& g) {
  for (int64_t axis = 0; axis < 3; ++axis) {
    const int64_t first = -g.pad_begin[axis];
    const int64_t last = first + (g.out[axis] - 1) * g.stride[axis] + (g.kernel[axis] - 1) * g.dilation[axis];
    if (first < 0 || last >= g.in[axis]) return false;
  }
  return true;
}

// Whether ATen multiplies `dtype` operands into a float32 product on this
// device (aten::mm.dtype, CUDA only), so f16/bf16 need no float32 copies.
bool multiplies_into_float32(const at::Tensor& data) {
  return data.is_cuda() && at::isReducedFloatingType(data.scalar_type());
}

// Whether ATen multiplies the bf16 operands of one ungrouped product as they
// are on this CPU: oneDNN's bf16 matmul on AVX512_BF16 or AMX sums in float32
// and rounds once, to the bf16 result (which a float32 product and a final
// conversion would give, to the order of the sums).
// Without oneDNN (torch.backends.mkldnn.enabled = False) ATen's own bf16
// product runs instead, slowly (and in older torch summed in bf16).
bool multiplies_bf16_on_cpu(const Problem& problem, const Geometry& g) {
  return problem.input.is_cpu() && problem.input.scalar_type() == at::kBFloat16 && g.groups == 1 &&
         cpu_has_avx512_bf16() && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
}

// Whether the operands go to the product in the caller's dtype (else copied
// to the accumulation dtype).
bool multiplies_as_given(const Problem& problem, const Geometry& g) {
  return multiplies_into_float32(problem.input) || multiplies_bf16_on_cpu(problem, g);
}

// One operand as a strided view of the caller's data, its dims in the order
// its matrices take: (g, rows, columns) or (g, columns, rows), rows being the
// (N, Y..) axes the product sums over. Plain sizes and strides, so that the
// cost model reads them without making tensors.
struct OperandView {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  std::vector<int64_t> shape;  // of the matrices
  bool rows_first = false;     // shape is (g, rows, columns)

  void permute(c10::IntArrayRef order) {
    std::vector<int64_t> permuted_sizes, permuted_strides;
    for (const int64_t dim : order) {
      permuted_sizes.push_back(sizes[dim]);
      permuted_strides.push_back(strides[dim]);
    }
    sizes = std::move(permuted_sizes);
    strides = std::move(permuted_strides);
  }
  // Whether the view flattens to `shape` without a copy.
  bool is_matrices() const { return at::detail::computeStride(sizes, strides, shape).has_value(); }
  double elements() const {
    double count = 1;
    for (const int64_t size : sizes) count *= static_cast<double>(size);
    return count;
  }
  // The matrices in `dtype`: a view of `data` where its strides allow,
  // otherwise one copy in the view's dim order (converting as it goes).
  at::Tensor matrices(const at::Tensor& data, at::ScalarType dtype) const {
    const at::Tensor view = data.as_strided(sizes, strides, offset);
    if (data.scalar_type() == dtype && is_matrices()) return view.view(shape);
    return at::empty(sizes, data.options().dtype(dtype)).copy_(view).view(shape);
  }
};

// The input's windows, (N, g, C/g, Y0, K0, Y1, K1, Y2, K2) permuted so that
// channels-last data is read along its channels.
OperandView windows_of(const Problem& problem, const Geometry& g) {
  const int64_t* step = g.input_strides;  // (N, C, X0, X1, X2)
  const int64_t in_per_group = g.in_channels / g.groups;
  OperandView view;
  view.sizes = {g.batch, g.groups, in_per_group};
  view.strides = {step[0], in_per_group * step[1], step[1]};
  view.offset = problem.input.storage_offset();
  for (int64_t axis = 0; axis < 3; ++axis) {
    view.sizes.insert(view.sizes.end(), {g.out[axis], g.kernel[axis]});
    view.strides.insert(view.strides.end(), {g.stride[axis] * step[2 + axis], g.dilation[axis] * step[2 + axis]});
    view.offset -= g.pad_begin[axis] * step[2 + axis];
  }
  const int64_t rows = g.batch * g.out_positions(), columns = in_per_group * g.taps();
  view.rows_first = g.in_channels > 1 && step[1] == 1;
  if (view.rows_first) {
    view.permute({1, 0, 3, 5, 7, 4, 6, 8, 2});
    view.shape = {g.groups, rows, columns};
  } else {
    view.permute({1, 2, 4, 6, 8, 0, 3, 5, 7});
    view.shape = {g.groups, columns, rows};
  }
  return view;
}

// The output gradient, (N, g, O/g, Y0, Y1, Y2) permuted likewise.
OperandView grad_output_of(const Problem& problem, const Geometry& g) {
  const int64_t* step = g.grad_output_strides;  // (N, O, Y0, Y1, Y2)
  const int64_t out_per_group = g.out_channels / g.groups;
  OperandView view;
  view.sizes = {g.batch, g.groups, out_per_group, g.out[0], g.out[1], g.out[2]};
  view.strides = {step[0], out_per_group * step[1], step[1], step[2], step[3], step[4]};
  view.offset = problem.grad_output.storage_offset();
  const int64_t rows = g.batch * g.out_positions();
  view.rows_first = g.out_channels > 1 && step[1] == 1;
  if (view.rows_first) {
    view.permute({1, 0, 3, 4, 5, 2});
    view.shape = {g.groups, rows, out_per_group};
  } else {
    view.permute({1, 2, 0, 3, 4, 5});
    view.shape = {g.groups, out_per_group, rows};
  }
  return view;
}

// cuBLAS's products are deterministic only with a fixed workspace
// (CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8, as PyTorch checks): without one,
// under torch.use_deterministic_algorithms ATen's mm raises (or warns),
// where cuDNN's convolutions pick deterministic algorithms instead.
bool cublas_may_run() {
  if (!at::globalContext().deterministicAlgorithms()) return true;
  const char* config = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  return config != nullptr && (std::string_view(config) == ":4096:8" || std::string_view(config) == ":16:8");
}

bool supports(const Problem& problem) {
  if (!(problem.input.is_cuda() || problem.input.is_cpu())) return false;
  if (problem.input.is_cuda()) {
    if (!cublas_may_run()) return false;
    // f32 follows the TF32 setting for convolutions (cuDNN's), and cuBLAS
    // follows its own: where only cuBLAS's allows TF32, its products would
    // be less precise than the convolutions' the caller asked for.
    const at::Context& context = at::globalContext();
    if (problem.input.scalar_type() == at::kFloat && context.allowTF32CuBLAS() && !context.allowTF32CuDNN())
      return false;
  }
  const Geometry g = geometry_of(problem);
  // cuBLAS takes 32-bit sizes.
  constexpr int64_t kLargest = std::numeric_limits<int32_t>::max();
  const double rows = static_cast<double>(g.batch) * g.out_positions();
  return reads_no_padding(g) && rows <= kLargest && (g.in_channels / g.groups) * g.taps() <= kLargest;
}

at::Tensor run(const Problem& problem) {
  const Geometry g = geometry_of(problem);
  const OperandView windows_view = windows_of(problem, g), grad_output_view = grad_output_of(problem, g);
  const at::ScalarType dtype = problem.input.scalar_type();
  const bool into_float32 = multiplies_into_float32(problem.input);
  const at::ScalarType storage = multiplies_as_given(problem, g) ? dtype : accumulation_dtype(dtype);
  at::Tensor windows = windows_view.matrices(problem.input, storage);
  at::Tensor grad_output = grad_output_view.matrices(problem.grad_output, storage);
  if (!windows_view.rows_first) windows = windows.transpose(1, 2);
  if (grad_output_view.rows_first) grad_output = grad_output.transpose(1, 2);
  // (g, O/g, C/g * K) in float32 (float64; bf16 where multiplies_bf16_on_cpu)
  at::Tensor product;
  if (g.groups == 1) {
    product = (into_float32 ? at::mm(grad_output[0], windows[0], at::kFloat) : at::mm(grad_output[0], windows[0]))
                  .unsqueeze(0);
  } else {
    product = into_float32 ? at::bmm(grad_output, windows, at::kFloat) : at::bmm(grad_output, windows);
  }
  const int64_t in_per_group = g.in_channels / g.groups;
  // (O, C/g, K0, K1, K2)
  at::Tensor canonical =
      windows_view.rows_first
          ? product.view({g.out_channels, g.kernel[0], g.kernel[1], g.kernel[2], in_per_group}).permute({0, 4, 1, 2, 3})
          : product.view({g.out_channels, in_per_group, g.kernel[0], g.kernel[1], g.kernel[2]});
  for (int64_t lifted = 0; lifted < 3 - problem.spatial_rank(); ++lifted) canonical = canonical.squeeze(2);
  return problem.finish(canonical);
}

// Whether the CPU cost model below has MKL's rates for this problem (the
// product in float32), ungrouped: on an AVX-512 CPU without bf16 products
// (the Cascade Lake's calibration) for float32 channels-last data, on an
// AVX2 one for float32, f16 and bf16 in either layout. On the Cascade Lake,
// on channels-first data the copies regroup whole planes and `gemm` ran
// faster on every benchmark layer (1.1-2x); f16/bf16, copied to float32
// first, ran slower than `gemm`'s conversion panel by panel (0.6-0.95x). On
// the Zen 3 (2026-12-05, benchmarks/forced_algorithms.py --layers sweep)
// matmul was the fastest on 30 of 42 1x1 layers on small maps and stride-2
// 1x1 layers (ResNet-50's 7x7 and 14x14 stages and its downsampling, in
// each dtype and layout), up to 1.5x as fast as `gemm` (bf16 512 -> 2048 on
// 7x7 maps, channels-first, 5.8 ms against 8.3; the stride-2 1024 -> 2048
// 14 -> 7 in bf16 17.2 against 25.7).
bool costed_on_cpu(const Problem& problem, const Geometry& g, const OperandView& windows,
                   const OperandView& grad_output) {
  if (!problem.input.is_cpu() || g.groups != 1) return false;
  const at::ScalarType dtype = problem.input.scalar_type();
  switch (cpu_calibration()) {
    case CpuCalibration::Avx2:
      return dtype == at::kFloat || at::isReducedFloatingType(dtype);
    case CpuCalibration::Avx512:
      return dtype == at::kFloat && windows.rows_first && grad_output.rows_first;
    default:
      return false;
  }
}

// Estimated seconds on CUDA, for bf16 on AVX-512 CPUs with AVX512_BF16 but no
// AMX, and where costed_on_cpu (elsewhere it runs only when forced).
//
// Measured on an H100 (torch 2.11, GPU time, the benchmark's 1x1 layers at
// batch 64, 2026-11-24): cuBLAS multiplied f16/bf16 at 330-380 TFLOP/s where
// the product was not bound by reading its operands (2.4 TB/s); the copies
// moved 1.3-1.5 TB/s (bytes read and written); a call took about 10 us more
// (launches, the result's conversion and layout). It beat cuDNN only on NCX
// data with a stride (1x1 stride 2, 256 -> 512 channels: 1.15x); on NCX
// data without a stride its copies cost more than cuDNN's slower product
// (0.24-0.86x), on channels-last data cuDNN ran as fast or faster (0.6-0.97x).
// float32 multiplies at the full precision torch.backends.cuda.matmul asks
// for (by default no TF32, 0.3-0.7x of cuDNN's TF32); the TF32 rate is the
// benchmark's roofline's (400 TFLOP/s on square products), halved.
double cost(const Problem& problem, const Geometry& g) {
  const CpuCalibration calibration = cpu_calibration();
  const bool cpu_bf16 = multiplies_bf16_on_cpu(problem, g) && (calibration == CpuCalibration::Avx512Bf16 ||
                                                               calibration == CpuCalibration::Avx512Bf16Wide);
  const OperandView windows = windows_of(problem, g), grad_output = grad_output_of(problem, g);
  const bool cpu_mkl = costed_on_cpu(problem, g, windows, grad_output);
  if (!problem.input.is_cuda() && !cpu_bf16 && !cpu_mkl) return 1e30;
  const at::ScalarType dtype = problem.input.scalar_type();
  const double element_size = problem.input.element_size();
  const double stored_size =
      multiplies_as_given(problem, g) ? element_size : c10::elementSize(accumulation_dtype(dtype));
  const double input_bytes = static_cast<double>(g.batch) * g.in_channels * g.in[0] * g.in[1] * g.in[2] * element_size;
  const double windows_elements = windows.elements(), grad_output_elements = grad_output.elements();
  double copy_bytes = 0;
  if (stored_size != element_size || !windows.is_matrices()) {
    // A channels-first gather with a stride reads every sector of the rows it
    // touches; windows that overlap read their shared input from cache.
    const double spread = windows.rows_first ? 1.0 : std::min<double>(g.stride[2], 32.0 / element_size);
    copy_bytes += std::min(input_bytes, windows_elements * element_size * spread) + windows_elements * stored_size;
  }
  if (stored_size != element_size || !grad_output.is_matrices())
    copy_bytes += grad_output_elements * (element_size + stored_size);
  if (cpu_bf16) {
    // Measured on an AMD EPYC (Zen 4, 2 threads, 2026-11-25), ResNet-50's
    // 1x1 layers, U-Net's and the 1-D layer: oneDNN's bf16 matmul ran at
    // 140-175 GMAC/s where both sides of the product are wide (256 and more),
    // 110-130 with 64 input channels and 80-110 with 64 output channels; the
    // copies cost little (channels-first 1024 -> 256 ran as fast as
    // channels-last, which has none).
    const auto width = [](double channels) { return width_share(channels, 255, 250); };
    const double columns = static_cast<double>(g.in_channels / g.groups) * g.taps();
    // On the Zen 5 (2026-12-02, two runs) the products ran 1.8-2 times as
    // fast, the 1-D layer's (rows along one axis) 1.1-1.2 times, and the
    // copies cost less still: ResNet-50's channels-first 1x1 layers ran as
    // fast as their channels-last twins, or faster.
    const bool zen5 = calibration == CpuCalibration::Avx512Bf16Wide;
    const double zen5_speedup = !zen5 ? 1.0 : g.one_axis() ? 1.15 : 1.9;
    const double macs_per_second =
        zen5_speedup * 160e9 * width(static_cast<double>(g.out_channels / g.groups)) * width(columns);
    return 15e-6 + copy_bytes / (zen5 ? 100e9 : 30e9) + g.macs() / macs_per_second;
  }
  if (cpu_mkl) {
    // Measured on an Intel Xeon (Cascade Lake, 2 threads, 2026-11-27): MKL's
    // f32 product ran at 92-98 GMAC/s with both sides 256 or wider, 82 with
    // 128 output channels (U-Net) and 56 with 64 columns (ResNet-50's 1x1 64
    // -> 256); the windows' copies (a stride, or U-Net's 2x2 taps) moved 20-31
    // GB/s, read and written. It beat the other algorithms on ResNet-50's 1x1
    // 1024 -> 256 (5.1 against gemm's 5.7 ms) and stride-2 1x1 (10.1 against
    // oneDNN's 10.3) layers and U-Net's (3.0 against 3.5).
    // On an AMD EPYC (Zen 3, AVX2, 2 threads, 2026-12-01, two runs) it ran
    // ResNet-50's stride-2 1x1 layer at 52-61 GMAC/s besides copies of about
    // 8 GB/s (15.1-17.3 ms against gemm's 19.0-25.8), its 1x1 64 -> 256 at
    // 36-42 (tied with oneDNN and gemm), its 1x1 1024 -> 256 at 44-45 (tied
    // with gemm), U-Net's and the 1-D layer 0.7-0.85 times as fast as gemm.
    const bool avx2 = calibration == CpuCalibration::Avx2;
    const auto width = [](double channels) { return width_share(channels, 200, 200); };
    const double columns = static_cast<double>(g.in_channels) * g.taps();
    // f16/bf16 at 0.92 of the rate: on the benchmark's 1x1 layers, where
    // gemm converts panel by panel, matmul took 0.92-1.09 times gemm's time
    // (2026-12-05), and so none of them moves to matmul.
    const double reduced = at::isReducedFloatingType(dtype) ? 0.92 : 1.0;
    // Where the output gradient is a matrix as it lies (channels-last) and
    // the wider operand (1x1 expansions), the Zen 3's products ran faster
    // than that (2026-12-05, 2 threads, algorithms interleaved in one
    // process, ResNet-50's, MobileNetV2's and ConvNeXt's 1x1 layers):
    // float32 at 69-80 GMAC/s with 96 input channels or more, 57-60 with 64
    // and 46 with 24, read in place; f16/bf16 products of float32 copies as
    // fast, and stride-2 layers' besides their gathers. gemm's fused kernel,
    // which takes the output gradient as its first operand there
    // (fused_swaps_operands), ran them at 55-69, so they move to MKL on maps
    // of 28x28 down to 7x7 (float32 1.05-1.2x as fast: 128 -> 512,
    // 256 -> 1024, 512 -> 2048, MobileNetV2's 96 -> 576; bf16 512 -> 2048
    // 1.11x, stride 2 512 -> 1024 1.1x, 1024 -> 2048 1.2x), where the copies
    // of f16/bf16 cost less than the products gain. Where the input is the
    // wider (2048 -> 512 on 7x7 maps, 1024 -> 256 on 14x14), MKL ran 64-75
    // GMAC/s by run and the fused kernel 0.9-1.2x as fast as it, so those
    // keep the rate below.
    if (avx2 && columns <= g.out_channels && grad_output.is_matrices())
      return 15e-6 + copy_bytes / 8e9 + g.macs() / (72e9 * width_share(columns, 125, 110));
    const double macs_per_second =
        (avx2 ? 55e9 : 95e9) * reduced * width(static_cast<double>(g.out_channels)) * width(columns);
    return 15e-6 + copy_bytes / (avx2 ? 8e9 : 25e9) + g.macs() / macs_per_second;
  }
  constexpr double kCopyBytesPerSecond = 1.4e12;
  constexpr double kReadBytesPerSecond = 2.4e12;
  const bool reduced = at::isReducedFloatingType(dtype);
  const double flops_per_second = reduced ? 3.5e14
                                  : dtype == at::kFloat && at::globalContext().allowTF32CuBLAS() ? 2e14
                                                                                                : 4e13;
  const double product_seconds = std::max(2 * g.macs() / flops_per_second,
                                          (windows_elements + grad_output_elements) * stored_size / kReadBytesPerSecond);
  return 10e-6 + copy_bytes / kCopyBytesPerSecond + product_seconds;
}

}  // namespace

const Algorithm kMatmulAlgorithm{"matmul", supports, cost, run};

}  // namespace torch_convgrad
