// The C++ side of the cxx bridge (src/ffi.rs): functions Rust calls into,
// and the helper every shim method uses to turn Rust errors into c10::Error.
// Kept free of PyTorch headers: the generated bridge code includes it.
#pragma once

#include <cstdint>
#include <functional>

#include "rust/cxx.h"

namespace openreg::ffi {

// Forwards to TORCH_WARN. Never throws.
void emit_warning(::rust::Str message) noexcept;
// Registers the openreg backend (name, device guard, hooks) with PyTorch.
void register_backend();
bool backend_registered() noexcept;

// A C++ closure queued on a stream; the stream's worker runs it once.
struct Kernel {
  std::function<void()> body;
};

void run_kernel(Kernel& kernel);

} // namespace openreg::ffi

// The guard's hot path, outside cxx: see Note [Guard hot path] in src/ffi.rs.
extern "C" {
int8_t openreg_guard_current_device() noexcept;
int8_t openreg_guard_exchange_device(int8_t index) noexcept;
void openreg_guard_unchecked_set_device(int8_t index) noexcept;
}
