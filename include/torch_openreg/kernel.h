// torch_openreg/kernel.h — writing your own openreg kernels in C++.
//
// Header-only, over the plain C ABI of <openreg.h>: an extension needs to
// link only libtorch_openreg.so (plus the PyTorch libraries it uses anyway).
//
//   #include <torch_openreg/kernel.h>
//
//   at::Tensor& scale_(at::Tensor& self, double factor) {
//     TORCH_CHECK(self.is_privateuseone(), "scale_: expected an openreg tensor");
//     float* data = self.data_ptr<float>();            // read metadata here,
//     int64_t n = self.numel();                        // on the calling thread
//     torch_openreg::launch(
//         torch_openreg::current_stream(self.device().index()),
//         [self, data, n, factor] {                    // `self` keeps the memory alive
//           for (int64_t i = 0; i < n; ++i) data[i] *= factor;
//         });
//     return self;                                     // returns at once
//   }
//
// The contract of launch(stream, kernel):
// - The kernel is moved to the heap and queued on `stream`; launch returns at
//   once. The kernel runs later, on the stream's worker thread, in stream
//   order: after everything queued on that stream before it (including event
//   waits, e.g. torch.Stream.wait_event), before everything queued after it.
//   Other streams run concurrently with it. OPENREG_LAUNCH_BLOCKING=1 makes
//   launch wait for it.
// - While it runs, device memory is host memory it may read and write through
//   data pointers (also under OPENREG_MEMORY_PROTECT=1, which opens device
//   memory for every kernel a stream runs).
// - Everything the kernel captures by value lives until it has run, and is
//   destroyed on the worker thread right after. Capture the tensors you touch
//   by value: their memory then cannot be freed, or reused by another
//   allocation, before the kernel is done. (Device memory is also
//   stream-ordered, as with CUDA: a freed block is reused only by later work
//   on the stream that allocated it, so a kernel on that stream may capture
//   bare data pointers; on any other stream, capture the tensor or call
//   Tensor.record_stream.) Read tensor metadata (data_ptr, sizes) before
//   launch, not inside the kernel: the host thread may change it.
// - The kernel must not queue openreg work or wait for streams (waiting for
//   its own stream deadlocks); host computation, PyTorch CPU ops included, is
//   fine. It should not throw: an exception cannot reach the launching thread
//   (the kernel runs after launch returned), so it is caught and printed to
//   stderr, and the stream carries on.
// - If the launch itself fails (a bad stream, the runtime shutting down), the
//   kernel is destroyed unrun and launch throws a c10::Error (a RuntimeError
//   in Python) carrying the runtime's message.
// - The stream sanitizer (OPENREG_SANITIZER, torch.openreg.sanitizer) checks
//   a kernel against stream order only if it says what memory it touches:
//   launch(stream, {a, b}, kernel) declares that it reads and writes the
//   tensors a and b; launch(stream, Accesses().reads(a).writes(b), kernel)
//   says which it only reads. In the sanitizer's "raise" mode such a launch
//   throws the report of the stream-ordering bug it makes (a kernel reading
//   a tensor another stream wrote, with no wait in between).
// - On a stream that is capturing a graph (torch.accelerator.Graph, or
//   orStreamBeginCapture), the kernel does not run at launch: it is recorded
//   and runs once per replay of the graph, on whatever the captured memory
//   holds then, so it must not consume what it captured. What it captured
//   lives until the graph is destroyed (reset, or the graph object goes).
// - At exit (Python): kernels queued when the script ends (normally, by
//   sys.exit or by an uncaught exception) run before the interpreter
//   finalizes, and their captures are destroyed then. A kernel that runs
//   once the interpreter is finalizing (queued later by a daemon thread or a
//   late atexit handler) still runs, but what it captured is leaked instead
//   of destroyed: a tensor's Python object can no longer be released then.
//   See orPrepareHostExit in <openreg.h>.
#pragma once

#include <cstdio>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

#include <initializer_list>
#include <vector>

#include <ATen/core/TensorBase.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include "../openreg.h"

namespace torch_openreg {

// Throws a c10::Error naming `call` and the runtime's message unless `code`
// is orSuccess.
inline void check(int code, const char* call) {
  if (code != orSuccess) {
    const char* detail = orGetLastErrorMessage();
    TORCH_CHECK(
        false, "openreg: ", call, " failed: ", detail && detail[0] ? detail : orGetErrorString(code));
  }
}

} // namespace torch_openreg

// OPENREG_CHECK(orStreamSynchronize(s)); — throws a c10::Error on failure.
#define OPENREG_CHECK(call) ::torch_openreg::check((call), #call)

namespace torch_openreg {

// This thread's current stream of `device` (-1: the current device).
inline orStream_t current_stream(c10::DeviceIndex device = -1) {
  orStream_t stream = nullptr;
  OPENREG_CHECK(orStreamGetCurrent(device, &stream));
  return stream;
}

// The c10::Stream (what torch.Stream wraps) for a runtime stream handle.
inline c10::Stream to_c10_stream(orStream_t stream) {
  int device = 0;
  int64_t id = 0;
  OPENREG_CHECK(orStreamGetId(stream, &device, &id));
  return c10::Stream(
      c10::Stream::UNSAFE,
      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
      static_cast<c10::StreamId>(id));
}

// This thread's current stream of `device` as a c10::Stream.
inline c10::Stream current_c10_stream(c10::DeviceIndex device = -1) {
  return to_c10_stream(current_stream(device));
}

// The runtime handle of an openreg c10::Stream.
inline orStream_t native_stream(const c10::Stream& stream) {
  TORCH_CHECK(
      stream.device_type() == c10::DeviceType::PrivateUse1,
      "torch_openreg: expected an openreg stream, got a stream of ",
      stream.device());
  return static_cast<orStream_t>(stream.native_handle());
}

namespace detail {

// Destroys a kernel that ran (and what it captured), or leaks it once the
// host is exiting: destroying a tensor whose Python object must be released
// would then take the GIL, and CPython ends a thread that does, aborting the
// process (see orPrepareHostExit in <openreg.h>).
template <typename Kernel>
void release(std::unique_ptr<Kernel> kernel) noexcept {
  if (!orKernelReleaseBegin()) {
    (void)kernel.release(); // leaked on purpose: the process is ending
    return;
  }
  kernel.reset();
  orKernelReleaseEnd();
}

// orLaunchHostFuncOwned's callback: runs the kernel (once, or once per
// graph replay). Nothing may unwind into the runtime.
template <typename Kernel>
void run(void* data) noexcept {
  try {
    (*static_cast<Kernel*>(data))();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_openreg: a kernel launched with torch_openreg::launch threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "torch_openreg: a kernel launched with torch_openreg::launch threw an unknown exception\n");
  }
}

// orLaunchHostFuncOwned's release: the kernel will not run again.
template <typename Kernel>
void release_kernel(void* data) noexcept {
  release(std::unique_ptr<Kernel>(static_cast<Kernel*>(data)));
}

} // namespace detail

// What a kernel reads and writes, for the stream sanitizer: each tensor's
// bytes in its storage (every element of a strided view).
class Accesses {
 public:
  Accesses() = default;
  // Each of `tensors` read and written: the declaration when a kernel says
  // no more.
  Accesses(std::initializer_list<at::TensorBase> tensors) {
    for (const at::TensorBase& t : tensors) {
      add(t, 1);
    }
  }
  Accesses& reads(const at::TensorBase& t) {
    return add(t, 0);
  }
  Accesses& writes(const at::TensorBase& t) {
    return add(t, 1);
  }
  const std::vector<orMemAccess>& list() const {
    return list_;
  }

 private:
  Accesses& add(const at::TensorBase& t, int written) {
    if (t.defined() && t.has_storage() && t.numel() > 0) {
      int64_t last = 0;
      for (int64_t d = 0; d < t.dim(); ++d) {
        last += (t.size(d) - 1) * (t.stride(d) < 0 ? -t.stride(d) : t.stride(d));
      }
      const char* start = static_cast<const char*>(t.storage().data()) + t.storage_offset() * t.itemsize();
      list_.push_back({start, static_cast<size_t>(last + 1) * t.itemsize(), written});
    }
    return *this;
  }

  std::vector<orMemAccess> list_;
};

// Queues `kernel` (a callable taking no arguments) on `stream`, declaring
// the memory it touches to the stream sanitizer; see the contract above.
template <typename F>
void launch(orStream_t stream, const Accesses& accesses, F&& kernel) {
  using Kernel = std::decay_t<F>;
  static_assert(std::is_invocable_v<Kernel&>, "torch_openreg::launch: the kernel must be callable with no arguments");
  // The runtime owns it from here: it releases it once it will not run
  // again, or before returning a failure.
  Kernel* owned = new Kernel(std::forward<F>(kernel));
  const std::vector<orMemAccess>& list = accesses.list();
  check(orLaunchKernel(stream, &detail::run<Kernel>, owned, &detail::release_kernel<Kernel>, nullptr, list.data(), list.size()),
        "orLaunchKernel");
}

// Queues `kernel` on `stream`, declaring nothing to the stream sanitizer.
template <typename F>
void launch(orStream_t stream, F&& kernel) {
  launch(stream, Accesses(), std::forward<F>(kernel));
}

template <typename F>
void launch(const c10::Stream& stream, F&& kernel) {
  launch(native_stream(stream), std::forward<F>(kernel));
}

// Queues `kernel` on the current stream of the current device.
template <typename F>
void launch(F&& kernel) {
  launch(current_stream(), std::forward<F>(kernel));
}

} // namespace torch_openreg
