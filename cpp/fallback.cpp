// The boxed fallback: every aten op without an openreg kernel runs PyTorch's
// CPU kernel on zero-copy CPU views of the device memory, as work on the
// current stream of its device (Note [One door] in device_memory.h).
//
// Note [Fallback]: a call takes one of three routes.
//  1. Inline: the stream is idle and the operands are small, so the CPU
//     kernel runs right here as the stream's next work (Note [Inline
//     launches] in src/stream.rs).
//  2. Queued: otherwise, if the op has a Meta kernel. The Meta
//     kernel, run on meta stand-ins of the arguments, tells what the results
//     are: fresh tensors (sizes, strides, dtype), views of an argument, or
//     the (possibly resized) out= argument itself. Fresh results and grown
//     out= storage are allocated now, in stream order; a kernel that runs
//     the CPU kernel on views and copies fresh results into place is queued,
//     and the call returns at once.
//  3. Waited: otherwise, when the results cannot be known without
//     running the op (no Meta kernel; a data-dependent shape, as nonzero's;
//     a non-tensor result; a generator argument, whose state must advance
//     at the call). The CPU kernel runs as the stream's next work and the
//     host waits for it, as CUDA waits for nonzero.
// After routes 1 and 3 the CPU kernel's results are on the host: results
// that view an argument are rebuilt as openreg views of its memory, and
// fresh results (or arguments the CPU kernel moved to fresh memory by
// resizing them) are copied into new device memory by a later kernel
// (copy_to_device), never written from the host after the allocation.
//
// Every route checks devices first, as CUDA does: openreg tensors on one
// device; a CPU tensor only as a read 0-dim scalar (or as indices).
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/device_memory.h"
#include "torch_openreg/src/ffi.rs.h"

namespace openreg {
namespace {

// Ops whose CPU kernels accept CPU index tensors next to device tensors,
// as CUDA's do.
bool accepts_cpu_indices(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" ||
      name.name == "aten::_index_put_impl_" || name.name == "aten::index_put";
}

// Calls `fn(tensor)` for each defined tensor in `value` (a Tensor, Tensor[]
// or Tensor?[]) and puts its result in the tensor's place.
template <typename Fn>
void map_tensors(c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      value = fn(value.toTensor());
    }
  } else if (value.isTensorList()) {
    c10::List<at::Tensor> list = value.toTensorList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      if (list.get(i).defined()) {
        list.set(i, fn(list.get(i)));
      }
    }
    value = list;
  } else if (value.isOptionalTensorList()) {
    auto list = value.toOptionalTensorList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      std::optional<at::Tensor> t = list.get(i);
      if (t.has_value() && t->defined()) {
        list.set(i, fn(*t));
      }
    }
    value = list;
  }
}

// The arguments of one call: where they are on the stack, and their device.
class Call {
 public:
  Call(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : op(op),
        stack(*stack),
        first_arg(stack->size() - op.schema().arguments().size()),
        num_returns(op.schema().returns().size()) {}

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
      map_tensors(value, [&](const at::Tensor& t) {
        if (t.is_privateuseone()) {
          note_device(t.device());
        } else if (t.is_cpu() && written) {
          written_host_tensor_ = true;
        } else if (t.is_cpu() && t.dim() > 0) {
          host_tensor_ = true;
        }
        return t;
      });
    }
    if (device_ && (written_host_tensor_ || (host_tensor_ && !accepts_cpu_indices(op.operator_name())))) {
      TORCH_CHECK(
          false, "Expected all tensors to be on the same device, but found at least two devices, ",
          *device_, " and cpu! (when checking arguments for ", op.operator_name(), ")");
    }
    return device_.value_or(c10::Device(c10::kPrivateUse1, ffi::current_device()));
  }

  // The most elements of any openreg tensor argument: a measure of the
  // op's work, for the choice to run it inline (kInlineKernelElements).
  int64_t largest_operand() {
    int64_t largest = 0;
    for (size_t i = first_arg; i < stack.size(); ++i) {
      map_tensors(stack[i], [&](const at::Tensor& t) {
        largest = std::max(largest, t.is_privateuseone() ? t.numel() : 0);
        return t;
      });
    }
    return largest;
  }

  // Routes 1 and 3: the arguments become CPU views (openreg devices become
  // the CPU) and the CPU kernel runs; the stack then holds its results.
  // Runs as stream work: device memory is accessible.
  void run_cpu_kernel_on_views() {
    for (size_t i = first_arg; i < stack.size(); ++i) {
      c10::IValue& value = stack[i];
      if (value.isDevice() && value.toDevice().is_privateuseone()) {
        value = c10::IValue(c10::Device(c10::kCPU));
      }
      map_tensors(value, [&](const at::Tensor& t) {
        if (!t.is_privateuseone()) {
          return t;
        }
        at::Tensor view = cpu_view(t);
        views_.emplace_back(view, t);
        return view;
      });
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
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
    for (const auto& [view, original] : views_) {
      if (result.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
        if (view.storage().data() != original.storage().data()) {
          // The CPU kernel resized the argument into fresh CPU memory.
          const_cast<at::Tensor&>(original).set_(copy_to_device(view, original.device()));
        } else if (!same_geometry(view, original)) {
          // Resized within its storage (an out= that shrank).
          const_cast<at::Tensor&>(original).set_(
              original.storage(), view.storage_offset(), view.sizes(), view.strides());
        }
        return original;
      }
    }
    for (const auto& [view, original] : views_) {
      if (result.storage().data() == view.storage().data() && result.storage().nbytes() > 0) {
        return alias_of(original, result);
      }
    }
    return copy_to_device(result, device);
  }

  void note_device(const c10::Device& device) {
    c10::Device indexed = device.has_index() ? device : c10::Device(device.type(), ffi::current_device());
    TORCH_CHECK(
        !device_ || *device_ == indexed,
        "Expected all tensors to be on the same device, but found at least two devices, ", *device_, " and ",
        indexed, "! (when checking arguments for ", op.operator_name(), ")");
    device_ = indexed;
  }

  std::optional<c10::Device> device_;
  bool host_tensor_ = false;
  bool written_host_tensor_ = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> views_; // (CPU view, openreg original)

 public:
  static bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.strides() == b.strides() && a.storage_offset() == b.storage_offset();
  }

  // An openreg view of `original`'s memory with the dtype and geometry of
  // `like` (a view that changes the element type keeps its own dtype).
  static at::Tensor alias_of(const at::Tensor& original, const at::Tensor& like) {
    return at::empty({0}, original.options().dtype(like.dtype()))
        .set_(original.storage(), like.storage_offset(), like.sizes(), like.strides());
  }
};

// A host tensor argument of a queued kernel is copied at the call, as CUDA
// copies it at the launch (a 0-dim scalar keeps its wrapped-number flag,
// which type promotion reads).
at::Tensor host_copy(const at::Tensor& t) {
  at::Tensor copy = t.clone();
  copy.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
  return copy;
}

// Data-dependent ops whose Meta kernels cannot know their output shape
// (they raise, or guess an upper bound): always route 3.
bool has_data_dependent_shape(const c10::OperatorName& name) {
  static const std::unordered_map<std::string, bool> ops = {
      {"aten::nonzero", true}, {"aten::nonzero_numpy", true}, {"aten::masked_select", true},
      {"aten::unique_consecutive", true}, {"aten::_unique", true}, {"aten::_unique2", true},
      {"aten::unique_dim", true}, {"aten::unique_dim_consecutive", true}, {"aten::bincount", true},
      {"aten::repeat_interleave", true}, {"aten::histc", true}, {"aten::_assert_async", true},
  };
  return ops.count(name.name) != 0;
}

// Whether route 2 may take `op`, by its schema and kernels. Cached per op.
class QueueableOps {
 public:
  bool allows(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = known_.try_emplace(&op.schema(), false);
    if (inserted) {
      it->second = judge(op);
    }
    return it->second;
  }

  // The op's Meta kernel turned out not to exist after all.
  void forbid(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    known_[&op.schema()] = false;
  }

 private:
  static bool judge(const c10::OperatorHandle& op) {
    if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta) || has_data_dependent_shape(op.operator_name())) {
      return false;
    }
    const auto is_tensor_like = [](const c10::TypePtr& type) {
      if (type->kind() == c10::TypeKind::OptionalType) {
        return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
      }
      if (type->kind() == c10::TypeKind::ListType) {
        return type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
      }
      return type->kind() == c10::TypeKind::TensorType;
    };
    for (const auto& ret : op.schema().returns()) {
      if (!is_tensor_like(ret.type())) {
        return false;
      }
    }
    for (const auto& arg : op.schema().arguments()) {
      if (arg.type()->kind() == c10::TypeKind::GeneratorType ||
          (arg.type()->kind() == c10::TypeKind::OptionalType &&
           arg.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)) {
        return false;
      }
    }
    return true;
  }

  std::mutex mutex_;
  std::unordered_map<const c10::FunctionSchema*, bool> known_;
};

QueueableOps& queueable_ops() {
  static auto* ops = new QueueableOps();
  return *ops;
}

// A meta tensor standing for the openreg tensor `t`: same dtype and
// geometry; tensors sharing memory share a meta storage, so the Meta kernel
// sees the same aliasing.
class MetaArguments {
 public:
  at::Tensor stand_in(const at::Tensor& t) {
    auto [it, inserted] = storages_.try_emplace(t.storage().unsafeGetStorageImpl());
    if (inserted) {
      it->second = c10::Storage(
          c10::Storage::use_byte_size_t(), t.storage().nbytes(), c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
          c10::GetAllocator(c10::kMeta), /*resizable=*/true);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    at::Tensor meta(std::move(impl));
    originals_.emplace_back(meta, t);
    return meta;
  }

  // The openreg tensor the Meta kernel's `result` stands for: the argument
  // itself (resized like its stand-in, in stream order), a view of an
  // argument's memory, or new device memory; `fresh` says which.
  at::Tensor to_device(const at::Tensor& result, c10::Device device, bool& fresh) {
    fresh = false;
    for (const auto& [meta, original] : originals_) {
      if (result.unsafeGetTensorImpl() == meta.unsafeGetTensorImpl()) {
        if (!Call::same_geometry(meta, original) || meta.dtype() != original.dtype()) {
          resize_like(original, meta);
        }
        return original;
      }
    }
    for (const auto& [meta, original] : originals_) {
      if (result.storage().unsafeGetStorageImpl() == meta.storage().unsafeGetStorageImpl()) {
        return Call::alias_of(original, result);
      }
    }
    fresh = true;
    c10::DeviceGuard guard(device);
    return at::detail::empty_strided_generic(
        result.sizes(), result.strides(), device_memory_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        result.scalar_type());
  }

 private:
  // An out= argument the Meta kernel resized: its openreg tensor gets the
  // same geometry, its storage grown if needed.
  static void resize_like(const at::Tensor& original, const at::Tensor& meta) {
    TORCH_CHECK(
        meta.dtype() == original.dtype(), "openreg fallback: the Meta kernel changed the dtype of an argument");
    const size_t needed =
        at::detail::computeStorageNbytes(meta.sizes(), meta.strides(), meta.itemsize(), meta.storage_offset());
    if (needed > original.storage().nbytes()) {
      resize_device_storage(original.storage(), needed);
    }
    original.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  }

  std::unordered_map<c10::StorageImpl*, c10::Storage> storages_;
  std::vector<std::pair<at::Tensor, at::Tensor>> originals_; // (meta stand-in, openreg original)
};

// Route 2 (see the Note); false if the Meta kernel cannot tell the results,
// leaving the stack as it was.
bool queue_with_meta_results(Call& call, c10::Device device) {
  if (!queueable_ops().allows(call.op)) {
    return false;
  }
  MetaArguments meta;
  torch::jit::Stack meta_stack(call.stack.begin() + call.first_arg, call.stack.end());
  for (c10::IValue& value : meta_stack) {
    if (value.isDevice() && value.toDevice().is_privateuseone()) {
      value = c10::IValue(c10::Device(c10::kMeta));
    }
    map_tensors(value, [&](const at::Tensor& t) { return t.is_privateuseone() ? meta.stand_in(t) : t; });
  }
  try {
    call.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
  } catch (const c10::NotImplementedError&) {
    queueable_ops().forbid(call.op);
    return false;
  } catch (const std::exception&) {
    return false; // route 3 raises the CPU kernel's own error
  }

  // The openreg results; out= arguments are resized before the kernel's
  // views of them are made.
  torch::jit::Stack results;
  std::vector<bool> fresh_results;
  for (c10::IValue& value : meta_stack) {
    map_tensors(value, [&](const at::Tensor& t) {
      bool fresh = false;
      at::Tensor result = meta.to_device(t, device, fresh);
      fresh_results.push_back(fresh);
      return result;
    });
    results.push_back(value);
  }
  const bool any_fresh = std::find(fresh_results.begin(), fresh_results.end(), true) != fresh_results.end();
  if (call.op.schema().is_mutable() || any_fresh) {
    torch::jit::Stack arguments(call.stack.begin() + call.first_arg, call.stack.end());
    for (c10::IValue& value : arguments) {
      if (value.isDevice() && value.toDevice().is_privateuseone()) {
        value = c10::IValue(c10::Device(c10::kCPU));
      }
      map_tensors(value, [](const at::Tensor& t) { return t.is_privateuseone() ? kernel_operand(t) : host_copy(t); });
    }
    torch::jit::Stack destinations = results;
    for (c10::IValue& value : destinations) {
      map_tensors(value, [](const at::Tensor& t) { return kernel_operand(t); });
    }
    queue_kernel(
        device.index(),
        [op = call.op, arguments = std::move(arguments), destinations = std::move(destinations)] {
          torch::jit::Stack stack = arguments; // a kernel may run again (graph replay)
          op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
          TORCH_CHECK(stack.size() == destinations.size(), "openreg fallback: ", op.operator_name(), " returned ",
                      stack.size(), " values, its Meta kernel ", destinations.size());
          for (size_t i = 0; i < stack.size(); ++i) {
            std::vector<at::Tensor> got, want;
            c10::IValue computed = stack[i], destination = destinations[i];
            map_tensors(computed, [&](const at::Tensor& t) { got.push_back(t); return t; });
            map_tensors(destination, [&](const at::Tensor& t) { want.push_back(t); return t; });
            TORCH_CHECK(got.size() == want.size(), "openreg fallback: ", op.operator_name(), " result ", i,
                        " differs from its Meta kernel's");
            for (size_t j = 0; j < got.size(); ++j) {
              if (got[j].data_ptr() == want[j].data_ptr() && Call::same_geometry(got[j], want[j])) {
                continue; // written in place
              }
              TORCH_CHECK(got[j].sizes() == want[j].sizes(), "openreg fallback: ", op.operator_name(),
                          " computed a result of shape ", got[j].sizes(), " where its Meta kernel said ",
                          want[j].sizes());
              want[j].copy_(got[j]);
            }
          }
        },
        ffi::LaunchMode::Queue);
  }
  call.stack.erase(call.stack.begin() + call.first_arg, call.stack.end());
  call.stack.insert(call.stack.end(), results.begin(), results.end());
  return true;
}

void run_on_cpu_views(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Call call(op, stack);
  const c10::Device device = call.check_devices();
  c10::DeviceGuard guard(device);
  if (run_inline(device.index(), call.largest_operand(), [&] { call.run_cpu_kernel_on_views(); })) {
    call.results_to_device(device);
  } else if (!queue_with_meta_results(call, device)) {
    run_in_stream_order(device.index(), [&] { call.run_cpu_kernel_on_views(); });
    call.results_to_device(device);
  }
}

} // namespace

void register_fallback(torch::Library& library) {
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_cpu_views>());
}

// A structured op without an openreg kernel runs PyTorch's default-backend
// composite (CompositeExplicitAutogradNonFunctional), which outranks a
// fallback: its meta function on the device, then the out= variant here.
// That is right for most ops, but the loss functions' meta functions shrink
// the output to 0-dim after sizing it, so the out= call resizes it back and
// warns "An output with one or more elements was resized", which CPU never
// does. Their functional forms go straight to the fallback instead.
void register_fallback_kernels(torch::Library& aten) {
  for (const char* op : {"mse_loss", "smooth_l1_loss"}) {
    aten.impl(op, torch::CppFunction::makeFromBoxedFunction<&run_on_cpu_views>());
  }
}

} // namespace openreg
