// openreg's at::PrivateUse1HooksInterface: how ATen asks about the device
// (availability, contexts, current device) without knowing the backend.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <cstring>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/random/generator.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

struct OpenRegHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  // Never throws and creates no context: it only reads the device count.
  bool isAvailable() const override {
    return ffi::device_count() > 0;
  }

  // Whether the device's context (its streams) has been created; never
  // creates it. An invalid index is an error naming index and count.
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return checked([&] { return ffi::has_primary_context(device_index); });
  }

  void init() const override {
    checked([] { ffi::init(); });
  }

  c10::DeviceIndex deviceCount() const override {
    return ffi::device_count();
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    checked([&] { ffi::set_device(device); });
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return ffi::current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return checked([&] { return ffi::exchange_device(device); });
  }

  // CUDA's variant avoids creating a context; ours never creates one on a
  // device switch, so it is the same exchange.
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return checked([&] { return ffi::exchange_device(device); });
  }

  // The device's default generator (-1: the current device); what
  // at::globalContext().defaultGenerator(Device(PrivateUse1, i)) returns.
  // An out-of-range index is an error naming it.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  // What torch.Generator(device="openreg:i") gets.
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_memory_allocator();
  }

  bool isPinnedPtr(const void* data) const override {
    return ffi::is_pinned(reinterpret_cast<uintptr_t>(data));
  }

  // The openreg device whose memory holds `data`; an error for any other pointer.
  at::Device getDeviceFromPtr(void* data) const override {
    c10::DeviceIndex device = ffi::device_of_pointer(reinterpret_cast<uintptr_t>(data));
    TORCH_CHECK(device >= 0, "getDeviceFromPtr: ", data, " is not openreg device memory");
    return at::Device(c10::DeviceType::PrivateUse1, device);
  }

  // Storage.resize_: new memory on the storage's device, old bytes copied in
  // stream order.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    TORCH_CHECK(
        static_cast<int64_t>(new_bytes) >= 0,
        "resize_: the new size of an openreg storage must be non-negative, got ", static_cast<int64_t>(new_bytes));
    resize_device_storage(storage, new_bytes);
  }
};

} // namespace

at::PrivateUse1HooksInterface* new_hooks() {
  return new OpenRegHooks();
}

} // namespace openreg
