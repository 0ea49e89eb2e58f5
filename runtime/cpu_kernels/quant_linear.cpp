// y = x @ W.T for group-wise quantized weights (groups of 32 inputs), bf16 activations and bf16
// outputs: the GGUF's own codes, run on CPUs with AVX512-BF16 (runtime/model/linear.py says when).
//   int4_linear: w = q * scale + offset, q in 0..15 (Q4_1 and Q4_K blocks: the q4 format's layers),
//   or 5-bit codes as stored (Q5_0, Q5_1, Q5_K: Packed5), or 6-bit ones (Q6_K, in groups of 16:
//   Packed6, the group a template's G), both PackedHigh over their bit planes beyond the nibble;
//   int8_linear: w = q * scale (+ offset), q in -128..127 (Q8_0 blocks: q4's logits layer; the
//   other codes where a layer's shape or a CPU keeps them off int4_linear).
//
// Why our own kernel: aten's _weight_int4pack_mm_for_cpu dequantizes every weight to fp32 for
// every row and multiplies with fp32 FMAs, so its cost grows with the row count at fp32 speed
// (a 512-row prefill chunk ran no faster than fp32 MKL). Here, over one group,
//   sum_k w_k x_k = scale * sum_k c_k x_k + offset' * sum_k x_k
// puts the codes straight into bf16 dot-product instructions (vdpbf16ps: 32 products a vector,
// twice the fp32 FMA rate). For int4, c = 128 + q is the bf16 word 0x4300 | q, so a code becomes an
// operand with one OR, and offset' = offset - 128 scale; an int8 code is exact in bf16 as it is.
// A code times a bf16 activation is exact in fp32, so the weights stay the GGUF's own (scale and
// offset in fp32, nothing rounded; a Q4_1 block's fp16 d and m are kept as they are, half the
// bytes a decode reads besides the codes, and made into the same fp32 scale and offset here).
// Runs of a few rows expand the codes at each use; longer runs expand a tile of columns once into
// a buffer and run every row over it. A single row (a decode) takes four column vectors a task, so
// that enough independent accumulations are in flight.
//
// Batch invariance: a row's output is computed alone, in one fixed order (pairs of inputs in
// order inside a group, groups in order, the scale term then the offset term), by one thread per
// column tile; it does not depend on the row count, the other rows, the expansion path or the
// thread split.
//
// AMX (where the CPU has it and the kernel grants its tiles: amx_usable), every call, whatever its
// row count, multiplies a group at once as tiles instead: up to 16 rows x 32 inputs by 32 inputs x
// 16 columns (_tile_dpbf16ps, the codes as the same bf16 words), from zero, then the same scale
// and offset steps. A row's bits again depend on nothing else in the call: the tile instruction
// computes each output from its own row and column (it sums a group's even inputs and its odd
// inputs apart, each in input order, then adds them), and a short call only configures fewer tile
// rows. These bits differ from the vector path's, so on one CPU every call takes the same path.
// `python -m bench.quant_linear_bench` measures both against aten's kernel.
#include <torch/extension.h>

#include "ops.h"
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "amx.h"
#include "vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>

#include "quant_linear_tile.h"

namespace {

using namespace jumpgate::quant_tile;  // the tile, its constants, the scale steps

using jumpgate::amx_usable;

// Whether these kernels may take AMX tiles where the CPU has them: only tests turn it off, to run the
// vector path on an AMX CPU (quant_linear_use_amx); a serving process keeps one path throughout.
std::atomic<bool> amx_allowed{true};

// Up to this many rows, codes are expanded at each use (one or two tile steps): expanding a column
// tile into a buffer first only paid past 16 rows (docs/perf-log.md), and a decode batch with its
// draft rows lives in 5-16.
constexpr int64_t EXPAND_ROWS = 16;
constexpr int64_t PREFETCH = 1024;    // bytes ahead in a stream of codes
constexpr int64_t AMX_ROWS = 16;      // rows of a full AMX tile

// 32 bytes -> the operands of two input pairs. Byte 2c + e holds column c's code of input e of the
// first pair (low nibble) and of the second pair (high nibble); word 2c + e is vdpbf16ps's slot
// for column c, input e.
inline void expand(const uint8_t* p, __m512i& first, __m512i& second) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i bias = _mm512_set1_epi16(0x4300);  // bf16 128.0: 0x4300 | q is 128 + q
  first = _mm512_ternarylogic_epi32(b, _mm512_set1_epi16(0x000F), bias, 0xEA);  // (b & 15) | bias
  second = _mm512_or_si512(_mm512_srli_epi16(b, 4), bias);
}

// 32 int8 codes, column c's pair at bytes 2c, 2c + 1 -> the 32 bf16 words of one operand (exact:
// |q| <= 128 has 8 significant bits).
inline __m512i expand8(const int8_t* p) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // words 0..15 from lo, 16..31 from hi
}

struct Packed4 {
  using Code = uint8_t;
  static constexpr at::ScalarType DTYPE = at::kByte;
  static constexpr int64_t INPUTS_PER_ROW = 4;  // inputs of one [.., 32] row of packed codes
  static constexpr int64_t QUAD_BYTES = WORDS;
  const uint8_t* p;  // the tile's first column vector in pack_int4_tiles' layout [K/4][32 bytes]
  int64_t quads;     // K / 4
  void get(int64_t j, int c, __m512i& first, __m512i& second) const {
    const uint8_t* at = p + (c * quads + j) * QUAD_BYTES;
    _mm_prefetch(reinterpret_cast<const char*>(at) + PREFETCH, _MM_HINT_T0);
    expand(at, first, second);
  }
};

// 5- and 6-bit codes (Q5_0, Q5_1, Q5_K: PLANES 1; Q6_K: PLANES 2): Packed4's 32 bytes of low
// nibbles, then each higher bit plane as two 32-bit masks, bit w of mask o for word w of operand o
// (pack_int5_tiles' layout [K/4][40 bytes], pack_int6_tiles' [K/4][48 bytes]): the code 128 + q is
// the bf16 word 0x4300 | q for q < 128, so plane b's bit is one masked add of 16 << b.
template <int PLANES>
struct PackedHigh {
  static_assert(PLANES == 1 || PLANES == 2, "5- or 6-bit codes");
  using Code = uint8_t;
  static constexpr at::ScalarType DTYPE = at::kByte;
  static constexpr int64_t INPUTS_PER_ROW = 4;
  static constexpr int64_t QUAD_BYTES = WORDS + 8 * PLANES;
  const uint8_t* p;
  int64_t quads;
  void get(int64_t j, int c, __m512i& first, __m512i& second) const {
    const uint8_t* at = p + (c * quads + j) * QUAD_BYTES;
    _mm_prefetch(reinterpret_cast<const char*>(at) + PREFETCH, _MM_HINT_T0);
    expand(at, first, second);
    uint32_t high[2 * PLANES];  // plane by plane: the first operand's mask, then the second's
    std::memcpy(high, at + WORDS, sizeof high);
    for (int b = 0; b < PLANES; ++b) {
      const __m512i bit = _mm512_set1_epi16(static_cast<int16_t>(16 << b));
      first = _mm512_mask_add_epi16(first, high[2 * b], first, bit);
      second = _mm512_mask_add_epi16(second, high[2 * b + 1], second, bit);
    }
  }
};
using Packed5 = PackedHigh<1>;
using Packed6 = PackedHigh<2>;

struct Packed8 {
  using Code = int8_t;
  static constexpr at::ScalarType DTYPE = at::kChar;
  static constexpr int64_t INPUTS_PER_ROW = 2;
  static constexpr int64_t QUAD_BYTES = 2 * WORDS;
  const int8_t* p;  // the tile's first column vector in pack_int8_tiles' layout [K/2][32 codes]
  int64_t quads;    // K / 4
  void get(int64_t j, int c, __m512i& first, __m512i& second) const {
    const int8_t* at = p + (c * quads + j) * QUAD_BYTES;
    _mm_prefetch(reinterpret_cast<const char*>(at) + 2 * PREFETCH, _MM_HINT_T0);
    first = expand8(at);
    second = expand8(at + WORDS);
  }
};

// The codes (Packed4/5/6 or Packed8 over the whole weight) and scale_offset entries (S a group) of the
// column tile that starts at column n0.
template <int S, int G, typename Packed, typename Scale>
std::pair<Packed, const Scale*> column_tile(const Packed& all, int64_t n0, int64_t K, const Scale* scale_offset) {
  const int64_t quads = K / 4;
  return {Packed{all.p + (n0 / COLS) * quads * Packed::QUAD_BYTES, quads},
          scale_offset + (n0 / COLS) * (K / G) * STORED<S, Scale> * COLS};
}

// A column tile's codes (C vectors of the weights `p`, `quads` quads deep) expanded once into
// `buffer` in Expanded<C>'s layout, for the calls that run many rows over them.
template <int C, typename Packed>
void expand_all(const Packed& p, int64_t quads, std::vector<uint16_t>& buffer) {
  buffer.resize(2 * quads * C * WORDS);
  for (int64_t j = 0; j < quads; ++j)
    for (int c = 0; c < C; ++c) {
      __m512i first, second;
      p.get(j, c, first, second);
      _mm512_storeu_si512(buffer.data() + (2 * j * C + c) * WORDS, first);
      _mm512_storeu_si512(buffer.data() + ((2 * j + 1) * C + c) * WORDS, second);
    }
}

// The tile rows for M rows (as quant_linear configures them).
inline int tile_rows_for(int64_t M) { return M <= 1 ? 1 : M <= 4 ? 4 : M <= 8 ? 8 : static_cast<int>(AMX_ROWS); }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// Tile registers: 0 the group's sums (R rows x 16 fp32), 1 the activations (R rows x 32 bf16),
// 2 the codes (16 input pairs x 16 columns x 2 bf16); amx_streamed also uses 3 (a second column
// vector's codes) and 4 (its sums).
// Each thread loads this before its tiles.
// R: rows of the sums and activation tiles (1, 4, 8 or 16: a short call multiplies few zero rows).
// G: inputs a group (the activations tile's columns, twice the codes tiles' rows).
template <int R, int G>
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 2 * G, 64, 64, 64};
  uint8_t rows[16] = {R, R, G / 2, G / 2, R};
};

// One tile configuration per row count and group size (a call sets it on each of its threads).
template <int G>
inline void configure_tiles(int64_t M) {
  static const TileConfig<1, G> rows1;
  static const TileConfig<4, G> rows4;
  static const TileConfig<8, G> rows8;
  static const TileConfig<AMX_ROWS, G> rows16;
  const int r = tile_rows_for(M);
  _tile_loadconfig(r == 1 ? static_cast<const void*>(&rows1) : r == 4 ? static_cast<const void*>(&rows4)
                   : r == 8 ? static_cast<const void*>(&rows8) : static_cast<const void*>(&rows16));
}

// Every row (x padded with zero rows to whole tiles) over the C column vectors in `expanded`
// (Expanded<C>'s layout: input pair p of vector c at (p * C + c) * WORDS, so a group's 16 pairs are
// one tile at a stride of C vectors), R rows at a time (R: the configured tile rows). Per group
// and R rows: one tile product from zero, then the same scale and offset steps as tile_rows.
template <int R, int C, int S, int G, typename Scale>
void amx_rows(const uint16_t* expanded, const uint16_t* xpad, int64_t M, int64_t K, const float* sums,
              const Scale* scale_offset, uint16_t* out, int64_t ldy) {
  const int64_t groups = K / G;
  alignas(64) float part[R * COLS];
  for (int c = 0; c < C; ++c)
    for (int64_t m0 = 0; m0 < M; m0 += R) {
      __m512 y[R];
      for (int r = 0; r < R; ++r) y[r] = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        _tile_loadd(1, xpad + m0 * K + g * G, K * sizeof(uint16_t));
        _tile_loadd(2, expanded + (g * (G / 2) * C + c) * WORDS, C * WORDS * sizeof(uint16_t));
        _tile_zero(0);
        _tile_dpbf16ps(0, 1, 2);
        _tile_stored(0, part, COLS * sizeof(float));
        __m512 d, o;
        scale_and_offset<S>(scale_offset + (c * groups + g) * STORED<S, Scale> * COLS, d, o);
        for (int r = 0; r < R; ++r) y[r] = _mm512_fmadd_ps(_mm512_load_ps(part + r * COLS), d, y[r]);
        if constexpr (S == 2) {
          for (int r = 0; r < R; ++r)
            y[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(sums[(m0 + r) * groups + g]), y[r]);
        }
      }
      for (int r = 0; r < R && m0 + r < M; ++r)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (m0 + r) * ldy + c * COLS), (__m256i)_mm512_cvtneps_pbh(y[r]));
    }
}

// One tile of rows (M <= R), each group's codes expanded where they are used (into 1-2 KB that stay
// in L1, instead of the whole column tile's codes into a buffer first), as a software pipeline. A
// group's product must be stored before the next group's scale step (each group has its own
// scales), so done one step at a time the tile unit waits on vector stores and the vector unit on
// tile stores (neither forwards). Here, while group g's products run, group g+1's codes are
// expanded into the other half of a double buffer and group g-1's sums are read back.
// The same products and the same scale and offset steps, group after group: amx_rows' bits.
template <int R, int C, int S, int G, typename Packed, typename Scale>
void amx_streamed(const Packed& p, const uint16_t* x, int64_t M, int64_t K, const float* sums,
                  const Scale* scale_offset, uint16_t* out, int64_t ldy) {
  static_assert(C == 1 || C == 2);
  // Column vectors per pass: 16 rows of sums for two vectors would need all 32 vector registers.
  constexpr int V = R * C <= 16 ? C : 1;
  constexpr int64_t TILE_WORDS = G / 2 * WORDS;  // one group's codes of one column vector
  constexpr int64_t BYTES = WORDS * sizeof(uint16_t);
  const int64_t groups = K / G;
  alignas(64) uint16_t codes[2][V][TILE_WORDS];  // [buffer][vector of the pass]
  alignas(64) float part[2][V][R * COLS];        // [buffer][vector of the pass]
  for (int c0 = 0; c0 < C; c0 += V) {
    __m512 y[V][R];
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) y[v][r] = _mm512_setzero_ps();
    const auto expand = [&](int64_t g, uint16_t (*into)[TILE_WORDS]) {
      for (int v = 0; v < V; ++v)
        for (int64_t j = 0; j < G / 4; ++j) {
          __m512i first, second;
          p.get(g * (G / 4) + j, c0 + v, first, second);
          _mm512_store_si512(into[v] + 2 * j * WORDS, first);
          _mm512_store_si512(into[v] + (2 * j + 1) * WORDS, second);
        }
    };
    const auto accumulate = [&](int64_t g, const float (*from)[R * COLS]) {
      for (int v = 0; v < V; ++v) {
        __m512 d, o;
        scale_and_offset<S>(scale_offset + ((c0 + v) * groups + g) * STORED<S, Scale> * COLS, d, o);
        for (int r = 0; r < R; ++r) y[v][r] = _mm512_fmadd_ps(_mm512_load_ps(from[v] + r * COLS), d, y[v][r]);
        if constexpr (S == 2) {
          for (int r = 0; r < R; ++r) y[v][r] = _mm512_fmadd_ps(o, _mm512_set1_ps(sums[r * groups + g]), y[v][r]);
        }
      }
    };
    expand(0, codes[0]);
    for (int64_t g = 0; g < groups; ++g) {
      const int b = g & 1;
      // Tiles: activations 1; codes 2 and 3 (the pass's vectors 0 and 1); sums 0 and 4.
      _tile_loadd(1, x + g * G, K * sizeof(uint16_t));
      _tile_loadd(2, codes[b][0], BYTES);
      _tile_zero(0);
      _tile_dpbf16ps(0, 1, 2);
      if constexpr (V == 2) {
        _tile_loadd(3, codes[b][1], BYTES);
        _tile_zero(4);
        _tile_dpbf16ps(4, 1, 3);
      }
      if (g + 1 < groups) expand(g + 1, codes[b ^ 1]);
      if (g > 0) accumulate(g - 1, part[b ^ 1]);
      _tile_stored(0, part[b][0], COLS * sizeof(float));
      if constexpr (V == 2) _tile_stored(4, part[b][1], COLS * sizeof(float));
    }
    accumulate(groups - 1, part[(groups - 1) & 1]);
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R && r < M; ++r)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldy + (c0 + v) * COLS),
                            (__m256i)_mm512_cvtneps_pbh(y[v][r]));
  }
}

// The C column vectors from column n0 on, for every row, on tiles: a call of up to 16 rows expands
// each group's codes where it is used; more rows expand the column tile's codes once into `buffer`
// (Expanded<C>'s layout) and run every 16 rows over them. `xpad`: x with zero rows up to whole tiles.
template <int C, int S, int G, typename Packed, typename Scale>
void run_tile_amx(const Packed& all, int64_t n0, std::vector<uint16_t>& buffer, const uint16_t* xpad, int64_t M,
                  int64_t K, const float* sums, const Scale* scale_offset, int64_t N, uint16_t* out) {
  const auto [p, so] = column_tile<S, G>(all, n0, K, scale_offset);
  switch (tile_rows_for(M)) {
    case 1: return amx_streamed<1, C, S, G>(p, xpad, M, K, sums, so, out + n0, N);
    case 4: return amx_streamed<4, C, S, G>(p, xpad, M, K, sums, so, out + n0, N);
    case 8: return amx_streamed<8, C, S, G>(p, xpad, M, K, sums, so, out + n0, N);
    default: break;
  }
  if (M <= AMX_ROWS) return amx_streamed<AMX_ROWS, C, S, G>(p, xpad, M, K, sums, so, out + n0, N);
  expand_all<C>(p, K / 4, buffer);
  amx_rows<AMX_ROWS, C, S, G>(buffer.data(), xpad, M, K, sums, so, out + n0, N);
}
#endif

// The C column vectors from column n0 on, for every row. `Packed`: Packed4/5/6 or Packed8 over the
// whole weight; S: scale_offset entries per group.
template <int C, int S, int G, typename Packed, typename Scale>
void run_tile(const Packed& all, int64_t n0, std::vector<uint16_t>& buffer, const uint16_t* x, int64_t M,
              int64_t K, const float* sums, const Scale* scale_offset, int64_t N, uint16_t* out) {
  const auto [p, so] = column_tile<S, G>(all, n0, K, scale_offset);
  if (M <= EXPAND_ROWS) return tile<C, S, G>(p, x, M, K, sums, so, N, out + n0);
  expand_all<C>(p, K / 4, buffer);
  tile<C, S, G>(Expanded<C>{buffer.data()}, x, M, K, sums, so, N, out + n0);
}

// One row (a decode) over four column vectors (64 columns) instead of two: four independent
// accumulation chains instead of two, so the vdpbf16ps latency is hidden, where a decode's task has
// little else to overlap it with. Each output's arithmetic is tile_rows' for any C, so the bits are
// those of the two-vector tiles.
template <int S, int G, typename Packed, typename Scale>
void run_one_row_wide(const Packed& all, int64_t n0, const uint16_t* x, int64_t K, const float* sums,
                      const Scale* scale_offset, int64_t N, uint16_t* out) {
  const auto [p, so] = column_tile<S, G>(all, n0, K, scale_offset);
  tile_rows<1, 4, S, G>(p, x, K, sums, K / G, so, out + n0, N);
}

// Checks, per-row group sums (int4 only), then one task per tile of 32 columns (16 where N is an
// odd number of vectors; 64 for a single row where N is a multiple of 64).
template <int S, int G, typename Packed, typename Scale>
torch::Tensor quant_linear(const char* name, torch::Tensor x, torch::Tensor packed, torch::Tensor scale_offset) {
  const bool amx = amx_usable() && amx_allowed.load(std::memory_order_relaxed);
  constexpr at::ScalarType code_type = Packed::DTYPE;
  constexpr int64_t inputs_per_row = Packed::INPUTS_PER_ROW;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, name, ": x [M, K], bfloat16");
  constexpr int64_t row_bytes = Packed::QUAD_BYTES * inputs_per_row / 4;  // a [.., row_bytes] row holds inputs_per_row
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == code_type && packed.size(2) == row_bytes, name,
              ": packed codes [N/16, K/", inputs_per_row, ", ", row_bytes, "], ", c10::toString(code_type));
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * COLS, groups = K / G;
  TORCH_CHECK(K % G == 0 && packed.size(1) * inputs_per_row == K, name, ": K must be a multiple of ", G,
              " and match the weights");
  constexpr at::ScalarType scale_type = std::is_same_v<Scale, ScaleHalf> ? at::kHalf : at::kFloat;
  constexpr int64_t stored = STORED<S, Scale>;
  TORCH_CHECK(scale_offset.scalar_type() == scale_type && scale_offset.dim() == 4 &&
              scale_offset.size(0) == N / COLS && scale_offset.size(1) == groups && scale_offset.size(2) == stored &&
              scale_offset.size(3) == COLS, name, ": scale_offset [N/16, K/", G, ", ", stored, ", 16], ",
              c10::toString(scale_type));
  x = x.contiguous();
  packed = packed.contiguous();
  scale_offset = scale_offset.contiguous();
  auto out = torch::empty({M, N}, x.options());
  if (M == 0) return out;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const Packed all{reinterpret_cast<const typename Packed::Code*>(packed.data_ptr()), K / 4};
  const Scale* so = reinterpret_cast<const Scale*>(scale_offset.data_ptr());
  uint16_t* yp = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());

  // AMX: the rows padded with zeros to whole tiles of the rows configured for M (their outputs are
  // never written); x itself where it already is (a decode's single row needs no copy).
  const int64_t tile_rows = amx ? tile_rows_for(M) : 1;
  const int64_t rows = (M + tile_rows - 1) / tile_rows * tile_rows;
  std::vector<uint16_t> xpad(rows > M ? rows * K : 0);
  if (rows > M) {
    std::memcpy(xpad.data(), xp, M * K * sizeof(uint16_t));
    std::memset(xpad.data() + M * K, 0, (rows - M) * K * sizeof(uint16_t));
  }
  const uint16_t* xtiles = rows > M ? xpad.data() : xp;
  // Each row's input sum per group, in one fixed order (16 lanes, then the lane tree).
  std::vector<float> sums(S == 2 ? rows * groups : 0);
  if (S == 2)
    at::parallel_for(0, M, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t g = 0; g < groups; ++g) {
          const auto* row = reinterpret_cast<const c10::BFloat16*>(xp + r * K + g * G);
          sums[r * groups + g] = G == 16 ? jumpgate::hsum(jumpgate::load_bf16(row, 16))
                                         : jumpgate::hsum(jumpgate::load_bf16(row, 16) + jumpgate::load_bf16(row + 16, 16));
        }
    });

  const int64_t wide = !amx && M == 1 && (N / COLS) % 4 == 0 ? 4 : (N / COLS) % 2 == 0 ? 2 : 1;
  const int64_t tiles = N / (COLS * wide);
  at::parallel_for(0, tiles, 1, [&](int64_t b, int64_t e) {
    std::vector<uint16_t> buffer;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (amx) {
      configure_tiles<G>(M);
      for (int64_t t = b; t < e; ++t) {
        if (wide == 2) run_tile_amx<2, S, G>(all, t * 2 * COLS, buffer, xtiles, M, K, sums.data(), so, N, yp);
        else run_tile_amx<1, S, G>(all, t * COLS, buffer, xtiles, M, K, sums.data(), so, N, yp);
      }
      _tile_release();
      return;
    }
#endif
    for (int64_t t = b; t < e; ++t) {
      if (wide == 4) run_one_row_wide<S, G>(all, t * 4 * COLS, xp, K, sums.data(), so, N, yp);
      else if (wide == 2) run_tile<2, S, G>(all, t * 2 * COLS, buffer, xp, M, K, sums.data(), so, N, yp);
      else run_tile<1, S, G>(all, t * COLS, buffer, xp, M, K, sums.data(), so, N, yp);
    }
  });
  return out;
}

}  // namespace

// x bf16 [M, K]; packed uint8 [N/16, K/4, 32] (runtime/model/linear.py's pack_int4_tiles); scale_offset
// [N/16, K/32, 2, 16]: per column vector and group, 16 scales then 16 offsets for the kernel's
// codes 128 + q, float32; or float16, a Q4_1 block's own d then m (w = d q + m; scale_and_offset).
// packed [N/16, K/4, 40] (pack_int5_tiles): 5-bit codes, the same scales and offsets.
// packed [N/16, K/4, 48] (pack_int6_tiles): 6-bit codes in groups of 16, scale_offset float32
// [N/16, K/16, 2, 16], or [N/16, K/16, 1, 16] for Q6_K's scales alone (w = (q - 32) * scale).
torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scale_offset) {
  const bool half = scale_offset.scalar_type() == at::kHalf;
  if (packed.dim() == 3 && packed.size(2) == Packed6::QUAD_BYTES)
    return scale_offset.dim() == 4 && scale_offset.size(2) == 1
               ? quant_linear<2, 16, Packed6, Centered6>("int4_linear", x, packed, scale_offset)
               : quant_linear<2, 16, Packed6, float>("int4_linear", x, packed, scale_offset);
  if (packed.dim() == 3 && packed.size(2) == Packed5::QUAD_BYTES)
    return half ? quant_linear<2, GROUP, Packed5, ScaleHalf>("int4_linear", x, packed, scale_offset)
                : quant_linear<2, GROUP, Packed5, float>("int4_linear", x, packed, scale_offset);
  return half ? quant_linear<2, GROUP, Packed4, ScaleHalf>("int4_linear", x, packed, scale_offset)
              : quant_linear<2, GROUP, Packed4, float>("int4_linear", x, packed, scale_offset);
}

// x bf16 [M, K]; packed int8 [N/16, K/2, 32] (pack_int8_tiles); scales float32 [N/16, K/G, S, 16]:
// groups of G = 32 inputs (Q8_0, Q5_0, Q5_K) or 16 (Q6_K's sub-blocks, and layers that stack Q6_K
// with other blocks), S = 1 (w = q * scale) or 2 (scales then offsets: w = q * scale + offset).
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  const bool g16 = x.dim() == 2 && scales.dim() == 4 && scales.size(1) * 16 == x.size(1);
  const bool offsets = scales.dim() == 4 && scales.size(2) == 2;
  if (g16)
    return offsets ? quant_linear<2, 16, Packed8, float>("int8_linear", x, packed, scales)
                   : quant_linear<1, 16, Packed8, float>("int8_linear", x, packed, scales);
  return offsets ? quant_linear<2, GROUP, Packed8, float>("int8_linear", x, packed, scales)
                 : quant_linear<1, GROUP, Packed8, float>("int8_linear", x, packed, scales);
}

bool int4_linear_available() { return true; }
bool int4_linear_amx() { return amx_usable(); }
bool quant_linear_use_amx(bool on) { return amx_allowed.exchange(on); }

#else  // no AVX512-BF16: runtime/model/linear.py keeps aten's int4 kernel and a bf16 logits layer

torch::Tensor int4_linear(torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "int4_linear: built without AVX512-BF16");
}

torch::Tensor int8_linear(torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "int8_linear: built without AVX512-BF16");
}

bool int4_linear_available() { return false; }
bool int4_linear_amx() { return false; }
bool quant_linear_use_amx(bool) { return false; }

#endif

TORCH_LIBRARY_FRAGMENT(jumpgate_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor scale_offset) -> Tensor", &int4_linear);
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scales) -> Tensor", &int8_linear);
  m.def("int4_linear_available() -> bool", &int4_linear_available);
  m.def("int4_linear_amx() -> bool", &int4_linear_amx);
  // tests: whether int4_linear and int8_linear may use AMX (where usable); returns the setting before
  m.def("quant_linear_use_amx(bool on) -> bool", &quant_linear_use_amx);
}
