// 16 x 16 transpositions of 32-bit units in AVX-512 registers, for the
// per-capability kernels' AVX-512 builds (depthwise_kernel.h,
// tap_gemm_kernel.h): of rows already in registers, and of rows loaded from
// memory. In a namespace of the capability's, like LineAlignedBuffer, so that
// no other build's copy can serve it.
#pragma once

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

namespace torch_convgrad::CPU_CAPABILITY {

// The low (or high) 64-bit units of each 128-bit lane of a and b, interleaved.
// (A function, not a lambda: GCC compiles a lambda's conversion to a
// function pointer without the target pragma's ISA and warns that the ABI of
// its vector return changes.)
inline __m512 unpack_pairs(__m512 a, __m512 b, bool high) {
  const __m512d a64 = _mm512_castps_pd(a), b64 = _mm512_castps_pd(b);
  return _mm512_castpd_ps(high ? _mm512_unpackhi_pd(a64, b64) : _mm512_unpacklo_pd(a64, b64));
}

// Within each 128-bit lane k, the 4 x 4 block of rows[0..3] transposed:
// out[j] lane k holds unit 4 * k + j of rows[0..3], in order. out may be
// rows.
inline void transpose_within_lanes(const __m512* rows, __m512* out) {
  const __m512 low01 = _mm512_unpacklo_ps(rows[0], rows[1]), high01 = _mm512_unpackhi_ps(rows[0], rows[1]);
  const __m512 low23 = _mm512_unpacklo_ps(rows[2], rows[3]), high23 = _mm512_unpackhi_ps(rows[2], rows[3]);
  out[0] = unpack_pairs(low01, low23, false);
  out[1] = unpack_pairs(low01, low23, true);
  out[2] = unpack_pairs(high01, high23, false);
  out[3] = unpack_pairs(high01, high23, true);
}

// columns[j] = lane j of rows[0..15], in registers: a 16 x 16 transpose of
// 32-bit units. Overwrites rows.
inline void transpose_registers(__m512 (&rows)[16], __m512 (&columns)[16]) {
  // rows[4 * i + j] lane k then holds column 4 * k + j of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) transpose_within_lanes(rows + 4 * i, rows + 4 * i);
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

// columns[j] lane c = 32-bit unit j of row c, rows `row_bytes` apart from
// `src`, for c, j < 16: the same transpose with its 128-bit lane moves done
// by the loads. Each register gathers one 4-lane chunk of four rows
// (vinsertf32x4 from memory runs on either of two ports, where vshuff32x4
// has one), then 4 x 4 blocks transpose within lanes: 32 single-port shuffles
// where transpose_registers has 64. The depthwise kernel's staging ran
// 1.02-1.05x as fast so (Cascade Lake); gemm's transposition, which reads
// rows from memory with prefetches and masks its edges, measured no faster
// (0.93-1.0x) and keeps transpose_registers.
inline void load_transposed(const void* src, int64_t row_bytes, __m512 (&columns)[16]) {
  const auto chunk = [&](int64_t row, int p) {
    return _mm_loadu_ps(reinterpret_cast<const float*>(static_cast<const char*>(src) + row * row_bytes) + 4 * p);
  };
  for (int p = 0; p < 4; ++p) {
    __m512 rows[4];
    for (int i = 0; i < 4; ++i) {
      // Lane q: row 4q + i's columns 4p .. 4p + 3.
      __m512 row = _mm512_castps128_ps512(chunk(i, p));
      row = _mm512_insertf32x4(row, chunk(4 + i, p), 1);
      row = _mm512_insertf32x4(row, chunk(8 + i, p), 2);
      rows[i] = _mm512_insertf32x4(row, chunk(12 + i, p), 3);
    }
    transpose_within_lanes(rows, columns + 4 * p);
  }
}

}  // namespace torch_convgrad::CPU_CAPABILITY

#endif
