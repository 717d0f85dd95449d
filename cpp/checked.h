// Calls into Rust and converts a Rust `Err` (thrown by cxx as rust::Error)
// into a c10::Error, so Python sees a RuntimeError with the Rust message,
// which already names the device, stream or event at fault.
#pragma once

#include <c10/util/Exception.h>

#include "rust/cxx.h"

namespace openreg {

template <typename F>
decltype(auto) checked(F&& call) {
  try {
    return call();
  } catch (const ::rust::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

} // namespace openreg
