// The math route of openreg's attention kernels: softmax(q k^T * scale +
// bias) v computed with ordinary device ops, forward and backward, and the
// dropout mask it draws from the device generator. The overrideable sdpa
// backend (Note [Fused attention], attention.cpp) takes it for what the CPU's
// fused kernel cannot do; CUDA's flash and memory-efficient attention
// operators (Note [Flash and efficient attention],
// flash_efficient_attention.cpp) take it for everything.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace openreg {

// Query, key and value are (..., heads, sequence, head_dim), heads at dim -3;
// query heads a multiple of key/value heads (grouped-query attention repeats
// the key/value heads). float16/bfloat16 are widened to float, as the fused
// kernels accumulate; other dtypes compute in their own.
struct MathAttention {
  at::Tensor key;           // widened, key/value heads repeated to the query's
  at::Tensor value;         // widened, heads repeated
  at::Tensor scores;        // q k^T * scale + bias; -inf where masked
  at::Tensor probabilities; // softmax(scores) over the keys
  double scale;
};

// float16/bfloat16 as float; other dtypes unchanged.
at::Tensor widened(const at::Tensor& t);

// A boolean mask (true: attend) as the additive mask the fused kernels take
// (0 or -inf, in `query`'s dtype); a floating-point mask as it is; nullopt
// for an undefined one.
std::optional<at::Tensor> additive_mask(const at::Tensor& mask, const at::Tensor& query);

// `attn_bias`: undefined, an additive floating-point bias, or a boolean mask
// (true: attend). `is_causal`: the causal mask aligned to the upper left
// (query i attends keys 0..i). `scale` defaults to 1/sqrt(head_dim).
MathAttention math_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const at::Tensor& attn_bias, bool is_causal, std::optional<double> scale);

// The gradients of the math route, in the widened dtype: with P =
// math.probabilities, D = `keep_scale` (1 when undefined), O = (P * D) v:
// dV = (P * D)^T dO, dP = (dO v^T) * D, dS = P * (dP - rowsum(dP * P)),
// dQ = dS k * scale, dK = dS^T q * scale. Repeated key/value heads sum
// their gradients back to `key`'s and `value`'s heads. `scores` is dS, the
// gradient of an additive bias (before summing broadcast dimensions).
struct MathAttentionGrads {
  at::Tensor query;
  at::Tensor key;
  at::Tensor value;
  at::Tensor scores;
};

MathAttentionGrads math_attention_backward(const MathAttention& math, const at::Tensor& grad_out,
                                           const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                           const at::Tensor& keep_scale);

// One dropout draw of the math route, from the default generator of `like`'s
// device: a copy of the generator draws it, and the default generator then
// moves past the draw, so the next call draws another mask (when another
// thread drew from it in between, by a draw of the same size of its own).
struct DropoutDraw {
  at::Tensor keep_scale; // like `like`: 1 / (1 - p) where kept, 0 where dropped
  at::Tensor state;      // the generator's state before the draw (get_state: seed, then offset)
  uint64_t seed;         // the Philox key of the draw
  uint64_t offset;       // the Philox offset of its first number (Note [Philox offsets])
};

DropoutDraw draw_dropout(const at::Tensor& like, double dropout_p);

// The keep-scale of a draw again, from the generator state it started at.
at::Tensor redraw_dropout(const at::Tensor& like, double dropout_p, const at::Tensor& state);
at::Tensor redraw_dropout(const at::Tensor& like, double dropout_p, uint64_t seed, uint64_t offset);

} // namespace openreg
