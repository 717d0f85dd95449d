// Note [Graph kernels]: a kernel captured in a graph runs once per replay,
// where nothing else costs time: the dispatcher and TensorIterator set-up
// of a CPU kernel (about 1.5 us) would be most of a replayed 1K-element op.
// So when a capturing stream records the commonest elementwise ops on
// simple operands, it records a plain loop over raw memory instead, which
// computes exactly what the CPU kernel computes (each element is one IEEE
// operation in the same precision, so the result is bit-identical):
// add/sub with alpha 1 and mul, float32 or float64, contiguous operands of
// one size, or a scalar second operand (a host scalar is read at capture,
// as CUDA reads it at launch; a device scalar at each replay). Anything
// else is recorded as the CPU kernel.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

namespace openreg {

enum class BinaryOp { Add, Sub, Mul };

// `out = a op alpha * b` as a raw loop, or an empty function when the
// operands are not simple enough (see the Note).
std::function<void()> raw_binary_kernel(
    BinaryOp op,
    const at::Tensor& out,
    const at::Tensor& a,
    const at::Tensor& b,
    const c10::Scalar& alpha);

} // namespace openreg
