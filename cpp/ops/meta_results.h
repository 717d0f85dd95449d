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
// training loop asks the same questions every step. A plan is trusted only
// after the CPU kernel, run once for the same key (the call waits for it),
// gave results of the planned dtypes and shapes: where the kernel is split
// (Note [Split kernels]) or where the host would wait only for that (a
// busy stream) and the CPU kernel accepted stand-ins of the arguments (Note
// [Trial on stand-ins] in fallback.cpp), the plan is used unchecked and the
// queued kernel checks it (Note [Plans checked by the kernel]), except for ops
// whose Meta kernels are known to disagree with their CPU kernels, or were
// found to. Ops whose result shapes
// depend on data (nonzero, unique...), that return non-tensors or take a
// generator are never planned.
#pragma once

#include <memory>
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

// A plan made for the arguments of one call, to be checked against the CPU
// kernel's results before it is trusted.
struct PlanToCheck;

struct PlanLookup {
  // The results, when a checked plan exists.
  std::optional<PlannedResults> planned;
  // Otherwise maybe a new plan: the caller runs the op itself and passes its
  // results to check_plan.
  std::shared_ptr<PlanToCheck> to_check;
};

// The results of calling `op` on `arguments` (its arguments as on the stack)
// on `device`, if a checked plan knows them (or, with `accept_unchecked`, a
// plan not checked yet). New memory is allocated on the current stream
// (stream-ordered), and resized arguments grow in stream order (Note [One
// door] in device_memory.h).
PlanLookup plan_results(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> arguments,
    c10::Device device,
    bool accept_unchecked = false);

// The results of a call with sparse arguments, if a plan learned from an
// earlier call of the same key knows them (Note [Sparse plans] in
// meta_results.cpp); otherwise maybe a plan to learn: the caller runs the op
// itself and passes its openreg results to check_plan, which learns it.
PlanLookup plan_sparse_results(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, c10::Device device);

// For a call with sparse arguments that will run inline: the plan to learn
// from its results (passed to check_plan), if none is known yet.
std::shared_ptr<PlanToCheck> sparse_plan_to_learn(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments);

// Whether the host needs `op`'s data to have its results: a shape that
// depends on the data (nonzero) or a result that is no tensor (a bool, a
// number). The fallback's inline route is then a wait the user asked for.
bool results_depend_on_data(const c10::OperatorHandle& op);

// Trusts `check`'s plan from now on if the op's `results`, computed by
// running it (openreg tensors, or the CPU kernel's on views), have the
// planned dtypes and shapes and its kernel did not warn (Note [Kernel
// warnings] in device_memory.h); else never uses it, and an op whose
// results differed is no longer planned unchecked. New results laid out
// otherwise than planned give the plan their strides, and their op too is
// no longer planned unchecked (Note [Memory format of results] in
// result_format.h). Returns whether the results matched.
bool check_plan(const PlanToCheck& check, c10::ArrayRef<c10::IValue> results, bool kernel_warned);

// Settles `check`'s plan without results to compare (a split kernel's
// chunks checked their parts): trusted if `usable`.
void settle_plan(const PlanToCheck& check, bool usable);

// Whether a new plan of `op` may be used before its check (see the Note).
bool may_use_unchecked(const c10::OperatorHandle& op);

// An openreg view of `original`'s memory with the dtype and geometry given
// (a view may change the element type: view_as_real).
at::Tensor alias_of(
    const at::Tensor& original,
    c10::ScalarType dtype,
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides,
    int64_t storage_offset);

} // namespace openreg
