// The AMX path's bf16 precision (paged_attention_tile_loop.h includes it, inside paged_attention.cpp's
// anonymous namespace): Q and K rounded once to bf16 (nearest even), a score one bf16 tile product
// with float32 sums, where the float32 precision splits both into two words (three products). The
// softmax weights P stay two words (hi + lo, two products a value sum, as at float32 precision):
// rounding them to one word cost greedy agreement with the fp32 reference (96.9% against 97.7% on
// tests/runtime/model/test_weight_formats.py's long-context cases; two words: 97.7%).
//
// Its chunk of 16 states runs in columns: the scores stay as the tile computes them, S^T = K Q^T
// (a row per key, a lane per state), so the online softmax is 16 states wide in every vector
// instruction (max, exp and sum over the block's 32 key rows, no transposes, no horizontal
// reductions, no per-state scalar work), and the values are summed as O^T = V^T P^T: P^T's
// word pairs come straight from two key rows, V^T is made once per block. The running output is
// kept [head dim][state], rescaled 16 states at a time.
//
// Batch invariance as on the other paths: a tile product's output element reads only its own row
// and column, and every other operation is lane-wise, so a state's lane computes the same bits
// whichever states share its chunk; lanes past the chunk's states are never stored. The sum over
// keys and the max are in one fixed order, the same for every row.
//
// A chunk of few states (ROW_STATES or fewer: a decode's query heads) runs fold_rows instead, a row
// per state as the float32 precision does, which would spend 16 lanes on 3 states in columns. It
// makes the same bits: the same tile products for the scores, the same lane-wise operations (the
// sum over keys is hsum's tree of the two 16-key halves, which is fold_columns' tree), the same
// fused multiply-adds, and O = P V multiplies the same word pairs as O^T = V^T P^T in the same
// order (tests/runtime/attention/test_cpu_attention.py: a row alone and in a batch, bitwise).
#pragma once

#include "paged_attention_tiles.h"  // BlockKV, States, the tile registers: the float32 precision's parts

#if defined(JUMPGATE_AMX)

// V^T of one block as A operands: [D][16 key pairs] words (a row per head dim, the block's 32
// keys in order), from the [16 key pairs][D] pairs that BlockKV::fill makes: one 16 x 16 transpose
// of 32-bit pairs per 16 dims.
inline void transpose_values(const uint32_t* pairs, uint32_t* vt, int64_t D) {
  for (int64_t c = 0; c < D; c += 16) {
    vu rows[16];
    for (int r = 0; r < 16; ++r) std::memcpy(&rows[r], &pairs[r * D + c], sizeof rows[r]);
    transpose16(rows);
    for (int d = 0; d < 16; ++d) std::memcpy(&vt[(c + d) * 16], &rows[d], sizeof rows[d]);
  }
}

constexpr int ROW_STATES = 4;

// The running max's rescale of a state's sums: exp(m_old - m_new), 0 for its first block
inline vf rescale(vf m_old, vf m_new) {
  const vf ninf = splat(-std::numeric_limits<float>::infinity());
  const vf e = exp_tiles(m_old - m_new);
  return m_old == ninf ? splat(0.f) : e;
}

// One block for states st0 .. st0 + n - 1 (n <= 16) of `s` (acc as [D][stride]), state lane k
// seeing the block's first valid[k] keys; qt_hi holds Q^T's bf16 words, kv.k_hi K's, vt V^T's.
void fold_columns(const Args& a, States& s, const BlockKV& kv, const uint32_t* vt, int64_t st0, int n,
                  const vi& valid) {
  const int64_t D = a.dim, stride = s.stride;
  alignas(64) float scores[BLK][TS];  // [key][state]
  // B operands: [key pair][state], a state's two keys' hi words, and their lo words
  alignas(64) uint32_t pt[TS][TS], pt_lo[TS][TS];
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t dc = 0; dc < D / 32; ++dc) {
    _tile_loadd(4, &s.qt_hi[dc * 16 * stride + st0], stride * 4);
    _tile_loadd(2, &kv.k_hi[dc * 32], D * 2);
    _tile_loadd(6, &kv.k_hi[16 * D + dc * 32], D * 2);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 6, 4);
  }
  _tile_stored(0, &scores[0][0], TS * 4);
  _tile_stored(1, &scores[16][0], TS * 4);
  const __mmask16 lanes = static_cast<__mmask16>((1u << n) - 1);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i lim = (__m512i)valid;
  bool all = true;  // most blocks: every key visible to every state
  for (int k = 0; k < n; ++k) all = all && valid[k] == BLK;
  __m512 x[BLK];
  __m512 mx = neg_inf;
  for (int j = 0; j < BLK; ++j) {
    x[j] = _mm512_mul_ps(_mm512_load_ps(scores[j]), _mm512_set1_ps(a.scale));
    if (!all) x[j] = _mm512_mask_mov_ps(neg_inf, _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(j)), x[j]);
    mx = _mm512_max_ps(mx, x[j]);
  }
  const __m512 m_old = _mm512_loadu_ps(s.m + st0), m_new = _mm512_max_ps(m_old, mx);
  for (int j = 0; j < BLK; ++j) {
    __m512 p = (__m512)exp_tiles((vf)_mm512_sub_ps(x[j], m_new));
    if (!all) p = _mm512_maskz_mov_ps(_mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(j)), p);  // adds nothing
    x[j] = p;
  }
  // the sum over keys as a fixed tree (halves, then quarters, ...): short dependency chains
  __m512 t[BLK / 2];
  for (int j = 0; j < BLK / 2; ++j) t[j] = _mm512_add_ps(x[j], x[j + BLK / 2]);
  for (int w = BLK / 4; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) t[j] = _mm512_add_ps(t[j], t[j + w]);
  // exp(0) is exactly 1, so a state whose max stayed keeps its sums; a state's first block has none
  const __m512 alpha = (__m512)rescale((vf)m_old, (vf)m_new);
  _mm512_mask_storeu_ps(s.l + st0, lanes, _mm512_fmadd_ps(_mm512_loadu_ps(s.l + st0), alpha, t[0]));
  _mm512_mask_storeu_ps(s.m + st0, lanes, m_new);
  alignas(64) static constexpr uint16_t PAIRS[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(PAIRS);
  for (int r = 0; r < TS; ++r) {  // keys 2r and 2r + 1 of each state, as its word pair
    __m512i hi, lo;
    split_words(x[2 * r], x[2 * r + 1], hi, lo);
    _mm512_store_si512(pt[r], _mm512_permutexvar_epi16(pairs, hi));
    _mm512_store_si512(pt_lo[r], _mm512_permutexvar_epi16(pairs, lo));
  }
  _tile_loadd(7, pt, TS * 4);
  _tile_loadd(6, pt_lo, TS * 4);
  // O^T += V^T P^T, 32 head dims at a time, then each dim's row of states rescaled and summed
  alignas(64) float pv[2][TS][TS];  // [dims half][dim][state]
  float* const acc = s.acc;
  for (int64_t dt = 0; dt < D / 16; dt += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, &vt[dt * 16 * 16], 64);
    _tile_loadd(3, &vt[(dt + 1) * 16 * 16], 64);
    _tile_dpbf16ps(0, 2, 7);
    _tile_dpbf16ps(1, 3, 7);
    _tile_dpbf16ps(0, 2, 6);
    _tile_dpbf16ps(1, 3, 6);
    _tile_stored(0, &pv[0][0][0], TS * 4);
    _tile_stored(1, &pv[1][0][0], TS * 4);
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < TS; ++d) {
        float* o = &acc[((dt + h) * 16 + d) * stride + st0];
        _mm512_mask_storeu_ps(o, lanes, _mm512_fmadd_ps(_mm512_loadu_ps(o), alpha, _mm512_load_ps(pv[h][d])));
      }
  }
}

// The same block for n <= ROW_STATES states, a row per state (the scores transposed): the same bits
// as fold_columns (see the top of this file), without 16 lanes of work for a decode's few states.
void fold_rows(const Args& a, States& s, const BlockKV& kv, int64_t st0, int n, const vi& valid) {
  const int64_t D = a.dim, stride = s.stride;
  alignas(64) float scores[BLK][TS];
  alignas(64) uint32_t p_hi[TS][TS], p_lo[TS][TS];  // A operands: states x key pairs
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t dc = 0; dc < D / 32; ++dc) {
    _tile_loadd(4, &s.qt_hi[dc * 16 * stride + st0], stride * 4);
    _tile_loadd(2, &kv.k_hi[dc * 32], D * 2);
    _tile_loadd(6, &kv.k_hi[16 * D + dc * 32], D * 2);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 6, 4);
  }
  _tile_stored(0, &scores[0][0], TS * 4);
  _tile_stored(1, &scores[16][0], TS * 4);
  vu rows[2][TS];
  std::memcpy(rows[0], &scores[0][0], sizeof rows[0]);
  std::memcpy(rows[1], &scores[16][0], sizeof rows[1]);
  transpose16(rows[0]);
  transpose16(rows[1]);
  const vf neg_inf = splat(-std::numeric_limits<float>::infinity());
  const vi key_lo = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, key_hi = key_lo + 16;
  float alpha[TS];
  for (int i = 0; i < n; ++i) {
    vf s0, s1;
    std::memcpy(&s0, &rows[0][i], sizeof s0);
    std::memcpy(&s1, &rows[1][i], sizeof s1);
    s0 = s0 * a.scale;
    s1 = s1 * a.scale;
    const bool all = valid[i] == BLK;
    const vi lim = splat_i(valid[i]);
    if (!all) {
      s0 = key_lo < lim ? s0 : neg_inf;
      s1 = key_hi < lim ? s1 : neg_inf;
    }
    const float m_old = s.m[st0 + i], m_new = std::max(m_old, hmax(max_v(s0, s1)));
    vf p0 = exp_tiles(s0 - m_new), p1 = exp_tiles(s1 - m_new);
    if (!all) {
      p0 = key_lo < lim ? p0 : splat(0.f);
      p1 = key_hi < lim ? p1 : splat(0.f);
    }
    alpha[i] = rescale(splat(m_old), splat(m_new))[0];
    s.l[st0 + i] = std::fma(s.l[st0 + i], alpha[i], hsum(p0 + p1));
    s.m[st0 + i] = m_new;
    __m512i h, l;
    split_words((__m512)p0, (__m512)p1, h, l);  // 32 keys in order: an A row of 16 key pairs
    _mm512_store_si512(p_hi[i], h);
    _mm512_store_si512(p_lo[i], l);
  }
  for (int i = n; i < TS; ++i) {  // rows of no state: zeros, whose sums are never stored
    std::memset(p_hi[i], 0, sizeof p_hi[i]);
    std::memset(p_lo[i], 0, sizeof p_lo[i]);
  }
  _tile_loadd(6, p_hi, TS * 4);
  _tile_loadd(7, p_lo, TS * 4);
  alignas(64) float pv[2][TS][W];  // [dims half][state][dim]
  for (int64_t dt = 0; dt < D / 16; dt += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, &kv.v[dt * 16], D * 4);
    _tile_loadd(4, &kv.v[dt * 16 + 16], D * 4);
    _tile_dpbf16ps(0, 6, 2);
    _tile_dpbf16ps(1, 6, 4);
    _tile_dpbf16ps(0, 7, 2);
    _tile_dpbf16ps(1, 7, 4);
    _tile_stored(0, &pv[0][0][0], W * 4);
    _tile_stored(1, &pv[1][0][0], W * 4);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < n; ++i)
        for (int d = 0; d < 16; ++d) {
          float& o = s.acc[((dt + h) * 16 + d) * stride + st0 + i];
          o = std::fma(o, alpha[i], pv[h][i][d]);
        }
  }
}

#endif  // JUMPGATE_AMX
