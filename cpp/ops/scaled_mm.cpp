// Float8 matmuls (_scaled_mm, _scaled_mm_v2) refuse what CUDA refuses.
//
// Note [Float8 matmul dtypes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA's _scaled_mm refuses two float8_e5m2 matrices, which cuBLASLt cannot
// multiply: it raises ValueError "Multiplication
// of two Float8_e5m2 matrices is not supported" (_scaled_mm_out_cuda and
// _scaled_mm_cuda_v2_out in aten/src/ATen/native/cuda/ScaledBlas.cpp, in
// aten/src/ATen/native/cuda/Blas.cpp before it; outside ROCm builds; the
// message is in the wheel's libtorch_cuda.so). The CPU kernel multiplies them, and the dtype policy
// reads one dtype per call (Note [Dtype policy]), so a front of the fallback
// checks the pair, at the call. A float8_e5m2 matrix beside a float8_e4m3fn
// one is computed, as on CUDA. Left as CPU has it: a float8_e4m3fnuz or
// float8_e5m2fnuz matrix, for which a CUDA build has no cuBLASLt type (an
// internal assert in ScalarTypeToCudaDataType, ATen/cuda/CUDADataType.h,
// rather than a designed refusal; op_db's samples have none).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/core/Tensor.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

// _scaled_mm(Tensor self, Tensor mat2, ...) and _scaled_mm_v2, with their
// out= forms: the matrices are the first two arguments.
void scaled_mm_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  TORCH_CHECK_VALUE(
      args[0].toTensor().scalar_type() != c10::ScalarType::Float8_e5m2 ||
          args[1].toTensor().scalar_type() != c10::ScalarType::Float8_e5m2,
      "Multiplication of two Float8_e5m2 matrices is not supported");
  fallback.callBoxed(op, keys, stack);
}

} // namespace

void register_scaled_mm(KernelRegistrar& kernels) {
  if (cpu_dtypes()) {
    return; // the CPU kernels' dtypes
  }
  for (const char* name : {"_scaled_mm", "_scaled_mm.out", "_scaled_mm_v2", "_scaled_mm_v2.out"}) {
    kernels.fallback(name, &scaled_mm_front);
  }
}

} // namespace openreg
