// Native kernels for the hottest elementwise ops (add, sub, mul, div). They
// skip the boxed fallback's argument rewriting and its extra output copy:
// the output is allocated on the device up front and the CPU kernel writes
// straight into it, as a kernel on the current stream (inline when short
// and the stream is idle: Note [Inline launches]). The CPU kernel is called
// directly (at::cpu::*_out), not re-dispatched: a 1K-element add costs
// about as much as the bookkeeping around it.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/graphs/graph_kernels.h"
#include "torch_openreg/cpp/ops/kernel_split.h"
#include "torch_openreg/cpp/ops/result_format.h"

namespace openreg {
namespace {

// The device of a binary op, with CUDA's rule: the other operand is on the
// same openreg device or is a CPU scalar (0-dim).
c10::Device binary_device(const at::Tensor& self, const at::Tensor& other, const char* op) {
  const at::Tensor& on_device = self.is_privateuseone() ? self : other;
  for (const at::Tensor* t : {&self, &other}) {
    bool ok = t->device() == on_device.device() || (t->is_cpu() && t->dim() == 0);
    TORCH_CHECK(
        ok, "Expected all tensors to be on the same device, but found at least two devices, ",
        on_device.device(), " and ", t->device(), "! (in ", op, ")");
  }
  return on_device.device();
}

// An operand of an inline kernel (Note [Scratch views]).
at::Tensor operand(const at::Tensor& t, size_t slot) {
  return t.is_privateuseone() ? scratch_cpu_view(t, slot) : t;
}

// Allocates the broadcast result (with TensorIterator's strides: Note
// [Memory format of results] in result_format.h) and queues `compute(out_view, a_view, b_view)`,
// in chunks when large (Note [Split kernels] in kernel_split.h; a raw loop
// for `kind` instead when a graph captures it: Note [Graph kernels] in
// graph_kernels.h).
template <typename Compute>
at::Tensor binary(
    const at::Tensor& self,
    const at::Tensor& other,
    c10::ScalarType dtype,
    const char* op,
    std::optional<BinaryOp> kind,
    const c10::Scalar& alpha,
    Compute compute) {
  c10::Device device = binary_device(self, other, op);
  c10::DeviceGuard guard(device);
  at::Tensor out = empty_pointwise_result(at::infer_size_dimvector(self.sizes(), other.sizes()), dtype, {self, other});
  const auto accesses = [&] { return KernelInfo(op, {self, other}, {out}); };
  const PointwiseSplit split(out.sizes());
  const auto compute_split = [split, compute](const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    run_chunks(split.chunks(), [&](size_t i) {
      at::Tensor out_part = split.part(out, i);
      compute(out_part, split.part(a, i), split.part(b, i));
    });
  };
  if (!run_inline(
          device.index(), out.numel(),
          [&] { compute_split(scratch_cpu_view(out, 0), operand(self, 1), operand(other, 2)); },
          op, accesses)) {
    const bool capturing = kind && checked([&] { return ffi::is_current_stream_capturing(device.index()); });
    if (std::function<void()> raw = capturing ? raw_binary_kernel(*kind, out, self, other, alpha) : nullptr) {
      queue_kernel(device.index(), std::move(raw), ffi::LaunchMode::Queue, accesses());
      return out;
    }
    queue_kernel(
        device.index(),
        [compute_split, out = kernel_operand(out), a = kernel_operand(self), b = kernel_operand(other)] {
          compute_split(out, a, b);
        },
        ffi::LaunchMode::Queue,
        accesses());
  }
  return out;
}

// at::result_type, without its cost in the common case of equal dtypes.
c10::ScalarType common_dtype(const at::Tensor& self, const at::Tensor& other) {
  return self.scalar_type() == other.scalar_type() ? self.scalar_type() : at::result_type(self, other);
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary(self, other, common_dtype(self, other), "aten::add", BinaryOp::Add, alpha, [alpha](at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    at::cpu::add_out(out, a, b, alpha);
  });
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return binary(self, other, common_dtype(self, other), "aten::sub", BinaryOp::Sub, alpha, [alpha](at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    at::cpu::sub_out(out, a, b, alpha);
  });
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  return binary(self, other, common_dtype(self, other), "aten::mul", BinaryOp::Mul, 1, [](at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    at::cpu::mul_out(out, a, b);
  });
}

// True division: integral inputs give the default floating dtype.
at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  c10::ScalarType dtype = common_dtype(self, other);
  if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
    dtype = c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  return binary(self, other, dtype, "aten::div", std::nullopt, 1, [](at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    at::cpu::div_out(out, a, b);
  });
}

} // namespace

void register_elementwise(KernelRegistrar& kernels) {
  kernels.impl("add.Tensor", TORCH_FN(add));
  kernels.impl("sub.Tensor", TORCH_FN(sub));
  kernels.impl("mul.Tensor", TORCH_FN(mul));
  kernels.impl("div.Tensor", TORCH_FN(div));
}

} // namespace openreg
