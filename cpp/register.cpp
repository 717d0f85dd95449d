// Registration with PyTorch, run by the library's load-time constructor
// (src/lib.rs) — see there for why it is not a static registrar.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <atomic>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/shim.h"

namespace openreg::ffi {
namespace {
std::atomic<bool> registered{false};
}

void register_backend() {
  // The C++ name lets libtorch programs write c10::Device("openreg:1");
  // Python's rename_privateuse1_backend("openreg") then finds it set already.
  c10::register_privateuse1_backend("openreg");
  c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, new_device_guard_impl());
  at::RegisterPrivateUse1HooksInterface(new_hooks());
  register_allocators();
  register_ops();
  register_autocast();
  register_graphs();
  register_profiler();
  register_profiler_stubs();
  registered.store(true);
}

bool backend_registered() noexcept {
  return registered.load();
}

void emit_warning(::rust::Str message) noexcept {
  try {
    TORCH_WARN(std::string(message));
  } catch (...) {
    // A warning handler that throws (warnings as errors) must not escape.
  }
}

} // namespace openreg::ffi
