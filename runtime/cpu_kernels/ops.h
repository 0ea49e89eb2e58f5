// The kernels' C++ entry points, for code that calls them without the dispatcher (decoder_layers.cpp).
// Each is also a dispatcher op of the same name (torch.ops.jumpgate_cpu.<name>); the files that
// define them include this header, so a signature that drifts fails to compile.
#pragma once

#include <torch/extension.h>

// paged_attention.cpp
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                              torch::Tensor meta, bool use_tiles, bool bf16_out, bool bf16_products);
// layer_ops.cpp
torch::Tensor add_rms_norm_bf16(torch::Tensor h, torch::Tensor delta, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_f32(torch::Tensor h, torch::Tensor delta, torch::Tensor w, double eps);
torch::Tensor silu_mul_bf16(torch::Tensor gate_up);
torch::Tensor silu_mul_f32(torch::Tensor gate_up);
torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin_signed, torch::Tensor slots,
                         torch::Tensor k_cache, torch::Tensor v_cache, int64_t heads);
// quant_linear.cpp (AVX512-BF16), quant_linear_f32.cpp and quant_linear_i8.cpp (AVX2 + FMA)
torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scale_offset);
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales);
torch::Tensor int4_linear_f32(torch::Tensor x, torch::Tensor packed, torch::Tensor scales);
torch::Tensor int8_linear_f32(torch::Tensor x, torch::Tensor packed, torch::Tensor scales);
torch::Tensor int4_linear_i8(torch::Tensor x, torch::Tensor packed, torch::Tensor scales);
