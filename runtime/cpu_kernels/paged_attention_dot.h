// The vector path's bf16 precision on CPUs with AVX512-BF16 but no AMX (paged_attention.cpp includes
// it inside its anonymous namespace; run_tile's DOT variant): a block's scores from bf16 dot-product
// instructions (vdpbf16ps), the softmax and the value sums as at float32 precision.
//
// Q and K are rounded once to bf16 (nearest even), as on the AMX path's bf16 precision; one
// instruction multiplies 16 pairs of dims (two bf16 words a 32-bit lane) with float32 sums, twice
// the products of a float32 fused multiply-add. A state's score for a key is one fixed order of
// them (dot_scores_rows' comment), computed by rows for a decode's few states and by columns from
// a block's K packed once for a prefill's many: the same bits either way, a function of the row's
// own q and k only, so batch invariance holds as elsewhere. V stays float32 (in the formats that
// take this path it is the qkv layer's bf16 output, exact).
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define JUMPGATE_BF16_DOT 1

constexpr int64_t COLUMN_STATES = 8;  // states of a block at or above which the scores run by columns

// q's D floats as D / 2 words of bf16 pairs (dims 2p, 2p + 1 in word p); D a multiple of 32.
inline void pack_query(const float* q, int64_t D, uint32_t* out) {
  for (int64_t d = 0; d < D; d += 32)
    _mm512_storeu_si512(out + d / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + d + 16), _mm512_loadu_ps(q + d)));
}

// A block's 32 keys (rows kp[j], D floats each) as pair words by column, kt[p * BLK + j]: each
// key's pairs made as a row, then 16 x 16 transposes.
inline void pack_keys(const float* const* kp, int64_t D, uint32_t* kt) {
  for (int64_t p0 = 0; p0 < D / 2; p0 += 16)
    for (int j0 = 0; j0 < BLK; j0 += 16) {
      vu rows[16];
      for (int j = 0; j < 16; ++j) {
        const float* k = kp[j0 + j] + 2 * p0;
        const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(k + 16), _mm512_loadu_ps(k));
        std::memcpy(&rows[j], &w, sizeof rows[j]);
      }
      transpose16(rows);
      for (int p = 0; p < 16; ++p) std::memcpy(kt + (p0 + p) * BLK + j0, &rows[p], sizeof rows[p]);
    }
}

// A state's score for key j, in one fixed order: lane l of a 16-word vector sums the pairs l, l + 16,
// l + 32 ... (one dot-product instruction per 16 pairs, in order), then the lanes are summed in
// hsum's tree; times scale. Both functions below compute exactly this.

// By rows (few states: a decode's query heads): each key's pairs made where they are used (the K
// rows stream from memory as on the float32 path) for all N states, in lanes, then reduce_lanes
// turns 16 keys' vectors into their 16 sums.
template <int N>
inline void dot_scores_rows(const uint32_t* qp, const float* const* kp, int64_t D, float scale, float* out) {
  vf dots[N][16];
  for (int j0 = 0; j0 < BLK; j0 += 16) {
    for (int jj = 0; jj < 16; ++jj) {
      const float* k = kp[j0 + jj];
      __m512 d[N];
      for (int s = 0; s < N; ++s) d[s] = _mm512_setzero_ps();
      for (int64_t p = 0; p < D / 2; p += 16) {
        const __m512bh w = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(k + 2 * p + 16), _mm512_loadu_ps(k + 2 * p));
        for (int s = 0; s < N; ++s) d[s] = _mm512_dpbf16_ps(d[s], w, (__m512bh)_mm512_loadu_si512(qp + s * D / 2 + p));
      }
      for (int s = 0; s < N; ++s) std::memcpy(&dots[s][jj], &d[s], sizeof d[s]);
    }
    for (int s = 0; s < N; ++s) store(out + s * BLK + j0, reduce_lanes(dots[s]) * scale);
  }
}

// By columns (many states: a prefill's rows), from pack_keys' words: 16 keys in lanes, one vector
// per pair lane l, summed in the same tree across those 16 vectors; N states share each K load.
template <int N>
inline void dot_scores_columns(const uint32_t* qp, const uint32_t* kt, int64_t D, float scale, float* out) {
  for (int j0 = 0; j0 < BLK; j0 += 16) {
    // lane l's sum for the N states: its pairs l, l + 16, ... in order
    const auto lane = [&](int l, __m512* t) {
      for (int s = 0; s < N; ++s) t[s] = _mm512_setzero_ps();
      for (int64_t p = l; p < D / 2; p += 16) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + p * BLK + j0);
        for (int s = 0; s < N; ++s)
          t[s] = _mm512_dpbf16_ps(t[s], k, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[s * D / 2 + p])));
      }
    };
    // hsum's tree: A_i = t_i + t_(i+8), B_i = A_i + A_(i+4), (B_0 + B_2) + (B_1 + B_3)
    const auto a = [&](int i, __m512* out) {
      __m512 x[N], y[N];
      lane(i, x), lane(i + 8, y);
      for (int s = 0; s < N; ++s) out[s] = _mm512_add_ps(x[s], y[s]);
    };
    const auto b = [&](int i, __m512* out) {
      __m512 x[N], y[N];
      a(i, x), a(i + 4, y);
      for (int s = 0; s < N; ++s) out[s] = _mm512_add_ps(x[s], y[s]);
    };
    __m512 b0[N], b1[N], b2[N], b3[N];
    b(0, b0), b(2, b2);
    for (int s = 0; s < N; ++s) b0[s] = _mm512_add_ps(b0[s], b2[s]);
    b(1, b1), b(3, b3);
    for (int s = 0; s < N; ++s) {
      const __m512 r = _mm512_add_ps(b0[s], _mm512_add_ps(b1[s], b3[s]));
      _mm512_storeu_ps(out + s * BLK + j0, _mm512_mul_ps(r, _mm512_set1_ps(scale)));
    }
  }
}

// The scores of n consecutive states (q pairs D / 2 words apart) into out[s * BLK + j]: by columns
// where enough states share the block to pay for packing it (into kt, once: `packed`).
inline void dot_scores(const uint32_t* qp, const float* const* kp, uint32_t* kt, bool& packed, int64_t D, float scale,
                       float* out, int64_t n) {
  if (n < COLUMN_STATES) {  // at most 7 states: 4 at a time, then the rest
    int64_t s = 0;
    for (; s + 4 <= n; s += 4) dot_scores_rows<4>(qp + s * D / 2, kp, D, scale, out + s * BLK);
    switch (n - s) {
      case 3: return dot_scores_rows<3>(qp + s * D / 2, kp, D, scale, out + s * BLK);
      case 2: return dot_scores_rows<2>(qp + s * D / 2, kp, D, scale, out + s * BLK);
      case 1: return dot_scores_rows<1>(qp + s * D / 2, kp, D, scale, out + s * BLK);
      default: return;
    }
  }
  if (!packed) pack_keys(kp, D, kt), packed = true;
  int64_t s = 0;
  for (; s + 4 <= n; s += 4) dot_scores_columns<4>(qp + s * D / 2, kt, D, scale, out + s * BLK);
  for (; s < n; ++s) dot_scores_columns<1>(qp + s * D / 2, kt, D, scale, out + s * BLK);
}

#endif  // AVX512-BF16
