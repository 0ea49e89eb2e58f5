// Every decoder layer of one model pass in one call, for the fused formats (q4, q8, bf16) on CPU.
//
// runtime/model.py's fused layer is 13 calls from Python a layer (4 linears, rope_store, attention,
// two add_rms_norm, silu_mul, the caches' lookups); at batch 1 each cost 2.5-3 us of dispatch
// against well under a microsecond of work, ~1 ms of a 6 ms step (tests and figures: docs/DEVELOPING.md).
// Here the same kernels run in the same order on the same tensors, called directly, so every output
// bit is the one the Python loop gives (tests/runtime/model/test_decoder_layers.py compares them). Each call is a
// profiler scope named as its dispatcher op, so `python -m bench engine`'s split still sees the
// linear layers and attention by name.
#include <torch/extension.h>
#include <ATen/record_function.h>

#include "ops.h"

namespace {

// How one linear layer runs (runtime/model/linear.py's `loop_spec`): one of our kernels over (a, b), or
// aten's int8 or dense matmul. The output then takes the bias, as the Python `native` does.
enum LinearKind : int64_t {
  INT4 = 0,         // int4_linear(x, packed, scale_offset), bf16 activations
  INT8 = 1,         // int8_linear(x, packed, scales), bf16
  INT4_F32 = 2,     // int4_linear_f32(x, packed, scales), float32
  INT8_F32 = 3,     // int8_linear_f32(x, packed, scales), float32
  INT4_I8 = 4,      // int4_linear_i8(x, packed, scales), float32
  ATEN_INT8 = 5,    // aten::_weight_int8pack_mm(x, qweight, scales), bf16
  DENSE = 6,        // aten::linear(x, weight, bias), bf16
};
constexpr int64_t LINEARS = 4;              // qkv, o_proj, gate_up, down
constexpr int64_t PER_LINEAR = 3;           // a, b, bias
constexpr int64_t PER_LAYER = LINEARS * PER_LINEAR + 2;  // + post_norm, the next norm

// Every layer's linear kinds and tensors, made once when the model loads (runtime/model.py), so a
// pass does not convert the 14 tensors a layer (420 for SmolLM2's 30) from a Python list again.
struct DecoderWeights : torch::CustomClassHolder {
  std::vector<int64_t> kinds;     // LINEARS a layer
  std::vector<at::Tensor> params;  // PER_LAYER a layer; an undefined tensor: no bias
  int64_t layers;

  DecoderWeights(std::vector<int64_t> kinds_, c10::List<std::optional<at::Tensor>> params_)
      : kinds(std::move(kinds_)), layers(static_cast<int64_t>(kinds.size()) / LINEARS) {
    TORCH_CHECK(layers > 0 && static_cast<int64_t>(kinds.size()) == LINEARS * layers &&
                    static_cast<int64_t>(params_.size()) == PER_LAYER * layers,
                "decoder_layers: ", layers, " layers need ", LINEARS * layers, " kinds and ", PER_LAYER * layers,
                " params, not ", kinds.size(), " and ", params_.size());
    for (const int64_t k : kinds) TORCH_CHECK(k >= INT4 && k <= DENSE, "decoder_layers: unknown linear kind ", k);
    params.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      std::optional<at::Tensor> t = params_.get(i);
      params.push_back(t.has_value() ? *t : at::Tensor());
    }
  }
};

at::Tensor linear(int64_t kind, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
  at::Tensor y;
  switch (kind) {
    case INT4: { RECORD_FUNCTION("jumpgate_cpu::int4_linear", {}); y = int4_linear(x, a, b); break; }
    case INT8: { RECORD_FUNCTION("jumpgate_cpu::int8_linear", {}); y = int8_linear(x, a, b); break; }
    case INT4_F32: { RECORD_FUNCTION("jumpgate_cpu::int4_linear_f32", {}); y = int4_linear_f32(x, a, b); break; }
    case INT8_F32: { RECORD_FUNCTION("jumpgate_cpu::int8_linear_f32", {}); y = int8_linear_f32(x, a, b); break; }
    case INT4_I8: { RECORD_FUNCTION("jumpgate_cpu::int4_linear_i8", {}); y = int4_linear_i8(x, a, b); break; }
    case ATEN_INT8: y = at::_weight_int8pack_mm(x, a, b); break;
    case DENSE: return at::linear(x, a, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
    default: TORCH_CHECK(false, "decoder_layers: unknown linear kind ", kind);  // DecoderWeights checked
  }
  return bias.defined() ? y + bias : y;
}

}  // namespace

// h [T, D] float32, the residual stream (grows in place); x = the first layer's input norm of h, in
// the activation dtype (bf16, or float32 for the AVX2 kernels). Per layer i of `weights`: kinds
// [4i .. 4i + 3] and params [14i ..]: (a, b, bias) of qkv, o_proj, gate_up, down, then post_norm
// and the norm after the layer (the next layer's input norm, the last one's the final norm). The
// pass's rope tables, its new tokens' slots and the attention backend's tables
// (runtime/attention/cpu_backend.py) as the Python loop gives them. Returns the last norm's output,
// the logits layer's input.
torch::Tensor decoder_layers(torch::Tensor h, torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed,
                             torch::Tensor out_slots, std::vector<torch::Tensor> k_caches,
                             std::vector<torch::Tensor> v_caches, const c10::intrusive_ptr<DecoderWeights>& weights,
                             torch::Tensor attn_slots, torch::Tensor attn_meta, bool tiles, int64_t heads, double eps,
                             bool bf16_products) {
  const int64_t layers = weights->layers;
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == layers && v_caches.size() == k_caches.size(),
              "decoder_layers: ", layers, " layers need as many K and V caches, not ", k_caches.size(), " and ",
              v_caches.size());
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || x.scalar_type() == at::kFloat, "decoder_layers: activations are bf16 or float32");
  const int64_t t = h.size(0), q_width = heads * k_caches[0].size(2);
  auto add_norm = [&](const at::Tensor& delta, const at::Tensor& w) {
    RECORD_FUNCTION(bf16 ? "jumpgate_cpu::add_rms_norm_bf16" : "jumpgate_cpu::add_rms_norm_f32", {});
    return bf16 ? add_rms_norm_bf16(h, delta, w, eps) : add_rms_norm_f32(h, delta, w, eps);
  };
  for (int64_t li = 0; li < layers; ++li) {
    const int64_t* kind = weights->kinds.data() + LINEARS * li;
    const at::Tensor* p = weights->params.data() + PER_LAYER * li;
    auto run = [&](int64_t j, const at::Tensor& in) {
      const at::Tensor* w = p + PER_LINEAR * j;
      return linear(kind[j], in, w[0], w[1], w[2]);
    };
    at::Tensor q;
    {
      const at::Tensor qkv = run(0, x);
      RECORD_FUNCTION("jumpgate_cpu::rope_store", {});
      q = rope_store(qkv, cos, sin_signed, out_slots, k_caches[li], v_caches[li], heads);
    }
    at::Tensor o;
    {
      RECORD_FUNCTION("jumpgate_cpu::paged_attention", {});
      o = paged_attention(q, k_caches[li], v_caches[li], attn_slots, attn_meta, tiles, bf16, bf16_products)
              .reshape({t, q_width});
    }
    x = add_norm(run(1, o), p[LINEARS * PER_LINEAR]);
    at::Tensor act;
    {
      const at::Tensor gate_up = run(2, x);
      RECORD_FUNCTION(bf16 ? "jumpgate_cpu::silu_mul_bf16" : "jumpgate_cpu::silu_mul_f32", {});
      act = bf16 ? silu_mul_bf16(gate_up) : silu_mul_f32(gate_up);
    }
    x = add_norm(run(3, act), p[LINEARS * PER_LINEAR + 1]);
  }
  return x;
}

TORCH_LIBRARY_FRAGMENT(jumpgate_cpu, m) {
  m.class_<DecoderWeights>("DecoderWeights")
      .def(torch::init<std::vector<int64_t>, c10::List<std::optional<at::Tensor>>>());
  m.def("decoder_layers(Tensor(a!) h, Tensor x, Tensor cos, Tensor sin_signed, Tensor out_slots, "
        "Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, __torch__.torch.classes.jumpgate_cpu.DecoderWeights weights, "
        "Tensor attn_slots, Tensor attn_meta, bool tiles, int heads, float eps, bool bf16_products=False) -> Tensor",
        &decoder_layers);
}
