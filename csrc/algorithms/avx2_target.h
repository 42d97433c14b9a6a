// Included first by the *_avx2.cpp kernels: what follows it compiles for
// AVX2 + FMA + F16C, the capability ATen names AVX2.
#pragma once

#include "target_prelude.h"

#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// GCC's target pragma does not define the ISA macros in C++, and sleef.h
// (through vec.h) declares its 256-bit functions only under them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
