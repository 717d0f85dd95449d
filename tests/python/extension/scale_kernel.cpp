// A user's custom openreg kernel, built by tests/python/test_cpp_extension.py
// with torch.utils.cpp_extension.load against <torch_openreg/kernel.h>.
// Registered as torch.ops.openreg_ext.* (no Python module: torch/library.h
// compiles much faster than torch/extension.h).
#include <atomic>
#include <stdexcept>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <torch_openreg/kernel.h>

namespace {

// Kernels destroyed so far (their captures included).
std::atomic<int64_t> kernels_destroyed{0};

struct CountsDestruction {
  ~CountsDestruction() { ++kernels_destroyed; }
};

// self[i] *= factor, queued on the current stream of self's device; returns
// at once.
at::Tensor& scale_(at::Tensor& self, double factor) {
  TORCH_CHECK(
      self.is_privateuseone(), "openreg_ext::scale_: expected an openreg tensor, got a tensor on ", self.device());
  TORCH_CHECK(
      self.scalar_type() == at::kFloat, "openreg_ext::scale_: expected a float32 tensor, got ", self.scalar_type());
  TORCH_CHECK(self.is_contiguous(), "openreg_ext::scale_: expected a contiguous tensor");
  float* data = self.data_ptr<float>();
  const int64_t n = self.numel();
  const float f = static_cast<float>(factor);
  torch_openreg::launch(
      torch_openreg::current_stream(self.device().index()),
      {self}, // read and written, for the stream sanitizer
      [self, data, n, f, counter = std::make_shared<CountsDestruction>()] {
        for (int64_t i = 0; i < n; ++i) {
          data[i] *= f;
        }
      });
  return self;
}

// [device, id] of the current stream of `device`, through the c10::Stream
// helpers.
std::vector<int64_t> current_stream(int64_t device) {
  c10::Stream stream = torch_openreg::current_c10_stream(static_cast<c10::DeviceIndex>(device));
  TORCH_CHECK(torch_openreg::native_stream(stream) == torch_openreg::current_stream(stream.device_index()));
  return {stream.device_index(), stream.id()};
}

// Queues a kernel that throws.
void throwing_kernel(int64_t device) {
  torch_openreg::launch(torch_openreg::current_stream(static_cast<c10::DeviceIndex>(device)), [] {
    throw std::runtime_error("a deliberate failure in throwing_kernel");
  });
}

// Launches on something that is not a stream: launch must throw and
// destroy the kernel unrun.
void launch_on_bad_stream() {
  alignas(64) static char not_a_stream[4096] = {};
  torch_openreg::launch(reinterpret_cast<orStream_t>(not_a_stream), [counter = std::make_shared<CountsDestruction>()] {
    throw std::logic_error("a kernel on a bad stream must never run");
  });
}

int64_t destroyed_kernels() {
  return kernels_destroyed.load();
}

} // namespace

TORCH_LIBRARY(openreg_ext, m) {
  m.def("scale_(Tensor(a!) self, float factor) -> Tensor(a!)");
  m.def("current_stream(int device=-1) -> int[]", &current_stream);
  m.def("throwing_kernel(int device=-1) -> ()", &throwing_kernel);
  m.def("launch_on_bad_stream() -> ()", &launch_on_bad_stream);
  m.def("destroyed_kernels() -> int", &destroyed_kernels);
}

// Every backend reaches the same kernel, which rejects non-openreg tensors
// with a clear message (instead of the dispatcher's "could not run").
TORCH_LIBRARY_IMPL(openreg_ext, CompositeExplicitAutograd, m) {
  m.impl("scale_", &scale_);
}
