// nansum of complex tensors on openreg, as CUDA computes it.
//
// Note [Complex nansum]
// ~~~~~~~~~~~~~~~~~~~~~
// CUDA's nansum kernel takes complex inputs (complex32, complex64,
// complex128): an element counts as NaN when either part is
// (at::_isnan of a c10::complex), and its whole value is left out of the sum
// (NanSumOps in aten/src/ATen/native/SharedReduceOps.h). The CPU kernel
// refuses complex inputs by device ("nansum on CPU does not support complex
// inputs", nansum_out in aten/src/ATen/native/ReduceOps.cpp), so the
// fallback cannot run it. For a
// complex input, openreg's nansum (and its out= form) sums
// where(isnan(self), 0, self) with the call's dim, keepdim and dtype, each
// step ordinary stream work; complex32 is summed in complex64 and rounded
// once (as CUDA accumulates it). Every other input goes to the fallback.
// nanmean is a composite over nansum and follows.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/native/Resize.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

// nansum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)
// and nansum.out(..., Tensor(a!) out).
void nansum_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(arguments));
  const at::Tensor& self = args[0].toTensor();
  if (!self.is_complex()) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const std::optional<std::vector<int64_t>> dim = args[1].toOptional<std::vector<int64_t>>();
  const bool keepdim = args[2].toBool();
  const std::optional<c10::ScalarType> dtype = args[3].toOptional<c10::ScalarType>();
  const bool half = self.scalar_type() == c10::ScalarType::ComplexHalf;
  const at::Tensor values = half ? self.to(c10::ScalarType::ComplexFloat) : self;
  const std::optional<c10::ScalarType> sum_dtype =
      half && dtype == c10::ScalarType::ComplexHalf ? std::optional(c10::ScalarType::ComplexFloat) : dtype;
  at::Tensor result = at::sum(
      at::where(at::isnan(values), c10::Scalar(0), values), at::OptionalIntArrayRef(dim), keepdim, sum_dtype);
  if (half && (!dtype || dtype == c10::ScalarType::ComplexHalf)) {
    result = result.to(c10::ScalarType::ComplexHalf);
  }
  if (arguments == 5) { // the out= form
    at::Tensor out = args[4].toTensor();
    at::native::resize_output(out, result.sizes());
    out.copy_(result);
    result = out;
  }
  torch::jit::drop(*stack, arguments);
  torch::jit::push(*stack, std::move(result));
}

} // namespace

void register_complex_nansum(KernelRegistrar& kernels) {
  for (const char* name : {"nansum", "nansum.out"}) {
    kernels.fallback(name, &nansum_front);
  }
}

} // namespace openreg
