// Batch-invariant paged attention for CPU (the contract is in runtime/attention/cpu_backend.py's docstring).
//
// A query row's result depends only on its own q, its request's slot list and its visible length
// n: keys are folded in blocks of BLK aligned to absolute position 0, each block reduced in one
// fixed order, blocks combined by the online-softmax rescale. Tiling rows of one request, the
// batch, the work split and the thread count only change which thread runs a row, never the
// arithmetic. Plain GCC vector types (no fast-math) keep every operation's order as written.
#include <torch/extension.h>

#include "ops.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "amx.h"
#include "vec.h"
#if defined(__AVX512F__)
#include <immintrin.h>  // before the namespace: paged_attention_dot.h uses it inside
#endif

namespace {

using namespace jumpgate;  // amx_usable; W lanes (16 or 8: vec.h) for the dot product and the V accumulation

constexpr int BLK = 32;       // keys per block
constexpr int MAX_TILE = 16;  // rows of one request that share each loaded K/V block
// The bf16 dot path's rows of one request a work item: each block's K packing and V loads shared
// by more rows (every work item of a long prefill reads the whole prefix's K/V, from memory past
// L2); 128 rows leave a 512-row chunk 4 x KV heads items for two threads (docs/perf-log.md).
constexpr int DOT_TILE = 128;
constexpr int GROUP_ROWS = 16;  // rows of a prefix group that share each loaded shared block
// The AMX path's tiles of one request: a block's K/V is made into tile operands once per tile, so
// more rows share it (a 16-row tile spent as long preparing blocks as multiplying them; an 8k
// prefill's attention took 1.24x as long at 64 rows as at 128, 0.96x at 256: docs/perf-log.md).
// 256 rows leave a 512-row prefill chunk 2 tiles x KV heads work items, enough for two threads.
constexpr int AMX_TILE = 256;
// With tiles on, a row that sees at most this many keys still takes the vector path: its few
// blocks gain nothing from tiles in a prefill (where such rows are a small share of the work),
// and a decode over a short context runs faster on vector code. The path is a function of the
// row's own visible length, so a row gets the same bits alone, batched, or inside an extend.
constexpr int64_t TILES_MIN_KEYS = 512;
constexpr int MAX_CHUNKS = 256 / W;  // head_dim <= 256
// Whether the AMX path may run where the CPU has it: only tests turn it off, to run the bf16 dot
// path (paged_attention_dot.h) on an AMX CPU; a serving process keeps one path throughout.
std::atomic<bool> amx_allowed{true};

alignas(64) const float ZERO_ROW[MAX_CHUNKS * W] = {};

// The lane sums of W vectors at once: out[j] = hsum(v[j]), bit for bit, since every lane pair
// is added in hsum's tree order (halves, then quarters, then (0+2)+(1+3)); W - 1 shuffle-adds
// instead of W horizontal sums.
#if defined(__AVX512F__)
inline vf reduce_lanes(const vf* v) {
  vf w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) {
    const vf a = v[2 * i], b = v[2 * i + 1];
    w[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    const vf a = w[2 * i], b = w[2 * i + 1];
    x[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    const vf a = x[2 * i], b = x[2 * i + 1];
    y[i] = __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#else
// AVX2, hsum's tree ((0+4)+(2+6)) + ((1+5)+(3+7)) with one lane-crossing op per pair of vectors: the
// halves are added as [a_lo, b_hi] + [a_hi, b_lo] (a blend and one vperm2f128), and the inputs are
// taken in the order v0 v4 v1 v5 v2 v6 v3 v7 so that the two in-lane levels after it (shufps) leave
// the sums in key order. The plain shuffles of hsum's order compiled to lane-crossing vpermd at
// every level, the hottest instructions of the shared-prefix attention under perf.
inline vf reduce_lanes(const vf* v) {
  static constexpr int ORDER[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  vf w[4], x[2];
  for (int i = 0; i < 4; ++i) {  // [a0+a4 .. a3+a7 | b0+b4 .. b3+b7]
    const vf a = v[ORDER[2 * i]], b = v[ORDER[2 * i + 1]];
    w[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 12, 13, 14, 15) + __builtin_shufflevector(a, b, 4, 5, 6, 7, 8, 9, 10, 11);
  }
  for (int i = 0; i < 2; ++i) {  // (0+4)+(2+6) and (1+5)+(3+7) of each vector, in-lane
    const vf a = w[2 * i], b = w[2 * i + 1];
    x[i] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
  }
  return __builtin_shufflevector(x[0], x[1], 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(x[0], x[1], 1, 3, 9, 11, 5, 7, 13, 15);
}
#endif

// Lane-wise max, and the max of a vector's lanes (exact: any order gives the same value).
inline vf max_v(vf x, vf y) { return x > y ? x : y; }
inline vf8 max_v8(vf8 x, vf8 y) { return x > y ? x : y; }
inline float hmax(vf v) {
#if defined(__AVX512F__)
  vf8 a = max_v8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
  vf8 a = v;
#endif
  vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3), c = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  b = b > c ? b : c;
  return std::max(std::max(b[0], b[2]), std::max(b[1], b[3]));
}

#include "paged_attention_dot.h"  // pack_query, dot_scores: the DOT variant's scores

struct Args {
  const float* q;
  int64_t q_row, q_head;  // strides of q (head_dim is contiguous)
  const float* k;
  const float* v;
  const int64_t* slots;
  float* out;                // [T, H, D], or null when the output is bf16:
  c10::BFloat16* out_bf16;   // rounded to nearest even as c10::BFloat16 does (the next layer's input)
  int64_t slot_stride, head_stride;  // of the caches, in floats: slot-major or head-major (KVPool)
  int64_t heads, group, dim;
  float scale;
  int64_t window;  // a sliding-window layer's window (a row of visible length n sees keys n - window ..); 0: all
  // gpt-oss's attention sinks: per query head, a logit in the softmax's denominator with no value;
  // null: none. A row's fold starts from it (running max = sink, sum = exp(0) = 1), the same fixed
  // point for any batch, tile or thread split, so the invariance holds with sinks too.
  const float* sinks;
};

// Output element `at` of the [T, H, D] result: `lanes` values (W, or a head's last chunk).
inline void put(const Args& a, int64_t at, vf o, int lanes) {
  if (a.out_bf16 != nullptr) store_bf16(a.out_bf16 + at, o, lanes);
  else if (lanes == W) store(a.out + at, o);
  else store_part(a.out + at, o, lanes);
}

// A run of consecutive query rows of one request: row i sees n0 + i keys.
struct Seg {
  int64_t row0, rows, n0, slot_off;
};

// A work unit: segments (one request's rows, or the rows of several requests that share their
// first `shared_blocks` key blocks), one KV head.
struct Tile {
  int64_t first_seg, num_segs, shared_blocks, cost;
  bool fast;  // on the AMX path or the bf16 dot one (else the float32 vector one)
};

// The value sums of S consecutive states of one row (one query head each) over keys first .. valid - 1
// of a block: acc[s * NC ..] rescaled by alpha[s], then p[s * BLK + j] times V row j added in key
// order. The states share each V load and their S * NC sums are independent chains (one state's
// NC chains alone wait on the fused multiply-add's latency); each state's arithmetic is its own.
template <int S, int NC, typename Load>
inline void fold_values_of(vf* acc, const float* p, const float* alpha, const float* const* vp, int first, int valid,
                           const Load& ld) {
  vf av[S][NC];
  for (int s = 0; s < S; ++s)
    for (int c = 0; c < NC; ++c) av[s][c] = alpha[s] == 1.f ? acc[s * NC + c] : acc[s * NC + c] * alpha[s];
  for (int j = first; j < valid; ++j) {
    vf v[NC];
    for (int c = 0; c < NC; ++c) v[c] = ld(vp[j], c);
    for (int s = 0; s < S; ++s) {
      const float pj = p[s * BLK + j];
      for (int c = 0; c < NC; ++c) av[s][c] = av[s][c] + pj * v[c];
    }
  }
  for (int s = 0; s < S; ++s)
    for (int c = 0; c < NC; ++c) acc[s * NC + c] = av[s][c];
}

// Folds every row of `tile` over its keys, block by block; the query heads of KV head `kvh`
// together. Shared blocks are addressed through the first segment's slots and read once for all
// rows; each row's arithmetic is the same as on its own. NC: W-lane chunks per head. DOT: the
// scores from bf16 dot products (paged_attention_dot.h; FULL, head_dim a multiple of 32).
template <int NC, bool FULL, bool DOT = false>
void run_tile(const Args& a, const Seg* segs, const Tile& t, int64_t kvh) {
  const int64_t G = a.group, D = a.dim;
  const int tail = FULL ? W : static_cast<int>(D - (NC - 1) * W);  // lanes of the last chunk
  auto ld = [tail](const float* ptr, int c) {
    return FULL || c < NC - 1 ? load(ptr + c * W) : load_part(ptr + c * W, tail);
  };
  segs += t.first_seg;
  int64_t rows = 0, n_max = 0, seg_rows = 0;  // seg_rows: the most rows of one segment
  for (int64_t sg = 0; sg < t.num_segs; ++sg) {
    rows += segs[sg].rows;
    n_max = std::max(n_max, segs[sg].n0 + segs[sg].rows - 1);
    seg_rows = std::max(seg_rows, segs[sg].rows);
  }
  const int64_t states = rows * G;
  // q as float32 vectors (DOT: its bf16 pairs below instead)
  std::vector<vf> qb(DOT ? 0 : states * NC), acc(states * NC, splat(0.f));
  std::vector<float> m(states, -std::numeric_limits<float>::infinity()), l(states, 0.f);
  for (int64_t sg = 0, st = 0; sg < t.num_segs; ++sg)
    for (int64_t i = 0; i < segs[sg].rows; ++i)
      for (int64_t g = 0; g < G; ++g, ++st) {
        const float* src = a.q + (segs[sg].row0 + i) * a.q_row + (kvh * G + g) * a.q_head;
        if constexpr (!DOT)
          for (int c = 0; c < NC; ++c) qb[st * NC + c] = ld(src, c);
        if (a.sinks != nullptr) m[st] = a.sinks[kvh * G + g], l[st] = 1.f;  // the sink's exp(sink - m)
      }
  // DOT: every state's q as bf16 pairs, and the block's K packed once for all of them
  std::vector<uint32_t> q_pairs(DOT ? states * D / 2 : 0), k_columns(DOT ? D / 2 * BLK : 0);
  bool k_packed = false;
#if defined(JUMPGATE_BF16_DOT)
  if constexpr (DOT)
    for (int64_t sg = 0, st = 0; sg < t.num_segs; ++sg)
      for (int64_t i = 0; i < segs[sg].rows; ++i)
        for (int64_t g = 0; g < G; ++g, ++st)
          pack_query(a.q + (segs[sg].row0 + i) * a.q_row + (kvh * G + g) * a.q_head, D, &q_pairs[st * D / 2]);
#endif
  const float* kp[BLK];
  const float* vp[BLK];
  // states whose value sums run together: at most 16 vector chains (NC each), and a row's heads
  constexpr int VALUE_STATES = NC >= 16 ? 1 : NC >= 8 ? 2 : 4;
  const auto fold_values = [&](int n, vf* at, const float* p, const float* alpha, int first, int valid) {
    switch (n) {
      case 4: if constexpr (VALUE_STATES >= 4) fold_values_of<4, NC>(at, p, alpha, vp, first, valid, ld); break;
      case 3: if constexpr (VALUE_STATES >= 4) fold_values_of<3, NC>(at, p, alpha, vp, first, valid, ld); break;
      case 2: if constexpr (VALUE_STATES >= 2) fold_values_of<2, NC>(at, p, alpha, vp, first, valid, ld); break;
      default: fold_values_of<1, NC>(at, p, alpha, vp, first, valid, ld);
    }
  };
  // One block's scores, then probabilities, for every state of a segment
  std::vector<float> scores(static_cast<size_t>(seg_rows * G * BLK)), alphas(seg_rows * G);
  float* const sbuf = scores.data();
  auto address = [&](const Seg& sg, int64_t base, int64_t end) {
    const int kc = static_cast<int>(std::min<int64_t>(BLK, end - base));
    for (int j = 0; j < kc; ++j) {
      const int64_t off = a.slots[sg.slot_off + base + j] * a.slot_stride + kvh * a.head_stride;
      kp[j] = a.k + off;
      vp[j] = a.v + off;
    }
    for (int j = kc; j < BLK; ++j) kp[j] = vp[j] = ZERO_ROW;  // scored in a group of W, never summed
    k_packed = false;
  };
  // One block for the rows of one segment: state index of its first row, keys base.. it sees.
  // Three passes over the segment's states (scores, softmax, values), so that each state's short
  // dependent chains overlap with the next state's work instead of stalling the core.
  // Under a window, row i (visible length n0 + i) sees keys from n0 + i - window on: the rows that
  // see none of the block (its last rows) skip it, and a row's keys before its first are scored -inf.
  auto fold = [&](const Seg& sg, int64_t st0, int64_t base) {
    const int64_t i0 = std::max<int64_t>(0, base - sg.n0 + 1);
    const int64_t i1 = a.window > 0 ? std::clamp<int64_t>(base + BLK + a.window - sg.n0, 0, sg.rows) : sg.rows;
    auto valid_keys = [&](int64_t i) { return static_cast<int>(std::min<int64_t>(BLK, sg.n0 + i - base)); };
    auto first_key = [&](int64_t i) {
      return a.window > 0 ? static_cast<int>(std::clamp<int64_t>(sg.n0 + i - a.window - base, 0, BLK)) : 0;
    };
#if defined(JUMPGATE_BF16_DOT)
    if constexpr (DOT) {  // every state's 32 scores (masked below like the others)
      dot_scores(&q_pairs[(st0 + i0 * G) * D / 2], kp, k_columns.data(), k_packed, D, a.scale, sbuf, (i1 - i0) * G);
    }
#endif
    for (int64_t i = i0; i < i1; ++i) {
      const int valid = valid_keys(i), first = first_key(i);
      for (int64_t g = 0; g < G; ++g) {
        float* s = sbuf + ((i - i0) * G + g) * BLK;
        if constexpr (!DOT) {
          const vf* qv = &qb[(st0 + i * G + g) * NC];
          for (int j0 = 0; j0 < valid; j0 += W) {  // W keys' scores at once, each as hsum would give it
            vf dots[W];
            for (int jj = 0; jj < W; ++jj) {
              const float* kr = kp[j0 + jj];
              vf d = qv[0] * ld(kr, 0);
              for (int c = 1; c < NC; ++c) d = d + qv[c] * ld(kr, c);
              dots[jj] = d;
            }
            store(s + j0, reduce_lanes(dots) * a.scale);
          }
        }
        for (int j = 0; j < first; ++j) s[j] = -std::numeric_limits<float>::infinity();  // out of the window
        for (int j = valid; j < BLK; ++j) s[j] = -std::numeric_limits<float>::infinity();  // weight 0
      }
    }
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t st = st0 + i * G + g, k = (i - i0) * G + g;
        float* s = sbuf + k * BLK;
        vf mv = load(s);
        for (int j = W; j < BLK; j += W) mv = max_v(mv, load(s + j));
        const float m_old = m[st], m_new = std::max(m_old, hmax(mv));
        vf sum = splat(0.f);
        for (int j = 0; j < BLK; j += W) {  // exp(-inf - m) is exactly 0: keys past n add nothing
          const vf pj = exp_v(load(s + j) - m_new);
          store(s + j, pj);
          sum = sum + pj;
        }
        // exp(0) is exactly 1: most blocks leave the running max where it was
        const float alpha = std::isinf(m_old) ? 0.f : m_old == m_new ? 1.f : std::exp(m_old - m_new);
        l[st] = l[st] * alpha + hsum(sum);
        alphas[k] = alpha;
        m[st] = m_new;
      }
    for (int64_t i = i0; i < i1; ++i) {
      const int valid = valid_keys(i), first = first_key(i);
      for (int64_t g = 0; g < G; g += VALUE_STATES) {
        const int64_t st = st0 + i * G + g, k = (i - i0) * G + g;
        const int n = static_cast<int>(std::min<int64_t>(VALUE_STATES, G - g));
        fold_values(n, &acc[st * NC], sbuf + k * BLK, &alphas[k], first, valid);
      }
    }
  };
  // Under a window the first blocks no row sees are skipped; the blocks stay aligned to position 0.
  int64_t b0 = 0;
  if (a.window > 0) {
    b0 = std::numeric_limits<int64_t>::max();
    for (int64_t sg = 0; sg < t.num_segs; ++sg) b0 = std::min(b0, std::max<int64_t>(0, segs[sg].n0 - a.window) / BLK);
  }
  for (int64_t b = b0, base = b0 * BLK; base < n_max; ++b, base += BLK) {
    if (b < t.shared_blocks) address(segs[0], base, base + BLK);  // every row sees all of it
    for (int64_t sg = 0, st0 = 0; sg < t.num_segs; st0 += segs[sg].rows * G, ++sg) {
      const int64_t end = segs[sg].n0 + segs[sg].rows - 1;
      if (end <= base) continue;
      if (a.window > 0 && base + BLK + a.window <= segs[sg].n0) continue;  // the block is before its window
      if (b >= t.shared_blocks) address(segs[sg], base, end);
      fold(segs[sg], st0, base);
    }
  }
  for (int64_t sg = 0, st = 0; sg < t.num_segs; ++sg)
    for (int64_t i = 0; i < segs[sg].rows; ++i)
      for (int64_t g = 0; g < G; ++g, ++st) {
        const int64_t dst = ((segs[sg].row0 + i) * a.heads + kvh * G + g) * D;
        for (int c = 0; c < NC; ++c) put(a, dst + c * W, acc[st * NC + c] / l[st], FULL || c < NC - 1 ? W : tail);
      }
}

#include "paged_attention_tile_loop.h"  // run_tile_amx: the same contract on AMX tiles

using TileFn = void (*)(const Args&, const Seg*, const Tile&, int64_t);

// dot: the bf16 dot variant (null where it is not built or head_dim is not a multiple of 32).
template <int NC>
TileFn pick(int nc, bool full, bool dot = false) {
  if constexpr (NC > MAX_CHUNKS) {
    return nullptr;
  } else {
    if (nc == NC && dot) {
#if defined(JUMPGATE_BF16_DOT)
      if constexpr (NC * W % 32 == 0) return full ? &run_tile<NC, true, true> : nullptr;
#endif
      return nullptr;
    }
    if (nc == NC) return full ? &run_tile<NC, true> : &run_tile<NC, false>;
    return pick<NC + 1>(nc, full, dot);
  }
}

}  // namespace

// q [T, H, D] float32 (head_dim contiguous); k_cache, v_cache [S, KVH, D] float32, head_dim contiguous
// (slot-major, or head-major: each KV head's slots one after another, as KVPool keeps them on CPU);
// slots: int64, all requests' slot rows one after another; meta [B, 6] int64 per request:
// (first row of q, new tokens, visible length of its last row, offset of its row in `slots`,
// prefix group or -1, the group's shared length). A group's members must hold the same first
// `shared length` slots, all cached (runtime/attention/cascade.py finds such groups).
// use_tiles: the AMX path, for rows that see more than TILES_MIN_KEYS keys, where the CPU has it and
// head_dim is a multiple of 32 (else the vector path).
// bf16_out: the result in bf16 (what the next layer takes in the bf16-activation formats), saving a
// conversion pass per layer; the same values as float32 output then .to(bfloat16).
// bf16_products: the AMX path at bf16 precision (q, k and the softmax weights rounded once to bf16:
// paged_attention_bf16.h), else at float32 precision (each split into two bf16 words).
// window: a sliding-window layer's window (row of visible length n sees keys n - window .. n - 1, as
// transformers' sliding mask: query i sees key j where i - window < j <= i); 0: every key. A windowed
// call takes the vector path (the AMX path has no window).
// sinks: [H] float32 per-head logits that join each row's softmax denominator (gpt-oss), or none;
// a call with sinks takes the vector path too.
torch::Tensor paged_attention_window(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor slots, torch::Tensor meta, bool use_tiles, bool bf16_out,
                                     bool bf16_products, int64_t window, c10::optional<torch::Tensor> sinks) {
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0");
  torch::Tensor sink;
  if (sinks.has_value() && sinks->defined()) {
    sink = sinks->contiguous();
    TORCH_CHECK(sink.scalar_type() == at::kFloat && sink.dim() == 1 && sink.size(0) == q.size(1),
                "paged_attention: sinks must be float32 [heads]");
  }
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "paged_attention: shapes");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
              v_cache.scalar_type() == at::kFloat, "paged_attention: float32 only");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.stride(2) == 1,
              "paged_attention: caches with head_dim contiguous, K and V alike");
  TORCH_CHECK(slots.scalar_type() == at::kLong && meta.scalar_type() == at::kLong, "paged_attention: int64 tables");
  TORCH_CHECK(meta.dim() == 2 && meta.size(1) == 6, "paged_attention: meta is [B, 6]");
  if (q.stride(2) != 1) q = q.contiguous();
  slots = slots.contiguous();
  meta = meta.contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1), B = meta.size(0);
  TORCH_CHECK(k_cache.size(2) == D && H % KVH == 0, "paged_attention: head_dim / GQA mismatch");
  const int nc = static_cast<int>((D + W - 1) / W);
  TileFn fn = pick<1>(nc, D % W == 0);
  TORCH_CHECK(fn != nullptr, "paged_attention: head_dim above ", MAX_CHUNKS * W);
  const bool amx = use_tiles && window == 0 && !sink.defined() && D % 32 == 0 && amx_usable() &&
                   amx_allowed.load(std::memory_order_relaxed);
  // Without AMX, bf16 precision takes the vector path with bf16 dot-product scores where it is built
  // (float32 precision there is the vector path itself).
  const TileFn dot_fn = use_tiles && !amx && bf16_products && D % 32 == 0 ? pick<1>(nc, true, true) : nullptr;
  TileFn fast_fn = dot_fn != nullptr ? dot_fn : fn;
#if defined(JUMPGATE_AMX)
  if (amx) fast_fn = bf16_products ? &run_tile_amx<false> : &run_tile_amx<true>;
#endif
  const bool fast = amx || dot_fn != nullptr;
  auto out = torch::empty({T, H, D}, q.options().dtype(bf16_out ? at::kBFloat16 : at::kFloat)
                                         .memory_format(at::MemoryFormat::Contiguous));
  Args a{q.data_ptr<float>(), q.stride(0), q.stride(1), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
         slots.data_ptr<int64_t>(), bf16_out ? nullptr : out.data_ptr<float>(),
         bf16_out ? out.data_ptr<c10::BFloat16>() : nullptr, k_cache.stride(0), k_cache.stride(1), H, H / KVH, D,
         static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), window,
         sink.defined() ? sink.data_ptr<float>() : nullptr};
  const int64_t* mt = meta.data_ptr<int64_t>();
  std::vector<Seg> segs;
  std::vector<Tile> tiles;
  std::vector<int64_t> grouped;  // requests in a group, by group then batch order
  // A request's first rows that see at most TILES_MIN_KEYS keys (none with tiles off)
  auto vector_rows = [&](const int64_t* r) {
    return fast ? std::clamp<int64_t>(TILES_MIN_KEYS - r[2] + r[1], 0, r[1]) : int64_t{0};
  };
  // Rows [i0, i1) of request r, `per_tile` rows of it to a tile
  auto add_tiles = [&](const int64_t* r, int64_t i0, int64_t i1, int64_t per_tile, bool on_fast) {
    for (int64_t i = i0; i < i1; i += per_tile) {
      const int64_t rows = std::min<int64_t>(per_tile, i1 - i), n0 = r[2] - r[1] + i + 1;
      tiles.push_back({static_cast<int64_t>(segs.size()), 1, 0, rows * (n0 + rows), on_fast});
      segs.push_back({r[0] + i, rows, n0, r[3]});
    }
  };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* r = mt + 6 * b;
    TORCH_CHECK(r[0] >= 0 && r[0] + r[1] <= T && r[1] <= r[2] && r[3] >= 0 && r[3] + r[2] <= slots.numel(),
                "paged_attention: meta row ", b, " out of range");
    TORCH_CHECK(r[4] < 0 || (r[5] >= 0 && r[5] <= r[2] - r[1]), "paged_attention: meta row ", b,
                ": the shared prefix must be cached");
    const int64_t few = vector_rows(r);
    add_tiles(r, 0, few, MAX_TILE, false);
    if (r[4] >= 0 && few < r[1]) { grouped.push_back(b); continue; }  // the rest joins its group
    add_tiles(r, few, r[1], amx ? AMX_TILE : fast ? DOT_TILE : MAX_TILE, fast);
  }
  std::stable_sort(grouped.begin(), grouped.end(),
                   [mt](int64_t x, int64_t y) { return mt[6 * x + 4] < mt[6 * y + 4]; });
  int64_t tile_rows = 0;
  for (size_t k = 0; k < grouped.size(); ++k) {
    const int64_t* r = mt + 6 * grouped[k];
    bool new_group = k == 0 || mt[6 * grouped[k - 1] + 4] != r[4];
    for (int64_t i = vector_rows(r); i < r[1]; i += MAX_TILE) {
      const int64_t rows = std::min<int64_t>(MAX_TILE, r[1] - i), n0 = r[2] - r[1] + i + 1;
      if (new_group || tile_rows + rows > GROUP_ROWS) {
        // segment 0 of each tile addresses the shared blocks (any member's slots would do)
        tiles.push_back({static_cast<int64_t>(segs.size()), 0, r[5] / BLK, 0, fast});
        tile_rows = 0;
        new_group = false;
      }
      ++tiles.back().num_segs;
      tiles.back().cost += rows * (n0 + rows);
      tile_rows += rows;
      segs.push_back({r[0] + i, rows, n0, r[3]});
    }
  }
  // Longest first, handed out one by one: balances threads without changing any row's arithmetic.
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) { return x.cost > y.cost; });
  const int64_t items = static_cast<int64_t>(tiles.size()) * KVH;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t) {
#if defined(JUMPGATE_AMX)
    static const AttentionTiles config;
    if (amx) _tile_loadconfig(&config);
#endif
    for (int64_t it; (it = next.fetch_add(1)) < items;) {
      const Tile& t = tiles[it / KVH];
      (t.fast ? fast_fn : fn)(a, segs.data(), t, it % KVH);
    }
#if defined(JUMPGATE_AMX)
    if (amx) _tile_release();
#endif
  };
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), items);
  if (workers <= 1) work(0, 1); else at::parallel_for(0, workers, 1, work);
  return out;
}

torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor slots, torch::Tensor meta, bool use_tiles, bool bf16_out,
                              bool bf16_products) {
  return paged_attention_window(q, k_cache, v_cache, slots, meta, use_tiles, bf16_out, bf16_products, 0, c10::nullopt);
}

// A dispatcher op (not a pybind function), so torch.profiler sees it by name.
TORCH_LIBRARY(jumpgate_cpu, m) {
  m.def("tiles_min_keys() -> int", []() -> int64_t { return TILES_MIN_KEYS; });
  // whether bf16 precision has its dot-product path without AMX (AVX512-BF16: paged_attention_dot.h)
  m.def("paged_attention_bf16_dot() -> bool", []() -> bool {
#if defined(JUMPGATE_BF16_DOT)
    return true;
#else
    return false;
#endif
  });
  // tests only: keep the AMX path off (returns the previous setting), to run the dot path on an AMX CPU
  m.def("paged_attention_use_amx(bool on) -> bool", [](bool on) -> bool { return amx_allowed.exchange(on); });
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor meta, bool use_tiles=False, bool bf16_out=False, bool bf16_products=False, int window=0, Tensor? sinks=None) -> Tensor",
        &paged_attention_window);
}
