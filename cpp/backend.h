// Factories for the PyTorch interface implementations, one per file, used by
// register.cpp. Each returns a new object PyTorch keeps for the process.
#pragma once

namespace c10::impl {
struct DeviceGuardImplInterface;
}
namespace at {
struct PrivateUse1HooksInterface;
}

namespace openreg {

c10::impl::DeviceGuardImplInterface* new_device_guard_impl();
at::PrivateUse1HooksInterface* new_hooks();

} // namespace openreg
