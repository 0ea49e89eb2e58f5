// W-lane float vectors (GCC vector extensions, no fast-math: every operation in the order
// written) shared by the CPU kernels: loads and stores, bf16 conversion, a fixed-tree lane sum,
// and a lane-wise expf. W is a register's width: 16 with AVX-512, else 8 (AVX2: 64-byte vectors
// without AVX-512 compile to stack spills, and the attention kernel spent its time in them). A build's
// arithmetic order follows its W, so results are the same for every batch and thread count on
// one machine, not across the two widths.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace jumpgate {

#if defined(__AVX512F__)
constexpr int W = 16;
#else
constexpr int W = 8;
#endif
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));
typedef uint32_t vu __attribute__((vector_size(W * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(W * sizeof(uint16_t))));
typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// A partial load or store copies n lanes with a variable-length memcpy, a library call: whole
// vectors take the plain path (a row's kernels call these for every chunk; the call was most of a
// decode step's norm and silu ops).
inline vf load_part(const float* p, int n) {
  if (n == W) return load(p);
  vf v = {};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}
inline void store_part(float* p, vf v, int n) {
  if (n == W) return store(p, v);
  std::memcpy(p, &v, n * sizeof(float));
}
inline vf splat(float x) { vf v = {}; return v + x; }

// bf16 -> fp32 is exact: the bits shifted up.
inline vf load_bf16(const c10::BFloat16* p, int n) {
  vh h = {};
  if (n == W) std::memcpy(&h, p, sizeof h); else std::memcpy(&h, p, n * sizeof(uint16_t));
  vu u = __builtin_convertvector(h, vu) << 16;
  vf v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// fp32 -> bf16, rounding to nearest even (finite inputs, as c10::BFloat16 does for them).
inline void store_bf16(c10::BFloat16* p, vf v, int n) {
  vu u;
  std::memcpy(&u, &v, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vh h = __builtin_convertvector(u, vh);
  if (n == W) std::memcpy(p, &h, sizeof h); else std::memcpy(p, &h, n * sizeof(uint16_t));
}

// Fixed tree: 16 -> 8 -> 4 -> 2 -> 1 (W = 16), or 8 -> 4 -> 2 -> 1.
inline float hsum(vf v) {
#if defined(__AVX512F__)
  vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  vf8 a = v;
#endif
  vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// Cephes expf (~1 ulp), lane-wise; x <= -87.4 gives exactly 0 (no libm call, so it vectorises).
inline vf exp_v(vf x) {
  const vf hi = splat(88.3762626647949f), lo = splat(-88.3762626647949f);
  x = x < hi ? x : hi;
  x = x > lo ? x : lo;
  vf fx = x * 1.44269504088896341f + 0.5f;
  vf t = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
  fx = t + __builtin_convertvector(t > fx, vf);  // floor: the mask is -1 where t rounded up
  x = x - fx * 0.693359375f;
  x = x - fx * -2.12194440e-4f;
  vf z = x * x;
  vf y = splat(1.9875691500e-4f);
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  vi e = (__builtin_convertvector(fx, vi) + 127) << 23;
  vf pow2;
  std::memcpy(&pow2, &e, sizeof pow2);
  return y * pow2;
}

#if defined(__AVX512F__)
// In place: r[i][j] <- r[j][i] (16 x 16 32-bit elements), one bit of the row and column index
// swapped per stage.
inline void transpose16(vu* r) {
#define JG_STAGE(d, ...)                                                                  \
  for (int i = 0; i < 16; ++i)                                                            \
    if (!(i & d)) {                                                                       \
      const vu a = r[i], b = r[i + d];                                                    \
      r[i] = __builtin_shufflevector(a, b, __VA_ARGS__);                                  \
      r[i + d] = JG_HI_##d;                                                               \
    }
#define JG_HI_1 __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31)
#define JG_HI_2 __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31)
#define JG_HI_4 __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31)
#define JG_HI_8 __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31)
  JG_STAGE(1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
  JG_STAGE(2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
  JG_STAGE(4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
  JG_STAGE(8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
#undef JG_STAGE
#undef JG_HI_1
#undef JG_HI_2
#undef JG_HI_4
#undef JG_HI_8
}
#endif

}  // namespace jumpgate
