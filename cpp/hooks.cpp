// openreg's at::PrivateUse1HooksInterface: how ATen asks about the device
// (availability, contexts, current device) without knowing the backend.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/src/ffi.rs.h"

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
};

} // namespace

at::PrivateUse1HooksInterface* new_hooks() {
  return new OpenRegHooks();
}

} // namespace openreg
