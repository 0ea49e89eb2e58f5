// `python -m bench.probes.quant_linear_bench --tile-ceiling` builds and runs this (g++ -O3 -march=native).
// What the q4 linears' arithmetic can reach on one core, and what int8 activations would buy:
//   peak:  independent vdpbf16ps / vpdpbusd (512-bit) in a loop, products a second;
//   bf16:  the kernel's own vector tile (runtime/cpu_kernels/quant_linear_tile.h, tile_rows<8, 2>: 8 rows
//          x 32 columns, codes expanded to bf16 words, per group of 32 inputs the scale and offset
//          steps) over M = 512 rows;
//   vnni:  the same tile with 4-bit codes as bytes times int8 activations (a scale per row and
//          group, as llama.cpp's Q4_1 x Q8_1) in vpdpbusd: half the instructions per product, the
//          scale steps then one conversion and three vector operations per group.
// Constant data: the products' rate does not depend on the values. One JSON line per (kind, K).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../runtime/cpu_kernels/quant_linear_tile.h"

namespace {

using jumpgate::quant_tile::COLS;
using jumpgate::quant_tile::GROUP;
constexpr int R = 8, C = 2;
constexpr int64_t M = 512;

template <typename F>
double best_seconds(F&& f, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Products a second of independent 512-bit dot-product instructions (12 chains hide the latency).
double peak(bool int8) {
  constexpr long ITERS = 50000000;
  __m512 f[12];
  __m512i n[12];
  for (int i = 0; i < 12; ++i) f[i] = _mm512_setzero_ps(), n[i] = _mm512_setzero_si512();
  __m512i a = _mm512_set1_epi16(0x3f80), b = a;
  const double s = best_seconds([&] {
    for (long i = 0; i < ITERS / 12; ++i) {
      for (int j = 0; j < 12; ++j) {
        if (int8) n[j] = _mm512_dpbusd_epi32(n[j], a, b);  // 16 lanes x 4 byte products
        else f[j] = _mm512_dpbf16_ps(f[j], (__m512bh)a, (__m512bh)b);  // 16 lanes x 2 bf16 products
      }
      __asm__ volatile("" : "+v"(a));
    }
  }, 3);
  float total = 0.f;  // every chain is used, so none is dropped as dead code
  for (int i = 0; i < 12; ++i) total += _mm512_reduce_add_ps(f[i]) + static_cast<float>(_mm512_reduce_add_epi32(n[i]));
  volatile float sink = total;
  (void)sink;
  return (ITERS / 12 * 12) * (int8 ? 64.0 : 32.0) / s;  // products (multiply-adds)
}

// y += (d * xs) * sum(q * xq) + m * (xs * sum(xq)) per group: w = d q + m, x = xs xq.
__attribute__((noinline)) void vnni_tile(const uint8_t* w, const int8_t* x, int64_t K, const float* xs,
                                         const float* xsum, const float* so, uint16_t* out) {
  const int64_t groups = K / GROUP;
  __m512 y[R][C];
  for (auto& row : y) for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[R][C];
    for (auto& row : acc) for (auto& v : row) v = _mm512_setzero_si512();
    for (int64_t j = g * 8; j < (g + 1) * 8; ++j) {
      __m512i q[C];
      for (int c = 0; c < C; ++c) q[c] = _mm512_loadu_si512(w + (j * C + c) * 64);
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, x + r * K + 4 * j, 4);
        const __m512i xb = _mm512_set1_epi32(quad);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], q[c], xb);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 d = _mm512_loadu_ps(so + (c * groups + g) * 32), m = _mm512_loadu_ps(so + (c * groups + g) * 32 + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 dx = _mm512_mul_ps(d, _mm512_set1_ps(xs[r * groups + g]));
        y[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), dx, y[r][c]);
        y[r][c] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * groups + g]), y[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * C * COLS + c * COLS), (__m256i)_mm512_cvtneps_pbh(y[r][c]));
}

}  // namespace

int main() {
  const double bf16_peak = peak(false), int8_peak = peak(true);
  std::printf("{\"bench\": \"quant_linear\", \"part\": \"tile_ceiling\", \"kind\": \"peak\", \"threads\": 1, "
              "\"vdpbf16ps_gmac_s\": %.1f, \"vpdpbusd_gmac_s\": %.1f}\n", bf16_peak / 1e9, int8_peak / 1e9);
  for (const int64_t K : {576, 1536}) {  // SmolLM2's layer inputs: hidden, and the MLP's down projection
    const int64_t groups = K / GROUP;
    std::vector<uint16_t> wb(2 * (K / 4) * C * 32, 0x3f80), xb(M * K, 0x3f80), out(M * C * COLS);
    std::vector<uint8_t> wq((K / 4) * C * 64, 3);
    std::vector<int8_t> xq(M * K, 5);
    std::vector<float> sums(M * groups, 1.f), so(C * groups * 32, 1.f);
    const double tb = best_seconds([&] {
      for (int64_t m = 0; m < M; m += R)
        jumpgate::quant_tile::tile_rows<R, C, 2, GROUP>(jumpgate::quant_tile::Expanded<C>{wb.data()}, xb.data() + m * K, K,
                                                        sums.data() + m * groups, groups, so.data(),
                                                        out.data() + m * C * COLS, C * COLS);
    }, 40);
    const double tv = best_seconds([&] {
      for (int64_t m = 0; m < M; m += R)
        vnni_tile(wq.data(), xq.data() + m * K, K, sums.data() + m * groups, sums.data() + m * groups, so.data(),
                  out.data() + m * C * COLS);
    }, 40);
    const double macs = static_cast<double>(M) * K * C * COLS;
    std::printf("{\"bench\": \"quant_linear\", \"part\": \"tile_ceiling\", \"kind\": \"tile\", \"threads\": 1, "
                "\"k\": %ld, \"rows\": %ld, \"bf16_gmac_s\": %.1f, \"bf16_of_peak\": %.3f, \"vnni_gmac_s\": %.1f, "
                "\"vnni_of_peak\": %.3f, \"vnni_vs_bf16\": %.3f}\n",
                static_cast<long>(K), static_cast<long>(M), macs / tb / 1e9, macs / tb / bf16_peak, macs / tv / 1e9,
                macs / tv / int8_peak, tb / tv);
  }
  return 0;
}
