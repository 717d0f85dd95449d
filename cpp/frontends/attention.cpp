// Fused scaled dot product attention on openreg: the OVERRIDEABLE backend of
// torch.nn.functional.scaled_dot_product_attention, forward and backward.
//
// Note [Fused attention]
// ~~~~~~~~~~~~~~~~~~~~~~
// scaled_dot_product_attention asks the device which backend to run (the
// dispatch stub _fused_sdp_choice_stub; torch._fused_sdp_choice asks the op
// of that name). With neither registered for openreg, sdpa took the math path
// (bmm, softmax, bmm: more ops, more memory, other rounding than the CPU's
// fused kernel). openreg now answers OVERRIDEABLE, the backend PyTorch keeps
// for out-of-tree devices, whenever the CPU's fused (flash) kernel can do
// the work, and implements _scaled_dot_product_fused_attention_overrideable
// and its backward with that kernel: at::_scaled_dot_product_flash_attention_for_cpu
// (and _backward) called on the openreg tensors, which the boxed fallback
// runs in stream order on the device memory (Note [Fallback]). Values and
// gradients are the CPU's, bit for bit. What the fused kernel cannot do goes
// to the math path, as on CUDA: dropout (the math path draws its mask from
// the device generator, reproducible from the seed), a mask that needs a
// gradient, grouped-query attention, head sizes that differ, other dtypes
// or ranks. torch.nn.attention.sdpa_kernel choices are honoured. Called
// directly, the overrideable op itself takes every input the math path
// takes, and routes what the fused kernel cannot do (dropout included)
// through its own math route (math_attention.h), forward and backward.
// Its backward returns the gradient of a floating-point attn_bias when
// grad_input_mask asks for it, as CUDA's memory-efficient kernel does
// (computed on the math route: the CPU's fused backward has none). sdpa
// never picks CUDA's own backends on openreg, but the flash and
// memory-efficient operators beneath them, which libraries call by name,
// run on the same math route (Note [Flash and efficient attention]).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <torch/library.h>

#include "torch_openreg/cpp/frontends/math_attention.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

bool fused_kernel_can_run(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool enable_gqa) {
  const auto dtype = query.scalar_type();
  const bool float_dtype =
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (!float_dtype || key.scalar_type() != dtype || value.scalar_type() != dtype) {
    return false;
  }
  if (query.dim() != 4 || key.dim() != 4 || value.dim() != 4 || query.is_nested()) {
    return false;
  }
  if (dropout_p > 0.0 || enable_gqa || query.size(1) != key.size(1) || key.size(1) != value.size(1)) {
    return false;
  }
  if (query.size(-1) != key.size(-1) || key.size(-1) != value.size(-1)) {
    return false;
  }
  if (attn_mask.has_value() && attn_mask->defined()) {
    const auto& mask = *attn_mask;
    const bool mask_dtype = mask.scalar_type() == at::kBool || mask.scalar_type() == dtype;
    if (!mask_dtype || (mask.dim() != 2 && mask.dim() != 4)) {
      return false;
    }
  }
  return true;
}

bool mask_needs_grad(const std::optional<at::Tensor>& attn_mask) {
  return attn_mask.has_value() && attn_mask->defined() && at::GradMode::is_enabled() && attn_mask->requires_grad();
}

int64_t fused_sdp_choice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    std::optional<double> scale,
    bool enable_gqa) {
  const auto& context = at::globalContext();
  if (context.userEnabledOverrideableSDP() && !mask_needs_grad(attn_mask) &&
      fused_kernel_can_run(query, key, value, attn_mask, dropout_p, enable_gqa)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  TORCH_CHECK(
      context.userEnabledMathSDP(),
      "scaled_dot_product_attention on openreg: no enabled backend can run these inputs. The fused "
      "(OVERRIDEABLE) backend ",
      context.userEnabledOverrideableSDP() ? "takes 4-D float query/key/value with equal head counts and "
                                             "head sizes, no dropout and no mask that requires grad"
                                           : "is disabled",
      ", and the MATH backend is disabled (torch.nn.attention.sdpa_kernel)");
  return static_cast<int64_t>(at::SDPBackend::math);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
fused_attention(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias,
    double dropout_p,
    bool is_causal,
    bool return_debug_mask,
    std::optional<double> scale) {
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0,
              "_scaled_dot_product_fused_attention_overrideable on openreg: dropout_p must be in [0, 1), got ",
              dropout_p);
  TORCH_CHECK(!return_debug_mask, "_scaled_dot_product_fused_attention_overrideable on openreg: no debug mask");
  at::Tensor output, logsumexp;
  // No random state without dropout: the output that carries it is empty,
  // as in the Meta kernel.
  at::Tensor random_state = at::empty({}, query.options().dtype(at::kLong));
  if (fused_kernel_can_run(query, key, value, attn_bias, dropout_p, false)) {
    auto mask = attn_bias.has_value() ? additive_mask(*attn_bias, query) : std::nullopt;
    std::tie(output, logsumexp) =
        at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, mask, scale);
  } else {
    MathAttention math = math_attention(query, key, value, attn_bias.value_or(at::Tensor()), is_causal, scale);
    at::Tensor probabilities = math.probabilities;
    if (dropout_p > 0.0) {
      // The random state output carries the generator's state before the
      // draw, from which the backward draws the mask again.
      DropoutDraw draw = draw_dropout(probabilities, dropout_p);
      random_state = draw.state;
      probabilities = probabilities * draw.keep_scale;
    }
    output = at::matmul(probabilities, math.value).to(query.scalar_type());
    logsumexp = at::logsumexp(math.scores, -1).to(at::kFloat);
  }
  // No variable-length batches and no debug mask: the outputs that carry
  // them are empty, as in the Meta kernel.
  return {
      output,
      logsumexp,
      at::Tensor(),
      at::Tensor(),
      c10::SymInt(query.size(-2)),
      c10::SymInt(key.size(-2)),
      random_state,
      at::empty({}, query.options().dtype(at::kLong)),
      at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const at::Tensor& attn_bias,
    std::array<bool, 4> grad_input_mask,
    const at::Tensor& out,
    const at::Tensor& logsumexp,
    const at::Tensor& cum_seq_q,
    const at::Tensor& cum_seq_k,
    c10::SymInt max_q,
    c10::SymInt max_k,
    double dropout_p,
    bool is_causal,
    const at::Tensor& philox_seed,
    const at::Tensor& philox_offset,
    std::optional<double> scale) {
  if (!grad_out.defined()) {
    return {}; // nothing flows back
  }
  const bool grad_bias = grad_input_mask[3] && attn_bias.defined();
  TORCH_CHECK(!grad_bias || attn_bias.is_floating_point(),
              "_scaled_dot_product_fused_attention_overrideable_backward on openreg: no gradient for a ",
              attn_bias.scalar_type(), " attn_bias (only a floating-point, additive bias has one)");
  if (!grad_bias && fused_kernel_can_run(query, key, value, attn_bias, dropout_p, false)) {
    auto [grad_query, grad_key, grad_value] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, additive_mask(attn_bias, query), scale);
    return {grad_query, grad_key, grad_value, at::Tensor()};
  }
  // The math route (math_attention_backward); the bias is added to the
  // scores, so its gradient is dS, summed over the dimensions along which it
  // was broadcast.
  MathAttention math = math_attention(query, key, value, attn_bias, is_causal, scale);
  const at::Tensor keep_scale =
      dropout_p > 0.0 ? redraw_dropout(math.probabilities, dropout_p, philox_seed) : at::Tensor();
  MathAttentionGrads grads = math_attention_backward(math, grad_out, query, key, value, keep_scale);
  at::Tensor grad_attn_bias =
      grad_bias ? grads.scores.sum_to_size(attn_bias.sizes()).to(attn_bias.scalar_type()) : at::Tensor();
  return {grads.query.to(query.scalar_type()), grads.key.to(key.scalar_type()), grads.value.to(value.scalar_type()),
          grad_attn_bias};
}

} // namespace

void register_attention(KernelRegistrar& kernels) {
  // scaled_dot_product_attention asks the dispatch stub, torch._fused_sdp_choice the op.
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&fused_sdp_choice);
  kernels.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  kernels.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(fused_attention));
  kernels.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(fused_attention_backward));
}

} // namespace openreg
