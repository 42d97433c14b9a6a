// The tap-product kernel for AVX2 + FMA + F16C machines, compiled the way ATen
// compiles its per-capability kernels.
#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// GCC's target pragma does not define the ISA macros in C++, and the
// intrinsics headers pulled in by other includes may test them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1

#include "tap_gemm_kernel.h"

namespace torch_convgrad::tap_gemm_kernel::AVX2 {

void block(const Args& args, int64_t m_begin, int64_t m_end, int64_t o_begin, int64_t o_end,
           int64_t chunk_rows, bool pack_a) {
  block_impl(args, m_begin, m_end, o_begin, o_end, chunk_rows, pack_a);
}

void transpose(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows,
               int64_t element_size) {
  transpose_impl(src, src_ld, dst, dst_ld, columns, rows, element_size);
}

}  // namespace torch_convgrad::tap_gemm_kernel::AVX2
