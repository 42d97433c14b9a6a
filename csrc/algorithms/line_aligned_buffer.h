// A zeroed buffer whose data starts on a cache line, for the per-capability
// kernels (depthwise_kernel.h, tap_gemm_kernel.h): their vector loads at
// whole-vector offsets from it never straddle two lines, as they do from
// std::vector's 16-byte-aligned data. Defined per CPU_CAPABILITY, like the
// kernels, so that no instantiation compiled for AVX2 serves a portable build.
#pragma once

#ifndef CPU_CAPABILITY
#error "line_aligned_buffer.h is for the per-capability kernel translation units"
#endif

#include <cstdint>
#include <vector>

namespace torch_convgrad::CPU_CAPABILITY {

template <typename A>
class LineAlignedBuffer {
 public:
  explicit LineAlignedBuffer(int64_t size) : storage_(size + kLine / sizeof(A), A(0)) {}
  A* data() {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    return reinterpret_cast<A*>((address + kLine - 1) & ~static_cast<std::uintptr_t>(kLine - 1));
  }

 private:
  static constexpr int64_t kLine = 64;
  std::vector<A> storage_;
};

}  // namespace torch_convgrad::CPU_CAPABILITY
