// A libtorch program meets CUDA's dtype support on openreg (Note [Dtype
// policy] in cpp/ops/dtype_policy.h): an integer mm is refused with CUDA's
// NotImplementedError at the call, integer histc and complex32 exp compute
// in a wider dtype and come back in their own.
// Exit status 0 iff every check passed.
#include <ATen/ATen.h>

#include "expect.h"

#include <cstdio>
#include <string>

namespace {

using openreg_test::failed;

const at::TensorOptions kDevice = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, 0));

void test_refused() {
  std::printf("[dtype policy] integer mm is refused\n");
  const at::Tensor a = at::arange(6, kDevice.dtype(at::kLong)).reshape({2, 3});
  std::string message;
  try {
    at::mm(a, a.t());
  } catch (const c10::NotImplementedError& e) {
    message = e.what_without_backtrace();
  }
  EXPECT(message == "\"mm_openreg\" not implemented for 'Long'");
  EXPECT(at::equal(at::mm(a.to(at::kFloat), a.t().to(at::kFloat)).cpu(),
                   at::mm(a.cpu().to(at::kFloat), a.cpu().t().to(at::kFloat))));
}

void test_widened() {
  std::printf("[dtype policy] integer histc and complex32 exp\n");
  const at::Tensor experts = at::tensor({0, 1, 1, 3, 3, 3}, at::kInt);
  const at::Tensor counts = at::histc(experts.to(kDevice.device()), 4, 0, 3);
  EXPECT(counts.scalar_type() == at::kInt);
  EXPECT(at::equal(counts.cpu(), at::tensor({1, 2, 0, 3}, at::kInt)));
  const at::Tensor x = at::full({4}, 0.5, at::kComplexFloat).to(at::kComplexHalf);
  const at::Tensor e = at::exp(x.to(kDevice.device()));
  EXPECT(e.scalar_type() == at::kComplexHalf);
  EXPECT(at::equal(e.cpu().to(at::kComplexFloat), at::exp(x.to(at::kComplexFloat)).to(at::kComplexHalf).to(at::kComplexFloat)));
}

} // namespace

int main() {
  try {
    test_refused();
    test_widened();
  } catch (const std::exception& e) {
    std::printf("  FAILED: unexpected exception: %s\n", e.what());
    ++failed;
  }
  std::printf("%s (%d failed checks)\n", failed == 0 ? "all dtype policy checks passed" : "FAILED", failed);
  return failed == 0 ? 0 : 1;
}
