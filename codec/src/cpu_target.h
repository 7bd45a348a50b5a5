// Code compiled for a CPU feature set beyond the build's baseline, chosen at run time:
// DC_TARGET_PUSH("avx512f,avx512bw") ... DC_TARGET_POP around the functions that use them.
// Internal to the codec.
#pragma once

#define DC_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define DC_TARGET_PUSH(t) DC_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define DC_TARGET_POP DC_PRAGMA(clang attribute pop)
#else
#define DC_TARGET_PUSH(t) DC_PRAGMA(GCC push_options) DC_PRAGMA(GCC target(t))
#define DC_TARGET_POP DC_PRAGMA(GCC pop_options)
#endif
