// The stream sanitizer from a libtorch program: ops on openreg tensors, with
// streams and events through PyTorch's own APIs (c10::StreamGuard, the
// device guard's record/block), and the sanitizer through the C ABI.
//  - a matmul whose input another stream wrote, with no wait, fails in
//    "raise" mode with a report naming both ops and streams;
//  - the same program with an event wait, or after a device synchronize,
//    reports nothing;
//  - in "warn" mode the race is counted, not raised.
// Exit status 0 iff every check passed.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <openreg.h>

#include "expect.h"

#include <cstdio>
#include <string>

namespace {

using openreg_test::failed;

const c10::Device kDev0(c10::DeviceType::PrivateUse1, 0);

const c10::impl::DeviceGuardImplInterface& impl() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

uint64_t races() {
  uint64_t counts[5] = {};
  orSanitizerGetCounts(counts, 5);
  return counts[0];
}

// What raising `body` throws, or "" when it does not.
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

void test_raise() {
  std::printf("[sanitizer] raise\n");
  EXPECT(orSanitizerSetMode(1) == orSuccess && orSanitizerGetMode() == 1);
  const at::TensorOptions on_device = at::TensorOptions().device(kDev0);
  at::Tensor weight = at::randn({64, 64}, on_device);
  const c10::Stream side = impl().getStreamFromGlobalPool(kDev0);
  const c10::Stream main_stream = impl().getStream(kDev0);
  impl().synchronizeDevice(0);

  at::Tensor h;
  {
    c10::StreamGuard on_side(side);
    h = at::relu(at::mm(at::ones({8, 64}, on_device), weight));
  }
  const std::string error = error_of([&] { (void)at::mm(h, weight); });
  EXPECT(error.rfind("openreg sanitizer: race:", 0) == 0);
  EXPECT(error.find("aten::mm") != std::string::npos && error.find("aten::relu") != std::string::npos);
  EXPECT(error.find("likely fix") != std::string::npos);
  std::printf("  report: %.160s...\n", error.c_str());

  // The same consumer after an event recorded on the side stream and
  // waited on by the main stream: ordered.
  void* event = nullptr;
  impl().record(&event, side, 0, c10::EventFlag::PYTORCH_DEFAULT);
  impl().block(event, main_stream);
  EXPECT(error_of([&] { (void)at::mm(h, weight).sum().item<float>(); }).empty());
  impl().destroyEvent(event, 0);

  // Written again on the side stream, read after a device synchronize.
  {
    c10::StreamGuard on_side(side);
    h.mul_(2);
  }
  impl().synchronizeDevice(0);
  EXPECT(error_of([&] { (void)at::mm(h, weight); }).empty());
}

void test_warn() {
  std::printf("[sanitizer] warn\n");
  impl().synchronizeDevice(0);
  EXPECT(orSanitizerSetMode(2) == orSuccess);
  orSanitizerClear();
  const at::TensorOptions on_device = at::TensorOptions().device(kDev0);
  const c10::Stream side = impl().getStreamFromGlobalPool(kDev0);
  at::Tensor x = at::zeros({1024}, on_device);
  impl().synchronizeDevice(0);
  {
    c10::StreamGuard on_side(side);
    x.add_(1);
  }
  at::Tensor y = x * 2; // a race, counted
  EXPECT(at::equal(y.cpu(), at::full({1024}, 2.0f)));
  EXPECT(races() == 1);
  EXPECT(orSanitizerGetReportCount() == 1);
  const char* text = nullptr;
  EXPECT(orSanitizerGetReport(0, &text) == orSuccess && std::string(text).find("aten::mul") != std::string::npos);
  EXPECT(orSanitizerGetReport(1, &text) == orErrorInvalidValue);
  EXPECT(orSanitizerSetMode(7) == orErrorInvalidValue);
  EXPECT(orSanitizerSetMode(0) == orSuccess && orSanitizerGetMode() == 0);
  EXPECT(races() == 1); // kept when turned off
}

} // namespace

int main() {
  try {
    test_raise();
    test_warn();
  } catch (const std::exception& e) {
    std::printf("  FAILED: unexpected exception: %s\n", e.what());
    ++failed;
  }
  std::printf("%s (%d failed checks)\n", failed == 0 ? "all sanitizer checks passed" : "FAILED", failed);
  return failed == 0 ? 0 : 1;
}
