// See graph_kernels.h (Note [Graph kernels]).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/graphs/graph_kernels.h"

#include <cstdint>

namespace openreg {
namespace {

bool plain_device_operand(const at::Tensor& t, c10::ScalarType dtype, int64_t numel) {
  return t.defined() && t.is_privateuseone() && t.scalar_type() == dtype && t.numel() == numel && t.is_contiguous() &&
      !t.is_conj() && !t.is_neg();
}

// Where the second operand's value comes from: a pointer to `numel`
// elements, or one element (`scalar_address`: device memory read at each
// run; otherwise `host_value`, read at capture).
template <typename T>
struct SecondOperand {
  const T* elements = nullptr;
  const T* scalar_address = nullptr;
  T host_value = 0;
};

template <typename T, typename Op>
std::function<void()> loop(T* out, const T* a, SecondOperand<T> b, int64_t n, Op op) {
  if (b.elements != nullptr) {
    return [=] {
      for (int64_t i = 0; i < n; ++i) {
        out[i] = op(a[i], b.elements[i]);
      }
    };
  }
  return [=] {
    const T value = b.scalar_address != nullptr ? *b.scalar_address : b.host_value;
    for (int64_t i = 0; i < n; ++i) {
      out[i] = op(a[i], value);
    }
  };
}

template <typename T>
std::function<void()> typed_kernel(BinaryOp op, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  const int64_t n = out.numel();
  SecondOperand<T> second;
  if (b.sizes() == out.sizes() && plain_device_operand(b, out.scalar_type(), n)) {
    second.elements = b.const_data_ptr<T>();
  } else if (b.dim() == 0 && b.is_privateuseone() && b.scalar_type() == out.scalar_type() && !b.is_conj() &&
             !b.is_neg()) {
    second.scalar_address = b.const_data_ptr<T>();
  } else if (b.dim() == 0 && b.is_cpu() && !b.is_complex() && b.scalar_type() != c10::kBool) {
    // ATen's CPU kernels take a scalar operand in the op's precision.
    second.host_value = b.item().to<T>();
  } else {
    return {};
  }
  T* out_data = out.mutable_data_ptr<T>();
  const T* a_data = a.const_data_ptr<T>();
  switch (op) {
    case BinaryOp::Add:
      return loop(out_data, a_data, second, n, [](T x, T y) { return x + y; });
    case BinaryOp::Sub:
      return loop(out_data, a_data, second, n, [](T x, T y) { return x - y; });
    case BinaryOp::Mul:
      return loop(out_data, a_data, second, n, [](T x, T y) { return x * y; });
  }
  return {};
}

} // namespace

std::function<void()> raw_binary_kernel(
    BinaryOp op,
    const at::Tensor& out,
    const at::Tensor& a,
    const at::Tensor& b,
    const c10::Scalar& alpha) {
  // alpha 1 makes ATen's fused multiply-add `a + alpha * b` exactly a + b.
  if (op != BinaryOp::Mul && !(alpha.isIntegral(false) && alpha.toLong() == 1) &&
      !(alpha.isFloatingPoint() && alpha.toDouble() == 1.0)) {
    return {};
  }
  const c10::ScalarType dtype = out.scalar_type();
  const int64_t n = out.numel();
  if ((dtype != c10::kFloat && dtype != c10::kDouble) || !plain_device_operand(out, dtype, n) ||
      !plain_device_operand(a, dtype, n) || a.sizes() != out.sizes()) {
    return {};
  }
  return dtype == c10::kFloat ? typed_kernel<float>(op, out, a, b) : typed_kernel<double>(op, out, a, b);
}

} // namespace openreg
