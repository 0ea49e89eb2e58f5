// y = x @ W.T for the GGUF's own Q4_1 codes on integer dot products (AVX2): the q4 format's linear
// layers on CPUs without native bf16 (quant_linear.cpp is the AVX512-BF16 one; runtime/model/linear.py picks).
//
// Each row of x is coded per block of 32 inputs (the weights' groups) as two int8 digits: with
// dx = max|x| / 127, x ~= dx * q1 + (dx / 254) * q2, q1 = round(x / dx) and q2 the first digit's
// rounding error at 254 times finer steps, both in -127..127 (a 15-bit code: the error is at most
// max|x| / 64516). With the block's exact float sum sx = sum(x) and a weight group's w = q * d + m:
//   sum_k w_k x_k  ~=  d * (dx * sum_k q_k q1_k + dx / 254 * sum_k q_k q2_k)  +  m * sx
// The integer sums are exact: vpmaddubsw multiplies the unsigned 4-bit codes by a digit and adds
// neighbours (|2 * 15 * 127| = 3810), eight of those per block still fit an int16 (30480), and one
// vpmaddwd per block widens them. The weights are the GGUF's own; only the activations are rounded.
// One digit alone (llama.cpp's Q8_1 activations) is twice as fast, but on SmolLM2 its greedy tokens
// agreed with fp32 on 94.1% of tests/runtime/model/test_weight_formats.py's positions, under the 97% bar; two
// digits agreed on all of them (logits within 0.014).
//
// Every column's float sum runs over the blocks in order whatever the row count, the other rows or
// the thread split (a tile of 16 columns is one thread's), and a row's coding depends on that row
// alone: a row's bits are the same in any batch.
#include <torch/extension.h>

#include "ops.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int64_t GROUP = 32;  // inputs per weight scale and per activation scale
constexpr int64_t COLS = 16;   // output columns of a tile
constexpr int64_t STEP = 4;    // inputs per packed step: 16 columns x 4 inputs = 64 codes in 32 bytes
constexpr int DIGITS = 2;      // int8 digits per activation
constexpr int ROWS = 3;        // rows sharing one unpack of the codes (4 integer accumulators each)
constexpr int REGISTER_ROWS = 2;  // up to this many rows also keep their float sums in registers
// Each row holds 4 int16 accumulators next to the two unpacked code vectors: three rows already
// spill some of them out of AVX2's 16 registers, more would spill more.
static_assert(ROWS <= 3, "ROWS rows x 4 accumulators + the unpacked codes must stay near 16 registers");

// The rows' codes: digit p's [M][K] int8 at q[p]; per block ([M][K / 32]) the digits' scales and sx.
struct CodedRows {
  int8_t* q[DIGITS];
  float* dx[DIGITS];
  float* sx;
  int64_t K;
};

// 32 int32 -> 32 int8 in order (the packs work within 128-bit lanes; the permutation undoes that).
inline __m256i pack_in_order(const __m256i i32[4]) {
  const __m256i w01 = _mm256_packs_epi32(i32[0], i32[1]), w23 = _mm256_packs_epi32(i32[2], i32[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Block i (row-major over [M][K / 32]) of x -> its digits, their scales and its exact sum.
inline void code_block(const float* x, const CodedRows& out, int64_t i) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  const float m = *std::max_element(lanes, lanes + 8);
  float s = 0.0f;
  for (int j = 0; j < 32; ++j) s += x[j];
  out.sx[i] = s;
  float scale = m / 127.0f, inv = m > 0.0f ? 127.0f / m : 0.0f;
  for (int p = 0; p < DIGITS; ++p) {
    out.dx[p][i] = scale;
    const __m256 vinv = _mm256_set1_ps(inv), vscale = _mm256_set1_ps(scale);
    __m256i digits[4];
    for (int j = 0; j < 4; ++j) {  // round to nearest even; |digit| <= 127
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      digits[j] = _mm256_cvtps_epi32(r);
      v[j] = _mm256_fnmadd_ps(r, vscale, v[j]);  // what this digit left over, |.| <= scale / 2
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q[p] + i * GROUP), pack_in_order(digits));
    scale /= 254.0f;
    inv *= 254.0f;
  }
}

// R rows of one tile over all K inputs. codes: the tile's [K / 4][32] bytes; so: its [K / 32][2][16]
// floats (d, then m). The float sums stay in registers for few rows, else in y (the same operations
// in the same order either way, so the same bits).
template <int R>
inline void tile_rows(const uint8_t* codes, const float* so, const CodedRows& xs, int64_t row0, float* y,
                      int64_t ldy) {
  constexpr bool IN_REGISTERS = R <= REGISTER_ROWS;
  const int64_t K = xs.K;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 out[R][2];
  for (int r = 0; r < R; ++r) {
    out[r][0] = out[r][1] = _mm256_setzero_ps();
    if (!IN_REGISTERS) {
      _mm256_storeu_ps(y + r * ldy, out[r][0]);
      _mm256_storeu_ps(y + r * ldy + 8, out[r][1]);
    }
  }
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m256i acc[R][DIGITS][2];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < DIGITS; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_si256();
    const uint8_t* c = codes + g * (GROUP / STEP) * 32;
    for (int64_t s = 0; s < GROUP / STEP; ++s) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 32 * s));
      const __m256i a = _mm256_and_si256(v, low);                        // columns 0..7, 4 inputs each
      const __m256i b = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);  // columns 8..15
      for (int r = 0; r < R; ++r)
        for (int p = 0; p < DIGITS; ++p) {
          int32_t four;  // this row's 4 digits, in every lane
          std::memcpy(&four, xs.q[p] + (row0 + r) * K + g * GROUP + STEP * s, 4);
          const __m256i xb = _mm256_set1_epi32(four);
          acc[r][p][0] = _mm256_add_epi16(acc[r][p][0], _mm256_maddubs_epi16(a, xb));
          acc[r][p][1] = _mm256_add_epi16(acc[r][p][1], _mm256_maddubs_epi16(b, xb));
        }
    }
    const __m256 d[2] = {_mm256_loadu_ps(so + g * 32), _mm256_loadu_ps(so + g * 32 + 8)};
    const __m256 m[2] = {_mm256_loadu_ps(so + g * 32 + 16), _mm256_loadu_ps(so + g * 32 + 24)};
    for (int r = 0; r < R; ++r) {
      const int64_t block = (row0 + r) * (K / GROUP) + g;
      const __m256 sx = _mm256_set1_ps(xs.sx[block]);
      for (int h = 0; h < 2; ++h) {
        __m256 f = _mm256_setzero_ps();  // sum_p dx_p * S_p, the finer digit first
        for (int p = DIGITS - 1; p >= 0; --p)
          f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][p][h], ones)),
                              _mm256_set1_ps(xs.dx[p][block]), f);
        float* yr = y + r * ldy + 8 * h;
        const __m256 prev = IN_REGISTERS ? out[r][h] : _mm256_loadu_ps(yr);
        out[r][h] = _mm256_fmadd_ps(m[h], sx, _mm256_fmadd_ps(f, d[h], prev));
        if (!IN_REGISTERS) _mm256_storeu_ps(yr, out[r][h]);
      }
    }
  }
  if (IN_REGISTERS)
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(y + r * ldy, out[r][0]);
      _mm256_storeu_ps(y + r * ldy + 8, out[r][1]);
    }
}

}  // namespace

// x float32 [M, K]; packed uint8 [N / 16, K / 4, 32]: per tile and 4 inputs 4j + e, byte 4c + e holds
// column c's code in its low nibble and column 8 + c's in its high nibble (runtime/model/linear.py's
// pack_int4_quads); scales float32 [N / 16, K / 32, 2, 16] (d, then m). y [M, N] float32.
torch::Tensor int4_linear_i8(torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "int4_linear_i8: x [M, K], float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == 32,
              "int4_linear_i8: packed codes [N / 16, K / 4, 32] of uint8");
  const int64_t M = x.size(0), K = x.size(1), tiles = packed.size(0), N = tiles * COLS;
  TORCH_CHECK(K % GROUP == 0 && packed.size(1) * STEP == K, "int4_linear_i8: x has ", K, " inputs, the codes ",
              packed.size(1) * STEP, " (a multiple of 32)");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 4 && scales.size(0) == tiles &&
                  scales.size(1) == K / GROUP && scales.size(2) == 2 && scales.size(3) == COLS,
              "int4_linear_i8: scales [N / 16, K / 32, 2, 16], float32");
  x = x.contiguous();
  packed = packed.contiguous();
  scales = scales.contiguous();
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const int64_t blocks = M * (K / GROUP);
  auto q = torch::empty({DIGITS, M, K}, x.options().dtype(at::kChar));
  auto scalars = torch::empty({DIGITS + 1, blocks}, x.options());
  CodedRows xs;
  xs.K = K;
  xs.sx = scalars.data_ptr<float>() + DIGITS * blocks;
  for (int p = 0; p < DIGITS; ++p) {
    xs.q[p] = q.data_ptr<int8_t>() + p * M * K;
    xs.dx[p] = scalars.data_ptr<float>() + p * blocks;
  }
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, blocks, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) code_block(xp + i * GROUP, xs, i);
  });
  const auto* pp = static_cast<const uint8_t*>(packed.data_ptr());
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const uint8_t* codes = pp + t * (K / STEP) * 32;
      const float* so = sp + t * (K / GROUP) * 2 * COLS;
      float* yt = yp + t * COLS;
      int64_t r = 0;
      for (; r + ROWS <= M; r += ROWS) tile_rows<ROWS>(codes, so, xs, r, yt + r * N, N);
      if (M - r == 2) tile_rows<2>(codes, so, xs, r, yt + r * N, N);
      if (M - r == 1) tile_rows<1>(codes, so, xs, r, yt + r * N, N);
    }
  });
  return y;
}
bool quant_linear_i8_available() { return true; }

#else
torch::Tensor int4_linear_i8(torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "int4_linear_i8: built without AVX2 and FMA");
}
bool quant_linear_i8_available() { return false; }
#endif

TORCH_LIBRARY_FRAGMENT(jumpgate_cpu, m) {
  m.def("int4_linear_i8(Tensor x, Tensor packed, Tensor scales) -> Tensor", &int4_linear_i8);
  m.def("quant_linear_i8_available() -> bool", &quant_linear_i8_available);
}
