// Included first by the per-capability kernels' *_avx2.cpp and *_avx512.cpp
// files, through avx2_target.h and avx512_target.h: what they need from the
// standard library and c10, compiled for the baseline before the target
// pragma. The linker keeps one copy of each inline function for the whole
// library, so a copy compiled for AVX2 could run on a CPU without it; and GCC
// 13 refuses to inline std::allocator's always_inline members, if compiled
// for AVX2, into implicit destructors it compiles for the baseline.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
