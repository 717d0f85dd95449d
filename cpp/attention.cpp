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
// or ranks. torch.nn.attention.sdpa_kernel choices are honoured.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

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
    if (!mask_dtype || (mask.dim() != 2 && mask.dim() != 4) || (at::GradMode::is_enabled() && mask.requires_grad())) {
      return false;
    }
  }
  return true;
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
  if (context.userEnabledOverrideableSDP() &&
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
  TORCH_CHECK(
      fused_kernel_can_run(query, key, value, attn_bias, dropout_p, false),
      "_scaled_dot_product_fused_attention_overrideable on openreg: unsupported inputs (query ",
      query.sizes(), " ", query.scalar_type(), ", key ", key.sizes(), ", value ", value.sizes(),
      ", dropout_p ", dropout_p, "); torch._fused_sdp_choice chooses the math path for these");
  TORCH_CHECK(!return_debug_mask, "_scaled_dot_product_fused_attention_overrideable on openreg: no debug mask");
  auto mask = attn_bias.has_value() ? additive_mask(*attn_bias, query) : std::nullopt;
  auto [output, logsumexp] =
      at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, mask, scale);
  // No variable-length batches, no random state (no dropout), no debug
  // mask: the outputs that carry them are empty, as in the Meta kernel.
  auto no_random_state = at::empty({}, query.options().dtype(at::kLong));
  return {
      output,
      logsumexp,
      at::Tensor(),
      at::Tensor(),
      c10::SymInt(query.size(2)),
      c10::SymInt(key.size(2)),
      no_random_state,
      no_random_state.clone(),
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
  TORCH_CHECK(
      !grad_input_mask[3] || !attn_bias.defined(),
      "_scaled_dot_product_fused_attention_overrideable_backward on openreg: no gradient for attn_bias "
      "(torch._fused_sdp_choice chooses the math path for a mask that requires grad)");
  auto [grad_query, grad_key, grad_value] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
      additive_mask(attn_bias, query), scale);
  return {grad_query, grad_key, grad_value, at::Tensor()};
}

} // namespace

void register_attention(torch::Library& aten) {
  // scaled_dot_product_attention asks the dispatch stub, torch._fused_sdp_choice the op.
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&fused_sdp_choice);
  aten.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  aten.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(fused_attention));
  aten.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(fused_attention_backward));
}

} // namespace openreg
