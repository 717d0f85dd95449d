// The math route of openreg's attention kernels (math_attention.h).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/frontends/math_attention.h"

#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros_like.h>

namespace openreg {
namespace {

at::Tensor repeat_heads(const at::Tensor& t, const at::Tensor& query) {
  if (t.dim() < 3 || query.dim() != t.dim() || t.size(-3) == query.size(-3)) {
    return t;
  }
  TORCH_CHECK(query.size(-3) % t.size(-3) == 0, "attention on openreg: ", query.size(-3),
              " query heads cannot share ", t.size(-3), " key/value heads");
  return t.repeat_interleave(query.size(-3) / t.size(-3), -3);
}

// A gradient of repeated key/value heads, summed back to the heads of `like`.
at::Tensor heads_back(const at::Tensor& grad, const at::Tensor& like) {
  if (grad.dim() < 3 || grad.size(-3) == like.size(-3)) {
    return grad;
  }
  std::vector<int64_t> grouped = like.sizes().vec();
  grouped.insert(grouped.end() - 2, grad.size(-3) / like.size(-3));
  return grad.reshape(grouped).sum(-3);
}

// A copy of the device's default generator, at `state` when one is given.
at::Generator generator_copy(c10::Device device, const at::Tensor& state = at::Tensor()) {
  at::Generator device_generator = at::globalContext().defaultGenerator(device);
  at::Generator copy;
  {
    std::lock_guard<std::mutex> lock(device_generator.mutex());
    copy = device_generator.clone();
  }
  if (state.defined()) {
    copy.set_state(state);
  }
  return copy;
}

at::Tensor keep_scale_from(const at::Tensor& like, double dropout_p, const at::Generator& generator) {
  return at::empty_like(like).bernoulli_(1.0 - dropout_p, generator) / (1.0 - dropout_p);
}

} // namespace

at::Tensor widened(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
}

std::optional<at::Tensor> additive_mask(const at::Tensor& mask, const at::Tensor& query) {
  if (!mask.defined()) {
    return std::nullopt;
  }
  if (mask.scalar_type() != at::kBool) {
    return mask;
  }
  auto additive = at::zeros_like(mask, query.options());
  return additive.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
}

MathAttention math_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const at::Tensor& attn_bias, bool is_causal, std::optional<double> scale) {
  MathAttention math;
  const at::Tensor q = widened(query);
  math.key = repeat_heads(widened(key), query);
  math.value = repeat_heads(widened(value), query);
  math.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  at::Tensor scores = at::matmul(q, math.key.transpose(-2, -1)) * math.scale;
  if (is_causal) {
    at::Tensor keep = at::ones({query.size(-2), key.size(-2)}, query.options().dtype(at::kBool)).tril();
    scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  }
  if (auto mask = additive_mask(attn_bias, query)) {
    scores = scores + widened(*mask);
  }
  math.probabilities = at::softmax(scores, -1);
  math.scores = std::move(scores);
  return math;
}

MathAttentionGrads math_attention_backward(const MathAttention& math, const at::Tensor& grad_out,
                                           const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                           const at::Tensor& keep_scale) {
  const at::Tensor dout = widened(grad_out);
  const at::Tensor& p = math.probabilities;
  at::Tensor grad_value = at::matmul((keep_scale.defined() ? p * keep_scale : p).transpose(-2, -1), dout);
  at::Tensor dp = at::matmul(dout, math.value.transpose(-2, -1));
  if (keep_scale.defined()) {
    dp = dp * keep_scale;
  }
  at::Tensor ds = p * (dp - (dp * p).sum(-1, /*keepdim=*/true));
  at::Tensor grad_query = at::matmul(ds, math.key) * math.scale;
  at::Tensor grad_key = at::matmul(ds.transpose(-2, -1), widened(query)) * math.scale;
  return {std::move(grad_query), heads_back(grad_key, key), heads_back(grad_value, value), std::move(ds)};
}

DropoutDraw draw_dropout(const at::Tensor& like, double dropout_p) {
  const c10::Device device = like.device();
  at::Generator copy = generator_copy(device);
  DropoutDraw draw;
  draw.state = copy.get_state();
  draw.seed = copy.current_seed();
  draw.offset = copy.get_offset();
  draw.keep_scale = keep_scale_from(like, dropout_p, copy);
  // Moves the device's default generator past the draw: to the copy's state
  // when nobody drew from it meanwhile, else by a draw of its own.
  at::Generator device_generator = at::globalContext().defaultGenerator(device);
  {
    std::lock_guard<std::mutex> lock(device_generator.mutex());
    if (at::equal(device_generator.get_state(), draw.state)) {
      device_generator.set_state(copy.get_state());
      return draw;
    }
  }
  keep_scale_from(like, dropout_p, device_generator);
  return draw;
}

at::Tensor redraw_dropout(const at::Tensor& like, double dropout_p, const at::Tensor& state) {
  return keep_scale_from(like, dropout_p, generator_copy(like.device(), state));
}

at::Tensor redraw_dropout(const at::Tensor& like, double dropout_p, uint64_t seed, uint64_t offset) {
  at::Generator generator = generator_copy(like.device());
  generator.set_current_seed(seed);
  generator.set_offset(offset);
  return keep_scale_from(like, dropout_p, generator);
}

} // namespace openreg
