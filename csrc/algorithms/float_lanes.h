// Loads of 16 float32 lanes from f32, bf16 and f16 data, whole or masked,
// for the per-capability kernels' AVX-512 builds (depthwise_kernel.h,
// tap_gemm_kernel.h). In a namespace of the capability's, like
// LineAlignedBuffer, so that no other build's copy can serve it.
#pragma once

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace torch_convgrad::CPU_CAPABILITY {

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

}  // namespace torch_convgrad::CPU_CAPABILITY

#endif
