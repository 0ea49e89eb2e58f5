// The small ops between a decoder layer's matmuls, fused, for the q4/q8/bf16 weight formats on CPU,
// in the linear layers' activation dtype: bf16, or float32 where q4 runs quant_linear_f32.cpp
// (runtime/model.py says when they are used and why).
//
// Unfused, a layer runs ~40 dispatcher ops around its 4 matmuls (norm: 6, dtype casts: 8, rope:
// 8, two index_put K/V writes, silu, mul, ...); at batch 1 their dispatch is a third of the step.
// Each op here is one pass over its rows, and every row is computed alone in one fixed order, so
// a row's result does not depend on the batch, the row count or the thread split (the engine's
// batch invariance holds through them as through the attention kernel).
#include <torch/extension.h>

#include "ops.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec.h"

namespace {

using namespace jumpgate;

constexpr int64_t ROW_GRAIN = 8;  // rows per thread chunk: a decode step's few rows stay on one thread

template <typename F>
void for_rows(int64_t rows, const F& f) {
  at::parallel_for(0, rows, ROW_GRAIN, [&](int64_t b, int64_t e) { for (int64_t r = b; r < e; ++r) f(r); });
}

// An activation row is bf16 (the bf16 kernels' input and output) or float32 (quant_linear_f32's).
inline vf load_act(const at::BFloat16* p, int n) { return load_bf16(p, n); }
inline vf load_act(const float* p, int n) { return load_part(p, n); }
inline void store_act(at::BFloat16* p, vf v, int n) { store_bf16(p, v, n); }
inline void store_act(float* p, vf v, int n) { store_part(p, v, n); }
template <typename Act>
constexpr const char* act_name() { return std::is_same_v<Act, float> ? "float32" : "bfloat16"; }

// One row: x * rsqrt(mean(x^2) + eps) * w into the activation dtype.
template <typename Act>
void norm_row(const float* row, const float* wp, int64_t D, double eps, Act* out) {
  vf acc = splat(0.f);
  for (int64_t d = 0; d < D; d += W) {
    const vf v = load_part(row + d, static_cast<int>(std::min<int64_t>(W, D - d)));
    acc = acc + v * v;
  }
  const float scale = 1.f / std::sqrt(hsum(acc) / static_cast<float>(D) + static_cast<float>(eps));
  for (int64_t d = 0; d < D; d += W) {
    const int n = static_cast<int>(std::min<int64_t>(W, D - d));
    store_act(out + d, load_part(row + d, n) * scale * load_part(wp + d, n), n);
  }
}

template <typename Act>
torch::Tensor rms_norm_as(const char* name, torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
              w.numel() == x.size(1), name, ": x [T, D] and w [D], float32");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t T = x.size(0), D = x.size(1);
  auto out = torch::empty({T, D}, x.options().dtype(c10::CppTypeToScalarType<Act>::value));
  const float* xp = x.template data_ptr<float>();
  const float* wp = w.template data_ptr<float>();
  Act* op = out.template data_ptr<Act>();
  for_rows(T, [&](int64_t r) { norm_row(xp + r * D, wp, D, eps, op + r * D); });
  return out;
}

template <typename Act>
torch::Tensor add_rms_norm_as(const char* name, torch::Tensor h, torch::Tensor delta, torch::Tensor w, double eps) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat && h.is_contiguous() && w.scalar_type() == at::kFloat &&
              w.numel() == h.size(1), name, ": h [T, D] float32 contiguous, w [D] float32");
  TORCH_CHECK(delta.scalar_type() == c10::CppTypeToScalarType<Act>::value && delta.sizes() == h.sizes(),
              name, ": delta [T, D], ", act_name<Act>());
  delta = delta.contiguous();
  w = w.contiguous();
  const int64_t T = h.size(0), D = h.size(1);
  auto out = torch::empty({T, D}, h.options().dtype(c10::CppTypeToScalarType<Act>::value));
  float* hp = h.template data_ptr<float>();
  const Act* dp = delta.template data_ptr<Act>();
  const float* wp = w.template data_ptr<float>();
  Act* op = out.template data_ptr<Act>();
  for_rows(T, [&](int64_t r) {
    float* row = hp + r * D;
    for (int64_t d = 0; d < D; d += W) {
      const int n = static_cast<int>(std::min<int64_t>(W, D - d));
      store_part(row + d, load_part(row + d, n) + load_act(dp + r * D + d, n), n);
    }
    norm_row(row, wp, D, eps, op + r * D);
  });
  return out;
}

template <typename Act>
torch::Tensor silu_mul_as(const char* name, torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == c10::CppTypeToScalarType<Act>::value &&
              gate_up.size(1) % 2 == 0, name, ": gate_up [T, 2I], ", act_name<Act>());
  gate_up = gate_up.contiguous();
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({T, I}, gate_up.options());
  const Act* gp = gate_up.template data_ptr<Act>();
  Act* op = out.template data_ptr<Act>();
  for_rows(T, [&](int64_t r) {
    for (int64_t i = 0; i < I; i += W) {
      const int n = static_cast<int>(std::min<int64_t>(W, I - i));
      const vf g = load_act(gp + r * 2 * I + i, n), u = load_act(gp + r * 2 * I + I + i, n);
      store_act(op + r * I + i, g / (1.f + exp_v(-g)) * u, n);
    }
  });
  return out;
}

}  // namespace

// x [T, D] float32 -> bf16 [T, D]: x * rsqrt(mean(x^2) + eps) * w, the input of the next matmul.
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor w, double eps) {
  return rms_norm_as<at::BFloat16>("rms_norm_bf16", x, w, eps);
}

// The residual add and the next norm in one pass: h [T, D] float32 += delta [T, D] bf16 (exact
// widening, one fp32 add: what `h += delta` gives), in place; returns rms_norm_bf16(h, w, eps).
torch::Tensor add_rms_norm_bf16(torch::Tensor h, torch::Tensor delta, torch::Tensor w, double eps) {
  return add_rms_norm_as<at::BFloat16>("add_rms_norm_bf16", h, delta, w, eps);
}

// gate_up bf16 [T, 2I] (gate first, then up) -> bf16 [T, I]: silu(gate) * up.
torch::Tensor silu_mul_bf16(torch::Tensor gate_up) { return silu_mul_as<at::BFloat16>("silu_mul_bf16", gate_up); }

// The same three with float32 activations (q4 through quant_linear_f32.cpp).
torch::Tensor rms_norm_f32(torch::Tensor x, torch::Tensor w, double eps) {
  return rms_norm_as<float>("rms_norm_f32", x, w, eps);
}
torch::Tensor add_rms_norm_f32(torch::Tensor h, torch::Tensor delta, torch::Tensor w, double eps) {
  return add_rms_norm_as<float>("add_rms_norm_f32", h, delta, w, eps);
}
torch::Tensor silu_mul_f32(torch::Tensor gate_up) { return silu_mul_as<float>("silu_mul_f32", gate_up); }

// qkv [T, (H + 2 KVH) D], bf16 or float32: q, k, v side by side. Rotates q and k by the rope
// tables (cos and sin with its first half negated, [T, D]: runtime/model/rope.py), writes k and v into
// the float32 caches at `slots`, and returns q float32 [T, H, D] for attention.
template <typename Act>
torch::Tensor rope_store_as(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin_signed, torch::Tensor slots,
                            torch::Tensor k_cache, torch::Tensor v_cache, int64_t heads) {
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == at::kFloat &&
              v_cache.scalar_type() == at::kFloat && k_cache.strides() == v_cache.strides() && k_cache.stride(2) == 1,
              "rope_store: caches [S, KVH, D], float32, head_dim contiguous, K and V alike");
  const int64_t T = qkv.size(0), KVH = k_cache.size(1), D = k_cache.size(2), S = k_cache.size(0);
  TORCH_CHECK(qkv.size(1) == (heads + 2 * KVH) * D && D % 2 == 0, "rope_store: qkv width is not (H+2KVH)D");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin_signed.scalar_type() == at::kFloat && cos.numel() == T * D &&
              sin_signed.numel() == T * D, "rope_store: tables [T, D], float32");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == T, "rope_store: slots [T], int64");
  qkv = qkv.contiguous();
  cos = cos.contiguous();
  sin_signed = sin_signed.contiguous();
  slots = slots.contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < S, "rope_store: slot out of range");
  auto q = torch::empty({T, heads, D}, k_cache.options());
  const Act* xp = qkv.template data_ptr<Act>();
  const float* cp = cos.data_ptr<float>();
  const float* sn = sin_signed.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = k_cache.data_ptr<float>();
  float* vp = v_cache.data_ptr<float>();
  // slot-major ([S, KVH, D] contiguous) or head-major (a [KVH, S, D] buffer seen as [S, KVH, D]): KVPool
  const int64_t half = D / 2, width = qkv.size(1), slot_stride = k_cache.stride(0), head_stride = k_cache.stride(1);
  for_rows(T, [&](int64_t t) {
    const Act* row = xp + t * width;
    const float* c = cp + t * D;
    const float* s = sn + t * D;
    // x * cos + swap_halves(x) * sin_signed, per head (the Hugging Face half-split layout)
    auto rotate = [&](const Act* x, float* dst) {
      for (int64_t d = 0; d < D; ++d) {
        const float xd = static_cast<float>(x[d]), xs = static_cast<float>(x[d < half ? d + half : d - half]);
        dst[d] = xd * c[d] + xs * s[d];
      }
    };
    for (int64_t h = 0; h < heads; ++h) rotate(row + h * D, qp + (t * heads + h) * D);
    for (int64_t h = 0; h < KVH; ++h) {
      rotate(row + (heads + h) * D, kp + sp[t] * slot_stride + h * head_stride);
      const Act* v = row + (heads + KVH + h) * D;
      float* dst = vp + sp[t] * slot_stride + h * head_stride;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(v[d]);
    }
  });
  return q;
}

torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin_signed, torch::Tensor slots,
                         torch::Tensor k_cache, torch::Tensor v_cache, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 2 && (qkv.scalar_type() == at::kBFloat16 || qkv.scalar_type() == at::kFloat),
              "rope_store: qkv [T, (H+2KVH)D], bfloat16 or float32");
  return qkv.scalar_type() == at::kFloat ? rope_store_as<float>(qkv, cos, sin_signed, slots, k_cache, v_cache, heads)
                                         : rope_store_as<at::BFloat16>(qkv, cos, sin_signed, slots, k_cache, v_cache, heads);
}

TORCH_LIBRARY_FRAGMENT(jumpgate_cpu, m) {
  m.def("rms_norm_bf16(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm_bf16);
  m.def("add_rms_norm_bf16(Tensor(a!) h, Tensor delta, Tensor w, float eps) -> Tensor", &add_rms_norm_bf16);
  m.def("silu_mul_bf16(Tensor gate_up) -> Tensor", &silu_mul_bf16);
  m.def("rms_norm_f32(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm_f32);
  m.def("add_rms_norm_f32(Tensor(a!) h, Tensor delta, Tensor w, float eps) -> Tensor", &add_rms_norm_f32);
  m.def("silu_mul_f32(Tensor gate_up) -> Tensor", &silu_mul_f32);
  m.def("rope_store(Tensor qkv, Tensor cos, Tensor sin_signed, Tensor slots, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, int heads) -> Tensor", &rope_store);
}
