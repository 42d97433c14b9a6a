#include "algorithm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <string>

namespace torch_convgrad {

Geometry geometry_of(const Problem& problem) {
  Geometry g{};
  g.batch = problem.input.size(0);
  g.in_channels = problem.input.size(1);
  g.out_channels = problem.grad_output.size(1);
  g.groups = problem.groups;
  const int64_t rank = problem.spatial_rank();
  const int64_t lead = 3 - rank;
  for (int64_t axis = 0; axis < 3; ++axis) {
    const bool lifted = axis < lead;
    const int64_t source = axis - lead;
    g.in[axis] = lifted ? 1 : problem.input.size(2 + source);
    g.out[axis] = lifted ? 1 : problem.grad_output.size(2 + source);
    g.kernel[axis] = lifted ? 1 : problem.kernel_size[source].expect_int();
    g.stride[axis] = lifted ? 1 : problem.stride[source];
    g.dilation[axis] = lifted ? 1 : problem.dilation[source];
    g.pad_begin[axis] = lifted ? 0 : problem.pad_begin[source].expect_int();
  }
  for (int64_t dim = 0; dim < 5; ++dim) {
    const bool lifted = dim >= 2 && dim - 2 < lead;
    const int64_t source = dim < 2 ? dim : dim - lead;
    g.input_strides[dim] = lifted ? 0 : problem.input.stride(source);
    g.grad_output_strides[dim] = lifted ? 0 : problem.grad_output.stride(source);
  }
  return g;
}

bool strides_divide_kernel(const Geometry& g) {
  for (int64_t axis = 0; axis < 3; ++axis)
    if (g.kernel[axis] % g.stride[axis] != 0) return false;
  return true;
}

bool spatial_flattens(const int64_t (&sizes)[3], const int64_t (&strides)[5], int64_t unit) {
  int64_t expected = unit;
  for (int64_t axis = 2; axis >= 0; --axis) {
    if (sizes[axis] != 1 && strides[2 + axis] != expected) return false;
    expected *= sizes[axis];
  }
  return true;
}

at::Tensor lift(const at::Tensor& ncx) {
  at::Tensor lifted = ncx;
  while (lifted.dim() < 5) lifted = lifted.unsqueeze(2);
  return lifted;
}

at::Tensor canonical_from_taps(const at::Tensor& taps, const Geometry& g, int64_t spatial_rank) {
  const int64_t parts = taps.size(0);
  const int64_t in_per_group = g.in_channels / g.groups, out_per_group = g.out_channels / g.groups;
  at::Tensor canonical =
      taps.reshape({parts, g.groups, g.kernel[0], g.kernel[1], g.kernel[2], in_per_group, out_per_group})
          .permute({0, 1, 6, 5, 2, 3, 4})
          .reshape({parts, g.out_channels, in_per_group, g.kernel[0], g.kernel[1], g.kernel[2]});
  for (int64_t lifted = 0; lifted < 3 - spatial_rank; ++lifted) canonical = canonical.squeeze(3);
  return canonical;
}

ThreadPartials::ThreadPartials(at::IntArrayRef sizes, const at::TensorOptions& options, bool shared)
    : taken_(shared ? 0 : at::get_num_threads(), 0) {
  std::vector<int64_t> shape{shared ? 1 : static_cast<int64_t>(taken_.size())};
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  partials_ = shared ? at::zeros(shape, options.dtype(at::kFloat)) : at::empty(shape, options.dtype(at::kFloat));
  part_elements_ = partials_.numel() / shape[0];
}

float* ThreadPartials::take() {
  float* data = partials_.mutable_data_ptr<float>();
  if (taken_.empty()) return data;
  const int thread = at::get_thread_num();
  TORCH_INTERNAL_ASSERT(thread >= 0 && static_cast<size_t>(thread) < taken_.size());
  float* part = data + thread * part_elements_;
  if (!taken_[thread]) std::fill_n(part, part_elements_, 0.0f);
  taken_[thread] = 1;
  return part;
}

const at::Tensor& ThreadPartials::sums() {
  for (size_t thread = 0; thread < taken_.size(); ++thread)
    if (!taken_[thread]) partials_[static_cast<int64_t>(thread)].zero_();
  return partials_;
}

double Geometry::macs() const {
  return static_cast<double>(batch) * out_positions() * out_channels * (in_channels / groups) * taps();
}

double Geometry::data_bytes(int64_t element_size) const {
  const double input = static_cast<double>(batch) * in_channels * in[0] * in[1] * in[2];
  const double grad_output = static_cast<double>(batch) * out_channels * out[0] * out[1] * out[2];
  return (input + grad_output) * static_cast<double>(element_size);
}

bool cpu_runs_avx2_kernels() {
  static const bool avx2 = [] {
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX2" || capability == "AVX512";
  }();
  return avx2;
}

bool cpu_is_avx512() {
  static const bool avx512 = at::get_cpu_capability().rfind("AVX512", 0) == 0;
  return avx512;
}

namespace {

// Whether CPUID leaf 7 reports every feature of `ebx_bits` and `edx_bits`
// (subleaf 0) and of `eax1_bits` (subleaf 1), and the OS saves the register
// state of XCR0's `xcr0_bits`.
bool cpu_reports(unsigned ebx_bits, unsigned edx_bits, unsigned eax1_bits, unsigned xcr0_bits) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((ebx & ebx_bits) != ebx_bits || (edx & edx_bits) != edx_bits) return false;
  const unsigned last_subleaf = eax;
  if (eax1_bits != 0 &&
      (last_subleaf < 1 || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || (eax & eax1_bits) != eax1_bits))
    return false;
  constexpr unsigned kOsXsave = 1u << 27;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & kOsXsave) == 0) return false;
  unsigned low = 0, high = 0;
  asm volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (low & xcr0_bits) == xcr0_bits;
#else
  (void)ebx_bits, (void)edx_bits, (void)eax1_bits, (void)xcr0_bits;
  return false;
#endif
}

constexpr unsigned kAvx512F = 1u << 16, kAvx512Dq = 1u << 17, kAvx512Bw = 1u << 30, kAvx512Vl = 1u << 31;
constexpr unsigned kAvx512Core = kAvx512F | kAvx512Dq | kAvx512Bw | kAvx512Vl;
constexpr unsigned kZmmState = 0xe6;  // SSE, AVX, opmask and both halves of the zmm registers

}  // namespace

bool cpu_has_amx_bf16() {
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24, kTileState = (1u << 17) | (1u << 18);
  static const bool amx_bf16 = cpu_reports(0, kAmxBf16 | kAmxTile, 0, kTileState);
  return amx_bf16;
}

bool cpu_has_avx512_bf16() {
  constexpr unsigned kAvx512Bf16 = 1u << 5;
  static const bool avx512_bf16 = cpu_reports(kAvx512Core, 0, kAvx512Bf16, kZmmState);
  return avx512_bf16;
}

namespace {

// Whether CPUID names AMD as the vendor and a family of at least `family`
// (base plus extended family, as AMD counts them: 19h Zen 3 and 4, 1Ah Zen 5).
bool amd_family_at_least(unsigned family) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  // "AuthenticAMD", in EBX, EDX, ECX order.
  if (ebx != 0x68747541u || edx != 0x69746e65u || ecx != 0x444d4163u) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned base = (eax >> 8) & 0xf, extended = (eax >> 20) & 0xff;
  return (base == 0xf ? base + extended : base) >= family;
#else
  (void)family;
  return false;
#endif
}

}  // namespace

CpuCalibration cpu_calibration() {
  static const CpuCalibration calibration = !cpu_is_avx512()           ? CpuCalibration::Avx2
                                            : cpu_has_amx_bf16()        ? CpuCalibration::Avx512Amx
                                            : !cpu_has_avx512_bf16()    ? CpuCalibration::Avx512
                                            : amd_family_at_least(0x1a) ? CpuCalibration::Avx512Bf16Wide
                                                                        : CpuCalibration::Avx512Bf16;
  return calibration;
}

const char* cpu_calibration_name() {
  switch (cpu_calibration()) {
    case CpuCalibration::Avx2: return "avx2";
    case CpuCalibration::Avx512: return "avx512";
    case CpuCalibration::Avx512Bf16: return "avx512_bf16";
    case CpuCalibration::Avx512Bf16Wide: return "avx512_bf16_wide";
    case CpuCalibration::Avx512Amx: return "avx512_amx";
  }
  return "";
}

}  // namespace torch_convgrad
