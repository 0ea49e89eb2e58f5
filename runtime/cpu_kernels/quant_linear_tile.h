// The vector path's tile of quant_linear.cpp: R rows x C column vectors of 16 over every group of
// inputs, the codes as bf16 words in vdpbf16ps, then the group's scale and offset steps. Kept apart
// from torch so that bench/probes/tile_ceiling.cpp times this very code (`quant_linear_bench
// --tile-ceiling`). Included where AVX512-BF16 is on (quant_linear.cpp's guard); quant_linear.cpp
// says why the codes run this way and what keeps a row's bits independent of the batch.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace jumpgate::quant_tile {

constexpr int GROUP = 32;             // inputs per (scale, offset); int8_linear also takes 16 (G)
constexpr int64_t COLS = 16;          // output columns a vector holds
constexpr int ROWS = 8;               // rows a tile step runs together (8 timed faster than 6, 10, 12)
constexpr int WORDS = 2 * COLS;       // bf16 words of one vdpbf16ps operand

// A tile's weights as vdpbf16ps operands: the two pairs of quad j of column vector c.
// Expanded: codes already expanded into [K/2][C][32 words] (many rows share them);
// Packed: expanded from the packed bytes at each use (a few rows: no buffer round trip).
// Both give the same words, so which one runs does not change a bit of the result.
template <int C>
struct Expanded {
  const uint16_t* w;
  void get(int64_t j, int c, __m512i& first, __m512i& second) const {
    first = _mm512_loadu_si512(w + (2 * j * C + c) * WORDS);
    second = _mm512_loadu_si512(w + ((2 * j + 1) * C + c) * WORDS);
  }
};

// A column vector's scale d (and, S = 2, offset o) for one group, as 16 float32 lanes. Stored as
// float32 (scale, offset), or as a Q4_1 block's own fp16 (d, m) (ScaleHalf): half the bytes, which a
// decode streams from memory with the codes. The offset for codes 128 + q is then
// o = (m + 8d) - 136d, each step one float32 rounding (8d and 136d are exact), as linear.py
// computes it for float32 storage: the same bits either way.
using ScaleHalf = uint16_t;
template <int S>
inline void scale_and_offset(const float* so, __m512& d, __m512& o) {
  d = _mm512_loadu_ps(so);
  o = S == 2 ? _mm512_loadu_ps(so + COLS) : _mm512_setzero_ps();
}
template <int S>
inline void scale_and_offset(const ScaleHalf* so, __m512& d, __m512& o) {
  static_assert(S == 2, "fp16 storage holds Q4_1's (d, m)");
  d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(so)));
  const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(so + COLS)));
  o = _mm512_fnmadd_ps(_mm512_set1_ps(136.0f), d, _mm512_fmadd_ps(_mm512_set1_ps(8.0f), d, m));
}
// Q6_K's scales alone (Centered6, stored as float32): w = (q - 32) d, so the offset for the codes
// 128 + q is -160 d, made here instead of streamed (2 bits a weight in groups of 16, not 4); exact,
// as d (an fp16 d times an int8 sc) has at most 18 significant bits: the bits of a stored offset.
struct Centered6 {
  float d;
};
// scale_offset entries stored per group: S, but one for Centered6 (its offset is made, not read)
template <int S, typename Scale>
constexpr int64_t STORED = std::is_same_v<Scale, Centered6> ? 1 : S;
template <int S>
inline void scale_and_offset(const Centered6* so, __m512& d, __m512& o) {
  static_assert(S == 2, "Centered6 makes an offset");
  d = _mm512_loadu_ps(reinterpret_cast<const float*>(so));
  o = _mm512_mul_ps(_mm512_set1_ps(-160.0f), d);
}

// R rows x C column vectors over every group. x: R rows of bf16 inputs (stride ldx); sums: the
// rows' per-group input sums (stride groups; unused without offsets); scale_offset:
// [C][groups][S][16] (the tile's column vectors' scales, then offsets where S = 2); out: bf16
// rows (stride ldy).
template <int R, int C, int S, int G, typename Weights, typename Scale>
void tile_rows(const Weights& w, const uint16_t* x, int64_t ldx, const float* sums, int64_t groups,
               const Scale* scale_offset, uint16_t* out, int64_t ldy) {
  __m512 y[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r][c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = g * (G / 4); j < (g + 1) * (G / 4); ++j) {
      __m512i first[C], second[C];
      for (int c = 0; c < C; ++c) w.get(j, c, first[c], second[c]);
      for (int r = 0; r < R; ++r) {
        int32_t pair[2];
        std::memcpy(pair, x + r * ldx + 4 * j, sizeof pair);
        const __m512bh x0 = (__m512bh)_mm512_set1_epi32(pair[0]), x1 = (__m512bh)_mm512_set1_epi32(pair[1]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)first[c], x0);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)second[c], x1);
      }
    }
    for (int c = 0; c < C; ++c) {
      __m512 d, o;
      scale_and_offset<S>(scale_offset + (c * groups + g) * STORED<S, Scale> * COLS, d, o);
      for (int r = 0; r < R; ++r) y[r][c] = _mm512_fmadd_ps(acc[r][c], d, y[r][c]);
      if constexpr (S == 2) {
        for (int r = 0; r < R; ++r) y[r][c] = _mm512_fmadd_ps(o, _mm512_set1_ps(sums[r * groups + g]), y[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)  // round to nearest even, as c10::BFloat16 does
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldy + c * COLS), (__m256i)_mm512_cvtneps_pbh(y[r][c]));
}

// Every row over one tile's weights, ROWS at a time, the rest in one smaller step.
template <int C, int S, int G, typename Weights, typename Scale>
void tile(const Weights& w, const uint16_t* x, int64_t M, int64_t K, const float* sums, const Scale* scale_offset,
          int64_t N, uint16_t* out) {
  const int64_t groups = K / G;
  auto step = [&](auto rows, int64_t m) {
    tile_rows<decltype(rows)::value, C, S, G>(w, x + m * K, K, sums + m * groups, groups, scale_offset, out + m * N, N);
  };
  int64_t m = 0;
  for (; m + ROWS <= M; m += ROWS) step(std::integral_constant<int, ROWS>{}, m);
  switch (M - m) {
    case 7: step(std::integral_constant<int, 7>{}, m); break;
    case 6: step(std::integral_constant<int, 6>{}, m); break;
    case 5: step(std::integral_constant<int, 5>{}, m); break;
    case 4: step(std::integral_constant<int, 4>{}, m); break;
    case 3: step(std::integral_constant<int, 3>{}, m); break;
    case 2: step(std::integral_constant<int, 2>{}, m); break;
    case 1: step(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

}  // namespace jumpgate::quant_tile
