// y = x @ W.T for the GGUF's own codes with float32 activations, on AVX2 + FMA: the q4 format's
// logits layer on CPUs without native bf16 (its layers run quant_linear_i8.cpp there, and
// quant_linear.cpp on AVX512-BF16; runtime/model/linear.py picks), and the exact reference for both.
//   int4_linear_f32: Q4_1 blocks, w = q * d + m, q in 0..15;
//   int8_linear_f32: Q8_0 blocks, w = q * d, q in -128..127.
//
// The weights are the float32 reference's own, bit for bit. The loader's float32 model is the GGUF
// dequantized (gguf's numpy: d * q + m in float32), and d * q is exact in float32 (an fp16 scale
// times a code of at most 8 bits), so w needs one rounding, which the FMA here does too. So these
// kernels compute with exactly the weights of `--weights fp32`, from a quarter (int4) or half (int8)
// of the bytes plus fp32 scales per group of 32; only the order of each row's sums differs from the
// BLAS call.
//
// Each row's sum runs over the inputs in order, y = fma(w_k, x_k, y), k = 0, 1, ..., by one thread
// per tile of 16 output columns: a row's bits do not depend on the row count, the other rows, the
// thread split or which path below ran. Up to EXPAND_ROWS rows dequantize the codes in registers
// at each use (one or two rows over two tiles at once); more rows dequantize a tile once into a
// buffer and run every row over it.
#include <torch/extension.h>

#include "ops.h"
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int64_t GROUP = 32;       // inputs per scale (and offset)
constexpr int64_t COLS = 16;        // output columns of a tile: two 8-lane vectors
constexpr int ROWS = 4;             // rows a step over codes keeps in registers (8 accumulators + 4 weights)
constexpr int BUFFER_ROWS = 6;      // over a dequantized tile, whose weights FMAs read from memory
constexpr int64_t EXPAND_ROWS = 4;  // up to this many rows, codes are dequantized at each use

// Q4_1 codes in quant_linear_f32's layout [N / 16][K / 2][16 bytes]: byte c holds column c's code of
// input 2j (low nibble) and 2j + 1 (high nibble). Scales [N / 16][K / 32][2][16]: d, then m.
struct Codes4 {
  static constexpr at::ScalarType DTYPE = at::kByte;
  static constexpr int64_t INPUTS_PER_ROW = 2;  // inputs of one row of packed codes
  static constexpr int64_t ROW_BYTES = COLS;
  static constexpr int64_t SCALES = 2;
  // The weights of inputs 2j, 2j + 1 for 16 columns (w[0..1]: input 2j; w[2..3]: input 2j + 1).
  static inline void get(const uint8_t* p, const float* so, __m256 w[4]) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m256 d0 = _mm256_loadu_ps(so), d1 = _mm256_loadu_ps(so + 8);
    const __m256 m0 = _mm256_loadu_ps(so + 16), m1 = _mm256_loadu_ps(so + 24);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d0, m0);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d1, m1);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d0, m0);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d1, m1);
  }
};

// Q8_0 codes in [N / 16][K / 2][32 bytes]: column c's codes of inputs 2j, 2j + 1 at bytes c, 16 + c.
// Scales [N / 16][K / 32][1][16].
struct Codes8 {
  static constexpr at::ScalarType DTYPE = at::kChar;
  static constexpr int64_t INPUTS_PER_ROW = 2;
  static constexpr int64_t ROW_BYTES = 2 * COLS;
  static constexpr int64_t SCALES = 1;
  static inline void get(const uint8_t* p, const float* so, __m256 w[4]) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    const __m256 d0 = _mm256_loadu_ps(so), d1 = _mm256_loadu_ps(so + 8);
    // q * d is exact in float32, so a product stands for the one rounding of Q4_1's FMA
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), d0);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), d1);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d0);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), d1);
  }
};

// R rows of one 16-column tile over all K inputs. `weights(j, w)` gives inputs 2j, 2j + 1.
template <int R, typename Weights>
inline void tile_rows(const Weights& weights, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < K / 2; ++j) {
    __m256 w[4];
    weights(j, w);
    for (int r = 0; r < R; ++r) {
      const __m256 x0 = _mm256_broadcast_ss(x + r * ldx + 2 * j);
      const __m256 x1 = _mm256_broadcast_ss(x + r * ldx + 2 * j + 1);
      acc[r][0] = _mm256_fmadd_ps(w[0], x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w[1], x0, acc[r][1]);
      acc[r][0] = _mm256_fmadd_ps(w[2], x1, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w[3], x1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}

// R rows (1 or 2) over two adjacent tiles at once. A decode row's sums are FMA-latency bound (each
// accumulator waits on its last FMA); two tiles give twice the independent chains, and every
// column's sum keeps the order it has alone.
template <int R, typename Weights>
inline void tile_pair_rows(const Weights& first, const Weights& second, int64_t K, const float* x, int64_t ldx,
                           float* y, int64_t ldy) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < K / 2; ++j) {
    __m256 w[4], v[4];
    first(j, w);
    second(j, v);
    for (int r = 0; r < R; ++r) {
      const __m256 x0 = _mm256_broadcast_ss(x + r * ldx + 2 * j);
      const __m256 x1 = _mm256_broadcast_ss(x + r * ldx + 2 * j + 1);
      acc[r][0] = _mm256_fmadd_ps(w[0], x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w[1], x0, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(v[0], x0, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(v[1], x0, acc[r][3]);
      acc[r][0] = _mm256_fmadd_ps(w[2], x1, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w[3], x1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(v[2], x1, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(v[3], x1, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(y + r * ldy + 8 * c, acc[r][c]);
}

template <int STEP, typename Weights>
void run_rows(const Weights& weights, int64_t K, const float* x, int64_t M, float* y, int64_t N) {
  int64_t r = 0;
  for (; r + STEP <= M; r += STEP) tile_rows<STEP>(weights, K, x + r * K, K, y + r * N, N);
  switch (M - r) {  // the rest, each row still alone in its own accumulators
    case 5: tile_rows<5>(weights, K, x + r * K, K, y + r * N, N); break;
    case 4: tile_rows<4>(weights, K, x + r * K, K, y + r * N, N); break;
    case 3: tile_rows<3>(weights, K, x + r * K, K, y + r * N, N); break;
    case 2: tile_rows<2>(weights, K, x + r * K, K, y + r * N, N); break;
    case 1: tile_rows<1>(weights, K, x + r * K, K, y + r * N, N); break;
    default: break;
  }
}

template <typename Codes>
torch::Tensor quant_linear_f32(const char* name, torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  constexpr int64_t ROW_BYTES = Codes::ROW_BYTES;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, name, ": x [M, K], float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == Codes::DTYPE && packed.size(2) == ROW_BYTES, name,
              ": packed codes [N / 16, K / 2, ", ROW_BYTES, "] of ", c10::toString(Codes::DTYPE));
  const int64_t M = x.size(0), K = x.size(1), tiles = packed.size(0), N = tiles * COLS;
  TORCH_CHECK(K % GROUP == 0 && packed.size(1) * Codes::INPUTS_PER_ROW == K, name,
              ": x has ", K, " inputs, the codes ", packed.size(1) * Codes::INPUTS_PER_ROW, " (a multiple of 32)");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 4 && scales.size(0) == tiles &&
                  scales.size(1) == K / GROUP && scales.size(2) == Codes::SCALES && scales.size(3) == COLS,
              name, ": scales [N / 16, K / 32, ", Codes::SCALES, ", 16], float32");
  x = x.contiguous();
  packed = packed.contiguous();
  scales = scales.contiguous();
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const auto* pp = static_cast<const uint8_t*>(packed.data_ptr());
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t per_group = GROUP / 2, scale_stride = Codes::SCALES * COLS;
  at::parallel_for(0, tiles, 2, [&](int64_t b, int64_t e) {
    std::vector<float> buf(M > EXPAND_ROWS ? K * COLS : 0);  // a tile's weights, [K][16]
    auto codes_of = [&](int64_t t) {
      const uint8_t* codes = pp + t * (K / 2) * ROW_BYTES;
      const float* so = sp + t * (K / GROUP) * scale_stride;
      return [codes, so, per_group, scale_stride](int64_t j, __m256 w[4]) {
        Codes::get(codes + j * Codes::ROW_BYTES, so + (j / per_group) * scale_stride, w);
      };
    };
    for (int64_t t = b; t < e; ++t) {
      const auto from_codes = codes_of(t);
      if (M <= 2 && t + 1 < e) {
        if (M == 1) tile_pair_rows<1>(from_codes, codes_of(t + 1), K, xp, K, yp + t * COLS, N);
        else tile_pair_rows<2>(from_codes, codes_of(t + 1), K, xp, K, yp + t * COLS, N);
        ++t;
        continue;
      }
      if (M <= EXPAND_ROWS) {
        run_rows<ROWS>(from_codes, K, xp, M, yp + t * COLS, N);
        continue;
      }
      for (int64_t j = 0; j < K / 2; ++j) {
        __m256 w[4];
        from_codes(j, w);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(buf.data() + (2 * j + i / 2) * COLS + (i % 2) * 8, w[i]);
      }
      auto from_buffer = [&](int64_t j, __m256 w[4]) {
        const float* p = buf.data() + 2 * j * COLS;
        w[0] = _mm256_loadu_ps(p);
        w[1] = _mm256_loadu_ps(p + 8);
        w[2] = _mm256_loadu_ps(p + COLS);
        w[3] = _mm256_loadu_ps(p + COLS + 8);
      };
      run_rows<BUFFER_ROWS>(from_buffer, K, xp, M, yp + t * COLS, N);
    }
  });
  return y;
}

}  // namespace

// x float32 [M, K]; packed/scales in the layouts above (runtime/model/linear.py packs them). y [M, N] float32.
torch::Tensor int4_linear_f32(torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  return quant_linear_f32<Codes4>("int4_linear_f32", x, packed, scales);
}
torch::Tensor int8_linear_f32(torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  return quant_linear_f32<Codes8>("int8_linear_f32", x, packed, scales);
}
bool quant_linear_f32_available() { return true; }

#else
torch::Tensor int4_linear_f32(torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "int4_linear_f32: built without AVX2 and FMA");
}
torch::Tensor int8_linear_f32(torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "int8_linear_f32: built without AVX2 and FMA");
}
bool quant_linear_f32_available() { return false; }
#endif

TORCH_LIBRARY_FRAGMENT(jumpgate_cpu, m) {
  m.def("int4_linear_f32(Tensor x, Tensor packed, Tensor scales) -> Tensor", &int4_linear_f32);
  m.def("int8_linear_f32(Tensor x, Tensor packed, Tensor scales) -> Tensor", &int8_linear_f32);
  m.def("quant_linear_f32_available() -> bool", &quant_linear_f32_available);
}
