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
// through its own math route (MathAttention below), forward and backward.
// Its backward returns the gradient of a floating-point attn_bias when
// grad_input_mask asks for it, as CUDA's memory-efficient kernel does
// (computed on the math route: the CPU's fused backward has none).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <mutex>

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

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

// sdpa hands masks over as they came: a boolean mask (true = attend) becomes
// the additive float mask the fused kernel takes.
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

// The math route of the overrideable op, for what the fused kernel cannot
// do: dropout, other ranks, head sizes that differ between key and
// value, grouped-query attention (fewer key/value heads), any float dtype.
// It computes softmax(q k^T * scale + mask) v in float (float16/bfloat16 are
// widened, as the fused kernel accumulates), and its backward recomputes the
// probabilities from the saved inputs.
struct MathAttention {
  at::Tensor key;   // widened, with key/value heads repeated for grouped-query attention
  at::Tensor value;
  at::Tensor scores; // q k^T * scale + mask
  at::Tensor probabilities;
  double scale;
};

at::Tensor widened(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
}

at::Tensor repeat_heads(const at::Tensor& t, const at::Tensor& query) {
  if (t.dim() < 3 || query.dim() != t.dim() || t.size(-3) == query.size(-3)) {
    return t;
  }
  TORCH_CHECK(query.size(-3) % t.size(-3) == 0, "_scaled_dot_product_fused_attention_overrideable on openreg: ",
              query.size(-3), " query heads cannot share ", t.size(-3), " key/value heads");
  return t.repeat_interleave(query.size(-3) / t.size(-3), -3);
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

// Dropout on the math route: the forward draws its mask from a copy of the
// device's default generator and returns the copy's state before the draw
// in the philox_seed output; the backward draws the same mask again from a
// generator set to that state. The default generator then moves past the
// draw, so the next call draws another mask (when another thread drew from
// it in between, by a draw of the same size of its own).
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

// The scaled keep-mask of one dropout draw from `generator`: 1 / (1 - p) where kept, 0 elsewhere.
at::Tensor dropout_keep_scale(const at::Tensor& like, double dropout_p, const at::Generator& generator) {
  return at::empty_like(like).bernoulli_(1.0 - dropout_p, generator) / (1.0 - dropout_p);
}

// Moves the device's default generator past a draw its copy made from `before`.
void advance_past(c10::Device device, const at::Tensor& before, const at::Generator& copy, const at::Tensor& like,
                  double dropout_p) {
  at::Generator device_generator = at::globalContext().defaultGenerator(device);
  {
    std::lock_guard<std::mutex> lock(device_generator.mutex());
    if (at::equal(device_generator.get_state(), before)) {
      device_generator.set_state(copy.get_state());
      return;
    }
  }
  dropout_keep_scale(like, dropout_p, device_generator);
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
      at::Generator copy = generator_copy(query.device());
      random_state = copy.get_state();
      probabilities = probabilities * dropout_keep_scale(probabilities, dropout_p, copy);
      advance_past(query.device(), random_state, copy, probabilities, dropout_p);
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
  // The math route: with P = softmax(S), S = q k^T * scale + mask, D the
  // scaled dropout mask (1 without dropout), O = (P * D) v:
  // dV = (P * D)^T dO, dP = (dO v^T) * D, dS = P * (dP - rowsum(dP * P)),
  // dQ = dS k * scale, dK = dS^T q * scale; repeated key/value heads sum
  // their gradients back.
  MathAttention math = math_attention(query, key, value, attn_bias, is_causal, scale);
  const at::Tensor dout = widened(grad_out);
  const at::Tensor& p = math.probabilities;
  const at::Tensor keep_scale = dropout_p > 0.0
      ? dropout_keep_scale(p, dropout_p, generator_copy(query.device(), philox_seed))
      : at::Tensor();
  at::Tensor grad_value = at::matmul((keep_scale.defined() ? p * keep_scale : p).transpose(-2, -1), dout);
  at::Tensor dp = at::matmul(dout, math.value.transpose(-2, -1));
  if (keep_scale.defined()) {
    dp = dp * keep_scale;
  }
  const at::Tensor ds = p * (dp - (dp * p).sum(-1, /*keepdim=*/true));
  at::Tensor grad_query = at::matmul(ds, math.key) * math.scale;
  at::Tensor grad_key = at::matmul(ds.transpose(-2, -1), widened(query)) * math.scale;
  const auto heads_back = [&](const at::Tensor& g, const at::Tensor& like) {
    if (g.dim() < 3 || g.size(-3) == like.size(-3)) {
      return g;
    }
    std::vector<int64_t> grouped = like.sizes().vec();
    grouped.insert(grouped.end() - 2, g.size(-3) / like.size(-3));
    return g.reshape(grouped).sum(-3);
  };
  // The bias is added to the scores, so its gradient is dS, summed over the
  // dimensions along which it was broadcast.
  at::Tensor grad_attn_bias = grad_bias ? ds.sum_to_size(attn_bias.sizes()).to(attn_bias.scalar_type()) : at::Tensor();
  return {grad_query.to(query.scalar_type()), heads_back(grad_key, key).to(key.scalar_type()),
          heads_back(grad_value, value).to(value.scalar_type()), grad_attn_bias};
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
