// Included first by the *_avx2.cpp kernels: what follows it compiles for
// AVX2 + FMA + F16C, the capability ATen names AVX2.
//
// The standard library and c10's scalar types come before the target pragma,
// compiled for the baseline. The linker keeps one copy of each inline function
// for the whole library, so a copy compiled for AVX2 could run on a CPU
// without it; and GCC 13 refuses to inline std::allocator's always_inline
// members, if compiled for AVX2, into implicit destructors it compiles for
// the baseline.
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
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// GCC's target pragma does not define the ISA macros in C++, and sleef.h
// (through vec.h) declares its 256-bit functions only under them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
