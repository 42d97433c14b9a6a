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
#include <algorithm>
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
// The first `count` (at most 8) lanes, as a mask of 32-bit lanes.
inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 halves (bf16 as the upper half of a float; F16C) as float lanes.
inline __m256 floats_of(const c10::BFloat16*, __m128i halves) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
inline __m256 floats_of(const c10::Half*, __m128i halves) { return _mm256_cvtph_ps(halves); }

// 8 elements as float lanes.
inline __m256 load_floats(const float* p) { return _mm256_loadu_ps(p); }
template <typename T>
inline __m256 load_floats(const T* p) {
  return floats_of(p, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The first `count` (at most 8) elements, the other lanes 0 and not read.
// AVX2 masks loads by 32 bits: 16-bit elements load in pairs, an odd last
// one on its own. (Copied into a buffer and reloaded as a vector, the load
// waited on the copy's stores: a third of the depthwise row staging's
// samples at stride 2, Zen 3.)
template <typename T>
inline __m256 load_first_floats(const T* p, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_maskload_ps(p, first_lanes(count));
  } else {
    const __m128i pair_index = _mm_setr_epi32(0, 1, 2, 3);
    const __m128i pairs = _mm_set1_epi32(static_cast<int>(count / 2));
    __m128i halves = _mm_maskload_epi32(reinterpret_cast<const int*>(p), _mm_cmpgt_epi32(pairs, pair_index));
    if (count % 2 == 1) {
      uint16_t last;
      std::memcpy(&last, p + count - 1, sizeof(last));
      halves = _mm_or_si128(halves, _mm_and_si128(_mm_set1_epi32(last), _mm_cmpeq_epi32(pairs, pair_index)));
    }
    return floats_of(p, halves);
  }
}

// The even and the odd ones of 16 elements (float: two vectors; bf16: 8
// 32-bit words), as float lanes: floats in two shuffles each, bf16 from the
// words' halves.
struct EvenOdd {
  __m256 even, odd;
};
// v's 64-bit units 0, 2, 1, 3. (A function, not a lambda: GCC compiles a
// lambda's conversion to a function pointer without the target pragma's ISA
// and warns that the ABI of its vector return changes.)
inline __m256 units_in_order(__m256 v) { return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8)); }
inline EvenOdd even_odd_floats(__m256 low, __m256 high) {
  // Within each 128-bit lane, then the lanes' 64-bit halves in order.
  return {units_in_order(_mm256_shuffle_ps(low, high, 0x88)), units_in_order(_mm256_shuffle_ps(low, high, 0xDD))};
}
inline EvenOdd even_odd_floats(const c10::BFloat16*, __m256i words) {
  return {_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))))};
}
// The same of the first `count` (at most 16; 16-bit: even) elements, the
// others not read. f16 is converted first (F16C) and split as f32: against
// splitting its 16-bit halves by packing them, MobileNetV2's stride-2 layer
// ran 1.03-1.05 times as fast (Zen 3, 2 threads, interleaved).
template <typename T>
inline EvenOdd load_even_odd_floats(const T* p, int64_t count = 16) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const auto* words = reinterpret_cast<const __m256i*>(p);
    if (count == 16) return even_odd_floats(p, _mm256_loadu_si256(words));
    return even_odd_floats(p, _mm256_maskload_epi32(reinterpret_cast<const int*>(p), first_lanes(count / 2)));
  } else {
    if (count == 16) return even_odd_floats(load_floats(p), load_floats(p + 8));
    return even_odd_floats(load_first_floats(p, std::min<int64_t>(count, 8)),
                           load_first_floats(p + 8, std::max<int64_t>(count - 8, 0)));
  }
}
// One element as a float (f16 by F16C: c10::Half converts by integer
// arithmetic and branches).
inline float float_of(const float* p) { return *p; }
inline float float_of(const c10::BFloat16* p) { return static_cast<float>(*p); }
inline float float_of(const c10::Half* p) { return _cvtsh_ss(p->x); }
#endif

}  // namespace torch_convgrad::CPU_CAPABILITY

#endif
