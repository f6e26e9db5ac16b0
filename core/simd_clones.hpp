#pragma once
/// AF_SIMD_CLONES before a function with a hot elementwise loop builds it
/// twice on x86-64, for the baseline ISA (SSE2: 4 floats an instruction) and
/// for AVX2 (8), and the dynamic loader picks the one the CPU has (GCC and
/// Clang `target_clones`; one version on other platforms or compilers).
///
/// AVX2 without FMA on purpose: `avx2` does not enable fused multiply-add,
/// so `a * b + c` is still rounded twice and each float operation gives the
/// same bits in both versions. A job's parameters then do not depend on
/// which CPU its ps ran on, and the tests that hold a result to a reference
/// computed one float at a time hold on every CPU.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AF_SIMD_CLONES __attribute__((target_clones("default", "avx2")))
#else
#define AF_SIMD_CLONES
#endif
