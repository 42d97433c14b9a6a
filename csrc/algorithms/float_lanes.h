// Loads of float32 lanes from f32, bf16 and f16 data for the per-capability
// kernels' AVX-512 builds (16 lanes, whole or masked) and AVX2 builds (8
// lanes, whole or the first few) (depthwise_kernel.h, tap_gemm_kernel.h). In
// a namespace of the capability's, like LineAlignedBuffer, so that no other
// build's copy can serve it.
#pragma once

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace torch_convgrad::CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512)

// The first `count` (at most 16) lanes.
inline __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1); }

// 16 elements as float lanes (F16C, and bf16 as the upper half of a float),
// or the lanes of `valid` only (the others 0, not read).
inline __m512 load_floats(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_floats(const float* p, __mmask16 valid) { return _mm512_maskz_loadu_ps(valid, p); }
inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load_floats(const c10::BFloat16* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load_floats(const c10::BFloat16* p, __mmask16 valid) {
  return widen_bf16(_mm256_maskz_loadu_epi16(valid, p));
}
inline __m512 load_floats(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load_floats(const c10::Half* p, __mmask16 valid) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, p));
}
#else
// 8 elements as float lanes (F16C, and bf16 as the upper half of a float).
inline __m256 load_floats(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_floats(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline __m256 load_floats(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The first `count` (below 8) elements, the other lanes 0 and not read (any
// count: 16-bit ones are copied, since AVX2 masks loads by 32 bits only).
template <typename T>
inline __m256 load_first_floats(const T* p, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    const __m256i lanes =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, lanes);
  } else {
    T part[8];
    std::memset(static_cast<void*>(part), 0, sizeof(part));
    std::memcpy(static_cast<void*>(part), p, count * sizeof(T));
    return load_floats(part);
  }
}
#endif

}  // namespace torch_convgrad::CPU_CAPABILITY

#endif
