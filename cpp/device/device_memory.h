// Helpers for code that touches device memory from C++: CPU views that alias
// device memory (zero-copy), and launching work on the current stream.
#pragma once

#include <exception>
#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {

// A CPU tensor over the same bytes as the openreg tensor `t` (same storage
// range, offset, sizes, strides, dtype, and the same lazy conjugate and
// negative bits, so a CPU kernel reads it as it would read `t`: matmul and
// copy_ resolve the bits themselves). It does not own the memory: keep `t`
// alive while the view is used. A CPU kernel may still resize it (an out=
// argument of the wrong size): it then moves to fresh CPU memory, which the
// caller must carry back to the device (see Note [Fallback]).
at::Tensor cpu_view(const at::Tensor& t);

// A CPU storage over the same bytes as the openreg `storage`, not owning
// them (what cpu_view's view holds).
c10::Storage cpu_storage_alias(const c10::Storage& storage);

// cpu_view(t) (t strided) over `cpu_storage`, a cpu_storage_alias of t's
// storage. Views of tensors sharing device memory should share one such
// storage when one CPU kernel sees them together: its overlap checks
// (assert_no_overlap, TensorIterator's) know memory as shared only through
// the storage (Note [Errors at the call] in cpp/ops/fallback.cpp).
at::Tensor cpu_view_over(const at::Tensor& t, c10::Storage cpu_storage);

// Note [Scratch views]: what cpu_view(t) gives, for a kernel running inline
// on this thread, without allocating. Each of kScratchViews slots per thread
// keeps the TensorImpl and StorageImpl of its last view and re-points them
// at `t`, unless something still holds them (then it makes a fresh view).
// A slot's view is valid until the next scratch_cpu_view of that slot on
// this thread. A 1K-element add costs about as much as making three views.
constexpr size_t kScratchViews = 3;
at::Tensor scratch_cpu_view(const at::Tensor& t, size_t slot);

// Note [Kernel captures]: a queued kernel captures kernel_operand(t) of each
// tensor it touches, never t. For a device tensor that is a CPU view of its
// memory, which does not keep the memory alive: device memory is
// stream-ordered (Note [Stream-ordered memory] in src/runtime/allocator.rs), so the
// tensor may be freed while the kernel is queued, as with CUDA. A host
// tensor (pinned memory, a CPU scalar) is kept alive by a fresh TensorImpl
// sharing its storage and geometry. Neither has a Python object: a kernel's
// captures are dropped on the stream's worker, possibly while a Python
// thread holds the GIL waiting for that stream, and dropping the last
// reference to a tensor whose Python object is gone would need the GIL.
at::Tensor kernel_operand(const at::Tensor& t);

// A new openreg tensor on the current device (the caller's DeviceGuard
// chooses it): what the `empty` kernel makes, without a dispatch to it.
at::Tensor empty_on_current_device(
    c10::IntArrayRef sizes,
    c10::ScalarType dtype,
    std::optional<c10::MemoryFormat> memory_format = std::nullopt);

// Note [One door]: every read or write of device memory is work on a stream
// (src/runtime/stream.rs): a kernel queued with queue_kernel, or run in its place
// by run_inline when the stream is idle. Nothing here touches device memory
// from the calling thread outside those two, and nothing waits for a stream
// unless the caller must see a result on the host (run_in_stream_order).
// Device memory is stream-ordered (Note [Stream-ordered memory] in
// src/runtime/allocator.rs): a block freed by any thread may be handed out again at
// once, while a kernel queued earlier on its stream still reads it, so the
// first write into fresh memory must itself be later stream work.

// A new openreg tensor on `device` (same sizes and strides as the CPU tensor
// `host`) whose contents are copied from `host` by a kernel on the current
// stream of `device`; `host` is kept alive until then. `name` (a string that
// lives for the process) names the kernel: the op whose result it carries.
at::Tensor copy_to_device(const at::Tensor& host, c10::Device device, const char* name = "copy to device");

// Gives `storage` (openreg memory) `new_bytes` of fresh memory on its device;
// the old bytes that fit are copied, and the old memory released, by a
// kernel on the current stream of that device.
void resize_device_storage(const c10::Storage& storage, size_t new_bytes);

// resize_device_storage to `min_bytes`, if `storage` is smaller.
void grow_device_storage(const c10::Storage& storage, size_t min_bytes);

// Device memory is accessible to host code while this lives (Note [Memory
// protection] in src/memory/device_memory.rs). Free unless OPENREG_MEMORY_PROTECT=1.
class DeviceAccess {
 public:
  DeviceAccess() {
    ffi::begin_device_access();
  }
  ~DeviceAccess() {
    ffi::end_device_access();
  }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// Note [Kernel threads]: PyTorch's CPU kernels parallelize with OpenMP, and
// OpenMP gives every thread that opens a parallel region a team of its own.
// Once a second team exists on this machine's cores, libgomp throttles its
// spinning for good and every parallel region of the user's own CPU work
// pays futex wake-ups: CPU matmuls ran 2x slower for the rest of the process
// after one backward pass on openreg, whose kernels ran on stream workers and
// autograd's device thread. So a device kernel runs with a team of one, on
// whatever thread it runs (the thread's own setting is restored after it):
// a stream computes like one core, streams run side by side, and a kernel's
// rounding (a reduction's split) never depends on which thread ran it, so
// results are the same run after run whether a kernel ran inline or queued.
// A large kernel uses the other cores by splitting itself into chunks, each
// such a single-threaded kernel (Note [Split kernels] in kernel_split.h).
class KernelThreads {
 public:
  KernelThreads();
  ~KernelThreads();
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

 private:
  int saved_ = 0; // 0: nothing to restore
};

// Note [No ops inside kernels]: a kernel is device work, not ops: the
// at:: calls a CPU kernel makes inside (mm calling mm_out, a composite's
// pieces) would otherwise reach the profiler as ops of their own, nested in
// the op that launched the kernel (doubling its CPU time) or, for a queued
// kernel, on a worker thread. CUDA's kernels make no op calls; so a kernel
// body runs with RecordFunction callbacks off (KernelScope) — when any are
// registered: turning them off copies the thread's callback state, which
// costs an inline kernel more than it runs for.
class KernelScope {
 public:
  KernelScope() {
    if (at::hasCallbacks()) {
      no_ops_inside_.emplace(false);
    }
  }

 private:
  KernelThreads threads_;
  std::optional<at::RecordFunctionGuard> no_ops_inside_;
};

// What a kernel is: its name (a string that lives for the process, like an
// operator's name) and the memory it reads and writes. Captured in a graph
// it labels the kernel's node in the debug dump (src/runtime/graph.rs); the stream
// sanitizer checks each launch's accesses (Note [Stream sanitizer] in
// src/diagnostics/sanitizer.rs).
struct KernelInfo {
  const char* name = "kernel";
  std::vector<ffi::KernelBuffer> buffers;

  KernelInfo() = default;
  explicit KernelInfo(const char* name) : name(name) {}
  KernelInfo(const char* name, std::initializer_list<at::Tensor> reads, std::initializer_list<at::Tensor> writes);
  // The bytes `t` spans in its storage (every element of a strided view).
  void add(const at::Tensor& t, bool written);
  void add_bytes(const void* address, size_t bytes, bool written);
};

// Checks a launch on the current stream of `device` against the stream
// sanitizer's model; throws its report in "raise" mode. Call only while
// sanitizer_on().
void sanitize(c10::DeviceIndex device, const KernelInfo& info);

// Queues `body` as a kernel on the current stream of `device` (see
// ffi::LaunchMode). A failure of a queued kernel is reported by the stream's
// next synchronize; otherwise rethrown. A stream capturing a graph records
// it instead (Note [Graph capture] in src/runtime/graph.rs): `body` then runs once
// per replay, so it must not consume its captures.
void queue_kernel(
    c10::DeviceIndex device,
    std::function<void()> body,
    ffi::LaunchMode mode,
    KernelInfo info = KernelInfo());

// Kernels up to this many elements run inline on an idle stream. Larger
// ones are queued, so that the host goes on with its Python and dispatch
// while the worker computes, as beside a GPU: at 64K elements the MLP step
// of benches/run_all.py (3 Linear 256, batch 64) ran every op inline, host
// and kernels in series, in 1.6-2.0 ms; at 4K its kernels overlap the host
// and the step takes 1.25 ms (CPU: 0.9-1.4 ms, same runs).
constexpr int64_t kInlineKernelElements = 1 << 12;

// The launch mode for a kernel touching `numel` elements.
ffi::LaunchMode launch_mode_for(int64_t numel);

// Runs `body` right here, as the next work of the current stream of
// `device`, if `numel` is at most kInlineKernelElements and that stream is
// idle (Note [Inline launches]); returns whether it did. The caller holds
// its tensors meanwhile, so `body` may capture them by reference. `name`
// (a string that lives for the process) names it to the profiler;
// `accesses()` returns its KernelInfo, asked for only by the sanitizer (a
// caller that gets false queues the kernel with that KernelInfo itself).
template <typename Body, typename Accesses>
bool run_inline(c10::DeviceIndex device, int64_t numel, Body&& body, const char* name, Accesses&& accesses) {
  if (numel > kInlineKernelElements || !checked([&] { return ffi::begin_inline_kernel(device); })) {
    return false;
  }
  struct EndInline {
    c10::DeviceIndex device;
    ~EndInline() {
      ffi::end_inline_kernel(device);
    }
  } end_inline{device};
  if (sanitizer_on()) {
    sanitize(device, accesses());
  }
  DeviceAccess access;
  KernelScope scope;
  if (!ffi::profiler_active()) {
    body();
    return true;
  }
  const int64_t start = ffi::profiler_now_ns(); // Note [Profiler activities]
  body();
  ffi::profiler_record_inline(name, device, start, ffi::profiler_now_ns());
  return true;
}

// Runs `body` on the current stream of `device` with device memory
// accessible, as `mode` says. InlineIfIdle on an idle stream runs it right
// here, without packaging it as a queued kernel.
template <typename Body>
void launch(c10::DeviceIndex device, Body&& body, ffi::LaunchMode mode, KernelInfo info = KernelInfo()) {
  if (mode == ffi::LaunchMode::InlineIfIdle &&
      run_inline(device, 0, body, info.name, [&info]() -> const KernelInfo& { return info; })) {
    return;
  }
  queue_kernel(device, std::forward<Body>(body), mode, std::move(info));
}


// Note [Kernel warnings]: a CPU kernel's warnings (TORCH_WARN) go to the
// warning handler of the thread that runs it, which for a stream's worker
// is not the caller's (Python's `warnings` never sees them there). A kernel
// the host waits for (run_in_stream_order) collects its warnings and the
// waiting thread raises them after it, once each, whichever thread ran it;
// the fallback sends an op whose kernel warned to that route on later calls
// too (a plan the warning marked unusable, meta_results.h), and its Meta
// runs, which only plan, raise none. A queued kernel that warns without
// having warned at its first call still warns on the worker (stderr).
class CollectedWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    warnings_.push_back(warning);
  }
  // Raises the collected warnings on the calling thread's handler; returns
  // whether there were any.
  bool raise_here() {
    for (const c10::Warning& warning : warnings_) {
      c10::warn(warning);
    }
    return !warnings_.empty();
  }
  bool any() const {
    return !warnings_.empty();
  }
  const std::vector<c10::Warning>& collected() const {
    return warnings_;
  }

 private:
  std::vector<c10::Warning> warnings_;
};

// Runs `body` as the next work of the current stream of `device` and
// returns once it has run: right here when the stream is idle, else on the
// stream's worker after the work queued before it while the caller waits (a
// synchronization the caller needs, e.g. to read a value on the host). An
// exception `body` throws reaches the caller as thrown. `what` names the
// operation for sync-debug mode, which reports it whether or not the stream
// is busy (Note [Sync debug] in src/diagnostics/sync_debug.rs); an empty `what` marks a
// wait of the runtime's own that CUDA would not make (a plan's first check,
// Note [Meta results]), which is not reported and orders nothing for the
// stream sanitizer, while a wait the user asked for orders the host after
// the stream's work. `accesses()` returns the KernelInfo (see run_inline).
// Returns whether `body` warned (Note [Kernel warnings]).
template <typename Body, typename Accesses>
bool run_in_stream_order(
    c10::DeviceIndex device,
    rust::Str what,
    Body&& body,
    const char* name,
    Accesses&& accesses) {
  if (!what.empty()) {
    checked([&] { ffi::check_host_sync(what); });
  }
  struct HostWaited {
    c10::DeviceIndex device;
    bool user_wait;
    void done() const {
      if (user_wait && sanitizer_on()) {
        checked([&] { ffi::sanitizer_host_waited(device); });
      }
    }
  } host_waited{device, !what.empty()};
  CollectedWarnings warnings;
  const auto body_collecting_warnings = [&body, &warnings] {
    c10::WarningUtils::WarningHandlerGuard collect(&warnings);
    body();
  };
  if (run_inline(device, 0, body_collecting_warnings, name, accesses)) {
    const bool warned = warnings.raise_here();
    if (host_waited.user_wait) {
      // A queued wait reports an earlier kernel's failure; so does this one
      // (Note [Sticky kernel failures] in src/runtime/stream.rs).
      checked([&] { ffi::report_stream_failure(device); });
    }
    host_waited.done();
    return warned;
  }
  std::exception_ptr failure;
  queue_kernel(
      device,
      [&body_collecting_warnings, &failure] {
        try {
          body_collecting_warnings();
        } catch (...) {
          failure = std::current_exception();
        }
      },
      ffi::LaunchMode::Wait,
      sanitizer_on() ? KernelInfo(accesses()) : KernelInfo(name));
  const bool warned = warnings.raise_here();
  if (failure) {
    std::rethrow_exception(failure);
  }
  host_waited.done();
  return warned;
}

} // namespace openreg
