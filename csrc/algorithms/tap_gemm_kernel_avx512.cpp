// The tap-product kernel for AVX-512 machines: twice the AVX2 build's lanes
// and tile height, compiled the way ATen compiles its per-capability kernels.
#include "avx512_target.h"

#include "tap_gemm_kernel.h"

namespace torch_convgrad::tap_gemm_kernel::AVX512 {

void block(const Args& args, int64_t m_begin, int64_t m_end, int64_t o_begin, int64_t o_end,
           int64_t chunk_rows, bool pack_a) {
  block_impl(args, m_begin, m_end, o_begin, o_end, chunk_rows, pack_a);
}

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

}  // namespace torch_convgrad::tap_gemm_kernel::AVX512
