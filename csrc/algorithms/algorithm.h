// The algorithm layer: every way of computing a weight gradient is an
// `Algorithm` in a file of its own under csrc/algorithms/. Each one answers
// whether it supports a resolved `Problem` and at what estimated cost, and runs
// it; `select_algorithm` (select.cpp) is the one place that picks.
#pragma once

#include "../problem.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace torch_convgrad {

struct Geometry;

struct Algorithm {
  // Stable name, used by the override (TORCH_CONVGRAD_ALGORITHM,
  // torch_convgrad.use_algorithm) and reported by torch_convgrad.last_algorithm().
  const char* name;
  // Whether `run` computes this problem exactly (device, dtype, attributes).
  bool (*supports)(const Problem& problem);
  // Estimated seconds on this machine; only compared between algorithms.
  // `geometry` is geometry_of(problem), computed once by the selector.
  double (*cost)(const Problem& problem, const Geometry& geometry);
  // The weight gradient as a new contiguous tensor in the requested format,
  // with f16/bf16 accumulated in float32.
  at::Tensor (*run)(const Problem& problem);
};

// The algorithms, one per file.
extern const Algorithm kAtenAlgorithm;             // aten.cpp: ATen in the caller's layout
extern const Algorithm kAtenChannelsLastAlgorithm; // aten.cpp: one copy to channels-last, then ATen
extern const Algorithm kAtenChannelsFirstAlgorithm; // aten.cpp: one copy to channels-first, then ATen
extern const Algorithm kGemmAlgorithm;             // gemm.cpp: one GEMM per kernel tap
extern const Algorithm kDepthwiseAlgorithm;        // depthwise.cpp: direct CPU kernel, groups == channels
extern const Algorithm kDirectAlgorithm;           // direct.cpp: plain loops for tiny problems
extern const Algorithm kBrgemmAlgorithm;           // brgemm.cpp: bf16 products through ATen's brgemm
extern const Algorithm kAmxPlanesAlgorithm;        // amx_planes.cpp: the same on AMX tiles, input from phase planes
extern const Algorithm kAmxDepthwiseAlgorithm;     // amx_depthwise.cpp: bf16 depthwise on AMX tiles
extern const Algorithm kMatmulAlgorithm;           // matmul.cpp: one ATen matrix product over im2col windows

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The dtype the algorithms accumulate a weight gradient in: float64 for
// float64 data, float32 for everything else (f16/bf16 included).
inline at::ScalarType accumulation_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Concrete (non-symbolic) sizes of a problem lifted to three spatial axes
// (missing leading axes have size 1, kernel 1, stride 1, no padding), the
// form the hand-written algorithms work on.
struct Geometry {
  int64_t batch, in_channels, out_channels, groups;
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], pad_begin[3];
  // Element strides of the data tensors as (N, C, X0, X1, X2); a lifted
  // axis has size 1 and stride 0.
  int64_t input_strides[5], grad_output_strides[5];
  int64_t taps() const { return kernel[0] * kernel[1] * kernel[2]; }
  // Whether some axis has a stride above 1.
  bool strided() const { return stride[0] * stride[1] * stride[2] > 1; }
  // Whether the input's rows run along one axis: 1-D, or 2-D of height 1.
  bool one_axis() const { return in[0] == 1 && in[1] == 1; }
  // Output positions a sample: Y0 * Y1 * Y2.
  int64_t out_positions() const { return out[0] * out[1] * out[2]; }
  // Multiply-adds of the weight gradient: N * Y * O * C/g * K.
  double macs() const;
  // Bytes of the two data tensors at `element_size` bytes each.
  double data_bytes(int64_t element_size) const;
};
Geometry geometry_of(const Problem& problem);

// Whether every axis's stride divides its kernel (windows that tile or
// overlap evenly: 1x1 and U-Net's 2x2 with stride 2, DCGAN's 4x4).
bool strides_divide_kernel(const Geometry& g);

// Whether the spatial axes of a (N, C, X0, X1, X2) tensor with these sizes and
// strides (Geometry's) flatten into one with stride `unit`.
bool spatial_flattens(const int64_t (&sizes)[3], const int64_t (&strides)[5], int64_t unit = 1);

// NCX data lifted to three spatial axes: (N, C, S0, S1, S2), a view.
at::Tensor lift(const at::Tensor& ncx);

// Per-tap products (P, groups, K0, K1, K2, C/g, O/g) in row-major order
// (a leading axis of P partial sums, then any shape that reshapes so), any
// dtype, as P canonical (O, C/g, K...) weight gradients at the problem's rank
// (Problem::finish_sum): a view where the strides allow (one group).
at::Tensor canonical_from_taps(const at::Tensor& taps, const Geometry& g, int64_t spatial_rank);

// Float32 partial sums, a part of `sizes` per thread, each zeroed by the
// thread that takes it (in parallel, into its own cache) where at::zeros
// would zero them all on the calling thread first: 48 us for two parts of a
// 1024 x 256 result (Sapphire Rapids). `shared`: one part, zeroed first, that
// every thread adds into where the others do not.
class ThreadPartials {
 public:
  ThreadPartials(at::IntArrayRef sizes, const at::TensorOptions& options, bool shared = false);
  // The calling thread's part, zeroed on its first call (the shared part);
  // inside at::parallel_for.
  float* take();
  // (threads, sizes...): each part as its thread left it, or zero where no thread took it.
  const at::Tensor& sums();

 private:
  at::Tensor partials_;
  int64_t part_elements_;
  std::vector<uint8_t> taken_;  // each written only by its part's thread; empty where shared
};

// Whether this CPU runs the hand-written kernels' AVX2 builds (AVX-512 CPUs
// included); at::get_cpu_capability() honours ATEN_CPU_CAPABILITY.
bool cpu_runs_avx2_kernels();

// Whether ATen and oneDNN run their AVX-512 kernels (ATen's capability says,
// and honours ATEN_CPU_CAPABILITY).
bool cpu_is_avx512();
// The calibration the CPU cost models use, chosen by what the CPU has: ATen's
// capability (cpu_is_avx512()), bf16 products, AMX tiles and, where CPUID's
// features are the same, AMD's family. Each was measured on one CPU, with 2
// threads.
enum class CpuCalibration {
  Avx2,        // an AMD EPYC (Zen 3)
  Avx512,      // AVX-512 without bf16 products: an Intel Xeon (Cascade Lake)
  Avx512Bf16,  // AVX-512 with AVX-512 BF16's dot products, no AMX: an AMD EPYC (Zen 4)
  // The same on AMD's family 1Ah, whose server cores execute 512-bit
  // instructions whole where the Zen 4 splits them in two: an AMD EPYC (Zen 5).
  Avx512Bf16Wide,
  Avx512Amx,  // an Intel Xeon (Sapphire Rapids)
};
CpuCalibration cpu_calibration();
// Its name as torch_convgrad.algorithms.cpu_calibration() gives it: "avx2",
// "avx512", "avx512_bf16", "avx512_bf16_wide" or "avx512_amx".
const char* cpu_calibration_name();
// Whether the CPU multiplies bf16 on AMX tiles, as oneDNN does for its bf16
// convolutions there.
bool cpu_has_amx_bf16();
// Whether the CPU has AVX-512 BF16's bf16 dot products, which oneDNN's bf16
// convolutions run on where there are no AMX tiles.
bool cpu_has_avx512_bf16();
// Whether ATen's bf16 brgemm runs here and now, on AMX tiles or AVX-512
// BF16's dot products (brgemm.cpp).
bool cpu_runs_brgemm_bf16();
// What the brgemm algorithms (brgemm, amx_planes) take: ungrouped strided
// CPU tensors of bf16, or of f16 split into bf16 parts, where
// cpu_runs_brgemm_bf16() (brgemm.cpp).
bool runs_brgemm_bf16(const Problem& problem);
// The share of a product's full rate that a side of `channels` rows or
// columns reaches, as the cost models fit it: linear in the channels, from
// offset / (full + offset) towards none, and all from `full` channels on.
inline double width_share(double channels, double full, double offset) {
  return std::min(1.0, (channels + offset) / (full + offset));
}
// The brgemm algorithms' (brgemm, amx_planes): all from 64 channels.
inline double tile_width(double channels) { return width_share(channels, 64, 32); }
// c (m x n, row stride ldc) += a (m x k, row stride lda) @ b, with b the k x n
// product's operand in VNNI pairs ((k / 2) x n x 2, k even), through ATen's
// brgemm in blocks of C (brgemm.cpp). Only where cpu_runs_brgemm_bf16().
void brgemm_bf16_blocks(int64_t m, int64_t n, int64_t k, int64_t lda, const at::BFloat16* a,
                        const at::BFloat16* vnni_b, float* c, int64_t ldc);

}  // namespace torch_convgrad
