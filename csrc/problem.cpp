// Validation and resolution of the spec attributes (SPEC sections 2, 3 and 7).
// This is the only place that interprets an attribute.
#include "problem.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/bit_cast.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <string>

namespace torch_convgrad {
namespace {

// A check on sizes that may be symbolic. Where they depend on a shape
// tensor's values (unbacked sizes under torch.compile/export) it becomes a
// runtime assert instead of a guard that cannot be decided at trace time.
#define CHECK_SIZES(condition, ...) TORCH_CHECK_VALUE((condition).expect_true(__FILE__, __LINE__), __VA_ARGS__)

// Attribute values and kernel sizes stay below 2^31 so that no size formula
// (eff_k, padded sizes, output_padding's check) can overflow int64.
constexpr int64_t kMaxValue = std::numeric_limits<int32_t>::max();

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return out;
}

enum class AutoPad { Explicit, SameUpper, SameLower, Valid };

AutoPad parse_auto_pad(std::string_view text) {
  const std::string value = lowercase(text);
  if (value == "none" || value == "explicit") return AutoPad::Explicit;
  if (value == "same_upper") return AutoPad::SameUpper;
  if (value == "same_lower") return AutoPad::SameLower;
  if (value == "valid") return AutoPad::Valid;
  TORCH_CHECK_VALUE(false, "auto_pad: expected one of None, 'none', 'explicit', 'same_upper', 'same_lower', "
                    "'valid', got '", text, "'");
}

// Data layout -> permutation of the caller's dims into NCX.
std::vector<int64_t> parse_data_format(std::string_view text, int64_t rank) {
  const std::string value = lowercase(text);
  std::vector<int64_t> to_ncx(rank + 2);
  std::iota(to_ncx.begin(), to_ncx.end(), 0);
  if (value == "ncx") return to_ncx;
  TORCH_CHECK_VALUE(value == "nxc", "data_format: expected 'NXC' or 'NCX', got '", text, "'");
  to_ncx[1] = rank + 1;
  for (int64_t axis = 0; axis < rank; ++axis) to_ncx[2 + axis] = 1 + axis;
  return to_ncx;
}

// A filter format is a word over {A, B, X}: A and B are the canonical axes 0
// and 1 (convolution: A = O, B = I; ConvTranspose: A = I, B = O), X the
// kernel axes in order. Returns the permutation canonical -> that format.
std::vector<int64_t> permutation_for(std::string_view word, int64_t rank) {
  std::vector<int64_t> perm;
  for (char axis : word) {
    if (axis == 'A') perm.push_back(0);
    if (axis == 'B') perm.push_back(1);
    if (axis == 'X')
      for (int64_t k = 0; k < rank; ++k) perm.push_back(2 + k);
  }
  return perm;
}

struct FormatChoice {
  const char* name;
  const char* word;
};

std::vector<int64_t> parse_filter_format(std::string_view text, int64_t rank, const char* arg_name,
                                         c10::ArrayRef<FormatChoice> choices) {
  const std::string value = lowercase(text);
  for (const auto& choice : choices)
    if (value == lowercase(choice.name)) return permutation_for(choice.word, rank);
  std::string expected;
  for (const auto& choice : choices) expected += (expected.empty() ? "'" : " or '") + std::string(choice.name) + "'";
  TORCH_CHECK_VALUE(false, arg_name, ": expected ", expected, ", got '", text, "'");
}

constexpr FormatChoice kConvolutionFormats[] = {{"XIO", "XBA"}, {"OIX", "ABX"}};
// Canonical ConvTranspose axes: A = IC, B = OC/groups.
constexpr FormatChoice kConvTransposeFormats[] = {
    {"XIO", "XAB"}, {"OIX", "BAX"}, {"IOX", "ABX"}, {"XOI", "XBA"}};

void check_data(const at::Tensor& input, const at::Tensor& output_delta, const ArgNames& names) {
  for (const auto& [tensor, name] : {std::pair{&input, names.input}, std::pair{&output_delta, names.output_delta}}) {
    const auto dtype = tensor->scalar_type();
    TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble,
                     name, ": expected a float32, float16, bfloat16 or float64 tensor, got ", dtype);
  }
  TORCH_CHECK_TYPE(input.scalar_type() == output_delta.scalar_type(), names.output_delta,
                   ": expected the dtype of ", names.input, " (", input.scalar_type(), "), got ",
                   output_delta.scalar_type());
  TORCH_CHECK_VALUE(input.device() == output_delta.device(), names.output_delta, ": expected the device of ",
                    names.input, " (", input.device(), "), got ", output_delta.device());
  TORCH_CHECK_VALUE(input.dim() >= 3 && input.dim() <= 5, names.input,
                    ": expected a 3-D, 4-D or 5-D tensor (batch, channels and 1 to 3 spatial axes), got ",
                    input.dim(), "-D with shape ", input.sym_sizes());
  TORCH_CHECK_VALUE(output_delta.dim() == input.dim(), names.output_delta, ": expected a ", input.dim(),
                    "-D tensor like ", names.input, ", got ", output_delta.dim(), "-D with shape ",
                    output_delta.sym_sizes());
  CHECK_SIZES(output_delta.sym_size(0).sym_eq(input.sym_size(0)), names.output_delta, ": expected batch size ",
                    input.sym_size(0), " (that of ", names.input, "), got ", output_delta.sym_size(0));
}

// One value per spatial axis, or `fallback` on every axis when not given.
std::vector<int64_t> per_axis(at::OptionalIntArrayRef values, int64_t rank, int64_t fallback, int64_t minimum,
                              const char* name) {
  if (!values.has_value()) return std::vector<int64_t>(rank, fallback);
  TORCH_CHECK_VALUE(static_cast<int64_t>(values->size()) == rank, name, ": expected ", rank,
                    " values (one per spatial axis), got ", values->size(), ": ", *values);
  for (int64_t value : *values)
    TORCH_CHECK_VALUE(value >= minimum && value <= kMaxValue, name, ": expected values between ", minimum, " and ",
                      kMaxValue, ", got ", *values);
  return values->vec();
}

c10::SymInt ceil_div(const c10::SymInt& a, int64_t b) { return (a + (b - 1)) / b; }

// Resolves pads per SPEC section 3; `size` is the spatial size the same_* rule
// is computed on.
void resolve_pads(Problem& problem, AutoPad mode, const Attributes& attrs, c10::SymIntArrayRef size) {
  const int64_t rank = problem.spatial_rank();
  if (mode == AutoPad::Explicit) {
    for (int64_t pad : per_axis(attrs.pads_begin, rank, 0, 0, "pads_begin")) problem.pad_begin.emplace_back(pad);
    for (int64_t pad : per_axis(attrs.pads_end, rank, 0, 0, "pads_end")) problem.pad_end.emplace_back(pad);
    return;
  }
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (mode == AutoPad::Valid) {
      problem.pad_begin.emplace_back(0);
      problem.pad_end.emplace_back(0);
      continue;
    }
    const int64_t s = problem.stride[axis];
    const c10::SymInt eff_k = problem.dilated_kernel_size(axis);
    const c10::SymInt total = ((ceil_div(size[axis], s) - 1) * s + eff_k - size[axis]).max(0);
    const c10::SymInt smaller = total / 2;
    const c10::SymInt larger = total - smaller;
    problem.pad_begin.push_back(mode == AutoPad::SameUpper ? smaller : larger);
    problem.pad_end.push_back(mode == AutoPad::SameUpper ? larger : smaller);
  }
}

// The number of windows along each axis: floor((in + pb + pe - eff_k) / s) + 1,
// checked against `windows` (the size of the tensor named `name`).
void check_spatial(const Problem& problem, c10::SymIntArrayRef in, c10::SymIntArrayRef windows,
                   const char* in_name, const char* name) {
  for (int64_t axis = 0; axis < problem.spatial_rank(); ++axis) {
    const c10::SymInt eff_k = problem.dilated_kernel_size(axis);
    const c10::SymInt padded = in[axis] + problem.pad_begin[axis] + problem.pad_end[axis];
    CHECK_SIZES(padded.sym_ge(eff_k), name, ": spatial axis ", axis, ": ", in_name, " size ", in[axis],
                      " with pads (", problem.pad_begin[axis], ", ", problem.pad_end[axis],
                      ") is smaller than the dilated kernel size ", eff_k, ", so no window fits");
    const c10::SymInt expected = (padded - eff_k) / problem.stride[axis] + 1;
    CHECK_SIZES(windows[axis].sym_eq(expected), name, ": spatial axis ", axis, " has size ", windows[axis],
                      ", expected ", expected, " = floor((", in[axis], " + ", problem.pad_begin[axis], " + ",
                      problem.pad_end[axis], " - ", eff_k, ") / ", problem.stride[axis], ") + 1 from ", in_name,
                      " size ", in[axis]);
  }
}

// Reads kernel sizes from the shape argument and checks its channel entries.
// `channels` are the expected canonical entries (A, B); `labels` name them
// (label, tensor and suffix, joined only for a message).
struct ChannelLabel {
  const char* entry;
  const char* tensor;
  const char* suffix;
};

void read_shape(Problem& problem, c10::SymIntArrayRef shape, int64_t rank, const char* shape_name,
                std::string_view format, const c10::SymInt (&channels)[2], const ChannelLabel (&labels)[2]) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(shape.size()) == rank + 2, shape_name, ": expected ", rank + 2,
                    " values (2 channel entries and ", rank, " kernel sizes), got ", shape.size(), ": ", shape);
  for (const auto& entry : shape)
    CHECK_SIZES(entry.sym_ge(1), shape_name, ": expected positive entries, got ", shape);
  std::vector<c10::SymInt> canonical(rank + 2);
  for (int64_t i = 0; i < rank + 2; ++i) canonical[problem.canonical_to_result[i]] = shape[i];
  for (int64_t axis = 0; axis < 2; ++axis) {
    const auto position =
        std::find(problem.canonical_to_result.begin(), problem.canonical_to_result.end(), axis) -
        problem.canonical_to_result.begin();
    CHECK_SIZES(canonical[axis].sym_eq(channels[axis]), shape_name, ": expected entry ", position, " (",
                labels[axis].entry, ", the channels of ", labels[axis].tensor, labels[axis].suffix, " in format '",
                format, "') to be ", channels[axis], ", got ", canonical[axis], " in ", shape);
  }
  problem.kernel_size.assign(canonical.begin() + 2, canonical.end());
  for (const auto& size : problem.kernel_size)
    CHECK_SIZES(size.sym_le(kMaxValue), shape_name, ": expected kernel sizes up to ", kMaxValue, ", got ", shape);
}

void check_groups(int64_t groups, const c10::SymInt& channels, const char* channels_name) {
  TORCH_CHECK_VALUE(groups >= 1, "groups: expected a positive value, got ", groups);
  CHECK_SIZES((channels % groups).sym_eq(0), "groups: expected a divisor of the ", channels,
                    " channels of ", channels_name, ", got ", groups);
}

c10::SymIntArrayRef spatial(const at::Tensor& ncx) { return ncx.sym_sizes().slice(2); }

// What differs between the convolution ops and ConvTranspose.
struct OpKind {
  c10::ArrayRef<FormatChoice> formats;
  // SPEC section 4: the ConvTranspose weight gradient is the convolution
  // weight gradient with the data tensors' roles swapped.
  bool roles_swapped;
  const char* channel_names[2];  // the canonical channel entries (A, B) in messages
};

constexpr OpKind kConvolution{kConvolutionFormats, false, {"O", "I"}};
constexpr OpKind kConvTranspose{kConvTransposeFormats, true, {"IC", "OC/groups"}};

Problem resolve(const at::Tensor& input_forward, const at::Tensor& output_delta, const Attributes& attrs,
                const ArgNames& names, const OpKind& kind) {
  check_data(input_forward, output_delta, names);
  Problem problem;
  const int64_t rank = input_forward.dim() - 2;
  problem.data_to_ncx = parse_data_format(attrs.data_format, rank);
  problem.stride = per_axis(attrs.strides, rank, 1, 1, "strides");
  problem.dilation = per_axis(attrs.dilations, rank, 1, 1, "dilations");
  problem.groups = attrs.groups;
  const AutoPad mode = parse_auto_pad(attrs.auto_pad);
  problem.canonical_to_result = parse_filter_format(attrs.format, rank, names.format, kind.formats);
  problem.roles_swapped = kind.roles_swapped;
  problem.input = (kind.roles_swapped ? output_delta : input_forward).permute(problem.data_to_ncx);
  problem.grad_output = (kind.roles_swapped ? input_forward : output_delta).permute(problem.data_to_ncx);

  check_groups(attrs.groups, input_forward.sym_size(problem.data_to_ncx[1]), names.input);
  check_groups(attrs.groups, output_delta.sym_size(problem.data_to_ncx[1]), names.output_delta);
  // A counts the channels of the tensor playing grad_output, B those of the one playing input.
  const char* a_tensor = kind.roles_swapped ? names.input : names.output_delta;
  const char* b_tensor = kind.roles_swapped ? names.output_delta : names.input;
  const ChannelLabel labels[2] = {{kind.channel_names[0], a_tensor, ""}, {kind.channel_names[1], b_tensor, " / groups"}};
  read_shape(problem, attrs.shape, rank, names.shape, attrs.format,
             {problem.grad_output.sym_size(1), problem.input.sym_size(1) / attrs.groups}, labels);

  resolve_pads(problem, mode, attrs, spatial(problem.input));
  const char* input_name = kind.roles_swapped ? names.output_delta : names.input;
  const char* windows_name = kind.roles_swapped ? names.input : names.output_delta;
  check_spatial(problem, spatial(problem.input), spatial(problem.grad_output), input_name, windows_name);
  return problem;
}

}  // namespace

std::vector<c10::SymInt> Problem::canonical_shape() const {
  std::vector<c10::SymInt> shape{grad_output.sym_size(1), input.sym_size(1) / groups};
  shape.insert(shape.end(), kernel_size.begin(), kernel_size.end());
  return shape;
}

std::vector<c10::SymInt> Problem::result_shape() const {
  const auto canonical = canonical_shape();
  std::vector<c10::SymInt> shape;
  for (int64_t axis : canonical_to_result) shape.push_back(canonical[axis]);
  return shape;
}

at::Tensor Problem::to_caller_layout(const at::Tensor& ncx) const {
  return ncx.permute(inverse_permutation(data_to_ncx));
}

at::Tensor Problem::canonical_from_result(const at::Tensor& result) const {
  return result.permute(inverse_permutation(canonical_to_result));
}

at::Tensor Problem::result_from_canonical(const at::Tensor& canonical) const {
  return canonical.permute(canonical_to_result);
}

namespace {

// finish_sum's tiles: kSumTile elements along the partials' contiguous axis
// times kSumTile along the result's last, so that reads and writes both run
// along cache lines where the two orders differ.
constexpr int64_t kSumTile = 16;
// The fewest elements a thread's task takes: smaller results stay on one
// thread.
constexpr int64_t kSumTaskElements = 32768;

// The result's axes longer than 1 as (sizes, the partials' strides), adjacent
// ones merged where the partials hold them in the same order; one axis for a
// single element.
std::pair<std::vector<int64_t>, std::vector<int64_t>> merged_axes(const at::Tensor& source) {
  std::vector<int64_t> sizes, strides;
  for (int64_t dim = 1; dim < source.dim(); ++dim) {
    if (source.size(dim) == 1) continue;
    if (!sizes.empty() && strides.back() == source.size(dim) * source.stride(dim)) {
      sizes.back() *= source.size(dim);
      strides.back() = source.stride(dim);
    } else {
      sizes.push_back(source.size(dim));
      strides.push_back(source.stride(dim));
    }
  }
  if (sizes.empty()) sizes.push_back(1), strides.push_back(1);
  return {sizes, strides};
}

// A sum in the result's dtype. bf16 rounds as c10::BFloat16(float) does (to
// nearest even, NaN as 0x7FC0), with a select for its branch so that a loop
// of them vectorises.
template <typename Out, typename Acc>
Out result_value(Acc sum) {
  if constexpr (std::is_same_v<Out, at::BFloat16> && std::is_same_v<Acc, float>) {
    const auto bits = c10::bit_cast<uint32_t>(sum);
    const auto rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    return at::BFloat16(sum != sum ? uint16_t{0x7FC0} : rounded, at::BFloat16::from_bits());
  } else {
    return static_cast<Out>(sum);
  }
}

// out[i] = Out(sum_p source[p][offset(i)]) over the result's axes (`sizes`,
// with the partials' `strides`, one of them 1), `out` contiguous over them.
template <typename Acc, typename Out>
void sum_partials(const at::Tensor& source, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                  Out* out) {
  const auto* partials = source.const_data_ptr<Acc>();
  const int64_t parts = source.size(0), part_stride = source.stride(0);
  const auto rank = static_cast<int64_t>(sizes.size());
  const int64_t last = rank - 1;
  std::vector<int64_t> out_strides(rank);
  for (int64_t axis = last, stride = 1; axis >= 0; stride *= sizes[axis], --axis) out_strides[axis] = stride;
  const auto fast = static_cast<int64_t>(std::find(strides.begin(), strides.end(), 1) - strides.begin());
  // Sums `count` contiguous elements from `first` into `sums`, part by part.
  const auto sum_run = [&](const Acc* first, int64_t count, Acc* sums) {
    for (int64_t i = 0; i < count; ++i) sums[i] = first[i];
    for (int64_t part = 1; part < parts; ++part)
      for (int64_t i = 0; i < count; ++i) sums[i] += first[part * part_stride + i];
  };
  // A unit of work: one index of every axis but the last and `fast`, and a
  // tile of `fast` over the whole last axis; or where the two are one, a
  // run of it.
  const int64_t tile = fast == last ? kSumTile * kSumTile : kSumTile;
  const int64_t tiles = (sizes[fast] + tile - 1) / tile;
  int64_t units = tiles;
  for (int64_t axis = 0; axis < last; ++axis)
    if (axis != fast) units *= sizes[axis];
  const int64_t unit_elements = fast == last ? tile : tile * sizes[last];
  at::parallel_for(0, units, std::max<int64_t>(1, kSumTaskElements / unit_elements), [&](int64_t begin, int64_t end) {
    Acc block[kSumTile * kSumTile];  // a tile's sums, [j][f]; or a run's
    Out converted[kSumTile * kSumTile];  // the tile's sums in the result's dtype, where it is another
    for (int64_t unit = begin; unit < end; ++unit) {
      int64_t rest = unit / tiles, from = 0, to = 0;
      for (int64_t axis = last - 1; axis >= 0; --axis) {
        if (axis == fast) continue;
        const int64_t index = rest % sizes[axis];
        rest /= sizes[axis];
        from += index * strides[axis];
        to += index * out_strides[axis];
      }
      const int64_t first = unit % tiles * tile, count = std::min(tile, sizes[fast] - first);
      from += first;
      to += first * out_strides[fast];
      if (fast == last) {  // the same order
        sum_run(partials + from, count, block);
        for (int64_t j = 0; j < count; ++j) out[to + j] = result_value<Out>(block[j]);
        continue;
      }
      for (int64_t j0 = 0; j0 < sizes[last]; j0 += kSumTile) {
        const int64_t columns = std::min(kSumTile, sizes[last] - j0);
        for (int64_t j = 0; j < columns; ++j)
          sum_run(partials + from + (j0 + j) * strides[last], count, block + j * kSumTile);
        // Converted in the tile's order (a loop that vectorises), then moved
        // to the result's: converting as they moved left bf16 results a
        // scalar loop, a seventh of ResNet-50's 1x1 1024 -> 256 channels-last
        // bf16 layer on brgemm (2026-12-05, Intel Xeon family 6 model 207).
        const Out* values;
        if constexpr (std::is_same_v<Out, Acc>) {
          values = block;
        } else {
          for (int64_t i = 0; i < columns * kSumTile; ++i) converted[i] = result_value<Out>(block[i]);
          values = converted;
        }
        for (int64_t f = 0; f < count; ++f) {
          Out* target = out + to + f * out_strides[fast] + j0;
          for (int64_t j = 0; j < columns; ++j) target[j] = values[j * kSumTile + f];
        }
      }
    }
  });
}

// Sums `source` (P, the result's axes) over P into `result` on CPU: false
// where the dtypes are not float or double sums (or one part copied), or no
// axis of the partials is contiguous.
bool sum_on_cpu(const at::Tensor& source, const at::Tensor& result) {
  const auto [sizes, strides] = merged_axes(source);
  if (std::find(strides.begin(), strides.end(), 1) == strides.end()) return false;
  const at::ScalarType from = source.scalar_type(), to = result.scalar_type();
  const bool one_part = source.size(0) == 1;
  if (from == at::kDouble && to == at::kDouble)
    sum_partials<double>(source, sizes, strides, result.mutable_data_ptr<double>());
  else if (from == at::kFloat && to == at::kFloat)
    sum_partials<float>(source, sizes, strides, result.mutable_data_ptr<float>());
  else if (from == at::kFloat && to == at::kBFloat16)
    sum_partials<float>(source, sizes, strides, result.mutable_data_ptr<at::BFloat16>());
  else if (from == at::kFloat && to == at::kHalf)
    sum_partials<float>(source, sizes, strides, result.mutable_data_ptr<at::Half>());
  else if (one_part && from == at::kBFloat16 && to == at::kBFloat16)
    sum_partials<at::BFloat16>(source, sizes, strides, result.mutable_data_ptr<at::BFloat16>());
  else if (one_part && from == at::kHalf && to == at::kHalf)
    sum_partials<at::Half>(source, sizes, strides, result.mutable_data_ptr<at::Half>());
  else
    return false;
  return true;
}

}  // namespace

at::Tensor Problem::finish_sum(const at::Tensor& partials) const {
  std::vector<int64_t> order{0};
  for (const int64_t axis : canonical_to_result) order.push_back(axis + 1);
  const at::Tensor source = partials.permute(order);  // (P, the result's axes)
  const c10::IntArrayRef sizes = source.sizes().slice(1);
  if (source.size(0) == 1 && source.scalar_type() == input.scalar_type()) {
    at::Tensor whole = source[0];  // already the result where its strides are contiguous
    if (whole.strides() == c10::IntArrayRef(c10::contiguous_strides(sizes))) return whole;
  }
  at::Tensor result = at::empty(sizes, input.options());
  if (result.numel() == 0) return result;
  if (source.size(0) == 0) return result.zero_();
  if (source.is_cpu() && sum_on_cpu(source, result)) return result;
  return result.copy_(source.size(0) == 1 ? source[0] : source.sum(0));  // other devices: ATen's ops
}

std::vector<c10::SymInt> Problem::window_reach() const {
  std::vector<c10::SymInt> reach;
  for (int64_t axis = 0; axis < spatial_rank(); ++axis)
    reach.push_back((grad_output.sym_size(2 + axis) - 1) * stride[axis] + dilated_kernel_size(axis));
  return reach;
}

Problem resolve_convolution(const at::Tensor& input_forward, const at::Tensor& output_delta,
                            const Attributes& attrs, const ArgNames& names) {
  return resolve(input_forward, output_delta, attrs, names, kConvolution);
}

Problem resolve_conv_transpose(const at::Tensor& input_forward, const at::Tensor& output_delta,
                               const Attributes& attrs) {
  Problem problem = resolve(input_forward, output_delta, attrs, kFiltersArgs, kConvTranspose);
  const int64_t rank = problem.spatial_rank();
  const auto out_size = spatial(problem.input);
  const auto in_size = spatial(problem.grad_output);
  if (attrs.output_padding.has_value()) {
    const auto output_padding = per_axis(attrs.output_padding, rank, 0, 0, "output_padding");
    for (int64_t axis = 0; axis < rank; ++axis) {
      const int64_t bound = std::max(problem.stride[axis], problem.dilation[axis]);
      TORCH_CHECK_VALUE(output_padding[axis] < bound, "output_padding: expected values below max(stride, dilation) = ",
                        bound, " on spatial axis ", axis, ", got ", *attrs.output_padding);
      const c10::SymInt eff_k = problem.dilated_kernel_size(axis);
      const c10::SymInt expected = problem.stride[axis] * (in_size[axis] - 1) + eff_k - problem.pad_begin[axis] -
                                   problem.pad_end[axis] + output_padding[axis];
      CHECK_SIZES(out_size[axis].sym_eq(expected), "output_padding: spatial axis ", axis, ": output_delta size ",
                        out_size[axis], " does not match ", expected, " = stride * (input_forward size ",
                        in_size[axis], " - 1) + ", eff_k, " - pads (", problem.pad_begin[axis], " + ",
                        problem.pad_end[axis], ") + output_padding ", output_padding[axis]);
    }
  }
  return problem;
}

}  // namespace torch_convgrad
