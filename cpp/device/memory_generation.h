// The check that device memory is of its device's current generation:
// memory allocated before a device restart raises an error naming it
// instead of being computed on (Note [Device memory generations] in
// src/runtime/allocator.rs). Called where a device tensor becomes a CPU view for a
// kernel (cpp/device/device_memory.cpp), so every kernel operand passes it.
#pragma once

#include <cstdint>

#include <c10/core/Storage.h>
#include <c10/macros/Macros.h>

#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {

// Throws a c10::Error if `storage` holds memory from before its device's
// restart. One call and an atomic load while no such memory is alive.
inline void check_memory_generation(const c10::Storage& storage) {
  const auto ptr = reinterpret_cast<uintptr_t>(storage.data());
  if (C10_UNLIKELY(!openreg_memory_is_current(ptr))) {
    checked([&] { ffi::check_device_memory(ptr); });
  }
}

} // namespace openreg
