// The boxed fallback: every aten op without an openreg kernel runs PyTorch's
// CPU kernel on zero-copy CPU views of the device memory.
//
// Note [Fallback]: the call waits for the current stream of its device (so
// it sees all queued work, and work queued later follows it: stream order),
// swaps each openreg tensor argument for a CPU view of the same memory, and
// each openreg device argument for the CPU, then redispatches to the CPU
// kernel with device memory accessible. Results that are argument views keep
// pointing at device memory (an in-place or out= result is the very argument
// tensor); fresh CPU results — and arguments the kernel resized, which it
// moves to CPU memory — are copied into device memory on the call's device:
// the only copies made.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

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

class ArgumentRewriter {
 public:
  explicit ArgumentRewriter(const c10::OperatorHandle& op) : op_(op) {}

  // `written`: the schema marks the argument as mutated (in-place or out=).
  void rewrite(c10::IValue& value, bool written) {
    if (value.isTensor()) {
      value = to_cpu_view(value.toTensor(), written);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list = value.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        list.set(i, to_cpu_view(list.get(i), written));
      }
      value = list;
    } else if (value.isOptionalTensorList()) {
      auto list = value.toOptionalTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        std::optional<at::Tensor> t = list.get(i);
        if (t.has_value()) {
          list.set(i, to_cpu_view(*t, written));
        }
      }
      value = list;
    } else if (value.isDevice() && value.toDevice().is_privateuseone()) {
      note_device(value.toDevice());
      value = c10::IValue(c10::Device(c10::kCPU));
    }
  }

  // Checks mixed-device use once all arguments are seen.
  void finish() {
    if (device_ && (written_host_tensor_ || (host_tensor_ && !accepts_cpu_indices(op_.operator_name())))) {
      TORCH_CHECK(
          false, "Expected all tensors to be on the same device, but found at least two devices, ",
          *device_, " and cpu! (when checking arguments for ", op_.operator_name(), ")");
    }
  }

  c10::Device device() const {
    return device_.value_or(c10::Device(c10::kPrivateUse1, ffi::current_device()));
  }

  // The openreg tensor a result stands for (see Note [Fallback]).
  at::Tensor to_device_result(const at::Tensor& result) {
    if (!result.defined() || !result.is_cpu()) {
      return result;
    }
    for (const auto& [view, original] : views_) {
      if (result.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
        if (view.storage().data() != original.storage().data()) {
          rebind_resized(view, original);
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
        return at::empty({0}, original.options())
            .set_(original.storage(), result.storage_offset(), result.sizes(), result.strides());
      }
    }
    return copy_to_device(result, device());
  }

  static bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.strides() == b.strides() && a.storage_offset() == b.storage_offset();
  }

  // The CPU kernel resized an argument's view into fresh CPU memory: give the
  // openreg tensor device memory of the new geometry holding the result.
  static void rebind_resized(const at::Tensor& view, const at::Tensor& original) {
    const_cast<at::Tensor&>(original).set_(copy_to_device(view, original.device()));
  }

 private:
  // A CPU tensor may join device tensors only as a read 0-dim scalar (or as
  // indices, see accepts_cpu_indices); a written CPU tensor never may.
  at::Tensor to_cpu_view(const at::Tensor& t, bool written) {
    if (!t.defined()) {
      return t;
    }
    if (t.is_privateuseone()) {
      note_device(t.device());
      at::Tensor view = cpu_view(t);
      views_.emplace_back(view, t);
      return view;
    }
    if (t.is_cpu() && written) {
      written_host_tensor_ = true;
    } else if (t.is_cpu() && t.dim() > 0) {
      host_tensor_ = true;
    }
    return t;
  }

  void note_device(const c10::Device& device) {
    c10::Device indexed = device.has_index() ? device : c10::Device(device.type(), ffi::current_device());
    TORCH_CHECK(
        !device_ || *device_ == indexed,
        "Expected all tensors to be on the same device, but found at least two devices, ", *device_, " and ",
        indexed, "! (when checking arguments for ", op_.operator_name(), ")");
    device_ = indexed;
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::Device> device_;
  bool host_tensor_ = false;
  bool written_host_tensor_ = false;
  std::vector<std::pair<at::Tensor, at::Tensor>> views_; // (CPU view, openreg original)
};

void run_on_cpu_views(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  const size_t num_returns = op.schema().returns().size();
  ArgumentRewriter rewriter(op);
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - num_args;
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::AliasInfo* alias = arguments[i - first].alias_info();
    rewriter.rewrite((*stack)[i], alias != nullptr && alias->isWrite());
  }
  rewriter.finish();

  c10::DeviceGuard guard(rewriter.device());
  synchronize_current_stream(rewriter.device().index());
  {
    DeviceAccess access;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      c10::IValue& result = (*stack)[i];
      if (result.isTensor()) {
        result = rewriter.to_device_result(result.toTensor());
      } else if (result.isTensorList()) {
        c10::List<at::Tensor> list = result.toTensorList();
        for (size_t j = 0; j < list.size(); ++j) {
          list.set(j, rewriter.to_device_result(list.get(j)));
        }
        result = list;
      }
    }
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
