// Included first by the *_avx512.cpp kernels: what follows it compiles for
// AVX-512 (F, BW, VL, DQ) with AVX2, FMA and F16C, which ATen's AVX512
// capability requires of the CPU.
#pragma once

#include "target_prelude.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
// GCC's target pragma does not define the ISA macros in C++; vec.h and
// sleef.h choose their 512-bit code by them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
// GCC's AVX-512 headers make their "undefined" vectors by initialising them
// from themselves (`__m512i __Y = __Y;`), which -Wuninitialized reports at
// every inlined use once those headers see the ISA macros above.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
