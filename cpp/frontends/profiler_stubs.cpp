// The profiler's PrivateUse1 stubs (torch::profiler::impl::ProfilerStubs):
// how the autograd profiler's "fallback" mode times openreg work.
//
// Note [Legacy profiler device timing]:
// torch.autograd.profiler.profile(use_device="openreg") without Kineto
// activities runs in ProfilerState::KINETO_PRIVATEUSE1_FALLBACK: on entry to
// and exit from every op, PyTorch calls record() of the registered
// PrivateUse1 stubs for a device event, and later elapsed() for the op's
// device time. Until a backend registers stubs, the default ones throw
// ("PrivateUse1 used in profiler but not enabled") from the middle of the
// op-entry callback, before it has set the op's start time or handed back
// its context: every op then reports a garbage (hugely negative) CPU time
// and its exit callback fails an internal assert. So these stubs must be
// registered at load and must never throw: a device event that cannot be
// recorded or timed means an op without device time, never a failed op.
//
// An event is a timing c10::Event (through our device guard, so its state
// is in Rust) recorded on the current stream of the current device, as
// CUDA's stubs record on the current CUDA stream. On a capturing stream no
// event is recorded: the profiler must not add nodes to the user's graph.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <exception>
#include <functional>
#include <memory>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "torch_openreg/cpp/backend.h"

namespace openreg {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

const c10::impl::DeviceGuardImplInterface& device_guard() {
  return *c10::impl::getDeviceGuardImpl(c10::kPrivateUse1);
}

// Warns (once per process) that `what` failed, without ever throwing: the
// callers run inside the profiler's op callbacks.
void warn_once_untimed(const char* what, const std::exception& error) noexcept {
  try {
    TORCH_WARN_ONCE("openreg profiler: could not ", what, " a device event, so some ops have no device time: ", error.what());
  } catch (...) {
    // A warning handler that throws (warnings as errors) must not escape.
  }
}

class OpenRegProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  // Any of the three outputs may be null (the op callbacks pass only
  // `event`). On failure `*event` stays empty: see the Note.
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    try {
      const c10::Device current = device_guard().getDevice();
      if (device != nullptr) {
        *device = current.index();
      }
      if (cpu_ns != nullptr) {
        *cpu_ns = c10::getTime();
      }
      if (event == nullptr) {
        return;
      }
      const c10::Stream stream = device_guard().getStream(current);
      if (device_guard().isStreamCapturing(stream)) {
        return;
      }
      auto timing_event = std::make_shared<c10::Event>(c10::kPrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
      timing_event->record(stream);
      *event = std::move(timing_event);
    } catch (const std::exception& error) {
      warn_once_untimed("record", error);
    }
  }

  // Microseconds from `start` to `end` (as CUDA's stubs), waiting for `end`
  // if its stream has not reached it yet; 0 when either was not recorded,
  // they are on different devices, or `end` was recorded on another stream
  // and ran first: a device time is never negative.
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) {
      return 0;
    }
    try {
      const auto& start_event = *static_cast<const c10::Event*>(start->get());
      const auto& end_event = *static_cast<const c10::Event*>(end->get());
      for (const c10::Event* e : {&start_event, &end_event}) {
        if (!e->query()) {
          e->synchronize();
        }
      }
      const double microseconds = start_event.elapsedTime(end_event) * 1000.0;
      return microseconds > 0 ? static_cast<float>(microseconds) : 0.0f;
    } catch (const std::exception& error) {
      warn_once_untimed("time", error);
      return 0;
    }
  }

  // openreg has no tracing-tool annotations (CUDA's are NVTX ranges).
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return true;
  }

  // `op(index)` with each device current in turn.
  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex count = device_guard().deviceCount();
    for (c10::DeviceIndex index = 0; index < count; ++index) {
      c10::DeviceGuard guard(c10::Device(c10::kPrivateUse1, index));
      op(index);
    }
  }

  void synchronize() const override {
    device_guard().synchronizeDevice(device_guard().getDevice().index());
  }
};

} // namespace

void register_profiler_stubs() {
  // Kept for the process: the profiler may call the stubs until exit.
  torch::profiler::impl::registerPrivateUse1Methods(new OpenRegProfilerStubs());
}

} // namespace openreg
