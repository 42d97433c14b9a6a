// The transposition and the gather for any CPU (ATEN_CPU_CAPABILITY=default,
// or no AVX2); the tap products themselves run only on AVX2 CPUs.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "tap_gemm_kernel.h"

namespace torch_convgrad::tap_gemm_kernel::DEFAULT {

void transpose(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t columns, int64_t rows,
               int64_t element_size) {
  transpose_impl(src, src_ld, dst, dst_ld, columns, rows, element_size);
}

void gather(const void* src, int64_t src_ld, int64_t step, void* dst, int64_t dst_ld, int64_t count, int64_t rows,
            int64_t element_size) {
  gather_impl(src, src_ld, step, dst, dst_ld, count, rows, element_size);
}

void interleave(const uint16_t* const* rows, uint16_t* dst, int64_t columns, int64_t pairs) {
  interleave_impl(rows, dst, columns, pairs);
}

bool split(const uint16_t* half, int64_t count, uint16_t* high, uint16_t* low) {
  return split_impl(half, count, high, low);
}

}  // namespace torch_convgrad::tap_gemm_kernel::DEFAULT
