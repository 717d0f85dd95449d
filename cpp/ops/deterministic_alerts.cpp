// Deterministic mode's alerts on openreg, where CUDA's kernels raise them.
//
// Note [Deterministic alerts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under torch.use_deterministic_algorithms(True), a CUDA kernel without a
// deterministic implementation calls at::globalContext().alertNotDeterministic(
// caller) on the host before it launches anything: a RuntimeError "<caller>
// does not have a deterministic implementation, but you set
// 'torch.use_deterministic_algorithms(True)'...", or under warn_only=True a
// UserWarning of the same form. openreg computes with the CPU kernels, which
// alert for almost none of these, so a front of the fallback
// (KernelRegistrar::fallback) alerts at the call, on the calling thread, before
// anything is queued, wherever CUDA's kernel does, and only there. The caller
// is CUDA's string with its device word ("cuda", "CUDA", "gpu") spelled
// "openreg" ("_histc_cuda" -> "_histc_openreg"); a caller without one
// ("put_") is CUDA's as it is.
//
// The table (kAlerts) mirrors every alertNotDeterministic call of the
// installed wheel's libtorch_cuda.so (42 call sites, found by disassembly,
// each site's string and condition read there and in aten/src/ATen/native/cuda/):
//  - histc (+out): floating input only (_histc_cuda, SummaryOps.cu);
//  - bincount: only with weights (_bincount_cuda, SummaryOps.cu);
//  - median / nanmedian with indices (the dim forms; median_with_indices_impl,
//    Sorting.cpp; the full reductions have no indices and do not alert);
//  - max_unpool2d/3d (+out) (MaxUnpooling.cu);
//  - nll_loss2d_forward (+output) with a reduction other than 'none'
//    (nll_loss2d_forward_out_cuda_template, NLLLoss2d.cu): NLLLoss of an input
//    of 3 or more dimensions, which nll_loss_nd sends there; nll_loss_forward
//    (1-D and 2-D inputs) has no alert;
//  - scatter_reduce.two (+out) with reduce='prod' and a non-empty index
//    (scatter_reduce_two_cuda_kernel, ScatterGatherKernel.cu: only its prod
//    case alerts; under deterministic mode scatter_impl sends 'sum' and 'mean'
//    to index_put_, and an empty index returns before the kernel);
//  - scatter.reduce (+out) with reduce='multiply' and a non-empty index
//    (scatter_reduce_cuda_kernel; 'add' goes to index_put_ as above);
//  - index_reduce (+out), every reduce (index_reduce_func_cuda_impl, Indexing.cu);
//  - the backward kernels: _ctc_loss_backward (both overloads; LossCTC.cu),
//    EmbeddingBag's in mode 'max' (_embedding_bag_dense_backward and
//    _embedding_bag_backward, which on openreg runs the former on the CPU;
//    EmbeddingBag.cu), grid_sampler_2d/3d_backward (GridSampler.cu),
//    _adaptive_avg_pool2d/3d_backward, adaptive_avg_pool3d_backward.grad_input,
//    adaptive_max_pool2d_backward, avg_pool3d_backward,
//    fractional_max_pool2d/3d_backward, reflection_pad1d/3d_backward,
//    upsample_{linear1d,bilinear2d,bicubic2d,trilinear3d}_backward and the
//    antialiased _upsample_{bilinear,bicubic}2d_aa_backward (functional and
//    grad_input forms, each with CUDA's string for that form);
//  - put_, any accumulate: TensorAdvancedIndexing.cpp alerts for
//    accumulate=False on every device and for accumulate=True on CUDA.
// The in-place forms (scatter_reduce_.two, scatter_.reduce, index_reduce_) and
// the composites (put, median.dim, grid_sampler_2d_backward.out...) reach these
// through the forms above. Not mirrored, on purpose:
//  - max_pool3d_with_indices_backward and replication_pad1d/2d/3d_backward
//    alert on CUDA, but torch.nn.functional's max_pool3d and pad pick a
//    decomposition with a deterministic backward for a CUDA input in
//    deterministic mode (`input.is_cuda`), so on CUDA they alert only for a
//    forward run outside deterministic mode. openreg's input is not
//    `is_cuda`: its forward runs the aten op and its backward kernel (CPU's,
//    deterministic) cannot tell where the forward ran; it does not alert.
//    (interpolate's bilinear, bicubic and trilinear decompositions test
//    `not input.is_cpu` and are taken on openreg as on CUDA.)
//  - cudnn_grid_sampler_backward: openreg has no cuDNN path; grid_sample takes
//    the native kernels, whose backward alerts under its own name. Likewise
//    CTCLoss with CPU int32 targets, which CUDA may compute with cuDNN
//    (no alert), takes the native backward (an alert) on openreg.
//  - scatter_cuda_kernel's alert (scatter with a tensor src): deterministic
//    mode sends that call to index_put_ before the kernel, so it never fires.
// Where CUDA checks its arguments first (a structured kernel's meta function,
// grid_sampler's checks), an invalid call in deterministic mode raises the
// alert here rather than CUDA's argument error. The CPU kernels of put_ and
// max_unpool2d/3d raise the same alert themselves: after this front's, a
// warning of theirs on the calling thread is dropped (one warning, as on
// CUDA); a kernel queued behind busy work warns again on the stream's worker
// (Note [Kernel warnings]). torch.use_deterministic_algorithms' documentation
// differs from the wheel: it lists ReflectionPad2d's backward (no alert left in
// CUDA's reflection_pad2d_backward), says scatter_reduce alerts on CUDA (only
// 'prod' does: 'sum' and 'mean' take index_put_, amax and amin do not alert),
// and leaves out index_reduce, nanmedian and the antialiased interpolations,
// which alert on CUDA; kthvalue alerts on MPS only, as it says.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <string>
#include <string_view>
#include <utility>

#include <ATen/Context.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

// The call's arguments, as a front sees them on the stack.
using Arguments = const c10::IValue*;

bool every_call(Arguments /*args*/) {
  return true;
}

// histc(Tensor self, int bins, Scalar min, Scalar max) and its out= form.
bool floating_self(Arguments args) {
  return args[0].toTensor().is_floating_point();
}

// bincount(Tensor self, Tensor? weights, SymInt minlength).
bool weights_given(Arguments args) {
  return !args[1].isNone();
}

// nll_loss2d_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index).
bool reduces(Arguments args) {
  return args[3].toInt() != at::Reduction::None;
}

// scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, ...) and
// scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce).
template <const char* reduce>
bool reduces_into_nonempty_index(Arguments args) {
  return args[4].toStringView() == reduce && args[2].toTensor().numel() > 0;
}
constexpr char kProd[] = "prod";
constexpr char kMultiply[] = "multiply";

// EmbeddingBagMode::MAX (aten/src/ATen/native/EmbeddingBag.h).
constexpr int64_t kEmbeddingBagMax = 2;

// _embedding_bag_dense_backward(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size,
// Tensor maximum_indices, SymInt num_weights, bool scale_grad_by_freq, int mode, ...).
bool dense_max_mode(Arguments args) {
  return args[7].toInt() == kEmbeddingBagMax;
}

// _embedding_bag_backward(Tensor grad, Tensor indices, Tensor offsets, Tensor offset2bag,
// Tensor bag_size, Tensor maximum_indices, SymInt num_weights, bool scale_grad_by_freq,
// int mode, bool sparse, ...): the dense backward's, as it calls it.
bool dense_backward_max_mode(Arguments args) {
  return args[8].toInt() == kEmbeddingBagMax && !args[9].toBool();
}

struct DeterministicAlert {
  const char* op; // as torch::Library::impl names it
  const char* caller; // CUDA's caller, in openreg's spelling (see the Note)
  bool (*applies)(Arguments args);
  // The CPU kernel raises the same alert itself (caller spelled as CUDA's).
  bool cpu_kernel_alerts = false;
};

constexpr DeterministicAlert kAlerts[] = {
    {"histc", "_histc_openreg with floating point input", &floating_self},
    {"histc.out", "_histc_openreg with floating point input", &floating_self},
    {"bincount", "_bincount_openreg", &weights_given},
    {"median.dim_values", "median openreg with indices output", &every_call},
    {"nanmedian.dim_values", "median openreg with indices output", &every_call},
    {"put_", "put_", &every_call, /*cpu_kernel_alerts=*/true},
    {"max_unpool2d", "max_unpooling2d_forward_out", &every_call, /*cpu_kernel_alerts=*/true},
    {"max_unpool2d.out", "max_unpooling2d_forward_out", &every_call, /*cpu_kernel_alerts=*/true},
    {"max_unpool3d", "max_unpooling3d_forward_out", &every_call, /*cpu_kernel_alerts=*/true},
    {"max_unpool3d.out", "max_unpooling3d_forward_out", &every_call, /*cpu_kernel_alerts=*/true},
    {"nll_loss2d_forward", "nll_loss2d_forward_out_openreg_template", &reduces},
    {"nll_loss2d_forward.output", "nll_loss2d_forward_out_openreg_template", &reduces},
    {"scatter_reduce.two", "scatter_reduce_openreg_prod_", &reduces_into_nonempty_index<kProd>},
    {"scatter_reduce.two_out", "scatter_reduce_openreg_prod_", &reduces_into_nonempty_index<kProd>},
    {"scatter.reduce", "scatter_reduce_openreg_kernel", &reduces_into_nonempty_index<kMultiply>},
    {"scatter.reduce_out", "scatter_reduce_openreg_kernel", &reduces_into_nonempty_index<kMultiply>},
    {"index_reduce", "index_reduce_openreg", &every_call},
    {"index_reduce.out", "index_reduce_openreg", &every_call},
    {"_ctc_loss_backward", "ctc_loss_backward_openreg", &every_call},
    {"_ctc_loss_backward.Tensor", "ctc_loss_backward_openreg", &every_call},
    {"_embedding_bag_dense_backward", "embedding_bag_backward_openreg_max", &dense_max_mode},
    {"_embedding_bag_backward", "embedding_bag_backward_openreg_max", &dense_backward_max_mode},
    {"grid_sampler_2d_backward", "grid_sampler_2d_backward_openreg", &every_call},
    {"grid_sampler_3d_backward", "grid_sampler_3d_backward_openreg", &every_call},
    {"_adaptive_avg_pool2d_backward", "adaptive_avg_pool2d_backward_openreg", &every_call},
    {"_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward_openreg", &every_call},
    {"adaptive_avg_pool3d_backward.grad_input", "adaptive_avg_pool3d_backward_out_openreg", &every_call},
    {"adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward_openreg", &every_call},
    {"adaptive_max_pool2d_backward.grad_input", "adaptive_max_pool2d_backward_openreg", &every_call},
    {"avg_pool3d_backward", "avg_pool3d_backward_openreg", &every_call},
    {"avg_pool3d_backward.grad_input", "avg_pool3d_backward_openreg", &every_call},
    {"fractional_max_pool2d_backward", "fractional_max_pool2d_backward_openreg", &every_call},
    {"fractional_max_pool2d_backward.grad_input", "fractional_max_pool2d_backward_openreg", &every_call},
    {"fractional_max_pool3d_backward", "fractional_max_pool3d_backward_openreg", &every_call},
    {"fractional_max_pool3d_backward.grad_input", "fractional_max_pool3d_backward_out_openreg", &every_call},
    {"reflection_pad1d_backward", "reflection_pad1d_backward_out_openreg", &every_call},
    {"reflection_pad1d_backward.grad_input", "reflection_pad1d_backward_out_openreg", &every_call},
    {"reflection_pad3d_backward", "reflection_pad3d_backward_out_openreg", &every_call},
    {"reflection_pad3d_backward.grad_input", "reflection_pad3d_backward_out_openreg", &every_call},
    {"upsample_linear1d_backward", "upsample_linear1d_backward_out_openreg", &every_call},
    {"upsample_linear1d_backward.grad_input", "upsample_linear1d_backward_out_openreg", &every_call},
    {"upsample_bilinear2d_backward", "upsample_bilinear2d_backward_out_openreg", &every_call},
    {"upsample_bilinear2d_backward.grad_input", "upsample_bilinear2d_backward_out_openreg", &every_call},
    {"upsample_bicubic2d_backward", "upsample_bicubic2d_backward_out_openreg", &every_call},
    {"upsample_bicubic2d_backward.grad_input", "upsample_bicubic2d_backward_out_openreg", &every_call},
    {"upsample_trilinear3d_backward", "upsample_trilinear3d_backward_out_openreg", &every_call},
    {"upsample_trilinear3d_backward.grad_input", "upsample_trilinear3d_backward_out_openreg", &every_call},
    {"_upsample_bilinear2d_aa_backward", "upsample_bilinear2d_aa_backward_out_openreg", &every_call},
    {"_upsample_bilinear2d_aa_backward.grad_input", "upsample_bilinear2d_aa_backward_out_openreg", &every_call},
    {"_upsample_bicubic2d_aa_backward", "upsample_bicubic2d_aa_backward_out_openreg", &every_call},
    {"_upsample_bicubic2d_aa_backward.grad_input", "upsample_bicubic2d_aa_backward_out_openreg", &every_call},
};

// Passes every warning to the handler it replaces but the CPU kernel's own
// alert of `caller`, which the front has raised already.
class RaisedAlertFilter final : public c10::WarningHandler {
 public:
  explicit RaisedAlertFilter(std::string_view caller)
      : alert_(std::string(caller) + " does not have a deterministic implementation"),
        next_(c10::WarningUtils::get_warning_handler()) {}

  void process(const c10::Warning& warning) override {
    if (warning.msg().rfind(alert_, 0) != 0) {
      next_->process(warning);
    }
  }

 private:
  std::string alert_;
  c10::WarningHandler* next_;
};

// The front of kAlerts[index]'s op: alerts at the call when the entry
// applies, then runs the rest (the next front, or the fallback).
template <size_t index>
void alert_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  constexpr const DeterministicAlert& alert = kAlerts[index];
  at::Context& context = at::globalContext();
  if (!context.deterministicAlgorithms()) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const Arguments args = arguments_of(op, *stack).data();
  const bool alerts = alert.applies(args);
  if (alerts) {
    context.alertNotDeterministic(alert.caller); // raises unless warn_only
  }
  if (alerts && alert.cpu_kernel_alerts) {
    RaisedAlertFilter filter(alert.caller);
    c10::WarningUtils::WarningHandlerGuard guard(&filter);
    fallback.callBoxed(op, keys, stack);
    return;
  }
  fallback.callBoxed(op, keys, stack);
}

template <size_t... index>
void register_alerts(KernelRegistrar& kernels, std::index_sequence<index...> /*entries*/) {
  (kernels.fallback(kAlerts[index].op, &alert_front<index>), ...);
}

} // namespace

// Before the other fronts: CUDA alerts at its kernel's entry, before the
// dtype dispatch that refuses (scatter_reduce's front).
void register_deterministic_alerts(KernelRegistrar& kernels) {
  for (const DeterministicAlert& alert : kAlerts) {
    TORCH_INTERNAL_ASSERT(
        aten_op(alert.op).hasKernelForDispatchKey(c10::DispatchKey::CPU), "deterministic alert for ", alert.op,
        ", which has no CPU kernel for the fallback to run");
  }
  register_alerts(kernels, std::make_index_sequence<std::size(kAlerts)>());
}

} // namespace openreg
