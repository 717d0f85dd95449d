// The boxed fallback: every aten op without an openreg kernel runs PyTorch's
// CPU kernel on zero-copy CPU views of the device memory, as work on the
// current stream of its device (Note [One door] in device_memory.h).
//
// Note [Fallback]: a call takes one of three routes.
//  1. Inline: the stream is idle and the operands are small, so the CPU
//     kernel runs right here as the stream's next work (Note [Inline
//     launches] in src/runtime/stream.rs).
//  2. Queued: otherwise, if the op's results are planned (Note [Meta
//     results]): its Meta kernel, run on stand-ins of arguments of the same
//     metadata and checked against the CPU kernel once, tells what the
//     results are: fresh tensors (sizes, strides, dtype), views of an
//     argument, or the (possibly resized) out= argument itself. Fresh
//     results and grown out= storage are allocated now, in stream order; a
//     kernel that runs the CPU kernel on views and copies fresh results into
//     place is queued, and the call returns at once. A large kernel runs
//     in chunks (Note [Split kernels] in kernel_split.h); a call that
//     splits never takes route 1, so its bits never depend on the route.
//     While the stream captures a graph, a plan not yet checked is used
//     as it is (the capture cannot run the op to check it; each replay's
//     kernel still checks the shapes it computed against it).
//  3. Waited: otherwise, when the results cannot be known without
//     running the op (no Meta kernel; a data-dependent shape, as nonzero's;
//     a non-tensor result; a generator argument, whose state must advance
//     at the call), or the first time a plan is made (the run checks it).
//     Two first calls take route 2 instead, and the plan's kernel checks it
//     (Note [Plans checked by the kernel]): a split kernel's, while the host
//     waits, and a small call's behind queued work, without a wait, once
//     the CPU kernel accepted stand-ins of its arguments (Note [Trial on
//     stand-ins]). Either way a first call raises its errors at the call
//     (Note [Errors at the call]). The CPU kernel runs as the stream's next
//     work and the host waits for it, as CUDA waits for nonzero.
// After routes 1 and 3 the CPU kernel's results are on the host: results
// that view an argument are rebuilt as openreg views of its memory, and
// fresh results (or arguments the CPU kernel moved to fresh memory by
// resizing them) are copied into new device memory by a later kernel
// (copy_to_device), never written from the host after the allocation.
//
// Every route checks devices first, as CUDA does: openreg tensors on one
// device; a CPU tensor only as a read 0-dim scalar (or as indices).
//
// Note [Errors at the call]: CUDA checks an op's arguments on the host
// before it launches anything, so an error that depends only on metadata
// (shapes, dtypes, devices, overlapping memory) or on argument values is
// raised by the call itself, whether the stream is idle or busy. The CPU
// kernel makes the same checks in the same words, so openreg lets it make
// them where the caller sees them:
//  - A call whose results are not planned yet, or whose plan is new, runs
//    its kernel where the host waits (route 1 or 3; a split kernel, route 2
//    waited), except a small call behind queued work, whose arguments the
//    CPU kernel checks on stand-ins first (Note [Trial on stand-ins]). A
//    plan is trusted only once the CPU kernel accepted arguments of exactly
//    its key (metadata, aliasing and non-tensor values, Note [Meta
//    results]), so a call queued on a trusted plan passes every such
//    check; a plan whose first kernel raised is never trusted, and later
//    calls with that key wait again and raise again.
//  - The CPU kernel sees what the openreg tensors share: one call's views
//    of one device storage share one CPU storage, and a tensor passed twice
//    is one view, so assert_no_overlap, assert_no_internal_overlap and
//    TensorIterator's overlap checks raise as they would on CPU (gather's,
//    cat's, aminmax's out= checks...).
// What remains for a later wait are checks of tensor contents in a call
// queued on a trusted plan, or on a new plan after its trial: an index out of range (index, index_select,
// gather, scatter, take, embedding, nll_loss's targets). CUDA reports those by
// a device-side assert at its next synchronizing call; openreg parks the
// kernel's error, which names the op (Note [Sticky kernel failures] in
// src/runtime/stream.rs), for its next synchronizing call. Own kernels
// check their arguments at the call (the random kernels run PyTorch's
// checks in PyTorch's words before they queue).
//
// Note [Trial on stand-ins]: behind queued work, a call with a new plan
// would wait for the stream only so that its CPU kernel checks the
// arguments where the caller sees an error. CUDA checks on the host without
// waiting, and so does openreg for a small call (operands of at most
// kInlineKernelElements, kTrialBytes of storage in all): the CPU kernel
// runs right away on the caller's thread over stand-ins, host tensors with
// the arguments' dtypes and geometry over zeroed host storages, one storage
// per device storage and one tensor per argument tensor, so that they
// share memory as the arguments do (host tensors and non-tensor arguments
// are passed as they are). Every check of metadata, overlap or argument
// values raises there as on the real arguments; only a check of contents
// cannot (zeros are not the data: that one raises later, as above). If the
// trial raises or warns, the call takes route 3: the real kernel decides,
// where the caller sees it (a trial that raised on zeros alone, as a
// Cholesky factorization does, only costs that wait). The trial's error is
// dropped; its warnings are the call's (a warn-once is spent by the trial),
// raised before the real kernel runs, whose warnings of the same text are
// not raised again. Otherwise the call is queued on the plan, which its
// kernel checks. The trial costs what an inline run of the op would.
//
// Note [Nested tensors]: a nested openreg tensor is a NestedTensorImpl whose
// buffer is device memory (dispatch key NestedTensorPrivateUse1). PyTorch
// registers its nested kernels for NestedTensorCPU and NestedTensorCUDA only,
// so the fallback also serves NestedTensorPrivateUse1: each nested argument
// becomes a NestedTensorCPU view of the same memory (same nested sizes,
// strides and offsets), and the CPU nested kernel runs on the views. A nested
// result is rebuilt on openreg: over the argument's memory when it views it,
// else with its buffer copied to new device memory, like any fresh result
// (so also for ops that make nested tensors from dense ones, as
// nn.TransformerEncoder's fast path does with _nested_tensor_from_mask).
// Meta kernels cannot plan nested results (their sizes are data), so a call
// with nested arguments runs inline or waited (routes 1 and 3).
//
// Note [Quantized tensors]: as on CUDA, a quantized openreg tensor is a
// QTensorImpl over device memory (QuantizedPrivateUse1) with its quantizer;
// per-channel scales and zero points are kept as CPU tensors the quantizer
// owns (q_per_channel_scales() returns them on the device, as CUDA does).
// The fallback serves QuantizedPrivateUse1 as it serves nested tensors: each
// quantized argument becomes a QuantizedCPU view of the same bytes with the
// same quantizer, the CPU quantized kernel runs (quantize, dequantize,
// int_repr, views such as flatten and flip, q_scale...), and a quantized
// result comes back over the argument's memory or with its bytes copied to
// the device. A copy between quantized tensors copies their bytes with the
// dense copy (_copy_from, which the CPU lacks). Also routes 1 and 3.
//
// Sparse tensors (Note [Sparse tensors] in sparse_tensors.h) take the same
// routes, with a sparse CPU view of each sparse argument.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/NestedTensorImpl.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/graphs/graph_kernels.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"
#include "torch_openreg/cpp/ops/kernel_split.h"
#include "torch_openreg/cpp/ops/meta_results.h"
#include "torch_openreg/cpp/ops/sparse_tensors.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

// The most host memory one trial on stand-ins zeroes for its storages (Note
// [Trial on stand-ins]): a small operand may view a large storage.
constexpr size_t kTrialBytes = size_t{1} << 20;

// A resizable host storage of as many zero bytes as `device_storage` has.
c10::Storage zeroed_host_storage(const c10::Storage& device_storage) {
  const size_t nbytes = device_storage.nbytes();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(), /*resizable=*/true);
  if (nbytes > 0) {
    std::memset(storage.mutable_data(), 0, nbytes);
  }
  return storage;
}

// Passes on to the handler in place when it was made the warnings whose
// text is not among `raised`'s (Note [Trial on stand-ins]).
class WarningsNotRaisedYet final : public c10::WarningHandler {
 public:
  explicit WarningsNotRaisedYet(const CollectedWarnings& raised)
      : raised_(raised), next_(c10::WarningUtils::get_warning_handler()) {}

  void process(const c10::Warning& warning) override {
    const auto& raised = raised_.collected();
    const bool repeated = std::any_of(
        raised.begin(), raised.end(), [&](const c10::Warning& earlier) { return earlier.msg() == warning.msg(); });
    if (!repeated) {
      next_->process(warning);
    }
  }

 private:
  const CollectedWarnings& raised_;
  c10::WarningHandler* next_;
};

// Host views of one call's dense openreg tensors, as one CPU kernel must see
// them (Note [Errors at the call]): one view per tensor, over one host
// storage per device storage (made by `host_storage` from the device
// storage), so that the views share memory as the tensors do.
class SharedHostViews {
 public:
  explicit SharedHostViews(c10::Storage (*host_storage)(const c10::Storage&)) : host_storage_(host_storage) {}

  // t's view, and whether it was made by this call.
  std::pair<at::Tensor, bool> view_of(const at::Tensor& t) {
    auto [view, is_new] = views_.try_emplace(t.unsafeGetTensorImpl());
    if (is_new) {
      auto [storage, new_storage] = storages_.try_emplace(t.storage().unsafeGetStorageImpl());
      if (new_storage) {
        storage->second = host_storage_(t.storage());
      }
      view->second = cpu_view_over(t, storage->second);
    }
    return {view->second, is_new};
  }

 private:
  c10::Storage (*host_storage_)(const c10::Storage&);
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages_; // by device storage
  std::unordered_map<const c10::TensorImpl*, at::Tensor> views_; // by tensor
};

// Ops whose CPU kernels accept CPU index tensors next to device tensors,
// as CUDA's do.
bool accepts_cpu_indices(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" ||
      name.name == "aten::_index_put_impl_" || name.name == "aten::index_put";
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() && a.storage_offset() == b.storage_offset();
}

// The whole storage of a nested tensor, as a 1-D dense tensor of its dtype.
at::Tensor nested_buffer(const at::Tensor& nested) {
  return at::native::get_nested_tensor_impl(nested)->get_unsafe_storage_as_tensor();
}

// `like`'s nested geometry over `buffer` (a 1-D tensor of its storage).
at::Tensor nested_over(const at::Tensor& buffer, const at::Tensor& like) {
  const auto* impl = at::native::get_nested_tensor_impl(like);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}

// The bytes of a quantized tensor as a dense tensor of its integer dtype,
// same geometry and device.
at::Tensor quantized_bytes(const at::Tensor& q) {
  const auto key = q.is_cpu() ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1;
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(q.storage()), c10::DispatchKeySet(key), c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  impl->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return at::Tensor(std::move(impl));
}

// `quantizer` with tensors of its own (a CPU kernel's per-channel quantizer
// may hold CPU views of device memory, which do not keep it alive). Reads
// those views: call it in a kernel body, where device memory is accessible.
at::QuantizerPtr owned_quantizer(const at::QuantizerPtr& quantizer) {
  if (quantizer->qscheme() != c10::kPerChannelAffine && quantizer->qscheme() != c10::kPerChannelAffineFloatQParams) {
    return quantizer;
  }
  const auto* per_channel = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
  return at::make_per_channel_affine_quantizer(
      per_channel->scales().clone(), per_channel->zero_points().clone(), per_channel->axis(), quantizer->scalar_type());
}

// A quantized tensor over `bytes` (dense, its integer dtype): `like`'s dtype,
// `bytes`' geometry and device, `quantizer`.
at::Tensor quantized_over(const at::Tensor& bytes, const at::Tensor& like, at::QuantizerPtr quantizer) {
  const auto key = bytes.is_cpu() ? c10::DispatchKey::QuantizedCPU : c10::DispatchKey::QuantizedPrivateUse1;
  auto impl = c10::make_intrusive<at::QTensorImpl>(
      c10::Storage(bytes.storage()), c10::DispatchKeySet(key), like.dtype(), std::move(quantizer));
  impl->set_sizes_and_strides(bytes.sizes(), bytes.strides(), bytes.storage_offset());
  return at::Tensor(std::move(impl));
}

// _copy_from(src, dst) or copy_(dst, src) between quantized tensors (CPU
// has no _copy_from kernel, and either may be on the host): the bytes move
// with openreg's dense copy, dst takes src's quantizer (as CPU's copy_ of
// quantized tensors does). False if not such a call.
bool copy_quantized_bytes(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.operator_name().name;
  const bool copy_from = name == "aten::_copy_from";
  if (!copy_from && name != "aten::copy_") {
    return false;
  }
  const c10::ArrayRef<c10::IValue> arguments = arguments_of(op, *stack);
  const at::Tensor& src = arguments[copy_from ? 0 : 1].toTensor();
  const at::Tensor& dst = arguments[copy_from ? 1 : 0].toTensor();
  if (!src.is_quantized() || !dst.is_quantized()) {
    return false;
  }
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "Quantized copy only works with same qtype, got ",
              src.scalar_type(), " and ", dst.scalar_type());
  TORCH_CHECK(src.sizes() == dst.sizes(), "Quantized copy only works with tensors of the same shape, got ",
              src.sizes(), " and ", dst.sizes());
  const bool non_blocking = arguments[2].toBool();
  at::get_qtensorimpl(dst)->set_quantizer_(at::get_qtensorimpl(src)->quantizer());
  quantized_bytes(dst).copy_(quantized_bytes(src), non_blocking);
  at::Tensor result = dst;
  torch::jit::drop(*stack, arguments.size());
  stack->emplace_back(std::move(result));
  return true;
}

// The arguments of one call: where they are on the stack, and their device.
class Call {
 public:
  Call(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : op(op),
        stack(*stack),
        first_arg(stack->size() - op.schema().arguments().size()),
        num_returns(op.schema().returns().size()),
        caller_keys_(c10::impl::tls_local_dispatch_key_set()) {}

  // Checks the devices of all arguments (see the Note); returns the device.
  c10::Device check_devices() {
    const auto& arguments = op.schema().arguments();
    for (size_t i = first_arg; i < stack.size(); ++i) {
      const c10::AliasInfo* alias = arguments[i - first_arg].alias_info();
      const bool written = alias != nullptr && alias->isWrite();
      c10::IValue& value = stack[i];
      if (value.isDevice() && value.toDevice().is_privateuseone()) {
        note_device(value.toDevice());
      }
      for_each_tensor(value, [&](const at::Tensor& t) {
        if (t.is_privateuseone()) {
          note_device(t.device());
          has_nested_ |= t.is_nested();
          has_quantized_ |= t.is_quantized();
          has_sparse_ |= is_sparse_any(t);
          const int64_t elements = t.is_nested() ? nested_buffer(t).numel()
              : is_sparse_any(t)                 ? sparse_stored_elements(t)
                                                 : t.numel();
          largest_operand_ = std::max(largest_operand_, elements);
        } else if (t.is_cpu() && written) {
          written_host_tensor_ = true;
        } else if (t.is_cpu() && t.dim() > 0) {
          host_tensor_ = true;
        }
      });
    }
    if (device_ && (written_host_tensor_ || (host_tensor_ && !accepts_cpu_indices(op.operator_name())))) {
      TORCH_CHECK(
          false, "Expected all tensors to be on the same device, but found at least two devices, ",
          *device_, " and cpu! (when checking arguments for ", op.operator_name(), ")");
    }
    return device_.value_or(c10::Device(c10::kPrivateUse1, ffi::current_device()));
  }

  // The most elements of any openreg tensor argument (after
  // check_devices): a measure of the op's work, for the choice to run it
  // inline (kInlineKernelElements).
  int64_t largest_operand() const {
    return largest_operand_;
  }

  // Whether a nested, quantized or sparse openreg tensor is among the
  // arguments (after check_devices; Note [Nested tensors], Note [Quantized
  // tensors], Note [Sparse tensors]): no Meta kernel plans such a call.
  bool has_wrapped_tensors() const {
    return has_nested_ || has_quantized_ || has_sparse_;
  }

  // Whether a sparse openreg tensor is among the arguments (after
  // check_devices): its results may be planned from an earlier call's
  // (Note [Sparse plans] in meta_results.cpp).
  bool has_sparse_tensors() const {
    return has_sparse_;
  }

  // The CPU dispatch key the kernel of the call runs under: a call that
  // reached the fallback through the QuantizedPrivateUse1 key (a quantized
  // factory has no quantized argument) runs the QuantizedCPU kernel.
  void run_quantized_kernel() {
    has_quantized_ = true;
  }

  // What the op reads and writes of its arguments, from the schema's alias
  // information (an argument marked `(a!)` is written). Results that are
  // new tensors are written by the kernels that fill them.
  KernelInfo accesses() const {
    KernelInfo info(op.schema().name().c_str());
    const auto& schema_arguments = op.schema().arguments();
    for (size_t i = 0; i < schema_arguments.size() && first_arg + i < stack.size(); ++i) {
      const c10::AliasInfo* alias = schema_arguments[i].alias_info();
      for_each_tensor(stack[first_arg + i], [&](const at::Tensor& t) {
        for_each_dense_part(t, [&](const at::Tensor& part) { info.add(part, alias != nullptr && alias->isWrite()); });
      });
    }
    return info;
  }

  // The op's arguments on the stack; once it has run, its results.
  c10::ArrayRef<c10::IValue> arguments() const {
    return c10::ArrayRef<c10::IValue>(stack.data() + first_arg, stack.size() - first_arg);
  }

  // Routes 1 and 3: the arguments become CPU views (openreg devices become
  // the CPU) and the CPU kernel runs; the stack then holds its results.
  // Runs as stream work: device memory is accessible.
  void run_cpu_kernel_on_views() {
    // The kernel may run on the stream's worker: it sees the dispatch keys
    // the caller's thread excludes (autograd's, below which it was called),
    // as it would on that thread (_coalesce_sparse_cpu asserts them).
    c10::impl::ForceDispatchKeyGuard caller_keys(caller_keys_);
    for (size_t i = first_arg; i < stack.size(); ++i) {
      c10::IValue& value = stack[i];
      retarget_device(value, c10::kCPU);
      map_tensors(value, [&](const at::Tensor& t) {
        if (!t.is_privateuseone()) {
          return t;
        }
        if (is_sparse_any(t)) {
          return sparse_cpu_view(t);
        }
        if (t.is_nested() || t.is_quantized()) {
          at::Tensor view = t.is_nested() ? nested_over(cpu_view(nested_buffer(t)), t)
                                          : quantized_over(cpu_view(quantized_bytes(t)), t, at::get_qtensorimpl(t)->quantizer());
          views_.emplace_back(view, t);
          return view;
        }
        auto [view, is_new] = dense_views_.view_of(t);
        if (is_new) {
          views_.emplace_back(view, t);
        }
        return view;
      });
    }
    const auto key = has_nested_  ? c10::DispatchKey::NestedTensorCPU
        : has_quantized_          ? c10::DispatchKey::QuantizedCPU
                                  : c10::DispatchKey::CPU;
    // With sparse views, the dispatcher picks the highest of the keys, as
    // for the same call on CPU tensors (SparseCsrCPU over SparseCPU).
    c10::DispatchKeySet keys(key);
    for (const auto& [view, original] : sparse_views_) {
      keys = keys.add(sparse_cpu_key(view));
    }
    op.redispatchBoxed(keys, &stack);
    // Still in the kernel body: quantized results take quantizers of their
    // own while the scales they may view are accessible.
    for (size_t i = stack.size() - num_returns; i < stack.size(); ++i) {
      for_each_tensor(stack[i], [](const at::Tensor& t) {
        if (t.is_quantized()) {
          at::get_qtensorimpl(t)->set_quantizer_(owned_quantizer(at::get_qtensorimpl(t)->quantizer()));
        }
      });
    }
  }

  // Whether the CPU kernel accepts stand-ins of this call's arguments
  // without an error or a warning (Note [Trial on stand-ins]); its warnings
  // go to `warnings`. False, with no trial, for a call larger than a trial
  // may be (only dense arguments reach here: has_wrapped_tensors() is false).
  bool cpu_kernel_accepts_stand_ins(CollectedWarnings& warnings) const {
    if (largest_operand_ > kInlineKernelElements) {
      return false;
    }
    std::unordered_set<const c10::StorageImpl*> storages;
    size_t bytes = 0;
    for (const c10::IValue& value : arguments()) {
      for_each_tensor(value, [&](const at::Tensor& t) {
        if (t.is_privateuseone() && storages.insert(t.storage().unsafeGetStorageImpl()).second) {
          bytes += t.storage().nbytes();
        }
      });
    }
    if (bytes > kTrialBytes) {
      return false;
    }
    torch::jit::Stack trial(arguments().begin(), arguments().end());
    SharedHostViews stand_ins(zeroed_host_storage);
    for (c10::IValue& value : trial) {
      retarget_device(value, c10::kCPU);
      map_tensors(value, [&](const at::Tensor& t) {
        // A host scalar or host indices are read as they are.
        return t.is_privateuseone() ? stand_ins.view_of(t).first : t;
      });
    }
    try {
      // As a kernel runs: a team of one, no op events (Note [Kernel
      // threads], Note [No ops inside kernels] in device_memory.h).
      KernelScope as_a_kernel;
      c10::WarningUtils::WarningHandlerGuard collect(&warnings);
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &trial);
    } catch (const std::exception&) {
      return false;
    }
    return !warnings.any();
  }

  // Routes 1 and 3, after the kernel: each host result becomes the openreg
  // tensor it stands for.
  void results_to_device(c10::Device device) {
    for (size_t i = stack.size() - num_returns; i < stack.size(); ++i) {
      map_tensors(stack[i], [&](const at::Tensor& t) { return to_device_result(t, device); });
    }
  }

  const c10::OperatorHandle& op;
  torch::jit::Stack& stack;
  const size_t first_arg;
  const size_t num_returns;

 private:
  at::Tensor to_device_result(const at::Tensor& result, c10::Device device) {
    if (!result.is_cpu()) {
      return result;
    }
    if (result.is_nested()) {
      return nested_to_device(result, device);
    }
    if (result.is_quantized()) {
      return quantized_to_device(result, device);
    }
    if (is_sparse_any(result)) {
      return sparse_to_device(result, device);
    }
    for (const auto& [view, original] : views_) {
      if (result.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
        if (view.storage().data() != original.storage().data()) {
          // The CPU kernel resized the argument into fresh CPU memory. Its
          // bytes move as they are: `original` keeps its own conjugate and
          // negative bits, which a copy of `view` would resolve.
          at::Tensor bytes = view.detach();
          bytes.unsafeGetTensorImpl()->_set_conj(false);
          bytes.unsafeGetTensorImpl()->_set_neg(false);
          const_cast<at::Tensor&>(original).set_(copy_to_device(bytes, original.device(), op.schema().name().c_str()));
        } else if (!same_geometry(view, original)) {
          // Resized within its storage (an out= that shrank).
          const_cast<at::Tensor&>(original).set_(
              original.storage(), view.storage_offset(), view.sizes(), view.strides());
        }
        // A kernel may conjugate or negate an out= argument lazily, by its
        // bit (linalg_lu_solve with left=False does).
        original.unsafeGetTensorImpl()->_set_conj(view.is_conj());
        original.unsafeGetTensorImpl()->_set_neg(view.is_neg());
        return original;
      }
    }
    for (const auto& [view, original] : views_) {
      // A view whose storage the kernel moved to fresh CPU memory (by
      // resizing it) no longer shares the original's: its aliases are fresh.
      if (result.storage().data() == view.storage().data() && result.storage().nbytes() > 0 &&
          view.storage().data() == original.storage().data()) {
        at::Tensor alias =
            alias_of(original, result.scalar_type(), result.sizes(), result.strides(), result.storage_offset());
        alias.unsafeGetTensorImpl()->_set_conj(result.is_conj());
        alias.unsafeGetTensorImpl()->_set_neg(result.is_neg());
        return alias;
      }
    }
    return copy_to_device(result, device, op.schema().name().c_str());
  }

  // A nested CPU result as the openreg tensor it stands for (Note [Nested
  // tensors]).
  at::Tensor nested_to_device(const at::Tensor& result, c10::Device device) {
    for (const auto& [view, original] : views_) {
      if (result.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
        return original; // an in-place op
      }
      if (result.storage().data() == view.storage().data() && result.storage().nbytes() > 0) {
        const int64_t elements = static_cast<int64_t>(original.storage().nbytes() / result.itemsize());
        return nested_over(alias_of(original, result.scalar_type(), {elements}, {1}, 0), result);
      }
    }
    return nested_over(copy_to_device(nested_buffer(result), device, op.schema().name().c_str()), result);
  }

  // A quantized CPU result as the openreg tensor it stands for (Note
  // [Quantized tensors]).
  at::Tensor quantized_to_device(const at::Tensor& result, c10::Device device) {
    const at::QuantizerPtr quantizer = at::get_qtensorimpl(result)->quantizer(); // owned (run_cpu_kernel_on_views)
    for (const auto& [view, original] : views_) {
      if (result.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
        if (original.is_quantized()) {
          at::get_qtensorimpl(original)->set_quantizer_(quantizer); // an in-place op may requantize
        }
        return original;
      }
      if (result.storage().data() == view.storage().data() && result.storage().nbytes() > 0) {
        const at::Tensor bytes = quantized_bytes(result);
        return quantized_over(
            alias_of(original, bytes.scalar_type(), bytes.sizes(), bytes.strides(), bytes.storage_offset()), result,
            quantizer);
      }
    }
    return quantized_over(copy_to_device(quantized_bytes(result), device, op.schema().name().c_str()), result, quantizer);
  }

  // The sparse CPU view of the sparse openreg argument `t`: its structure
  // over CPU views of its members, which views_ maps back.
  at::Tensor sparse_cpu_view(const at::Tensor& t) {
    std::vector<at::Tensor> members;
    for (const at::Tensor& member : sparse_members(t)) {
      members.push_back(cpu_view(member));
      views_.emplace_back(members.back(), member);
    }
    at::Tensor view = sparse_over(t, members);
    sparse_views_.emplace_back(view, t);
    return view;
  }

  // A sparse CPU result as the openreg tensor it stands for (Note [Sparse
  // tensors]): each member an argument's member, a view of one, or new
  // device memory. A sparse argument the op changed takes the new structure.
  at::Tensor sparse_to_device(const at::Tensor& result, c10::Device device) {
    std::vector<at::Tensor> members;
    for (const at::Tensor& member : sparse_members(result)) {
      members.push_back(to_device_result(member, device));
    }
    for (const auto& [view, original] : sparse_views_) {
      if (result.unsafeGetTensorImpl() != view.unsafeGetTensorImpl()) {
        continue;
      }
      const std::vector<at::Tensor> before = sparse_members(original);
      bool changed = original.sizes() != result.sizes() || original.layout() != result.layout() ||
          (is_sparse_coo(result) && coalesced_flag(original) != coalesced_flag(result));
      for (size_t i = 0; i < members.size(); ++i) {
        changed |= members[i].unsafeGetTensorImpl() != before[i].unsafeGetTensorImpl();
      }
      if (changed) {
        set_sparse_structure(original, result, members);
      }
      return original;
    }
    return sparse_over(result, members);
  }

  void note_device(const c10::Device& device) {
    c10::Device indexed = device.has_index() ? device : c10::Device(device.type(), ffi::current_device());
    // The indexed tensor comes first; CUDA names indices on another device so.
    TORCH_CHECK(
        !device_ || *device_ == indexed || !accepts_cpu_indices(op.operator_name()),
        "indices should be either on cpu or on the same device as the indexed tensor (", *device_, ")");
    TORCH_CHECK(
        !device_ || *device_ == indexed,
        "Expected all tensors to be on the same device, but found at least two devices, ", *device_, " and ",
        indexed, "! (when checking arguments for ", op.operator_name(), ")");
    device_ = indexed;
  }

  c10::impl::LocalDispatchKeySet caller_keys_;
  std::optional<c10::Device> device_;
  int64_t largest_operand_ = 0;
  bool has_nested_ = false;
  bool has_quantized_ = false;
  bool has_sparse_ = false;
  bool host_tensor_ = false;
  bool written_host_tensor_ = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> views_; // (CPU view, openreg original), dense
  std::vector<std::pair<at::Tensor, at::Tensor>> sparse_views_; // the same, sparse
  SharedHostViews dense_views_{cpu_storage_alias}; // views_' dense views
};

// A host tensor argument of a queued kernel is copied at the call, as CUDA
// copies it at the launch (a 0-dim scalar keeps its wrapped-number flag,
// which type promotion reads).
at::Tensor host_copy(const at::Tensor& t) {
  at::Tensor copy = t.clone();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    copy.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return copy;
}

// Route 2, in the queued kernel: the CPU kernel's results `computed` go
// where the plan put them (CPU views of the planned openreg results),
// unless the kernel wrote them there itself.
void fill_planned_results(
    const c10::OperatorHandle& op,
    const torch::jit::Stack& computed,
    const torch::jit::Stack& destinations) {
  TORCH_CHECK(computed.size() == destinations.size(), "openreg fallback: ", op.operator_name(), " returned ",
              computed.size(), " values where its Meta kernel returned ", destinations.size());
  for (size_t i = 0; i < computed.size(); ++i) {
    std::vector<at::Tensor> got, want;
    for_each_tensor(computed[i], [&](const at::Tensor& t) { got.push_back(t); });
    for_each_tensor(destinations[i], [&](const at::Tensor& t) { want.push_back(t); });
    TORCH_CHECK(got.size() == want.size(), "openreg fallback: ", op.operator_name(), " result ", i,
                " differs from its Meta kernel's");
    for (size_t j = 0; j < got.size(); ++j) {
      if (got[j].data_ptr() == want[j].data_ptr() && same_geometry(got[j], want[j])) {
        continue;
      }
      TORCH_CHECK(got[j].sizes() == want[j].sizes() && got[j].scalar_type() == want[j].scalar_type(),
                  "openreg fallback: ", op.operator_name(), " computed a ", got[j].scalar_type(), " result of shape ",
                  got[j].sizes(), " where its Meta kernel said ", want[j].scalar_type(), " ", want[j].sizes());
      want[j].copy_(got[j]);
    }
  }
}

// How a call's results relate to its arguments' memory.
struct ResultMemory {
  // Some result views an argument's memory without being the argument
  // itself (a split kernel fills only results it may narrow).
  bool views_an_argument = false;
  // Every result is a tensor of new memory: no argument, nor a view of one
  // (Note [Out variants]).
  bool all_new = true;
};

ResultMemory result_memory(c10::ArrayRef<c10::IValue> arguments, const torch::jit::Stack& results) {
  const std::vector<at::Tensor> argument_tensors = tensors_of(arguments);
  ResultMemory memory;
  for (const c10::IValue& value : results) {
    memory.all_new = memory.all_new && value.isTensor() && value.toTensor().defined();
    for_each_tensor(value, [&](const at::Tensor& r) {
      for (const at::Tensor& a : argument_tensors) {
        if (r.has_storage() && a.has_storage() && r.storage().is_alias_of(a.storage())) {
          memory.all_new = false;
          memory.views_an_argument |= r.unsafeGetTensorImpl() != a.unsafeGetTensorImpl();
        }
      }
    });
  }
  return memory;
}

// Note [Out variants]: a queued functional op whose results are all new
// memory computes straight into them through its out= overload (sin ->
// sin.out, threshold_backward -> threshold_backward.grad_input), when it
// has one taking the same arguments and one out= tensor per result, instead
// of computing fresh CPU tensors and copying them (a result's copy is as
// much memory traffic as the op itself). Only ops whose out= kernels are
// TensorIterator or structured kernels that write the planned geometry as
// it is: pointwise ops, matrix products, softmax and the inner reductions
// (a loss function's out= kernel resizes its out= tensor, and warns doing
// so); and only with a checked plan. relu has an out= overload without a
// CPU kernel: it computes through clamp_min.out(self, 0), which is how
// ATen writes relu (after refusing bool, which a checked plan has not).
bool out_variant_writes_in_place(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> kOps{
      "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::_log_softmax",
      "aten::_softmax_backward_data", "aten::_log_softmax_backward_data", "aten::sum", "aten::mean",
      "aten::amax", "aten::amin"};
  return op.hasTag(at::Tag::pointwise) || kOps.count(op.operator_name().name) > 0;
}

// The out= kernel a functional op computes through.
struct OutVariant {
  c10::OperatorHandle op;
  // Arguments the out= op takes after the functional op's first one, before
  // the rest (clamp_min's min, for relu).
  std::vector<c10::IValue> inserted;

  // The out= op's stack: `arguments`, `inserted` after the first, `outs`.
  torch::jit::Stack stack(torch::jit::Stack arguments, const torch::jit::Stack& outs) const {
    arguments.insert(arguments.begin() + 1, inserted.begin(), inserted.end());
    arguments.insert(arguments.end(), outs.begin(), outs.end());
    return arguments;
  }
};

// Whether `out` takes `functional`'s arguments, then one out= tensor per
// result.
bool out_variant_of(const c10::FunctionSchema& functional, const c10::FunctionSchema& out) {
  const auto& arguments = functional.arguments();
  const auto& out_arguments = out.arguments();
  if (out_arguments.size() != arguments.size() + functional.returns().size()) {
    return false;
  }
  for (size_t i = 0; i < out_arguments.size(); ++i) {
    const c10::Argument& a = out_arguments[i];
    const bool matches = i >= arguments.size()
        ? a.is_out() && a.type()->kind() == c10::TypeKind::TensorType
        : !a.is_out() && a.name() == arguments[i].name() && *a.type() == *arguments[i].type();
    if (!matches) {
      return false;
    }
  }
  return true;
}

std::optional<OutVariant> find_out_variant(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (!out_variant_writes_in_place(op) || schema.is_mutable() || schema.returns().empty()) {
    return std::nullopt;
  }
  for (const c10::Argument& ret : schema.returns()) {
    if (ret.type()->kind() != c10::TypeKind::TensorType) {
      return std::nullopt;
    }
  }
  if (op.operator_name() == c10::OperatorName("aten::relu", "")) {
    return OutVariant{c10::Dispatcher::singleton().findSchemaOrThrow("aten::clamp_min", "out"), {c10::Scalar(0)}};
  }
  // The codegen's names are irregular (add.Tensor -> add.out, add.Scalar ->
  // add.Scalar_out, sum.dim_IntList -> sum.IntList_out, threshold_backward
  // -> threshold_backward.grad_input): candidates are checked by their
  // arguments.
  const std::string& overload = schema.overload_name();
  for (const std::string& name : {overload.empty() ? std::string("out") : overload + "_out", std::string("out"),
                                  std::string("IntList_out"), std::string("grad_input")}) {
    auto out = c10::Dispatcher::singleton().findOp({schema.name(), name});
    if (out && out->hasKernelForDispatchKey(c10::DispatchKey::CPU) && out_variant_of(schema, out->schema())) {
      return OutVariant{*out, {}};
    }
  }
  return std::nullopt;
}

std::optional<OutVariant> out_variant(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* found = new std::unordered_map<const c10::FunctionSchema*, std::optional<OutVariant>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = found->try_emplace(&op.schema());
  if (inserted) {
    it->second = find_out_variant(op);
  }
  return it->second;
}

// Note [Plans checked by the kernel]: a plan not yet checked (route 2 of
// Note [Fallback], when the kernel is split, behind queued work after a
// trial on stand-ins, or while a graph captures) is checked where the
// kernel runs: the CPU kernel's results must have the planned dtypes and
// shapes (and views the planned geometry) before they are written where the
// plan put them. The host waits for a split kernel's first run (Note
// [Errors at the call]): a mismatch, or an error of the kernel, raises at
// the call. Otherwise (after a trial, or in a capture) it fails the kernel
// (the replay), which the next synchronizing call reports (Note [Sticky
// kernel failures] in src/runtime/stream.rs). Either way the plan is never
// trusted, and after a mismatch the op's later new plans are checked by a
// waited, unsplit run. A kernel that warns marks its plan unusable too, so
// that later calls raise their warnings on the caller's thread (Note
// [Kernel warnings]).
class QueuedKernel {
 public:
  QueuedKernel(c10::OperatorHandle op, c10::DispatchKeySet keys, torch::jit::Stack arguments,
               torch::jit::Stack destinations, CallSplit split, std::shared_ptr<PlanToCheck> check,
               std::optional<OutVariant> out_variant)
      : op_(std::move(op)),
        keys_(keys),
        caller_keys_(c10::impl::tls_local_dispatch_key_set()),
        arguments_(std::move(arguments)),
        destinations_(std::move(destinations)),
        split_(std::move(split)),
        check_(std::move(check)),
        out_variant_(std::move(out_variant)) {}

  void operator()() const {
    // As Call::run_cpu_kernel_on_views: the caller's excluded keys.
    c10::impl::ForceDispatchKeyGuard caller_keys(caller_keys_);
    if (!check_) {
      compute(nullptr);
      return;
    }
    CollectedWarnings warnings;
    bool usable = false;
    {
      c10::WarningUtils::WarningHandlerGuard collect(&warnings);
      try {
        usable = compute(&warnings);
      } catch (...) {
        settle_plan(*check_, false);
        throw;
      }
    }
    warnings.raise_here();
    TORCH_CHECK(usable, "openreg fallback: ", op_.operator_name(),
                " computed results other than its Meta kernel planned (dtype, shape or view); this call's results "
                "are not valid, and its later calls wait for the CPU kernel");
  }

 private:
  // Runs the CPU kernel (in chunks when split) and fills the results; with
  // a plan to check, checks it first and settles it (`warnings`: what the
  // kernel raised so far). False if the plan did not match.
  bool compute(const CollectedWarnings* warnings) const {
    if (out_variant_) { // Note [Out variants]
      run_chunks(split_.chunks(), [&](size_t i) {
        const torch::jit::Stack outs = split_.split() ? split_.results_part(destinations_, i) : destinations_;
        torch::jit::Stack stack = out_variant_->stack(
            split_.split() ? split_.arguments_part(arguments_, i) : arguments_, outs);
        out_variant_->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
        for (size_t r = 0; r < outs.size(); ++r) {
          TORCH_CHECK(stack.at(r).toTensor().data_ptr() == outs[r].toTensor().data_ptr(), "openreg fallback: ",
                      out_variant_->op.operator_name(), " moved its out= tensor (Note [Out variants])");
        }
      });
      return true;
    }
    if (split_.split()) {
      // Each chunk's results are checked as they fill the planned ones.
      run_chunks(split_.chunks(), [&](size_t i) {
        torch::jit::Stack stack = split_.arguments_part(arguments_, i);
        op_.redispatchBoxed(keys_, &stack);
        fill_planned_results(op_, stack, split_.results_part(destinations_, i));
      });
      if (check_) {
        settle_plan(*check_, !warnings->any());
      }
      return true;
    }
    torch::jit::Stack stack = arguments_; // a kernel may run again (graph replay)
    op_.redispatchBoxed(keys_, &stack);
    if (check_ && !check_plan(*check_, stack, warnings->any())) {
      return false;
    }
    fill_planned_results(op_, stack, destinations_);
    return true;
  }

  c10::OperatorHandle op_;
  c10::DispatchKeySet keys_; // CPU, and the sparse CPU keys of its sparse operands
  c10::impl::LocalDispatchKeySet caller_keys_;
  torch::jit::Stack arguments_;
  torch::jit::Stack destinations_;
  CallSplit split_;
  std::shared_ptr<PlanToCheck> check_;
  std::optional<OutVariant> out_variant_; // Note [Out variants]
};

// Route 2 (see the Note) with the planned results; `check`: the plan's
// check, for a plan used unchecked (Note [Plans checked by the kernel]);
// `wait`: the host waits for the kernel (Note [Errors at the call]).
void queue_with_planned_results(
    Call& call,
    c10::Device device,
    PlannedResults& planned,
    CallSplit split,
    std::shared_ptr<PlanToCheck> check,
    bool wait) {
  torch::jit::Stack& results = planned.results;
  if (call.op.schema().is_mutable() || planned.any_fresh || check) {
    const ResultMemory memory = result_memory(call.arguments(), results);
    if (split.split() && (!split.fits_results(results) || memory.views_an_argument)) {
      split = CallSplit();
    }
    torch::jit::Stack arguments(call.stack.begin() + call.first_arg, call.stack.end());
    c10::DispatchKeySet keys(c10::DispatchKey::CPU);
    for (c10::IValue& value : arguments) {
      retarget_device(value, c10::kCPU);
      map_tensors(value, [&](const at::Tensor& t) {
        if (!t.is_privateuseone()) {
          return host_copy(t);
        }
        if (!is_sparse_any(t)) {
          return kernel_operand(t);
        }
        std::vector<at::Tensor> members; // Note [Sparse plans] in meta_results.cpp
        for (const at::Tensor& member : sparse_members(t)) {
          members.push_back(kernel_operand(member));
        }
        keys = keys.add(sparse_cpu_key(t));
        return sparse_over(t, members);
      });
    }
    torch::jit::Stack destinations = results;
    KernelInfo info = call.accesses();
    for (c10::IValue& value : destinations) {
      for_each_tensor(value, [&](const at::Tensor& t) { info.add(t, true); });
      map_tensors(value, [](const at::Tensor& t) { return kernel_operand(t); });
    }
    // The out= variants are CPU (dense) kernels.
    std::optional<OutVariant> out =
        check || !memory.all_new || keys != c10::DispatchKeySet(c10::DispatchKey::CPU) ? std::nullopt
                                                                                      : out_variant(call.op);
    QueuedKernel kernel(call.op, keys, std::move(arguments), std::move(destinations), std::move(split),
                        std::move(check), std::move(out));
    if (wait) {
      run_in_stream_order(device.index(), "", kernel, call.op.schema().name().c_str(), [&info] { return info; });
    } else {
      queue_kernel(device.index(), std::move(kernel), ffi::LaunchMode::Queue, std::move(info));
    }
  }
  call.stack.erase(call.stack.begin() + call.first_arg, call.stack.end());
  call.stack.insert(call.stack.end(), results.begin(), results.end());
}

// The out= forms of add, sub and mul, as a raw loop while a graph captures
// them (Note [Graph kernels] in graph_kernels.h); false if not applicable.
bool queue_graph_kernel(Call& call, c10::Device device) {
  const c10::OperatorName& name = call.op.operator_name();
  if (name.overload_name != "out") {
    return false;
  }
  std::optional<BinaryOp> kind;
  if (name.name == "aten::add") {
    kind = BinaryOp::Add;
  } else if (name.name == "aten::sub") {
    kind = BinaryOp::Sub;
  } else if (name.name == "aten::mul") {
    kind = BinaryOp::Mul;
  } else {
    return false;
  }
  c10::ArrayRef<c10::IValue> args = call.arguments();
  // add.out / sub.out: (self, other, alpha, out); mul.out: (self, other, out).
  const size_t count = *kind == BinaryOp::Mul ? 3 : 4;
  if (args.size() != count || !args[0].isTensor() || !args[1].isTensor() || !args.back().isTensor()) {
    return false;
  }
  const at::Tensor& out = args.back().toTensor();
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& other = args[1].toTensor();
  const c10::Scalar alpha = count == 4 ? args[2].toScalar() : c10::Scalar(1);
  std::function<void()> raw = raw_binary_kernel(*kind, out, self, other, alpha);
  if (!raw) {
    return false;
  }
  queue_kernel(
      device.index(), std::move(raw), ffi::LaunchMode::Queue,
      KernelInfo(call.op.schema().name().c_str(), {self, other}, {out}));
  at::Tensor result = out;
  call.stack.erase(call.stack.begin() + call.first_arg, call.stack.end());
  call.stack.emplace_back(std::move(result));
  return true;
}

// The fallback; `quantized_kernel`: the call came through the
// QuantizedPrivateUse1 key (Note [Quantized tensors]).
void run_call(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool quantized_kernel) {
  Call call(op, stack);
  if (quantized_kernel) {
    call.run_quantized_kernel();
  }
  const c10::Device device = call.check_devices();
  c10::DeviceGuard guard(device);
  const char* name = op.schema().name().c_str();
  const auto accesses = [&call] { return call.accesses(); };
  // A split call always runs its split kernel (route 2), never another.
  const CallSplit split =
      call.has_wrapped_tensors() ? CallSplit() : CallSplit(op, call.arguments(), call.largest_operand());
  // An inline run teaches its plan too (Note [Sparse plans] in meta_results.cpp).
  const std::shared_ptr<PlanToCheck> learn_inline =
      call.has_sparse_tensors() ? sparse_plan_to_learn(op, call.arguments()) : nullptr;
  if (!split.split() &&
      run_inline(device.index(), call.largest_operand(), [&] { call.run_cpu_kernel_on_views(); }, name, accesses)) {
    if (ffi::stream_has_parked_failure(device.index()) && results_depend_on_data(op)) {
      // As a waited call would (Note [Sticky kernel failures] in src/runtime/stream.rs).
      checked([&] { ffi::report_stream_failure(device.index()); });
    }
    call.results_to_device(device);
    if (learn_inline) {
      check_plan(*learn_inline, call.arguments(), /*kernel_warned=*/false);
    }
    return;
  }
  const bool capturing = checked([&] { return ffi::is_current_stream_capturing(device.index()); });
  if (capturing && queue_graph_kernel(call, device)) {
    return;
  }
  PlanLookup lookup = call.has_sparse_tensors() ? plan_sparse_results(op, call.arguments(), device)
      : call.has_wrapped_tensors()                 ? PlanLookup()
                                                   : plan_results(op, call.arguments(), device, /*accept_unchecked=*/capturing);
  // Note [Plans checked by the kernel]: a new plan is used, and its kernel
  // checks it, if the kernel is split (the host waits for it) or if the
  // CPU kernel accepted stand-ins of the arguments (Note [Trial on
  // stand-ins]; the call is queued).
  CollectedWarnings trial_warnings;
  if (!call.has_sparse_tensors() && !lookup.planned && lookup.to_check && may_use_unchecked(op) &&
      (split.split() || call.cpu_kernel_accepts_stand_ins(trial_warnings))) {
    std::shared_ptr<PlanToCheck> check = std::move(lookup.to_check);
    lookup = plan_results(op, call.arguments(), device, /*accept_unchecked=*/true);
    if (lookup.planned) {
      const bool wait = split.split();
      queue_with_planned_results(call, device, *lookup.planned, split, std::move(check), wait);
      return;
    }
  }
  if (lookup.planned) {
    queue_with_planned_results(call, device, *lookup.planned, split, nullptr, /*wait=*/false);
    return;
  }
  // A plan's first check is the runtime's own wait, not reported (empty),
  // except to a capture, which cannot wait: a sparse call's plan is learned
  // only from an eager call (Note [Sparse plans] in meta_results.cpp).
  const std::string what = lookup.to_check && call.has_sparse_tensors() && capturing
      ? op.schema().name() + " (the host waits for its results: a sparse op's result shapes are learned from an "
                             "eager call with the same arguments' shapes, before the capture)"
      : lookup.to_check ? std::string()
      : call.has_sparse_tensors()
      ? op.schema().name() + " (the host waits for its results: a sparse result's size may depend on the data)"
      : call.has_wrapped_tensors()
      ? op.schema().name() + " (the host waits for its results: nested and quantized results are not planned)"
      : op.schema().name() + " (the host waits for its results: a data-dependent shape or a host value)";
  // A trial's warnings are the call's (Note [Trial on stand-ins]).
  trial_warnings.raise_here();
  bool warned = false;
  {
    WarningsNotRaisedYet once(trial_warnings);
    c10::WarningUtils::WarningHandlerGuard raise_once(&once);
    warned = run_in_stream_order(device.index(), what, [&] { call.run_cpu_kernel_on_views(); }, name, accesses);
  }
  call.results_to_device(device);
  if (lookup.to_check) {
    check_plan(*lookup.to_check, call.arguments(), warned);
  }
}


// Whether the call moves data between devices, the host's included, or
// makes a tensor from host values: a wrapped (nested or quantized) CPU
// tensor among its arguments, a `device` argument other than its openreg
// tensors' device (_to_copy to the host or to another openreg device, which
// makes the result with empty_quantized on that device), or no openreg
// tensor at all (a factory such as _empty_per_channel_affine_quantized,
// whose scales are host tensors). The CPU kernels of such calls do their
// work with factories and dense ops on the buffers, which reach openreg's
// own allocator and copies, so they run as they are.
bool crosses_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  bool host_wrapped = false;
  std::optional<c10::Device> tensor_device;
  std::optional<c10::Device> device_argument;
  for (const c10::IValue& value : arguments_of(op, stack)) {
    if (value.isDevice()) {
      const c10::Device device = value.toDevice();
      device_argument = device.is_privateuseone() && !device.has_index()
          ? c10::Device(c10::kPrivateUse1, ffi::current_device())
          : device;
    }
    for_each_tensor(value, [&](const at::Tensor& t) {
      host_wrapped |= (t.is_nested() || t.is_quantized()) && t.is_cpu();
      if (!tensor_device && t.is_privateuseone()) {
        tensor_device = t.device();
      }
    });
  }
  return host_wrapped || !tensor_device || (device_argument && *device_argument != *tensor_device);
}

// Whether an openreg tensor is among the call's arguments (not so for a
// factory).
bool has_openreg_tensor(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  bool found = false;
  for (const c10::IValue& value : arguments_of(op, stack)) {
    for_each_tensor(value, [&](const at::Tensor& t) { found |= t.is_privateuseone(); });
  }
  return found;
}

// Runs the CPU kernel of `key` as it is (see crosses_devices), on the
// openreg device the call names (a `device` argument, else its first openreg
// tensor): a CPU kernel sets no device guard, and the allocator allocates on
// the current device.
void run_cpu_kernel_as_is(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey key) {
  std::optional<c10::Device> device;
  for (const c10::IValue& value : arguments_of(op, *stack)) {
    if (value.isDevice() && value.toDevice().is_privateuseone()) {
      device = value.toDevice();
    }
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!device && t.is_privateuseone()) {
        device = t.device();
      }
    });
  }
  c10::OptionalDeviceGuard guard;
  if (device) {
    guard.reset_device(*device);
  }
  op.redispatchBoxed(c10::DispatchKeySet(key), stack);
}

} // namespace

void run_fallback_unrecorded(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_call(op, stack, /*quantized_kernel=*/false);
}

void run_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (recording_dtypes()) {
    run_recorded(fallback_kernel(), op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
    return;
  }
  run_call(op, stack, /*quantized_kernel=*/false);
}

namespace {

// The QuantizedPrivateUse1 kernel of every op (Note [Quantized tensors]).
void run_quantized(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (copy_quantized_bytes(op, stack)) {
    return;
  }
  if (crosses_devices(op, *stack)) {
    run_cpu_kernel_as_is(op, stack, c10::DispatchKey::QuantizedCPU);
    return;
  }
  run_call(op, stack, /*quantized_kernel=*/true);
}

// The NestedTensorPrivateUse1 kernel of every op (Note [Nested tensors]).
// copy_ also runs its CPU nested kernel as it is: a copy of buffers.
void run_nested(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (op.operator_name().name == "aten::copy_" || crosses_devices(op, *stack)) {
    run_cpu_kernel_as_is(op, stack, c10::DispatchKey::NestedTensorCPU);
    return;
  }
  run_fallback_unrecorded(op, stack);
}

} // namespace

void register_fallback(torch::Library& library) {
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&run_fallback>());
}

namespace {

// The SparsePrivateUse1 (`cpu_key` SparseCPU) or SparseCsrPrivateUse1
// (SparseCsrCPU) kernel of every op (Note [Sparse tensors]), outside the
// dtype policy.
template <c10::DispatchKey cpu_key>
void run_sparse_unrecorded(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Other ops with a host sparse tensor among openreg ones are refused by
  // the fallback's device check.
  if (runs_sparse_kernel_as_is(op.operator_name().name) || !has_openreg_tensor(op, *stack)) {
    run_cpu_kernel_as_is(op, stack, cpu_key);
    return;
  }
  run_fallback_unrecorded(op, stack);
}

// The suffix of the dtype rules of `cpu_key`'s kernels (Note [Sparse dtype
// rules] in dtype_policy.h).
constexpr const char* sparse_rules(c10::DispatchKey cpu_key) {
  return cpu_key == c10::DispatchKey::SparseCPU ? kSparseRules : kSparseCompressedRules;
}

// run_sparse_unrecorded, recorded under OPENREG_DTYPES=record.
template <c10::DispatchKey cpu_key>
void run_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (recording_dtypes()) {
    static const c10::KernelFunction kernel =
        c10::KernelFunction::makeFromBoxedFunction<&run_sparse_unrecorded<cpu_key>>();
    run_recorded(kernel, op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack, sparse_rules(cpu_key));
    return;
  }
  run_sparse_unrecorded<cpu_key>(op, stack);
}

// Calls `fn(op, name)` for every aten op in the dispatcher; `name` is what
// torch::Library::impl takes ("add.Tensor").
template <typename Fn>
void for_each_aten_op(Fn&& fn) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& op_name : dispatcher.getAllOpNames()) {
    constexpr std::string_view kAten = "aten::";
    auto op = dispatcher.findOp(op_name);
    if (op_name.name.rfind(kAten, 0) != 0 || !op) {
      continue;
    }
    std::string name = op_name.name.substr(kAten.size());
    if (!op_name.overload_name.empty()) {
      name += "." + op_name.overload_name;
    }
    fn(*op, name);
  }
}

// Registers `kernel` for every aten op that has a `cpu_key` kernel and none
// for `openreg_key`, under `openreg_key`. A backend fallback ranks below an
// op's composite kernels, which for a nested or quantized tensor would
// decompose into dense ops those tensors lack (linear into matmul into
// sizes(); clone into empty_strided), where CPU and CUDA have kernels of
// their own.
template <c10::BoxedKernel::BoxedKernelFunction* kernel>
void register_wrapped_kernels(
    torch::Library& fallback,
    torch::Library& aten,
    c10::DispatchKey cpu_key,
    c10::DispatchKey openreg_key) {
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<kernel>());
  for_each_aten_op([&](const c10::OperatorHandle& op, const std::string& name) {
    if (op.hasKernelForDispatchKey(cpu_key) && !op.hasKernelForDispatchKey(openreg_key)) {
      aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<kernel>());
    }
  });
}

} // namespace

void register_nested_fallback(torch::Library& fallback, torch::Library& nested_aten) {
  register_wrapped_kernels<&run_nested>(
      fallback, nested_aten, c10::DispatchKey::NestedTensorCPU, c10::DispatchKey::NestedTensorPrivateUse1);
}

void register_quantized_fallback(torch::Library& fallback, torch::Library& quantized_aten) {
  register_wrapped_kernels<&run_quantized>(
      fallback, quantized_aten, c10::DispatchKey::QuantizedCPU, c10::DispatchKey::QuantizedPrivateUse1);
}

namespace {

// The sparse kernels (register_wrapped_kernels), each behind the dtype check
// of its rules where the table has them (Note [Sparse dtype rules]).
template <c10::DispatchKey cpu_key, c10::DispatchKey openreg_key>
void register_sparse_kernels_of(torch::Library& fallback, torch::Library& aten) {
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&run_sparse<cpu_key>>());
  for_each_aten_op([&](const c10::OperatorHandle& op, const std::string& name) {
    if (!op.hasKernelForDispatchKey(cpu_key) || op.hasKernelForDispatchKey(openreg_key)) {
      return;
    }
    if (const OpRules* rules = dtype_rules(name + sparse_rules(cpu_key))) {
      aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedKernel(dtype_checked(
                                  c10::KernelFunction::makeFromBoxedFunction<&run_sparse_unrecorded<cpu_key>>(), *rules)));
    } else {
      aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_sparse<cpu_key>>());
    }
  });
}

} // namespace

void register_sparse_fallback(torch::Library& fallback, torch::Library& sparse_aten) {
  register_sparse_kernels_of<c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1>(fallback, sparse_aten);
}

void register_sparse_compressed_fallback(torch::Library& fallback, torch::Library& compressed_aten) {
  register_sparse_kernels_of<c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1>(
      fallback, compressed_aten);
}

namespace {

// Note [Foreach ops]: the _foreach_ ops (torch.optim's foreach steps: SGD's
// _foreach_add_, Adam's _foreach_lerp_, _foreach_addcdiv_...) have CUDA
// kernels and, for other backends, a CompositeExplicitAutograd kernel that
// loops over the lists calling the per-tensor op. On openreg each tensor
// was then a fallback call of its own, a plan lookup and a stream task per
// tensor: 13.5 us of host time for SGD's step over the 6 tensors of a
// 3-layer MLP. A call of an in-place foreach op whose tensors are all float
// or double openreg tensors of one device is instead one fallback call: one
// task (in chunks of whole tensors when large: Note [List chunks] in
// kernel_split.cpp), whose CPU kernel is that same loop over CPU views, so
// each tensor is computed by the per-tensor CPU kernel as before (5.8 us of
// host time for that step). Other calls keep the loop, whose per-tensor
// calls the dtype policy checks (and may compute in a wider dtype:
// Note [Dtype policy]), as do out-of-place forms (their lists of fresh
// results are planned per tensor).
bool in_place_foreach(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  return schema.name().rfind("aten::_foreach_", 0) == 0 && schema.is_mutable() && schema.returns().empty() &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
}

// Whether a call of an in_place_foreach op runs as one fallback call.
bool foreach_as_one_call(c10::ArrayRef<c10::IValue> arguments) {
  if (recording_dtypes()) {
    return false; // the per-tensor calls are what the dtype table records
  }
  std::optional<c10::Device> device;
  bool fits = true;
  for (const c10::IValue& value : arguments) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      fits = fits && t.is_privateuseone() && t.layout() == c10::kStrided && !t.is_nested() &&
          (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) && device.value_or(t.device()) == t.device();
      device = t.device();
    });
  }
  return fits && device.has_value();
}

// The PrivateUse1 kernel of the in_place_foreach ops (Note [Foreach ops]).
void run_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (foreach_as_one_call(arguments_of(op, *stack))) {
    run_call(op, stack, /*quantized_kernel=*/false);
    return;
  }
  // The op has no CPU kernel: its CPU entry is the CompositeExplicitAutograd
  // loop, which dispatches each per-tensor call on the tensors' own keys.
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

} // namespace

// Note [Composites that differ from CPU]
// PyTorch's dispatcher prefers an op's default-backend composite kernel
// (CompositeExplicitAutograd[NonFunctional]) to a backend fallback, so an op
// without an openreg kernel does not always reach the fallback. Every op
// below is found in the dispatcher at registration and sent to the
// fallback, i.e. to its CPU kernel.
//  - Functional structured ops (a CPU kernel and a
//    CompositeExplicitAutogradNonFunctional one: sin, mm, addmm,
//    threshold_backward, nll_loss_forward, sum.dim_IntList...). Their
//    composite runs the op's meta function on the host at every call
//    (TensorIterator set-up, type promotion: 0.6-1.6 us of a queued call's
//    2-5 us, measured for threshold_backward, sum, mm and nll_loss),
//    allocates the results and calls the out= variant, which
//    reaches the fallback. The fallback plans the call once per argument
//    metadata (Note [Meta results]) and computes through the same out=
//    kernel on the worker (Note [Out variants]), so the host pays the meta
//    function once, not per call. It also keeps the loss functions' meta
//    functions from shrinking their output to 0-dim after sizing it (the
//    out= call resized it back and warned "An output with one or more
//    elements was resized", which CPU never does), and index's uint8-mask
//    deprecation from being raised twice (by the meta function and again by
//    the out= kernel). Their in-place forms keep the composite: it runs the
//    meta function on the argument itself and calls the out= variant with
//    it, the way CPU does (the table's rules for the out= forms cover them,
//    Note [Dtype policy]).
//  - Ops with their own CPU kernel and a CompositeExplicitAutograd or
//    CompositeImplicitAutograd kernel (native_layer_norm, native_group_norm,
//    addr, silu_backward, mish_backward, ...): the composite is a different
//    algorithm (math_native_layer_norm computes mean and variance by other
//    reductions; silu_backward's decomposition rounds float16 at each step
//    where the CPU kernel computes in float32), so results differ from CPU
//    beyond float16 tolerance. With a kernel for the backend, autograd uses
//    the op's own derivative, as on CPU, instead of differentiating the
//    decomposition.
// Except narrow_copy: its composite (narrow, then a copy) is what CUDA runs,
// and the CPU kernel checks its arguments in other words than narrow's
// (Note [Errors at the call]).
static bool cuda_runs_the_composite(const std::string& name) {
  return name == "narrow_copy";
}

void register_fallback_kernels(KernelRegistrar& kernels) {
  for_each_aten_op([&](const c10::OperatorHandle& op, const std::string& name) {
    if (op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      return;
    }
    if (in_place_foreach(op)) {
      kernels.unchecked<&run_foreach>(name);
      return;
    }
    if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU) || cuda_runs_the_composite(name)) {
      return;
    }
    const bool functional_structured =
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !op.schema().is_mutable();
    if (functional_structured || op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      kernels.fallback(name);
    }
  });
}

} // namespace openreg
