// scatter_reduce's dtypes as CUDA dispatches them.
//
// Note [scatter_reduce dtypes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA's scatter_reduce.two kernel (scatter_reduce_two_cuda_kernel,
// aten/src/ATen/native/cuda/ScatterGatherKernel.cu) runs "sum" through
// cuda_scatter_gather_base_kernel's ReduceAdd overload, which dispatches bool,
// and "prod", "amax", "amin" and "mean" through its generic overload, which
// dispatches AT_DISPATCH_ALL_TYPES_AND2(Half, BFloat16) and so raises
// NotImplementedError "\"cuda_scatter_gather_base_kernel_func\" not
// implemented for 'Bool'". The kernel is reached only for a non-empty index
// (scatter_impl in aten/src/ATen/native/TensorAdvancedIndexing.cpp returns
// before it otherwise), so an empty index computes (a copy of self) in every
// mode. The CPU kernel computes bool prod, amax and amin (and refuses mean
// with a message of its own), and the dtype policy's rules go by (op, dtype)
// only (Note [Dtype policy]), so a front of the fallback reads `reduce` and
// refuses the four as CUDA does, with CUDA's message in openreg's spelling
// ("_openreg" for CUDA's "cuda_"), at the call, before anything is queued or
// written. Left as it is: CUDA checks the arguments' shapes (the op's meta
// function) before its kernel refuses, the front refuses first, and CUDA's
// out= form has copied self into `out` when it refuses.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/core/Tensor.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"

namespace openreg {
namespace {

// The reductions CUDA's kernel runs through its generic overload, which has
// no bool.
bool refuses_bool(std::string_view reduce) {
  return reduce == "prod" || reduce == "amax" || reduce == "amin" || reduce == "mean";
}

// scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True)
// and its out= form: `index` is the third argument and `reduce` the fifth. The
// in-place form keeps its composite, which calls the out= form (Note
// [Composites that differ from CPU] in fallback.cpp).
void scatter_reduce_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(op.schema().arguments().size()));
  const at::Tensor& self = args[0].toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(
      self.scalar_type() != c10::ScalarType::Bool || args[2].toTensor().numel() == 0 ||
          !refuses_bool(args[4].toStringView()),
      "\"openreg_scatter_gather_base_kernel_func\" not implemented for 'Bool'");
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
