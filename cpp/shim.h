// The C++ side of the cxx bridge (src/bridge/ffi.rs): functions Rust calls into,
// and the helper every shim method uses to turn Rust errors into c10::Error.
// Kept free of PyTorch headers: the generated bridge code includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rust/cxx.h"

namespace openreg::ffi {

// Forwards to TORCH_WARN. Never throws.
void emit_warning(::rust::Str message) noexcept;
// Registers the openreg backend (name, device guard, hooks) with PyTorch.
void register_backend();
bool backend_registered() noexcept;

// A range of memory a kernel reads or writes: for a graph's debug dump and
// the stream sanitizer, which reads it as `sanitizer::KernelBuffer` (same
// layout). `tensor` is the c10::TensorImpl it belongs to (0: none), valid
// during the launch call, for the sanitizer's report.
struct KernelBuffer {
  uintptr_t address = 0;
  size_t bytes = 0;
  bool written = false;
  uintptr_t tensor = 0;
};
static_assert(sizeof(KernelBuffer) == 4 * sizeof(uintptr_t), "KernelBuffer must match sanitizer::KernelBuffer");

// "float32[64, 256]" for the c10::TensorImpl at `tensor`.
::rust::String describe_tensor(size_t tensor);

// A C++ closure queued on a stream; the stream's worker runs it once, or
// once per replay when a graph captured it (so it must not consume what it
// captured). `name` and `buffers` describe it for a graph's debug dump;
// `name` (a string that lives for the process: an operator's name or a
// literal) also names it in an op timeout (Note [Task names] in src/runtime/stream.rs).
struct Kernel {
  std::function<void()> body;
  const char* name = "kernel";
  std::vector<KernelBuffer> buffers;
};

void run_kernel(Kernel& kernel);
inline const char* kernel_name(const Kernel& kernel) noexcept {
  return kernel.name;
}
::rust::String describe_kernel(const Kernel& kernel);

} // namespace openreg::ffi

// Outside cxx: see Note [Guard hot path] in src/bridge/ffi.rs.
extern "C" {
void openreg_guard_unchecked_set_device(int8_t index) noexcept;
// See Note [Device memory generations] in src/runtime/allocator.rs.
bool openreg_memory_is_current(uintptr_t ptr) noexcept;
// Set while the stream sanitizer is on (src/diagnostics/sanitizer.rs): the shim's one
// test per launch when it is off.
extern bool openreg_sanitizer_on;
}

namespace openreg {
inline bool sanitizer_on() noexcept {
  return __atomic_load_n(&openreg_sanitizer_on, __ATOMIC_RELAXED);
}
} // namespace openreg
