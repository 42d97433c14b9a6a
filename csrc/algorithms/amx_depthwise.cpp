// bf16 depthwise 2-D layers with stride 1 on AMX tiles: depthwise_kernel.h's
// amx_bf16, two tile products per pair of output rows and chunk of 32
// positions along the padded input row. The depthwise kernel's FMA tiles run
// at the FMA ports' rate, which bounds a 7x7 layer (ConvNeXt: 49
// multiply-adds per element read), so its bf16 form gains from the tiles'
// rate even though a product uses only 7 x 7 of its 8 x 8 sums. ATen
// takes inputs with an infinity or NaN.
#include "depthwise.h"

#if defined(TORCH_CONVGRAD_DEPTHWISE_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <ATen/ops/isfinite.h>

#include <algorithm>

namespace torch_convgrad {

#if defined(TORCH_CONVGRAD_DEPTHWISE_AMX)
bool depthwise_kernel::amx_tiles_granted() {
  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux 5.16 and
  // later hand out the tile state only on request. oneDNN asks the same.
  constexpr int kRequestPermission = 0x1023, kTileData = 18;
  static const bool granted = syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  return granted;
}
#endif

namespace {

// Chunks of 32 positions along the padded input row, as the kernel splits it.
int64_t row_chunks(const Geometry& g) { return ceil_div(g.in[2] + g.pad_begin[2], 32); }

// Steps (two tile products each): one per chunk and pair of output rows.
int64_t steps_of(const Geometry& g) {
  return g.batch * g.in_channels * g.out[0] * ceil_div(g.out[1], 2) * row_chunks(g);
}

// Whether both tensors have unit-stride rows, read in place as planes
// (channels-first); otherwise the kernel transposes channels-last data.
bool channels_first(const Geometry& g) { return g.input_strides[4] == 1 && g.grad_output_strides[4] == 1; }

bool supports(const Problem& problem) {
#if defined(TORCH_CONVGRAD_DEPTHWISE_AMX)
  const at::Tensor& input = problem.input;
  if (!input.device().is_cpu() || input.layout() != at::kStrided || input.scalar_type() != at::kBFloat16 ||
      problem.grad_output.layout() != at::kStrided)
    return false;
  if (problem.spatial_rank() > 3 || depthwise_group_channels(problem) != 1) return false;
  if (!cpu_is_avx512() || !cpu_has_amx_bf16() || !depthwise_kernel::amx_tiles_granted()) return false;
  const Geometry g = geometry_of(problem);
  // The first axis (3-D layers only) runs plane by plane: kernel 1, stride 1.
  if (g.kernel[0] != 1 || g.stride[0] != 1 || g.pad_begin[0] != 0) return false;
  if (g.stride[1] != 1 || g.stride[2] != 1 || g.dilation[1] != 1 || g.dilation[2] != 1 || g.pad_begin[1] < 0)
    return false;
  // B's 8 columns hold the taps along the row, read as overlapping pairs of
  // grad_output positions (consecutive only without dilation); A's 16 rows
  // the kernel's rows plus one.
  if (g.kernel[2] > 8 || g.kernel[1] > 15) return false;
  return channels_first(g) || (g.input_strides[1] == 1 && g.grad_output_strides[1] == 1);
#else
  (void)problem;
  return false;
#endif
}

// Measured on an Intel Xeon (Sapphire Rapids, 2 cores), 2 threads, bf16,
// 2026-11-24: ConvNeXt's 7x7 layers (N=8, 96 channels at 56x56 to 768 at
// 7x7, channels-first) fit about 14 ns a step and 25 ns a plane (the input's
// copy, the loop's ends) with B built per step; channels-last data adds its
// transposition, 12 to 60 GB/s of padded planes, 25 typical, and 35 ns a
// plane (the 7x7 maps'). With B read from pair rows (AMX CPU, 2026-11-28),
// those layers and 5x5 and 3x3 ones on 28x28 maps, channels-first, took
// 0.83-1.2 times 11 ns a step and 15 ns a plane. The depthwise kernel ran the
// 3x3 layers and the 7x7 maps of 7x7 channels-last faster. Where the
// transposition makes grad_output's pair rows (amx_makes_pair_rows), seven
// channels-last layers (3x3 to 7x7, 28x28 to 112x112 maps) took what is left
// after the rest of this model at 37-75 GB/s of those bytes and 35 ns a plane
// (AMX CPU, 2026-11-28).
constexpr double kSecondsPerStep = 11e-9;
constexpr double kSecondsPerPlane = 15e-9;
constexpr double kTransposedBytesPerSecond = 25e9;
constexpr double kPairsMadeBytesPerSecond = 45e9;
constexpr double kTransposedSecondsPerPlane = 35e-9;
constexpr double kBytesPerSecond = 21e9;
constexpr double kOverheadSeconds = 15e-6;

double cost(const Problem& problem, const Geometry& g) {
  const double bytes = g.data_bytes(problem.input.element_size());
  const double planes = static_cast<double>(g.batch * g.in_channels * g.out[0]);
  const double compute = static_cast<double>(steps_of(g)) * kSecondsPerStep + planes * kSecondsPerPlane;
  // Channels-last planes are transposed into the input's padded layout (its
  // rows the products reach, each a whole number of chunks) and the output
  // gradient's.
  const double padded_input = static_cast<double>((2 * ceil_div(g.out[1], 2) + g.kernel[1]) * 32 * row_chunks(g));
  const double transposed = planes * (padded_input + static_cast<double>(g.out[1] * g.out[2])) * 2;
  const double rate = depthwise_kernel::amx_makes_pair_rows(row_chunks(g), g.out[2]) ? kPairsMadeBytesPerSecond
                                                                                      : kTransposedBytesPerSecond;
  return kOverheadSeconds + std::max(bytes / kBytesPerSecond, compute) +
         (channels_first(g) ? 0.0 : transposed / rate + planes * kTransposedSecondsPerPlane);
}

at::Tensor run(const Problem& problem) {
#if defined(TORCH_CONVGRAD_DEPTHWISE_AMX)
  const Geometry geometry = geometry_of(problem);
  std::atomic<bool> non_finite{false};
  depthwise_kernel::Args args = depthwise_args(problem, geometry);
  args.non_finite = &non_finite;
  // Tasks split samples, then channels; channels-last tasks take whole
  // blocks of 32 (a cache line of bf16), which the kernel transposes
  // together, so that memory is read a pixel at a time.
  at::Tensor result = run_depthwise_tasks(problem, geometry, args, depthwise_kernel::AVX512::amx_bf16, 0,
                                          channels_first(geometry) ? 1 : 32);
  // The tiles multiply the input's rows by zeros of the output gradient
  // outside its plane, which an infinity or NaN in the input turns into NaN
  // in taps that never read it: then (seen as a non-finite sum) ATen
  // recomputes the call. An infinity or NaN in the output gradient meets the
  // input's zero padding, on every side, as in the reference.
  if (non_finite && !at::isfinite(problem.input).all().item<bool>()) return kAtenAlgorithm.run(problem);
  return result;
#else
  (void)problem;
  TORCH_CHECK(false, "the amx_depthwise algorithm needs AMX tile intrinsics (GCC 11, Clang 12) on Linux");
  return {};
#endif
}

}  // namespace

const Algorithm kAmxDepthwiseAlgorithm{"amx_depthwise", supports, cost, run};

}  // namespace torch_convgrad
