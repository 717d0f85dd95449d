// Factories for the PyTorch interface implementations, one per file, used by
// register.cpp. Each returns a new object PyTorch keeps for the process.
#pragma once

namespace c10::impl {
struct DeviceGuardImplInterface;
}
namespace at {
struct PrivateUse1HooksInterface;
}
namespace c10 {
struct Allocator;
}

namespace openreg {

c10::impl::DeviceGuardImplInterface* new_device_guard_impl();
at::PrivateUse1HooksInterface* new_hooks();

// Registers the device allocator (c10::SetAllocator for PrivateUse1).
void register_allocators();
// The device allocator (what c10::GetAllocator(kPrivateUse1) returns).
c10::Allocator* device_memory_allocator();
// The allocator behind pin_memory() (handed out by the hooks).
c10::Allocator* pinned_memory_allocator();
// Registers the aten kernels and the boxed fallback for PrivateUse1.
void register_ops();
// Registers the AutocastPrivateUse1 kernels (Note [Autocast policy], autocast.cpp).
void register_autocast();
// Registers the at::GraphImplInterface behind torch.accelerator.Graph (graph.cpp).
void register_graphs();
// Registers the Kineto activity profiler for openreg devices (profiler.cpp).
void register_profiler();
// Registers the profiler's PrivateUse1 stubs, which time ops for the
// autograd profiler's fallback mode (Note [Legacy profiler device timing],
// profiler_stubs.cpp).
void register_profiler_stubs();

} // namespace openreg
