// See device_memory.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/device/device_memory.h"

#include <array>
#include <cstring>
#include <memory>
#include <sstream>

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/cpp/device/memory_generation.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

// The OpenMP runtime PyTorch loaded (libtorch_cpu needs it), reached without
// linking one of our own: a second runtime would have separate settings.
extern "C" {
__attribute__((weak)) int omp_get_max_threads();
__attribute__((weak)) void omp_set_num_threads(int);
}

namespace openreg {

c10::Storage cpu_storage_alias(const c10::Storage& storage) {
  check_memory_generation(storage);
  return c10::Storage(
      c10::Storage::use_byte_size_t(),
      storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)),
      c10::GetCPUAllocator(),
      /*resizable=*/true);
}

at::Tensor cpu_view(const at::Tensor& t) {
  TORCH_CHECK(
      t.layout() == c10::kStrided, "openreg supports strided tensors only, got layout ", t.layout());
  return cpu_view_over(t, cpu_storage_alias(t.storage()));
}

at::Tensor cpu_view_over(const at::Tensor& t, c10::Storage cpu_storage) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(std::move(impl));
}

at::Tensor scratch_cpu_view(const at::Tensor& t, size_t slot) {
  thread_local std::array<c10::intrusive_ptr<c10::TensorImpl>, kScratchViews> views;
  c10::intrusive_ptr<c10::TensorImpl>& impl = views.at(slot);
  if (!impl || impl.use_count() != 1 || impl->storage().use_count() != 1) {
    at::Tensor fresh = cpu_view(t);
    impl = fresh.getIntrusivePtr();
    return fresh;
  }
  const c10::Storage& storage = t.storage();
  check_memory_generation(storage);
  c10::StorageImpl* alias = impl->storage().unsafeGetStorageImpl();
  alias->set_data_ptr_noswap(c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)));
  alias->set_nbytes(storage.nbytes());
  impl->set_storage_and_dtype(impl->storage(), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(impl);
}

at::Tensor kernel_operand(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  if (t.is_privateuseone()) {
    return cpu_view(t);
  }
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

at::Tensor empty_on_current_device(
    c10::IntArrayRef sizes,
    c10::ScalarType dtype,
    std::optional<c10::MemoryFormat> memory_format) {
  return at::detail::empty_generic(
      sizes, device_memory_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype, memory_format);
}

at::Tensor copy_to_device(const at::Tensor& host, c10::Device device, const char* name) {
  c10::DeviceGuard guard(device);
  at::Tensor copy = at::detail::empty_strided_generic(
      host.sizes(), host.strides(), device_memory_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      host.scalar_type());
  const auto accesses = [&] { return KernelInfo(name, {}, {copy}); };
  if (!run_inline(device.index(), host.numel(), [&] { cpu_view(copy).copy_(host); }, name, accesses)) {
    queue_kernel(
        device.index(),
        [dst = kernel_operand(copy), src = kernel_operand(host)] { dst.copy_(src); },
        ffi::LaunchMode::Queue,
        accesses());
  }
  return copy;
}

void resize_device_storage(const c10::Storage& storage, size_t new_bytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceGuard guard(storage.device());
  const size_t keep = std::min(new_bytes, storage.nbytes());
  // The old memory moves into the kernel that copies from it, so it is
  // released (for later work on this stream) only once the copy has run.
  auto old = std::make_shared<c10::DataPtr>(
      storage.unsafeGetStorageImpl()->set_data_ptr(storage.allocator()->allocate(new_bytes)));
  storage.unsafeGetStorageImpl()->set_nbytes(new_bytes);
  if (keep > 0) {
    KernelInfo info("resize storage");
    info.add_bytes(old->get(), keep, false);
    info.add_bytes(storage.data(), keep, true);
    launch(
        storage.device().index(),
        [old, dst = storage.mutable_data(), keep] { std::memcpy(dst, old->get(), keep); },
        launch_mode_for(static_cast<int64_t>(keep / sizeof(float))),
        std::move(info));
  }
}

void grow_device_storage(const c10::Storage& storage, size_t min_bytes) {
  if (min_bytes > storage.nbytes()) {
    resize_device_storage(storage, min_bytes);
  }
}

KernelThreads::KernelThreads() {
  constexpr int team = 1;
  if (omp_get_max_threads == nullptr || omp_set_num_threads == nullptr) {
    return;
  }
  // The first parallel call on a thread sets its team size from ATen's
  // setting: let that happen before the override, not after it.
  at::get_num_threads();
  saved_ = omp_get_max_threads();
  if (saved_ != team) {
    omp_set_num_threads(team);
  } else {
    saved_ = 0;
  }
}

KernelThreads::~KernelThreads() {
  if (saved_ > 0) {
    omp_set_num_threads(saved_);
  }
}

KernelInfo::KernelInfo(const char* name, std::initializer_list<at::Tensor> reads, std::initializer_list<at::Tensor> writes)
    : name(name) {
  for (const at::Tensor& t : reads) {
    add(t, false);
  }
  for (const at::Tensor& t : writes) {
    add(t, true);
  }
}

void KernelInfo::add(const at::Tensor& t, bool written) {
  if (t.defined() && t.is_nested()) { // its whole buffer (Note [Nested tensors] in fallback.cpp)
    add_bytes(t.storage().data(), t.storage().nbytes(), written);
    return;
  }
  if (!t.defined() || !t.has_storage() || t.numel() == 0) {
    return;
  }
  int64_t last = 0; // the offset of the last element, in elements
  for (int64_t d = 0; d < t.dim(); ++d) {
    last += (t.size(d) - 1) * std::abs(t.stride(d));
  }
  const auto address = reinterpret_cast<uintptr_t>(t.storage().data()) + t.storage_offset() * t.itemsize();
  const auto bytes = static_cast<size_t>(last + 1) * t.itemsize();
  for (const ffi::KernelBuffer& b : buffers) {
    if (b.address == address && b.bytes == bytes && b.written == written) {
      return; // an out= argument is also among the results
    }
  }
  buffers.push_back({address, bytes, written, reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl())});
}

void KernelInfo::add_bytes(const void* address, size_t bytes, bool written) {
  buffers.push_back({reinterpret_cast<uintptr_t>(address), bytes, written, 0});
}

void sanitize(c10::DeviceIndex device, const KernelInfo& info) {
  checked([&] { ffi::sanitize_launch(device, info.name, info.buffers.data(), info.buffers.size()); });
}

void queue_kernel(c10::DeviceIndex device, std::function<void()> body, ffi::LaunchMode mode, KernelInfo info) {
  if (sanitizer_on()) {
    sanitize(device, info);
  }
  auto kernel = std::make_unique<ffi::Kernel>();
  kernel->body = std::move(body);
  kernel->name = info.name;
  kernel->buffers = std::move(info.buffers);
  checked([&] { ffi::launch_kernel(device, std::move(kernel), mode); });
}

ffi::LaunchMode launch_mode_for(int64_t numel) {
  return numel <= kInlineKernelElements ? ffi::LaunchMode::InlineIfIdle : ffi::LaunchMode::Queue;
}

} // namespace openreg

namespace openreg::ffi {

void run_kernel(Kernel& kernel) {
  KernelScope scope;
  kernel.body();
}

::rust::String describe_tensor(size_t tensor) {
  const auto* impl = reinterpret_cast<const c10::TensorImpl*>(tensor);
  std::ostringstream text;
  text << c10::getDtypeNames(impl->dtype().toScalarType()).first << impl->sizes();
  return ::rust::String(text.str());
}

::rust::String describe_kernel(const Kernel& kernel) {
  std::ostringstream text;
  text << kernel.name;
  for (const KernelBuffer& b : kernel.buffers) {
    text << "\\n" << (b.written ? "writes " : "reads ") << "0x" << std::hex << b.address << std::dec << " ("
         << b.bytes << " bytes)";
  }
  return ::rust::String(text.str());
}

} // namespace openreg::ffi
