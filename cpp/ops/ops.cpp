// The aten kernels openreg implements itself: tensor creation and views,
// storage (re)binding, copies, scalar reads, fills. Everything else goes
// through the boxed fallback (fallback.cpp). Registered by register_ops()
// at load, not by a static registrar.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/kernel_split.h"
#include "torch_openreg/cpp/ops/meta_kernels.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {

void register_fallback(torch::Library& library);
void register_sparse_fallback(torch::Library& fallback, torch::Library& sparse_aten);
void register_sparse_compressed_fallback(torch::Library& fallback, torch::Library& compressed_aten);
void register_sparse_kernels(torch::Library& compressed_aten);
void register_nested_fallback(torch::Library& fallback, torch::Library& nested_aten);
void register_quantized_fallback(torch::Library& fallback, torch::Library& quantized_aten);
void register_fallback_kernels(KernelRegistrar& kernels);
void register_convolution(KernelRegistrar& kernels);
void register_batch_norm(KernelRegistrar& kernels);
void register_max_pool(KernelRegistrar& kernels);
void register_elementwise(KernelRegistrar& kernels);
void register_random(KernelRegistrar& kernels);
void register_attention(KernelRegistrar& kernels);
void register_flash_efficient_attention(KernelRegistrar& kernels);
void register_accelerator_ops(KernelRegistrar& kernels);
void register_half_precision_fft(KernelRegistrar& kernels);
void register_nansum(KernelRegistrar& kernels);
void register_scatter_reduce(KernelRegistrar& kernels);
void register_scaled_mm(KernelRegistrar& kernels);
void register_device_named_ops(KernelRegistrar& kernels);
void register_deterministic_alerts(KernelRegistrar& kernels);

namespace {

constexpr c10::DispatchKeySet kOpenRegKeys(c10::DispatchKey::PrivateUse1);

c10::Device checked_device(std::optional<c10::Device> device_opt) {
  c10::Device device = c10::device_or_default(device_opt);
  TORCH_CHECK(device.is_privateuseone(), "expected an openreg device, got ", device);
  if (!device.has_index()) {
    device = c10::Device(device.type(), ffi::current_device());
  }
  checked([&] { ffi::check_device(device.index()); });
  return device;
}

void check_factory_args(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "openreg supports strided tensors only, got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "only CPU memory can be pinned");
}

// Note [Uninitialized memory in deterministic mode]: with
// torch.use_deterministic_algorithms(True) and
// torch.utils.deterministic.fill_uninitialized_memory (its default), CUDA's
// empty, empty_strided and resize_ (empty_cuda and empty_strided_cuda,
// aten/src/ATen/native/cuda/TensorFactories.cu; resize_cuda_,
// aten/src/ATen/native/cuda/Resize.cpp) fill the memory they hand
// out uninitialized with NaN (floating and complex dtypes) or the dtype's
// largest value (integers, True), so that reading it is reproducible; so do
// openreg's, with fills queued as stream work. Results the kernels allocate
// for themselves (empty_on_current_device, the fallback's planned results)
// are written in full and not filled, as CUDA's at::detail::empty_cuda.
bool fills_uninitialized_memory() {
  const at::Context& context = at::globalContext();
  return C10_UNLIKELY(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory());
}

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device_opt,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  check_factory_args(layout, pin_memory);
  c10::DeviceGuard guard(checked_device(device_opt));
  at::Tensor result = empty_on_current_device(size, c10::dtype_or_default(dtype), memory_format);
  if (fills_uninitialized_memory()) {
    at::native::fill_empty_deterministic_(result);
  }
  return result;
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device_opt,
    std::optional<bool> pin_memory) {
  check_factory_args(layout, pin_memory);
  c10::DeviceGuard guard(checked_device(device_opt));
  at::Tensor result = at::detail::empty_strided_generic(
      size, stride, device_memory_allocator(), kOpenRegKeys, c10::dtype_or_default(dtype));
  if (fills_uninitialized_memory()) {
    at::native::fill_empty_deterministic_(result);
  }
  return result;
}

// Views only rewrite metadata: no device memory is touched.
at::Tensor as_strided(
    const at::Tensor& self,
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Growing the storage copies the old bytes in stream order (Note [One
// door]); the metadata change itself is host-side.
const at::Tensor& resize_(
    const at::Tensor& self,
    c10::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(
      std::all_of(size.begin(), size.end(), [](int64_t s) { return s >= 0; }),
      "Trying to create tensor with negative dimension: ", size);
  const int64_t old_storage_nbytes = self.has_storage() ? static_cast<int64_t>(self.storage().nbytes()) : 0;
  if (self.has_storage()) {
    grow_device_storage(
        self.storage(), at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), self.storage_offset()));
  }
  at::native::resize_(self, size, memory_format);
  if (fills_uninitialized_memory()) {
    at::native::fill_resize_deterministic_(self, old_storage_nbytes); // the grown part only
  }
  return self;
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_source_storage_offset(
    at::Tensor& self,
    c10::Storage source,
    int64_t storage_offset,
    c10::IntArrayRef size,
    c10::IntArrayRef stride) {
  TORCH_CHECK(
      source.device().is_privateuseone(), "set_: expected openreg storage, got storage on ", source.device());
  // A geometry beyond the storage grows it, copying the old bytes in
  // stream order (Note [One door]).
  // (A negative offset or size is reported by set_storage_cpu_ below.)
  if (storage_offset >= 0 && size.size() == stride.size() &&
      std::all_of(size.begin(), size.end(), [](int64_t s) { return s >= 0; })) {
    grow_device_storage(source, at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), storage_offset));
  }
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

// .item(): reads the value in stream order, the host waiting for it.
at::Scalar local_scalar_dense(const at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  at::Scalar value;
  run_in_stream_order(
      self.device().index(), "Tensor.item() (_local_scalar_dense)",
      [&] { value = at::native::_local_scalar_dense_cpu(cpu_view(self)); }, "aten::_local_scalar_dense",
      [&] { return KernelInfo("aten::_local_scalar_dense", {self}, {}); });
  return value;
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  c10::DeviceGuard guard(self.device());
  const c10::DeviceIndex device = self.device().index();
  const auto accesses = [&] { return KernelInfo("aten::fill_", {}, {self}); };
  const auto fill = [split = PointwiseSplit(self.sizes()), value](const at::Tensor& view) {
    run_chunks(split.chunks(), [&](size_t i) { split.part(view, i).fill_(value); });
  };
  if (!run_inline(device, self.numel(), [&] { fill(cpu_view(self)); }, "aten::fill_", accesses)) {
    queue_kernel(device, [fill, self = kernel_operand(self)] { fill(self); }, ffi::LaunchMode::Queue, accesses());
  }
  return self;
}

at::Tensor& zero(at::Tensor& self) {
  return fill_scalar(self, 0);
}

// Note [Copies]: a copy runs on the current stream of the openreg device
// involved (the source's, for openreg→openreg across devices, after the
// destination device's current stream has reached this point; the
// destination's current stream then waits for it). A device-to-device copy
// is always asynchronous; a copy to or from the host is asynchronous when
// non_blocking and the host side is pinned, otherwise the call waits for
// it, as CUDA does.
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src.defined() && dst.defined(), "copy_: undefined tensor");
  const bool src_on_device = src.is_privateuseone();
  const bool dst_on_device = dst.is_privateuseone();
  const c10::DeviceIndex device = src_on_device ? src.device().index() : dst.device().index();
  const bool cross_device = src_on_device && dst_on_device && src.device() != dst.device();
  const at::Tensor& host = src_on_device ? dst : src;
  const bool asynchronous = (src_on_device && dst_on_device) ||
      (non_blocking && ffi::is_pinned(reinterpret_cast<uintptr_t>(host.data_ptr())));

  c10::DeviceGuard guard(c10::Device(c10::kPrivateUse1, device));
  if (!asynchronous) {
    checked([&] { ffi::check_host_sync("a blocking copy between openreg and host memory (Tensor.cpu(), .to(), copy_)"); });
  }
  // Under the sanitizer a non-blocking copy with pinned memory is done now
  // and its host memory guarded until the host synchronizes with it (Note
  // [Pinned memory guard] in src/diagnostics/pinned_guard.rs).
  const bool guard_pinned = asynchronous && !(src_on_device && dst_on_device) && sanitizer_on() &&
      !checked([&] { return ffi::is_current_stream_capturing(device); });
  if (cross_device) {
    checked([&] { ffi::stream_wait_stream(device, dst.device().index()); });
  }
  launch(
      device,
      // The operands keep the conjugate and negative bits (cpu_view): the CPU
      // copy_ resolves them (a lazily conjugated source is copied conjugated).
      // Chunks narrow the destination and, unless broadcast, the source.
      [split = PointwiseSplit(dst.sizes()), src = kernel_operand(src), dst = kernel_operand(dst)] {
        run_chunks(split.chunks(), [&](size_t i) { split.part(dst, i).copy_(split.part(src, i)); });
      },
      asynchronous && !guard_pinned ? launch_mode_for(src.numel()) : ffi::LaunchMode::Wait,
      KernelInfo("aten::copy_", {src}, {dst}));
  if (cross_device) {
    checked([&] { ffi::stream_wait_stream(dst.device().index(), device); });
  }
  if (sanitizer_on() && !asynchronous) {
    checked([&] { ffi::sanitizer_host_waited(device); });
  }
  if (guard_pinned) {
    KernelInfo span("pinned");
    span.add(host, false);
    for (const ffi::KernelBuffer& b : span.buffers) {
      checked([&] { ffi::sanitizer_guard_pinned(device, b.address, b.bytes, src_on_device, b.tensor); });
    }
  }
  return dst;
}

// Tensor.record_stream(s): see recordDataPtrOnStream.
void record_stream(at::Tensor& self, c10::Stream stream) {
  c10::getDeviceAllocator(c10::kPrivateUse1)->recordStream(self.storage().data_ptr(), stream);
}

// Note [Shallow copies between CPU and openreg]: `param.data = t` (and so
// nn.Module.to, .half(), load_state_dict and the optimizers' view of a moved
// model) rebinds a tensor to another's storage in place only if PyTorch
// calls their types compatible; otherwise Module._apply makes a new
// Parameter per module, which unties shared weights, drops a lazy module's
// UninitializedParameter and leaves an optimizer built before the move with
// the old tensors. TensorImpl::has_compatible_shallow_copy_type counts CPU
// and CUDA (and a few others) dense tensors as compatible with each other,
// and leaves a PrivateUse1 backend to register this op: dense CPU and
// openreg tensors are compatible, in either direction, as CPU and CUDA are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense_cpu_or_openreg = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.is_privateuseone());
  };
  if (dense_cpu_or_openreg(self) && dense_cpu_or_openreg(from)) {
    return true;
  }
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  dst.resize_(src.sizes());
  return copy_from(src, dst, false);
}

} // namespace

void register_ops() {
  // Kept for the life of the process: destroying a Library deregisters it.
  static auto* aten = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  static auto* kernels = new KernelRegistrar(*aten);
  kernels->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  kernels->impl("empty_strided", TORCH_FN(empty_strided));
  kernels->impl("as_strided", TORCH_FN(as_strided));
  kernels->impl("view", TORCH_FN(view));
  kernels->impl("_reshape_alias", TORCH_FN(reshape_alias));
  kernels->impl("resize_", TORCH_FN(resize_));
  kernels->impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  kernels->impl("set_.source_Storage", TORCH_FN(set_source_storage));
  kernels->impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  kernels->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  kernels->impl("fill_.Scalar", TORCH_FN(fill_scalar));
  kernels->impl("zero_", TORCH_FN(zero));
  kernels->impl("_copy_from", TORCH_FN(copy_from));
  kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  kernels->impl("record_stream", TORCH_FN(record_stream));
  kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  register_convolution(*kernels);
  register_batch_norm(*kernels);
  register_max_pool(*kernels);
  register_elementwise(*kernels);
  register_random(*kernels);
  register_attention(*kernels);
  register_flash_efficient_attention(*kernels);
  register_accelerator_ops(*kernels);
  register_deterministic_alerts(*kernels); // first of the fronts (Note [Deterministic alerts])
  register_half_precision_fft(*kernels);
  register_nansum(*kernels);
  register_scatter_reduce(*kernels);
  register_scaled_mm(*kernels);
  register_device_named_ops(*kernels);
  // Last: it sends ops that have no openreg kernel by now to the fallback.
  register_fallback_kernels(*kernels);
  kernels->finish();
  index_cxx_meta_kernels();

  // The copy handles the conjugate and negative bits itself (cpu_view):
  // their fallbacks would materialize the source with another copy, which
  // comes back here, forever.
  for (auto key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    auto* bits = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    bits->impl("_copy_from", torch::CppFunction::makeFallthrough());
    bits->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }

  static auto* all = new torch::Library(
      torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  register_fallback(*all);
  register_nested_fallback(
      *new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__),
      *new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__));
  register_quantized_fallback(
      *new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::QuantizedPrivateUse1, __FILE__, __LINE__),
      *new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::QuantizedPrivateUse1, __FILE__, __LINE__));
  register_sparse_fallback(
      *new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__),
      *new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__));
  auto* compressed_aten =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
  register_sparse_kernels(*compressed_aten); // first: the fallback serves the ops left
  register_sparse_compressed_fallback(
      *new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__),
      *compressed_aten);
}

} // namespace openreg
