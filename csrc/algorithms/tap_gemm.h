// Products of row-shifted views of one matrix with another, for every kernel
// tap at once, computed directly on the strided operands (no BLAS packing of
// the long row axis). The gemm algorithm's inner loop.
#pragma once

#include <cstdint>

namespace torch_convgrad {

// What a and b hold; the products are computed in float32 whatever it is.
enum class TapElement { Float, Half, BFloat16 };

// out[t][c][o] (+)= sum_{r < rows} a[(offsets[t] + r) * lda + c] * b[r * ldb + o]
// for t < taps, c < channels_a, o < channels_b: a is row-major with row stride
// lda >= channels_a, b with ldb >= channels_b (offsets[t] >= 0), out is
// contiguous (taps, channels_a, channels_b). `accumulate` false overwrites out,
// true adds to it. Each element is summed over r in increasing order, so the
// result does not depend on the thread count. a and b hold `element`s, read
// as float32; out is float32.
void tap_products(TapElement element, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t rows,
                  const int64_t* offsets, int64_t taps, int64_t channels_a, int64_t channels_b, float* out,
                  bool accumulate);

}  // namespace torch_convgrad
