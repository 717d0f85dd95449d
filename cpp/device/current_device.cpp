// See Note [Current device slot] in current_device.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/device/current_device.h"

namespace openreg {

__thread int8_t current_device_slot __attribute__((tls_model("initial-exec"))) = 0;

} // namespace openreg

int8_t openreg_current_device_get() noexcept {
  return openreg::current_device_slot;
}

void openreg_current_device_set(int8_t index) noexcept {
  openreg::current_device_slot = index;
}
