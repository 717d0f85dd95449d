// This thread's current openreg device, kept in C++ so that the device
// guard reaches it without a call (Note [Current device slot]).
//
// Note [Current device slot]: a c10::DeviceGuard round trip is an exchange
// and a restore of the current device; its target is at most 3x a bare
// thread-local exchange (benches/cpp/bench_guard.cpp). The slot used to be a
// Rust thread_local, and Rust (stable) compiles a thread-local of a shared
// library in the general-dynamic model: every access calls __tls_get_addr,
// twice per round trip, which alone cost about as much as the rest. C++ can
// ask for the initial-exec model instead: the slot is then at a fixed offset
// from the thread pointer, one `mov %fs:` away, so the guard
// (cpp/device/guard.cpp) reads and writes it inline.
//  - One source of truth: only this slot holds the current device. Rust
//    (src/runtime/device.rs) reads and writes it through the two accessors below,
//    never a copy, so the guard, the bridge and the C ABI always agree.
//  - The price of initial-exec in a library that is dlopen'ed after the
//    process started (Python imports torch_openreg late): the linker marks
//    the library DF_STATIC_TLS, and the loader must place its whole TLS
//    block (a few hundred bytes) in the static TLS surplus that glibc keeps
//    for such libraries (>= 512 bytes; tunable glibc.rtld.optional_static_tls),
//    and initialize it in every thread that already exists. If the surplus
//    were used up by other libraries, loading fails with "cannot allocate
//    memory in static TLS block": an import error, never a crash.
//    tests/python/test_current_device_slot.py loads the library late, with
//    threads running, and checks each thread's slot through every path.
//  - `__thread` rather than `thread_local`: it is constant-initialized
//    (every thread starts on device 0), so no TLS wrapper call either.
#pragma once

#include <cstdint>

namespace openreg {

extern __thread int8_t current_device_slot __attribute__((tls_model("initial-exec")));

} // namespace openreg

// The accessors Rust uses (src/runtime/device.rs). Never throw.
extern "C" {
int8_t openreg_current_device_get() noexcept;
void openreg_current_device_set(int8_t index) noexcept;
}
