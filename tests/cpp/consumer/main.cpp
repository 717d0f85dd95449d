// Uses openreg only through PyTorch's API, so it references no symbol of
// libtorch_openreg.so: it works only if the package links the library even
// under --as-needed (Note [Linking a library nobody references]).
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <iostream>

int main() {
  try {
    const c10::Device device("openreg:1"); // throws unless openreg registered
    const c10::impl::VirtualGuardImpl openreg(device.type());
    c10::DeviceGuard guard(device);
    const c10::Stream stream = openreg.getStreamFromGlobalPool(device);
    stream.synchronize();
    if (openreg.getDevice() != device || !stream.query()) {
      std::cerr << "consumer: unexpected device or stream state\n";
      return 1;
    }
    std::cout << "consumer: ran on " << device << ", " << stream << "\n";
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "consumer: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
