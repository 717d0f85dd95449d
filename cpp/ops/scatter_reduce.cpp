// scatter_reduce's dtypes as CUDA dispatches them.
//
// Note [scatter_reduce dtypes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA's scatter_reduce runs one kernel per reduction
// (scatter_reduce_two_cuda_kernel, aten/src/ATen/native/cuda/ScatterGatherKernel.cu):
// "sum" and "mean" dispatch bool, "prod", "amax" and "amin" do not, and raise
// NotImplementedError ("scatter_reduce_cuda_prod_" not implemented for
// 'Bool'). The CPU kernel computes them all, and the dtype policy's rules go
// by (op, dtype) only (Note [Dtype policy]), so a front of the fallback reads
// `reduce` and refuses as CUDA does, at the call, before anything is queued.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/core/Tensor.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

// scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True)
// and its out= form: `reduce` is the fifth argument. The in-place form keeps
// its composite, which calls the out= form (Note [Composites that differ
// from CPU] in fallback.cpp).
void scatter_reduce_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(op.schema().arguments().size()));
  const at::Tensor& self = args[0].toTensor();
  if (self.scalar_type() == c10::ScalarType::Bool) {
    const std::string_view reduce = args[4].toStringView();
    TORCH_CHECK_NOT_IMPLEMENTED(
        reduce != "prod" && reduce != "amax" && reduce != "amin",
        "\"scatter_reduce_openreg_", reduce, "_\" not implemented for 'Bool'");
  }
  fallback.callBoxed(op, keys, stack);
}

} // namespace

void register_scatter_reduce(KernelRegistrar& kernels) {
  if (cpu_dtypes()) {
    return; // the CPU kernels' dtypes
  }
  for (const char* name : {"scatter_reduce.two", "scatter_reduce.two_out"}) {
    kernels.fallback(name, &scatter_reduce_front);
  }
}

} // namespace openreg
