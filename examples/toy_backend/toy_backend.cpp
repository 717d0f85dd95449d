// toy: the smallest PrivateUse1 backend, broken on purpose in four places.
//
// Device memory is host memory from malloc; every op runs on the CPU through
// ATen's boxed CPU fallback; there is one stream per device, the default
// stream, and all work is synchronous, so events are complete as soon as
// they are recorded. Four contracts are broken on purpose, each marked
// "Broken on purpose: <contract>", so that the conformance kit can be seen
// to catch them (see README.md). Everything else it offers is meant to be
// correct; what it does not offer (generators, pinned memory, memory stats,
// autocast, compile, graphs, profiler, IPC, distributed) it does not claim.

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_native_batch_norm_legit.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace toy {
namespace {

constexpr c10::DeviceType kToy = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kDeviceCount = 2;
constexpr size_t kCapacityBytes = size_t{1} << 30; // per device

thread_local c10::DeviceIndex current_device = 0;

// ---------------------------------------------------------------------------
// Memory: malloc'd host memory, at most kCapacityBytes live per device.

// Bytes live per device, indexed by the index's low byte (any DeviceIndex
// has a slot, since nothing refuses a bad index: see ToyGuardImpl::setDevice).
std::array<std::atomic<size_t>, 256> live_bytes{};

std::atomic<size_t>& live_bytes_of(c10::DeviceIndex device) {
  return live_bytes[static_cast<uint8_t>(device)];
}

struct Allocation {
  void* data;
  size_t bytes;
  c10::DeviceIndex device;
};

void release(void* context) {
  auto* allocation = static_cast<Allocation*>(context);
  std::free(allocation->data);
  live_bytes_of(allocation->device) -= allocation->bytes;
  delete allocation;
}

// A plain c10::Allocator, not a c10::DeviceAllocator: no caching, no memory
// statistics (torch.accelerator.memory_* are not offered).
struct ToyAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex device = current_device;
    std::atomic<size_t>& live = live_bytes_of(device);
    size_t before = live.load();
    do {
      // Broken on purpose: memory.out_of_memory. Running out raises a plain
      // c10::Error (Python RuntimeError); the contract is c10::OutOfMemoryError
      // (torch.OutOfMemoryError), i.e. TORCH_CHECK_WITH(OutOfMemoryError, ...).
      TORCH_CHECK(bytes <= kCapacityBytes - before, "toy: out of memory: ", bytes, " bytes requested on toy:",
                  static_cast<int>(device), ", ", kCapacityBytes - before, " bytes free");
    } while (!live.compare_exchange_weak(before, before + bytes));
    void* data = bytes == 0 ? nullptr : std::malloc(bytes);
    if (bytes != 0 && data == nullptr) {
      live -= bytes;
      // Broken on purpose: memory.out_of_memory (as above).
      TORCH_CHECK(false, "toy: out of memory: malloc(", bytes, ") failed");
    }
    return {data, new Allocation{data, bytes, device}, &release, c10::Device(kToy, device)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

ToyAllocator allocator;

// ---------------------------------------------------------------------------
// Device guard: the current device is a thread-local; every stream is the
// default stream (id 0) of its device; work is synchronous.

// Streams check their device's index (unlike setDevice): the one break of
// device indices stays within device.bad_index_raises.
c10::Stream default_stream(c10::Device device) {
  const c10::DeviceIndex index = device.index() == -1 ? current_device : device.index();
  TORCH_CHECK(index >= 0 && index < kDeviceCount, "toy has no device ", static_cast<int>(index), " (it has ",
              static_cast<int>(kDeviceCount), ")");
  return c10::Stream(c10::Stream::DEFAULT, c10::Device(kToy, index));
}

struct ToyGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kToy;
  }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }

  c10::Device getDevice() const override {
    return c10::Device(kToy, current_device);
  }

  void setDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kToy);
    // Broken on purpose: device.bad_index_raises. No check that the index is
    // below kDeviceCount: toy:2 becomes current, and the allocator serves it.
    if (device.index() != -1) {
      current_device = device.index();
    }
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() != -1) {
      current_device = device.index();
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    return default_stream(device);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(device);
  }

  // A pool of one: the default stream, as every stream is.
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*isHighPriority*/) const override {
    return default_stream(device);
  }

  // "A new stream" is the default stream: streams never run concurrently.
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return default_stream(device);
  }

  // The current stream is always the default one, so that is the previous one.
  c10::Stream exchangeStream(c10::Stream stream) const override {
    TORCH_CHECK(stream.id() == c10::Stream::DEFAULT, "toy has only the default stream; got stream id ", stream.id());
    return default_stream(stream.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return kDeviceCount;
  }

  // Events need no state: work is done when record() is called, so a recorded
  // event is complete and waiting for it is a no-op. The event pointer stays null.
  void record(void** /*event*/, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "an event of toy:",
                static_cast<int>(device_index), " cannot be recorded on a stream of toy:",
                static_cast<int>(stream.device_index()));
  }

  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}

  bool queryEvent(void* /*event*/) const override {
    return true;
  }

  void synchronizeEvent(void* /*event*/) const override {}

  double elapsedTime(void* /*event1*/, void* /*event2*/, const c10::DeviceIndex /*device_index*/) const override {
    // Broken on purpose: streams.timing_events. A crash, where the contract is
    // the milliseconds between two timing events (or a clear error).
    std::abort();
  }

  bool queryStream(const c10::Stream& /*stream*/) const override {
    // Broken on purpose: streams.query_honest. Never returns, where the
    // contract is true once the stream's work is done (always, here).
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  void synchronizeStream(const c10::Stream& /*stream*/) const override {}

  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
};

const ToyGuardImpl guard_impl;

// ---------------------------------------------------------------------------
// Hooks: what torch asks of an accelerator in general. No generator (random
// ops on toy tensors draw from the CPU generator, through the fallback), no
// pinned memory.

struct ToyHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return kDeviceCount;
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    guard_impl.setDevice(c10::Device(kToy, device));
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return guard_impl.exchangeDevice(c10::Device(kToy, device)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
};

// ---------------------------------------------------------------------------
// Kernels: allocation and copies; views, which share the toy storage (the
// CPU kernels for these touch metadata only); everything else falls back to CPU.

void check_factory(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "toy tensors are strided");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "toy has no pinned memory");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_factory(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device)); // the allocator serves the current device
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_factory(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// The same bytes as a CPU tensor (toy memory is host memory), with the
// conjugate and negative bits, which copy_ resolves.
at::Tensor as_cpu(const at::Tensor& tensor) {
  if (tensor.is_cpu()) {
    return tensor;
  }
  TORCH_CHECK(tensor.device().type() == kToy, "toy copies between toy and CPU tensors only; got ", tensor.device());
  at::Tensor alias = at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                                   tensor.options().device(at::kCPU));
  alias._set_conj(tensor.is_conj());
  alias._set_neg(tensor.is_neg());
  return alias;
}

// cpu -> toy, toy -> cpu, toy:i -> toy:j; complete on return (non_blocking
// changes nothing: there is nothing to overlap with).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

// Resizing may allocate: under the tensor's device, which the allocator serves.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage_(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                         c10::IntArrayRef stride) {
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// native_batch_norm updates its running statistics in place, but its schema
// does not mark them mutable, so the CPU fallback would update CPU copies
// and drop them; _native_batch_norm_legit marks them, and the fallback copies
// them back.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  const bool has_mean = running_mean.has_value() && running_mean->defined();
  const bool has_var = running_var.has_value() && running_var->defined();
  if (!has_mean && !has_var) {
    return at::_native_batch_norm_legit(input, weight, bias, training, momentum, eps);
  }
  TORCH_CHECK(has_mean && has_var, "toy: batch norm takes both running statistics or neither");
  at::Tensor mean = *running_mean;
  at::Tensor var = *running_var;
  return at::_native_batch_norm_legit(input, weight, bias, mean, var, training, momentum, eps);
}

// Work is synchronous and memory is freed only when its last tensor goes, so
// no stream can still be using it: nothing to record.
void record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {}

// Module.to, `param.data = t` and load_state_dict rebind a Parameter to the
// moved tensor in place only if torch calls the two tensor types
// shallow-copy compatible, which TensorImpl says of dense CPU and CUDA (and
// other named) tensors but leaves to a PrivateUse1 backend to say of its own;
// otherwise Module.to makes new Parameters, untying tied weights and leaving
// an optimizer built before the move with the old ones.
bool dense_cpu_or_toy(const at::Tensor& tensor) {
  const c10::DispatchKeySet keys = tensor.key_set();
  return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) &&
      (keys.has_backend(c10::BackendComponent::CPUBit) || keys.has_backend(c10::BackendComponent::PrivateUse1Bit));
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return (dense_cpu_or_toy(self) && dense_cpu_or_toy(from)) ||
      self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // A view op without a kernel here raises instead of silently returning a
  // copy (Note [CPU Fallback Does Not Handle View Operators] in ATen).
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

int64_t device_count() {
  return kDeviceCount;
}

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new ToyHooks()); // leaked: torch keeps it to the end
  return true;
}();

} // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, ToyGuardImpl);

REGISTER_ALLOCATOR(kToy, &allocator);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  // The view and storage-metadata ops that have no composite kernel: the
  // CPU ones serve toy, which keeps its data where the CPU can read it.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", set_storage_);
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
  // Ops the fallback cannot serve as they are.
  m.impl("native_batch_norm", native_batch_norm);
  m.impl("record_stream", record_stream);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  // Composite ops that pick a kernel by device type, and for any device but
  // CPU or CUDA pick convolution_overrideable, which raises: the fallback runs them whole on CPU.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// NB: copy_from resolves the conjugate and negative bits itself (as_cpu).
// Left to the Conjugate and Negative fallbacks, a conjugate source would be
// cloned first, and the clone copies it through _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// For toy.py, which needs the device count for torch.toy.device_count()
// (torch.accelerator.device_count() asks the device module).
TORCH_LIBRARY(toy, m) {
  m.def("device_count() -> int", &device_count);
}

} // namespace toy
