// scatter_reduce's dtypes as CUDA dispatches them.
//
// Note [scatter_reduce dtypes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA's scatter_reduce.two kernel (scatter_reduce_two_cuda_kernel,
// aten/src/ATen/native/cuda/ScatterGatherKernel.cu) runs "sum" through
// cuda_scatter_gather_base_kernel's ReduceAdd overload, which dispatches
// AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(Half, Bool, BFloat16), and "prod",
// "amax", "amin" and "mean" through its generic overload, which dispatches
// AT_DISPATCH_ALL_TYPES_AND2(Half, BFloat16): any other dtype raises
// NotImplementedError "\"cuda_scatter_gather_base_kernel_func\" not
// implemented for '<Dtype>'" (bool prod, complex mean, uint16 sum...). The
// kernel is reached only for a non-empty index (scatter_impl in
// aten/src/ATen/native/TensorAdvancedIndexing.cpp returns before it
// otherwise), so an empty index computes (a copy of self) in every mode, and
// under deterministic algorithms scatter_impl computes "sum" and "mean" by
// index_put_ instead, which the front leaves to the CPU kernel. The
// CPU kernel computes more (bool prod/amax/amin, complex prod/mean,
// uint16/uint32/uint64 sum/prod; it refuses the rest with messages of its
// own), and the dtype policy's rules go by (op, dtype) only (Note [Dtype
// policy]), so a front of the fallback reads `reduce` and refuses as CUDA
// does, with CUDA's message in openreg's spelling ("openreg_" for CUDA's
// "cuda_"), at the call, before anything is queued or written. Left as it
// is: CUDA checks the arguments' shapes (the op's meta function) before its
// kernel refuses, the front refuses first, and CUDA's out= form has copied
// self into `out` when it refuses.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

// Whether CUDA refuses the call: its kernel runs for a non-empty index, and
// not for "sum" and "mean" under deterministic algorithms (scatter_impl sends
// them to _scatter_via_index_put); "sum" (the ReduceAdd overload) dispatches
// bool, complex64 and complex128 too.
bool refused_on_cuda(std::string_view reduce, c10::ScalarType dtype, const at::Tensor& index) {
  if (index.numel() == 0 ||
      ((reduce == "sum" || reduce == "mean") && at::globalContext().deterministicAlgorithms())) {
    return false;
  }
  const bool add_overload_dtype =
      dtype == c10::kBool || dtype == c10::kComplexFloat || dtype == c10::kComplexDouble;
  const bool generic_overload_dtype = is_all_types(dtype) || dtype == c10::kHalf || dtype == c10::kBFloat16;
  return !generic_overload_dtype && !(reduce == "sum" && add_overload_dtype);
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
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  const c10::ScalarType dtype = args[0].toTensor().scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(
      !refused_on_cuda(args[4].toStringView(), dtype, args[2].toTensor()),
      "\"openreg_scatter_gather_base_kernel_func\" not implemented for '", dtype, "'");
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
