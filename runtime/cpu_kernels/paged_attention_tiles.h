// The AMX path of paged_attention.cpp: its tile registers, K/V blocks and the float32 precision's
// block (included there through paged_attention_tile_loop.h, inside its anonymous namespace, after
// the Args / Seg / Tile types and the vector path's helpers it shares).
#pragma once

#if defined(JUMPGATE_AMX)
// ---- The AMX path (use_tiles, where the CPU has AMX: runtime/attention/cpu_backend.py says when) ----
//
// The same blocks of 32 keys, aligned to absolute position 0 and folded in order by the online
// softmax, but each block's products are tile products: S^T = K Q^T (keys x states) and O = P V
// (states x head dims), where a state is one query head of one row. q, k and p are float32, so
// each is split into bf16 words hi + lo (x - hi, rounded again): a score is hi*hi + lo*hi + hi*lo
// (lo*lo, under 2^-16 of it, is dropped) and a value sum phi*v + plo*v, each from its tile
// instruction's float32 sums: close to float32 (tests/runtime/attention/test_cpu_attention.py: within 1e-4 of
// SDPA). V takes no remainder: in the formats that turn tiles on it is the qkv layer's bf16 output.
// The scores are transposed to a row per state (2 x 16 x 16 words), so each state's softmax runs
// in its own row and a decode's 3 states cost 3 rows, not a tile's 16. That is the float32
// precision (SPLIT); the bf16 precision (paged_attention_bf16.h) rounds q, k and p once and runs
// its chunks in columns.
//
// Batch invariance holds as on the vector path: a tile instruction computes each output from its
// own row and column, and the softmax and the value sums of a state run in its own row, so
// neither a state's place in a tile nor its neighbours change its bits. A block inside a prefix
// group's shared part is one K/V preparation for all the tile's states; outside it, each request
// prepares its own.
//
// Measured (docs/DEVELOPING.md): long prompts prefill faster and a prefix group's shared blocks
// cost less; a decode's few states per block pay the K/V preparation alone and run slower. The
// engine takes this path by default where it can run (--attention-tiles auto).

constexpr int TS = 16;  // states per tile chunk (tile rows and columns)
static_assert(W == 16, "the AMX path runs on AVX-512");

// Tile registers, all 16 rows of 64 bytes. Scores: 0-1 the block's two halves (16 keys x 16
// states), 2-3 and 6-7 K hi/lo of each half (16 keys x 32 dims), 4-5 Q^T hi/lo (16 dim pairs x 16
// states). Values: 0-1 the output of 32 dims (16 states x 16 dims each), 2 and 4 V of each (16 key
// pairs x 16 dims), 6-7 P hi/lo (16 states x 16 key pairs).
struct alignas(64) AttentionTiles {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

inline uint16_t bf16_word(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>(((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u) >> 16);
}
inline float bf16_value(uint16_t w) {
  const uint32_t u = static_cast<uint32_t>(w) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline vi splat_i(int32_t x) { vi v = {}; return v + x; }

// e^x for x <= 0 (a score minus its running max), ~1 ulp: n = round(x log2 e), r = x - n ln 2 in
// two steps (Cody-Waite), Cephes' polynomial for e^r, then scalef for 2^n. Half the instructions
// of exp_v (no integer exponent assembly); x below -87 gives about 1e-38, not 0 (callers zero
// the keys they mask).
inline vf exp_tiles(vf x) {
  __m512 v = _mm512_max_ps((__m512)x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  v = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), v);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(v, v), _mm512_add_ps(v, _mm512_set1_ps(1.0f)));
  return (vf)_mm512_scalef_ps(y, n);
}

// 32 floats (x0: the first 16, x1: the next) -> their hi and lo bf16 words in order, in one
// AVX512-BF16 conversion each (rounding to nearest even); lo is the remainder x - hi, rounded.
inline void split_words(__m512 x0, __m512 x1, __m512i& hi, __m512i& lo) {
  hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
  const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
  lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
}

// A thread's buffers, kept from one work item to the next (a decode's items are short: allocating
// and clearing them each time cost as much as their blocks). Grown, never cleared: every user
// writes what it reads.
template <typename T>
T* scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// One block's keys and values in tile layout (kc of its 32 keys real, the rest zero).
struct BlockKV {
  uint16_t *k_hi, *k_lo;  // [32 keys][D]: A operands, rows of 32 dims
  uint32_t* v;            // [16 key pairs][D]: B operand, a pair per dim
  explicit BlockKV(int64_t D) {
    thread_local std::vector<uint16_t> keys[2];
    thread_local std::vector<uint32_t> values;
    k_hi = scratch(keys[0], BLK * D);
    k_lo = scratch(keys[1], BLK * D);
    v = scratch(values, BLK / 2 * D);
  }

  // SPLIT: K as hi and lo words (the float32 precision); else its words alone (bf16)
  template <bool SPLIT>
  void fill(const float* const* kp, const float* const* vp, int kc, int64_t D) {
    const __m512i zero = _mm512_setzero_si512();
    for (int j = 0; j < BLK; ++j)
      for (int64_t c = 0; c < D; c += 32) {
        __m512i hi = zero, lo = zero;
        if (j < kc) {
          const __m512 x0 = _mm512_loadu_ps(kp[j] + c), x1 = _mm512_loadu_ps(kp[j] + c + 16);
          if constexpr (SPLIT) split_words(x0, x1, hi, lo);
          else hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        }
        _mm512_storeu_si512(&k_hi[j * D + c], hi);
        if constexpr (SPLIT) _mm512_storeu_si512(&k_lo[j * D + c], lo);
      }
    // V's words (rounded: in the formats tiles serve V is the qkv layer's bf16 output, so exact and
    // with no lo part), key 2r's and key 2r + 1's interleaved dim by dim
    alignas(64) static constexpr uint16_t PAIRS[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pairs = _mm512_load_si512(PAIRS);
    for (int r = 0; r < BLK / 2; ++r)
      for (int64_t c = 0; c < D; c += W) {
        const __m512 even = 2 * r < kc ? _mm512_loadu_ps(vp[2 * r] + c) : _mm512_setzero_ps();
        const __m512 odd = 2 * r + 1 < kc ? _mm512_loadu_ps(vp[2 * r + 1] + c) : _mm512_setzero_ps();
        const __m512i words = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
        _mm512_storeu_si512(&v[r * D + c], _mm512_permutexvar_epi16(pairs, words));
      }
  }
};

// Per work item: every state's Q^T words and its running max, sum and output.
struct States {
  int64_t count, stride;  // states; a row of qt (room for a chunk that starts at any state)
  uint32_t *qt_hi, *qt_lo;  // [D / 32][16 dim pairs][stride]: B operands (columns past count: any)
  float *m, *l, *acc;       // [count], [count], [count][D]
  States(int64_t n, int64_t D) : count(n), stride((n + 2 * TS - 1) / TS * TS) {
    thread_local std::vector<uint32_t> qt[2];
    thread_local std::vector<float> running[3];
    qt_hi = scratch(qt[0], D / 2 * stride);
    qt_lo = scratch(qt[1], D / 2 * stride);
    m = scratch(running[0], stride);
    l = scratch(running[1], stride);
    acc = scratch(running[2], stride * D);
    std::fill(m, m + n, -std::numeric_limits<float>::infinity());
    std::fill(l, l + n, 0.f);
    std::fill(acc, acc + n * D, 0.f);
  }

  template <bool SPLIT>
  void set_q(int64_t st, const float* q, int64_t D) {
    for (int64_t dp = 0; dp < D / 2; ++dp) {  // dim pair dp: chunk dp / 16, row dp % 16
      uint32_t hi = 0, lo = 0;
      for (int e = 0; e < 2; ++e) {
        const float x = q[2 * dp + e];
        const uint16_t h = bf16_word(x);
        hi |= static_cast<uint32_t>(h) << (16 * e);
        if constexpr (SPLIT) lo |= static_cast<uint32_t>(bf16_word(x - bf16_value(h))) << (16 * e);
      }
      qt_hi[dp * stride + st] = hi;
      if constexpr (SPLIT) qt_lo[dp * stride + st] = lo;
    }
  }
};

// One block for states st0 .. st0 + n - 1 (n <= 16), state s seeing the block's first valid[s]
// keys (lanes past n see them all and are never stored).
void fold_chunk(const Args& a, States& s, const BlockKV& kv, int64_t st0, int n, const vi& valid) {
  const int64_t D = a.dim, stride = s.stride;
  alignas(64) float scores[BLK][TS];
  alignas(64) uint32_t p_hi[TS][TS], p_lo[TS][TS];  // A operands: states x key pairs
  float* const acc = s.acc;
  // S^T = K Q^T over 32 dims at a time
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t dc = 0; dc < D / 32; ++dc) {
    _tile_loadd(4, &s.qt_hi[dc * 16 * stride + st0], stride * 4);
    _tile_loadd(5, &s.qt_lo[dc * 16 * stride + st0], stride * 4);
    _tile_loadd(2, &kv.k_hi[dc * 32], D * 2);
    _tile_loadd(3, &kv.k_lo[dc * 32], D * 2);
    _tile_loadd(6, &kv.k_hi[16 * D + dc * 32], D * 2);
    _tile_loadd(7, &kv.k_lo[16 * D + dc * 32], D * 2);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 6, 4);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(1, 7, 4);
    _tile_dpbf16ps(0, 2, 5);
    _tile_dpbf16ps(1, 6, 5);
  }
  _tile_stored(0, &scores[0][0], TS * 4);
  _tile_stored(1, &scores[16][0], TS * 4);
  // The scores to a row per state (two 16 x 16 transposes), then each real state's online softmax
  // in its own row: a short chunk (a decode's few states) costs only its own rows.
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
    const bool all = valid[i] == BLK;  // most blocks: every key visible
    const vi lim = splat_i(valid[i]);
    if (!all) {
      s0 = key_lo < lim ? s0 : neg_inf;
      s1 = key_hi < lim ? s1 : neg_inf;
    }
    const float m_old = s.m[st0 + i], m_new = std::max(m_old, hmax(max_v(s0, s1)));
    vf p0 = exp_tiles(s0 - m_new), p1 = exp_tiles(s1 - m_new);
    if (!all) {  // keys past valid add exactly nothing
      p0 = key_lo < lim ? p0 : splat(0.f);
      p1 = key_hi < lim ? p1 : splat(0.f);
    }
    // exp(0) is exactly 1: most blocks leave the running max where it was
    alpha[i] = std::isinf(m_old) ? 0.f : m_old == m_new ? 1.f : std::exp(m_old - m_new);
    s.l[st0 + i] = s.l[st0 + i] * alpha[i] + hsum(p0 + p1);
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
  // O += P V, 32 dims at a time (two independent sums in flight), then each state's rescale and
  // sum in its own row (accumulating in the tiles instead, rescaling only states whose max moved,
  // measured no faster)
  alignas(64) float pv[2][TS][W];
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
    for (int i = 0; i < n; ++i) {
      float* o = &acc[(st0 + i) * D + dt * 16];
      store(o, load(o) * alpha[i] + load(pv[0][i]));
      store(o + W, load(o + W) * alpha[i] + load(pv[1][i]));
    }
  }
}
#endif  // JUMPGATE_AMX
