// The tensors inside a boxed argument or result (an IValue holding a
// Tensor, a Tensor[] or a Tensor?[]), for code that handles ops generically:
// the fallback and its result planning.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/List.h>

namespace openreg {

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
  } else if (value.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      if (t.has_value() && t->defined()) {
        fn(*t);
      }
    }
  }
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
  } else if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> mapped;
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      mapped.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(fn(*t)) : t);
    }
    value = std::move(mapped);
  }
}

} // namespace openreg
