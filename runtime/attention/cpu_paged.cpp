// Batch-invariant paged attention for CPU (the contract is in cpu_backend.py's docstring).
//
// A query row's result depends only on its own q, its request's slot list and its visible length
// n: keys are folded in blocks of BLK aligned to absolute position 0, each block reduced in one
// fixed order, blocks combined by the online-softmax rescale. Tiling rows of one request, the
// batch, the work split and the thread count only change which thread runs a row, never the
// arithmetic. Plain GCC vector types (no fast-math) keep every operation's order as written.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int BLK = 32;       // keys per block
constexpr int W = 16;         // lanes of the dot product and of the V accumulation
constexpr int MAX_TILE = 16;  // rows of one request that share each loaded K/V block
constexpr int MAX_CHUNKS = 16;  // head_dim <= 256

typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int vi __attribute__((vector_size(W * sizeof(int))));
typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf load_part(const float* p, int n) { vf v = {}; std::memcpy(&v, p, n * sizeof(float)); return v; }
inline void store_part(float* p, vf v, int n) { std::memcpy(p, &v, n * sizeof(float)); }
inline vf splat(float x) { vf v = {}; return v + x; }

// Fixed tree: 16 -> 8 -> 4 -> 2 -> 1.
inline float hsum(vf v) {
  vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
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

struct Args {
  const float* q;
  int64_t q_row, q_head;  // strides of q (head_dim is contiguous)
  const float* k;
  const float* v;
  const int64_t* slots;
  float* out;
  int64_t kv_heads, heads, group, dim;
  float scale;
};

// One tile: `rows` consecutive query rows of one request (row i sees n0 + i keys), one KV head,
// its `group` query heads. NC: chunks of W lanes per head (head_dim rounded up).
template <int NC, bool FULL>
void run_tile(const Args& a, int64_t row0, int64_t rows, int64_t n0, int64_t slot_off, int64_t kvh) {
  const int64_t G = a.group, D = a.dim, states = rows * G;
  const int tail = FULL ? W : static_cast<int>(D - (NC - 1) * W);  // lanes of the last chunk
  auto ld = [tail](const float* ptr, int c) {
    return FULL || c < NC - 1 ? load(ptr + c * W) : load_part(ptr + c * W, tail);
  };
  std::vector<vf> qb(states * NC), acc(states * NC, splat(0.f));
  std::vector<float> m(states, -std::numeric_limits<float>::infinity()), l(states, 0.f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const float* src = a.q + (row0 + i) * a.q_row + (kvh * G + g) * a.q_head;
      for (int c = 0; c < NC; ++c)
        qb[(i * G + g) * NC + c] = ld(src, c);
    }
  const int64_t n_max = n0 + rows - 1;
  const float* kp[BLK];
  const float* vp[BLK];
  alignas(64) float s[BLK];
  alignas(64) float p[BLK];
  for (int64_t base = 0; base < n_max; base += BLK) {
    const int kc = static_cast<int>(std::min<int64_t>(BLK, n_max - base));
    for (int j = 0; j < kc; ++j) {
      const int64_t off = (a.slots[slot_off + base + j] * a.kv_heads + kvh) * D;
      kp[j] = a.k + off;
      vp[j] = a.v + off;
    }
    for (int64_t i = std::max<int64_t>(0, base - n0 + 1); i < rows; ++i) {
      const int valid = static_cast<int>(std::min<int64_t>(BLK, n0 + i - base));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t st = i * G + g;
        const vf* qv = &qb[st * NC];
        float mb = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < valid; ++j) {
          vf d = qv[0] * ld(kp[j], 0);
          for (int c = 1; c < NC; ++c)
            d = d + qv[c] * ld(kp[j], c);
          s[j] = hsum(d) * a.scale;
          mb = std::max(mb, s[j]);
        }
        for (int j = valid; j < BLK; ++j) s[j] = 0.f;
        const float m_old = m[st], m_new = std::max(m_old, mb);
        const float alpha = std::isinf(m_old) ? 0.f : std::exp(m_old - m_new);
        for (int j = 0; j < BLK; j += W) store(p + j, exp_v(load(s + j) - m_new));
        float ps = 0.f;  // keys past n contribute nothing: they are not summed
        for (int j = 0; j < valid; ++j) ps += p[j];
        l[st] = l[st] * alpha + ps;
        vf av[NC];
        for (int c = 0; c < NC; ++c) av[c] = alpha == 1.f ? acc[st * NC + c] : acc[st * NC + c] * alpha;
        for (int j = 0; j < valid; ++j) {
          const float pj = p[j];
          for (int c = 0; c < NC; ++c)
            av[c] = av[c] + pj * ld(vp[j], c);
        }
        for (int c = 0; c < NC; ++c) acc[st * NC + c] = av[c];
        m[st] = m_new;
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t st = i * G + g;
      float* dst = a.out + ((row0 + i) * a.heads + kvh * G + g) * D;
      const float inv = l[st];
      for (int c = 0; c < NC; ++c) {
        vf o = acc[st * NC + c] / inv;
        if (FULL || c < NC - 1) store(dst + c * W, o); else store_part(dst + c * W, o, tail);
      }
    }
}

using TileFn = void (*)(const Args&, int64_t, int64_t, int64_t, int64_t, int64_t);

template <int NC>
TileFn pick(int nc, bool full) {
  if constexpr (NC > MAX_CHUNKS) {
    return nullptr;
  } else {
    if (nc == NC) return full ? &run_tile<NC, true> : &run_tile<NC, false>;
    return pick<NC + 1>(nc, full);
  }
}

struct Tile {
  int64_t row0, rows, n0, slot_off, cost;
};

}  // namespace

// q [T, H, D] float32 (head_dim contiguous); k_cache, v_cache [S, KVH, D] float32 contiguous;
// slots: int64, all requests' slot rows one after another; meta [B, 4] int64 per request:
// (first row of q, new tokens, visible length of its last row, offset of its row in `slots`).
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor slots, torch::Tensor meta) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "paged_attention: shapes");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
              v_cache.scalar_type() == at::kFloat, "paged_attention: float32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: contiguous caches");
  TORCH_CHECK(slots.scalar_type() == at::kLong && meta.scalar_type() == at::kLong, "paged_attention: int64 tables");
  if (q.stride(2) != 1) q = q.contiguous();
  slots = slots.contiguous();
  meta = meta.contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && H % KVH == 0, "paged_attention: head_dim / GQA mismatch");
  const int nc = static_cast<int>((D + W - 1) / W);
  TileFn fn = pick<1>(nc, D % W == 0);
  TORCH_CHECK(fn != nullptr, "paged_attention: head_dim above ", MAX_CHUNKS * W);
  auto out = torch::empty({T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  Args a{q.data_ptr<float>(), q.stride(0), q.stride(1), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
         slots.data_ptr<int64_t>(), out.data_ptr<float>(), KVH, H, H / KVH, D,
         static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))};
  const int64_t* mt = meta.data_ptr<int64_t>();
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < meta.size(0); ++b) {
    const int64_t row0 = mt[4 * b], ext = mt[4 * b + 1], seq = mt[4 * b + 2], off = mt[4 * b + 3];
    TORCH_CHECK(row0 >= 0 && row0 + ext <= T && ext <= seq && off >= 0 && off + seq <= slots.numel(),
                "paged_attention: meta row ", b, " out of range");
    for (int64_t i = 0; i < ext; i += MAX_TILE) {
      const int64_t rows = std::min<int64_t>(MAX_TILE, ext - i), n0 = seq - ext + i + 1;
      tiles.push_back({row0 + i, rows, n0, off, rows * (n0 + rows)});
    }
  }
  // Longest first, handed out one by one: balances threads without changing any row's arithmetic.
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) { return x.cost > y.cost; });
  const int64_t items = static_cast<int64_t>(tiles.size()) * KVH;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t) {
    for (int64_t it; (it = next.fetch_add(1)) < items;) {
      const Tile& t = tiles[it / KVH];
      fn(a, t.row0, t.rows, t.n0, t.slot_off, it % KVH);
    }
  };
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), items);
  if (workers <= 1) work(0, 1); else at::parallel_for(0, workers, 1, work);
  return out;
}

// A dispatcher op (not a pybind function), so torch.profiler sees it by name.
TORCH_LIBRARY(jumpgate_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor meta) -> Tensor",
        &paged_attention);
}
