// Autocast (automatic mixed precision) for openreg: the AutocastPrivateUse1
// kernels, registered by register_autocast() at load.
//
// Note [Autocast policy]
// ~~~~~~~~~~~~~~~~~~~~~~
// `torch.autocast("openreg")` turns on the AutocastPrivateUse1 dispatch key;
// PyTorch registers no kernel for it, so without these an op under autocast
// would find no kernel at all. openreg follows CUDA's policy, which torch's
// header publishes as op lists (ATen/autocast_mode.h): matmul, linear and
// convolutions run in the autocast dtype (AT_FORALL_LOWER_PRECISION_FP);
// softmax, norms, losses and other precision-sensitive ops run in float32
// (AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE and the norm overloads that
// take an appended dtype); ops with several floating inputs run in the widest
// of them (AT_FORALL_PROMOTE); binary_cross_entropy is refused, as on CUDA,
// because it is unsafe in float16. Every other op falls through to the
// device kernel unchanged. The wrappers (at::autocast::WrapFunction) cast
// only openreg floating tensors and keep the weight cache: a float32 leaf
// that requires grad is cast once per autocast region (`cache_enabled`).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace openreg {
namespace {

// The policy lists name types unqualified, as inside namespace at::autocast.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

at::Tensor binary_cross_entropy_refused(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast "
      "on openreg (as on CUDA): a float16 probability rounds to 0 or 1 and the log overflows. "
      "Combine the sigmoid and the loss with torch.nn.functional.binary_cross_entropy_with_logits "
      "or torch.nn.BCEWithLogitsLoss, which are safe to autocast, or compute the loss outside "
      "the autocast region.");
}

void register_policy(torch::Library& m) {
#define OPENREG_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define OPENREG_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define OPENREG_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define OPENREG_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(OPENREG_LOWER_PRECISION)
  AT_FORALL_FP32(OPENREG_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENREG_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(OPENREG_PROMOTE)
#undef OPENREG_LOWER_PRECISION
#undef OPENREG_FP32
#undef OPENREG_FP32_SET_OPT_DTYPE
#undef OPENREG_PROMOTE
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
}

} // namespace

void register_autocast() {
  // Kept for the life of the process: destroying a Library deregisters it.
  static auto* everything = new torch::Library(
      torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  everything->fallback(torch::CppFunction::makeFallthrough());
  static auto* aten = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  register_policy(*aten);
}

} // namespace openreg
