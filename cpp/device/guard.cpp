// openreg's c10::impl::DeviceGuardImplInterface: every method forwards to the
// Rust runtime through the bridge. Contracts are quoted from the interface.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <atomic>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/cpp/device/current_device.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

constexpr c10::DeviceType kOpenReg = c10::DeviceType::PrivateUse1;

void check_device_type(const c10::Device& device, const char* method) {
  TORCH_CHECK(
      device.type() == kOpenReg, method, ": expected an openreg device, but got ", device);
}

void check_stream_type(const c10::Stream& stream, const char* method) {
  TORCH_CHECK(
      stream.device_type() == kOpenReg, method, ": expected an openreg stream, but got ", stream);
}

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kOpenReg, index), id);
}

// A device's index, or the current device's for an index-less device.
c10::DeviceIndex index_of(const c10::Device& device) {
  return device.has_index() ? device.index() : ffi::current_device();
}

// The guard's hot path (Note [Current device slot] in current_device.h):
// exchanging and restoring the current device of a valid index is a check
// against the device count, known here once the first slow call has read it
// (it is fixed once options are read: Note [Invalid options]), and two
// accesses to the slot. Everything else (the first call, a wrong device
// type, an invalid index) takes the out-of-line slow path, so the fast path
// saves no registers and builds no stack frame.
std::atomic<uint8_t> known_device_count{0}; // 0 until read: every index is slow

// Whether `index` is below the known device count (negatives wrap around).
inline bool is_known_device(c10::DeviceIndex index) {
  return static_cast<uint8_t>(index) < known_device_count.load(std::memory_order_relaxed);
}

C10_NOINLINE void learn_device_count() {
  known_device_count.store(static_cast<uint8_t>(ffi::device_count()), std::memory_order_relaxed);
}

C10_NOINLINE c10::Device exchange_device_slow(c10::Device device) {
  check_device_type(device, "exchangeDevice");
  learn_device_count();
  const c10::DeviceIndex index = device.index();
  if (!is_known_device(index)) {
    checked([&] { ffi::exchange_device(index); }); // throws the reason
  }
  const c10::DeviceIndex previous = current_device_slot;
  current_device_slot = index;
  return c10::Device(kOpenReg, previous);
}

C10_NOINLINE void unchecked_set_device_slow(c10::DeviceIndex index) noexcept {
  learn_device_count();
  if (is_known_device(index)) {
    current_device_slot = index;
  } else {
    openreg_guard_unchecked_set_device(index); // warns once
  }
}

uintptr_t event_handle(const void* event) {
  return reinterpret_cast<uintptr_t>(event);
}

struct OpenRegGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kOpenReg;
  }

  // The current device is the C++ slot of Note [Current device slot]
  // (cpp/device/current_device.h); see also Note [Guard hot path] in
  // src/bridge/ffi.rs.
  c10::Device exchangeDevice(c10::Device device) const override {
    if (C10_UNLIKELY(device.type() != kOpenReg || !is_known_device(device.index()))) {
      return exchange_device_slow(device);
    }
    const c10::DeviceIndex previous = current_device_slot;
    current_device_slot = device.index();
    return c10::Device(kOpenReg, previous);
  }

  c10::Device getDevice() const override {
    return c10::Device(kOpenReg, current_device_slot);
  }

  void setDevice(c10::Device device) const override {
    check_device_type(device, "setDevice");
    checked([&] { ffi::set_device(device.index()); });
  }

  // REQUIRED to not raise: an invalid device is ignored with a one-time warning.
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (C10_LIKELY(is_known_device(device.index()))) {
      current_device_slot = device.index();
    } else {
      unchecked_set_device_slow(device.index());
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    check_device_type(device, "getStream");
    auto index = index_of(device);
    return make_stream(index, checked([&] { return ffi::current_stream(index); }));
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    check_device_type(device, "getDefaultStream");
    auto index = index_of(device);
    return make_stream(index, checked([&] { return ffi::default_stream(index); }));
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool isHighPriority) const override {
    check_device_type(device, "getStreamFromGlobalPool");
    auto index = index_of(device);
    int priority = isHighPriority ? -1 : 0;
    return make_stream(index, checked([&] { return ffi::pool_stream(index, priority); }));
  }

  // Streams come from the device's pools (round-robin, like CUDA); an
  // out-of-range priority is clamped to the supported range.
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    check_device_type(device, "getNewStream");
    auto index = index_of(device);
    return make_stream(index, checked([&] { return ffi::pool_stream(index, priority); }));
  }

  // Does not change the current device.
  c10::Stream exchangeStream(c10::Stream stream) const override {
    check_stream_type(stream, "exchangeStream");
    auto index = stream.device_index();
    return make_stream(index, checked([&] { return ffi::exchange_stream(index, stream.id()); }));
  }

  // A stable pointer to the runtime's stream (an orStream_t of openreg.h).
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    check_stream_type(stream, "getStreamNativeHandle");
    return reinterpret_cast<void*>(
        checked([&] { return ffi::stream_native_handle(stream.device_index(), stream.id()); }));
  }

  // REQUIRED to not raise: an invalid handle (destroyed twice, garbage) is
  // ignored with a warning (Note [Event handles] in src/runtime/event.rs).
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    ffi::destroy_event(event_handle(event));
  }

  // Creates the event on first record; PYTORCH_DEFAULT records no timing,
  // BACKEND_DEFAULT does. See Note [Event versions] in src/runtime/event.rs.
  void record(
      void** event,
      const c10::Stream& stream,
      const c10::DeviceIndex device_index,
      const c10::EventFlag flag) const override {
    check_stream_type(stream, "record");
    size_t handle = event_handle(*event);
    bool timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    try {
      checked([&] {
        ffi::record_event(handle, device_index, stream.device_index(), stream.id(), timing);
      });
    } catch (...) {
      *event = reinterpret_cast<void*>(handle); // keep a created event owned
      throw;
    }
    *event = reinterpret_cast<void*>(handle);
  }

  // The stream may belong to another device than the event, as with
  // cudaStreamWaitEvent; recording needs a stream of the event's device.
  void block(void* event, const c10::Stream& stream) const override {
    check_stream_type(stream, "block");
    checked([&] { ffi::block_event(event_handle(event), stream.device_index(), stream.id()); });
  }

  bool queryEvent(void* event) const override {
    return checked([&] { return ffi::query_event(event_handle(event)); });
  }

  // REQUIRED to not raise: 0 when the device count is misconfigured.
  c10::DeviceIndex deviceCount() const noexcept override {
    return ffi::device_count();
  }

  // Exactly the dtypes that work here: the runtime's set of ScalarType codes
  // (device::SUPPORTED_SCALAR_TYPES in src/runtime/device.rs), one bit field each.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    check_device_type(device, "getDeviceCapability");
    auto index = index_of(device);
    const uint64_t supported = checked([&] { return ffi::device_supported_scalar_types(index); });
    c10::DeviceCapability capability;
    auto& types = capability.capability_data.supported_scalar_types;
#define OPENREG_SET_SUPPORTED(_, name) \
  types.has_##name = (supported >> static_cast<int>(c10::ScalarType::name)) & 1;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(OPENREG_SET_SUPPORTED)
#undef OPENREG_SET_SUPPORTED
    return capability;
  }

  bool queryStream(const c10::Stream& stream) const override {
    check_stream_type(stream, "queryStream");
    return checked([&] { return ffi::query_stream(stream.device_index(), stream.id()); });
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    check_stream_type(stream, "synchronizeStream");
    checked([&] { ffi::synchronize_stream(stream.device_index(), stream.id()); });
  }

  // Whether the stream records into a graph capture (src/runtime/graph.rs).
  bool isStreamCapturing(const c10::Stream& stream) const override {
    check_stream_type(stream, "isStreamCapturing");
    return checked([&] { return ffi::is_stream_capturing(stream.device_index(), stream.id()); });
  }

  // Tells the caching allocator that `data_ptr` is used on `stream` too, so
  // its memory is not reused before that stream's queued work is done.
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    check_stream_type(stream, "recordDataPtrOnStream");
    c10::getDeviceAllocator(kOpenReg)->recordStream(data_ptr, stream);
  }

  void synchronizeEvent(void* event) const override {
    checked([&] { ffi::synchronize_event(event_handle(event)); });
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    checked([&] { ffi::synchronize_device(device_index); });
  }

  double elapsedTime(void* event1, void* event2, const c10::DeviceIndex device_index)
      const override {
    return checked([&] {
      return ffi::event_elapsed_ms(event_handle(event1), event_handle(event2), device_index);
    });
  }
};

} // namespace

c10::impl::DeviceGuardImplInterface* new_device_guard_impl() {
  return new OpenRegGuardImpl();
}

} // namespace openreg
