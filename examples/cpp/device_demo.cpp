// device_demo: a libtorch program that uses openreg devices through PyTorch's
// own C++ API only — no openreg header. Linking torch_openreg::torch_openreg
// is all it takes: loading libtorch_openreg.so registers the "openreg"
// backend (device name, device guard, hooks) before main runs.
//
// It switches devices, takes streams, records and waits on events,
// synchronizes, prints what it did, and exits non-zero if anything turned
// out other than PyTorch's contracts say.
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <iostream>
#include <string>

namespace {

int wrong = 0;

void expect(bool ok, const std::string& what) {
  std::cout << (ok ? "  ok     " : "  WRONG  ") << what << "\n";
  wrong += ok ? 0 : 1;
}

void run() {
  // What c10::DeviceGuard and friends call for PrivateUse1 devices.
  const c10::impl::VirtualGuardImpl openreg(c10::DeviceType::PrivateUse1);
  const std::string backend = c10::get_privateuse1_backend();
  std::cout << "PrivateUse1 backend \"" << backend << "\" with " << int(openreg.deviceCount())
            << " devices\n";
  expect(backend == "openreg", "the PrivateUse1 backend is named openreg");
  expect(openreg.deviceCount() >= 2, "there are at least two devices");

  const c10::Device dev0("openreg:0");
  const c10::Device dev1("openreg:1");

  std::cout << "\n1. Switching devices with c10::DeviceGuard\n";
  expect(openreg.getDevice() == dev0, "a thread starts on " + dev0.str());
  {
    c10::DeviceGuard guard(dev1);
    expect(openreg.getDevice() == dev1, "inside DeviceGuard(" + dev1.str() + ") the current device is " + dev1.str());
    expect(guard.original_device() == dev0, "the guard remembers " + dev0.str());
  }
  expect(openreg.getDevice() == dev0, "leaving the guard restores " + dev0.str());

  std::cout << "\n2. Streams of " << dev1 << "\n";
  const c10::Stream default1 = openreg.getDefaultStream(dev1);
  const c10::Stream pooled = openreg.getStreamFromGlobalPool(dev1, /*isHighPriority=*/false);
  const c10::Stream urgent = openreg.getNewStream(dev1, /*priority=*/-1);
  std::cout << "  default: " << default1 << "\n  pooled:  " << pooled << "\n  urgent:  " << urgent << "\n";
  expect(openreg.getStream(dev1) == default1, "the current stream of " + dev1.str() + " is its default stream");
  expect(pooled != default1 && urgent != pooled, "pool streams are distinct from each other and the default");
  {
    c10::StreamGuard guard(pooled);
    expect(openreg.getDevice() == dev1, "StreamGuard(pooled) makes " + dev1.str() + " current");
    expect(openreg.getStream(dev1) == pooled, "... and the pooled stream current on it");
  }
  expect(openreg.getDevice() == dev0 && openreg.getStream(dev1) == default1,
         "leaving the StreamGuard restores the device and the stream");

  std::cout << "\n3. Events\n";
  c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  start.record(pooled);
  end.record(pooled);
  end.block(urgent); // `urgent` waits for everything submitted to `pooled` so far
  std::cout << "  recorded start and end on the pooled stream; the urgent stream waits for end\n";
  expect(end.device() == dev1, "the events belong to " + dev1.str());
  urgent.synchronize();
  expect(end.query(), "once the urgent stream is done, end has completed");
  const double ms = start.elapsedTime(end);
  std::cout << "  start -> end: " << ms << " ms\n";
  expect(ms >= 0.0, "the elapsed time between them is not negative");

  std::cout << "\n4. Synchronizing\n";
  openreg.synchronizeDevice(dev1.index());
  expect(pooled.query() && urgent.query() && default1.query(),
         "after synchronizeDevice(1) every stream of " + dev1.str() + " is idle");
}

} // namespace

int main() {
  try {
    run();
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
  std::cout << "\n" << (wrong == 0 ? "everything as expected" : std::to_string(wrong) + " results were WRONG") << "\n";
  return wrong == 0 ? 0 : 1;
}
