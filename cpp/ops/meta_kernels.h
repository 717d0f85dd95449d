// Note [C++ Meta kernels]: openreg plans a fallback call's results by running
// a Meta kernel on stand-ins (Note [Meta results] in meta_results.h). For most
// structured ops the dispatcher's Meta kernel is not their C++ one: importing
// torch replaces it with a Python reference (activate_meta in
// torch/_meta_registrations.py), which holds the GIL, costs 0.05-5 ms per
// call, and whose first call in a process imports torch._dynamo (about
// 1.3 s). The C++ kernel is still there as a function, at::meta::NAME, and it
// is the meta step a structured CPU kernel runs before computing: it plans
// exactly the results the CPU kernel makes. meta_kernels_table.h, generated
// from the installed torch's ATen/ops/*_meta_dispatch.h, lists them all with
// their C++ types; an op overload uses the one whose inferred schema has the
// overload's argument and return types (found on the op's first plan),
// every other op the dispatcher's Meta kernel.
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>

namespace openreg {

struct CxxMetaKernel {
  const char* op; // "aten::NAME": the operator of some overload
  c10::KernelFunction kernel;
  c10::FunctionSchema (*infer_schema)(); // its arguments' and returns' types
};

template <class FuncType>
CxxMetaKernel cxx_meta_kernel(const char* op, FuncType* function) {
  return {op, c10::KernelFunction::makeFromUnboxedRuntimeFunction<false, FuncType>(function),
          &c10::inferFunctionSchemaFlattenedReturns<FuncType>};
}

// Builds the index of the C++ Meta kernels by operator name, once per
// process. register_ops calls it at load, so that the first plan of the
// process does not wait for it: built there, the host's first call behind
// queued work (x.sin() in a fresh process) takes 0.15 ms instead of 0.25 ms.
void index_cxx_meta_kernels();

// The C++ Meta kernel of `op`, or nullptr when it has none. A boxed call of
// it takes and returns what `op` does.
const c10::KernelFunction* cxx_meta_kernel_for(const c10::OperatorHandle& op);

} // namespace openreg
