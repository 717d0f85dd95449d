// nansum on openreg as CUDA computes it, where CPU's kernel refuses or
// rounds otherwise. nanmean is a composite over nansum and follows.
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
// once (as CUDA accumulates it).
//
// Note [Reduced-precision nansum]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA accumulates a float16 or bfloat16 nansum in float32 whatever the
// input's layout (acc_type, NanSumOps) and rounds the result once. CPU's
// nansum kernel does so for a contiguous input only: over a strided one
// (a transpose, a slice) it adds in the input's dtype, so the same values
// in another layout give another sum (a 7x5x5 float16 slice: 9.1953 where
// the contiguous copy gives 9.1797, the float32 sum 9.1782). openreg sums
// a contiguous float32 copy and rounds once to the result's dtype: the
// same bits for every layout, and CUDA's accumulation.
//
// Every other input goes to the fallback.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/native/Resize.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/nansum.h>
#include <ATen/ops/to.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

// nansum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)
// and nansum.out(..., Tensor(a!) out).
void nansum_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  const size_t arguments = args.size();
  const at::Tensor& self = args[0].toTensor();
  const bool reduced_float = self.scalar_type() == c10::kHalf || self.scalar_type() == c10::kBFloat16;
  if (!self.is_complex() && !reduced_float) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const std::optional<std::vector<int64_t>> dim = args[1].toOptional<std::vector<int64_t>>();
  const bool keepdim = args[2].toBool();
  const bool out_form = arguments == 5;
  // The result's dtype, as nansum_out reads it: `dtype`, else the out=
  // tensor's, else the input's (get_dtype_from_result, beside nansum_out).
  std::optional<c10::ScalarType> dtype = args[3].toOptional<c10::ScalarType>();
  if (out_form) {
    const c10::ScalarType out_dtype = args[4].toTensor().scalar_type();
    TORCH_CHECK(
        !dtype || *dtype == out_dtype, "nansum: provided dtype must match dtype of result. Got ",
        c10::toString(out_dtype), " and ", c10::toString(*dtype), ".");
    dtype = out_dtype;
  }
  at::Tensor result;
  if (reduced_float) {
    // Note [Reduced-precision nansum]: a contiguous float32 copy, one rounding.
    const c10::ScalarType result_dtype = dtype.value_or(self.scalar_type());
    at::Tensor wide = self.to(c10::kFloat, /*non_blocking=*/false, /*copy=*/false, c10::MemoryFormat::Contiguous);
    result = at::nansum(wide, at::OptionalIntArrayRef(dim), keepdim, c10::kFloat).to(result_dtype);
  } else {
    // complex32 is summed in complex64 and rounded once.
    const bool half_result = dtype.value_or(self.scalar_type()) == c10::ScalarType::ComplexHalf;
    const at::Tensor values =
        self.scalar_type() == c10::ScalarType::ComplexHalf ? self.to(c10::ScalarType::ComplexFloat) : self;
    result = at::sum(
        at::where(at::isnan(values), c10::Scalar(0), values), at::OptionalIntArrayRef(dim), keepdim,
        half_result ? std::optional(c10::ScalarType::ComplexFloat) : dtype);
    if (half_result) {
      result = result.to(c10::ScalarType::ComplexHalf);
    }
  }
  if (out_form) {
    at::Tensor out = args[4].toTensor();
    at::native::resize_output(out, result.sizes());
    out.copy_(result);
    result = out;
  }
  torch::jit::drop(*stack, arguments);
  torch::jit::push(*stack, std::move(result));
}

} // namespace

void register_nansum(KernelRegistrar& kernels) {
  for (const char* name : {"nansum", "nansum.out"}) {
    kernels.fallback(name, &nansum_front);
  }
}

} // namespace openreg
