// What a fallback op's results will be, known before it runs (route 2 of
// Note [Fallback] in fallback.cpp).
//
// Note [Meta results]: an op's Meta kernel, run on meta stand-ins of the
// openreg arguments (same dtype and geometry; arguments sharing memory share
// a meta storage), returns tensors that are either a stand-in itself (an
// out= or in-place argument, maybe resized), a view of a stand-in's storage,
// or new. That is a plan: per result, which argument it is or views, or the
// dtype and geometry of new memory. A plan depends only on the arguments'
// metadata (dtype, geometry, aliasing, device) and non-tensor values (and
// the default dtype), so it is cached under exactly those: in a Python
// process most Meta kernels are Python functions costing 0.1-10 ms, and a
// training loop asks the same questions every step. Ops whose result shapes
// depend on data (nonzero, unique...), that return non-tensors or take a
// generator are never planned.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace openreg {

struct PlannedResults {
  // The op's returns as openreg tensors: arguments (resized if the op
  // resizes them), views of arguments, or new device memory.
  torch::jit::Stack results;
  // Whether some result is new memory (the kernel must fill it).
  bool any_fresh = false;
};

// The results of calling `op` on `arguments` (its arguments as on the stack)
// on `device`; nullopt if they cannot be known without running it. New
// memory is allocated on the current stream (stream-ordered), and resized
// arguments grow in stream order (Note [One door] in device_memory.h).
std::optional<PlannedResults> plan_results(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> arguments,
    c10::Device device);

// An openreg view of `original`'s memory with the dtype and geometry given
// (a view may change the element type: view_as_real).
at::Tensor alias_of(
    const at::Tensor& original,
    c10::ScalarType dtype,
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides,
    int64_t storage_offset);

} // namespace openreg
