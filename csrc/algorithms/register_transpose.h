// A 16 x 16 transposition of 32-bit units in AVX-512 registers, for the
// per-capability kernels' AVX-512 builds (depthwise_kernel.h,
// tap_gemm_kernel.h). In a namespace of the capability's, like
// LineAlignedBuffer, so that no other build's copy can serve it.
#pragma once

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

namespace torch_convgrad::CPU_CAPABILITY {

// columns[j] = lane j of rows[0..15], in registers: a 16 x 16 transpose of
// 32-bit units. Overwrites rows.
inline void transpose_registers(__m512 (&rows)[16], __m512 (&columns)[16]) {
  __m512 pairs[16];
  // Within each 128-bit lane k: pairs of rows interleaved, then quads, so
  // that rows[4 * i + j] lane k holds column 4 * k + j of rows 4i..4i+3.
  for (int i = 0; i < 8; ++i) {
    pairs[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
    pairs[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
  }
  const auto quad = [](__m512 a, __m512 b, bool high) {
    const __m512d a64 = _mm512_castps_pd(a), b64 = _mm512_castps_pd(b);
    return _mm512_castpd_ps(high ? _mm512_unpackhi_pd(a64, b64) : _mm512_unpacklo_pd(a64, b64));
  };
  for (int i = 0; i < 4; ++i) {
    rows[4 * i] = quad(pairs[4 * i], pairs[4 * i + 2], false);
    rows[4 * i + 1] = quad(pairs[4 * i], pairs[4 * i + 2], true);
    rows[4 * i + 2] = quad(pairs[4 * i + 1], pairs[4 * i + 3], false);
    rows[4 * i + 3] = quad(pairs[4 * i + 1], pairs[4 * i + 3], true);
  }
  // Column 4 * k + j gathers lane k of rows[j], rows[4 + j], rows[8 + j], rows[12 + j].
  for (int j = 0; j < 4; ++j) {
    const __m512 even_low = _mm512_shuffle_f32x4(rows[j], rows[4 + j], 0x88);
    const __m512 odd_low = _mm512_shuffle_f32x4(rows[j], rows[4 + j], 0xdd);
    const __m512 even_high = _mm512_shuffle_f32x4(rows[8 + j], rows[12 + j], 0x88);
    const __m512 odd_high = _mm512_shuffle_f32x4(rows[8 + j], rows[12 + j], 0xdd);
    columns[j] = _mm512_shuffle_f32x4(even_low, even_high, 0x88);
    columns[4 + j] = _mm512_shuffle_f32x4(odd_low, odd_high, 0x88);
    columns[8 + j] = _mm512_shuffle_f32x4(even_low, even_high, 0xdd);
    columns[12 + j] = _mm512_shuffle_f32x4(odd_low, odd_high, 0xdd);
  }
}

}  // namespace torch_convgrad::CPU_CAPABILITY

#endif
