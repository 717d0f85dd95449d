// The tensors inside a boxed argument or result (an IValue holding a
// Tensor, a Tensor[] or a Tensor?[]), for code that handles ops generically:
// the fallback and its result planning.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

namespace openreg {

// The arguments of a boxed call of `op` on `stack`.
inline c10::ArrayRef<c10::IValue> arguments_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t count = op.schema().arguments().size();
  return c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - count, count);
}

// Whether `value` is a Tensor?[] list: isOptionalTensorList() compares type
// pointers, and a list TorchScript builds (prim::ListConstruct of
// `Optional[Tensor]`, as in `x[mask] = v`) carries a type object of its own
// that is equal to, not the same as, c10's.
inline bool is_optional_tensor_list(const c10::IValue& value) {
  if (!value.isList() || value.isIntList()) { // int[] (sizes, dims): the common list, answered cheaply
    return false;
  }
  if (value.isOptionalTensorList()) {
    return true;
  }
  const c10::TypePtr type = value.toList().elementType();
  return type->kind() == c10::OptionalType::Kind && *type == *c10::getTypePtr<std::optional<at::Tensor>>();
}

// Calls `fn(tensor)` for each defined tensor in `value`.
template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      fn(value.toTensor());
    }
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      if (t.defined()) {
        fn(t);
      }
    }
  } else if (is_optional_tensor_list(value)) {
    for (const c10::IValue& t : value.toListRef()) {
      if (t.isTensor() && t.toTensor().defined()) {
        fn(t.toTensor());
      }
    }
  }
}

// The defined tensors in `values`, in for_each_tensor order.
inline std::vector<at::Tensor> tensors_of(c10::ArrayRef<c10::IValue> values) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& value : values) {
    for_each_tensor(value, [&](const at::Tensor& t) { tensors.push_back(t); });
  }
  return tensors;
}

// An openreg device argument becomes `type` (a kernel's CPU or Meta run).
inline void retarget_device(c10::IValue& value, c10::DeviceType type) {
  if (value.isDevice() && value.toDevice().is_privateuseone()) {
    value = c10::IValue(c10::Device(type));
  }
}

// Puts `fn(tensor)` in the place of each defined tensor in `value` (a list
// is rebuilt: the caller's list is not changed).
template <typename Fn>
void map_tensors(c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      value = fn(value.toTensor());
    }
  } else if (value.isTensorList()) {
    c10::List<at::Tensor> mapped;
    for (const at::Tensor& t : value.toTensorList()) {
      mapped.push_back(t.defined() ? fn(t) : t);
    }
    value = std::move(mapped);
  } else if (is_optional_tensor_list(value)) {
    c10::List<std::optional<at::Tensor>> mapped;
    for (const c10::IValue& t : value.toListRef()) {
      const bool tensor = t.isTensor() && t.toTensor().defined();
      mapped.push_back(tensor ? std::optional<at::Tensor>(fn(t.toTensor())) : std::nullopt);
    }
    value = std::move(mapped);
  }
}

} // namespace openreg
