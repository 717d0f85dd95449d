// The sparse kernels CUDA has and the CPU lacks, and the refusal of those
// the CPU has and CUDA lacks (Note [Sparse tensors] in sparse_tensors.h):
// a program that runs on CUDA runs here, one refused there is refused here.
//
// CUDA-only, under SparseCsrCUDA (the dispatcher lists them): bmm.out and
// baddbmm.out with a batched CSR first operand (cuSPARSE's batched SpMM),
// and _spsolve (torch.linalg.solve with a CSR matrix, cuDSS). openreg
// computes them by the dense route, the compressed operand made dense on
// the device, with CUDA's argument checks first.
//
// One DispatchStub: the sparse constructors' argument checks are native
// functions the Python binding calls directly, not through the dispatcher;
// with is_coalesced=True, the COO check flattens the indices through
// flatten_indices_stub, which openreg registers (with dense ops on the
// device, as CUDA's kernel computes on its device).
//
// CPU-only (SparseCsrCPU kernels without a SparseCsrCUDA one; in torch 2.15
// _sparse_mm_reduce_impl and its backward, torch.sparse.mm(csr, dense,
// reduce)): refused as CUDA refuses them, with NotImplementedError. is_pinned
// and _pin_memory are CPU-only by nature: they run, and an openreg tensor is
// never pinned. (SparseCPU has no CPU-only kernel besides those two.)
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/ops/linalg_solve.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include "torch_openreg/cpp/ops/sparse_tensors.h"

// Declared in aten/src/ATen/native/sparse/FlattenIndicesCommon.h, which the
// wheel does not ship; the stub itself is exported by libtorch_cpu.
namespace at::native {
using flatten_indices_fn = at::Tensor (*)(const at::Tensor& indices, c10::IntArrayRef size);
DECLARE_DISPATCH(flatten_indices_fn, flatten_indices_stub)
} // namespace at::native

namespace openreg {
namespace {

// Each column of `indices` (sparse_dim x nnz) as one row-major index into
// `size`'s sparse dims.
at::Tensor flatten_indices(const at::Tensor& indices, c10::IntArrayRef size) {
  const int64_t sparse_dim = indices.size(0);
  std::vector<int64_t> strides(sparse_dim, 1);
  for (int64_t d = sparse_dim - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * size[d + 1];
  }
  const at::Tensor weights = at::tensor(strides, indices.options().device(c10::kCPU)).to(indices.device());
  return (indices * weights.unsqueeze(1)).sum(0);
}

// `compressed`, a sparse compressed operand of `op`, made dense.
at::Tensor dense_operand(const at::Tensor& compressed, const char* op) {
  TORCH_CHECK(is_sparse_compressed(compressed), op, ": expected a sparse compressed first operand, got ",
              compressed.layout());
  return compressed.to_dense();
}

at::Tensor& bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  TORCH_CHECK(mat2.layout() == c10::kStrided, "bmm: expected mat2 to be a strided tensor, got ", mat2.layout());
  return at::bmm_out(out, dense_operand(self, "bmm"), mat2);
}

at::Tensor& baddbmm_out(
    const at::Tensor& self,
    const at::Tensor& batch1,
    const at::Tensor& batch2,
    const c10::Scalar& beta,
    const c10::Scalar& alpha,
    at::Tensor& out) {
  TORCH_CHECK(self.layout() == c10::kStrided && batch2.layout() == c10::kStrided,
              "baddbmm: expected self and batch2 to be strided tensors, got ", self.layout(), " and ", batch2.layout());
  return at::baddbmm_out(out, self, dense_operand(batch1, "baddbmm"), batch2, beta, alpha);
}

// CUDA's checks (aten/src/ATen/native/sparse/cuda/SparseCsrTensorMath.cu,
// _apply_sparse_csr_linear_solve), then the dense solve.
at::Tensor spsolve(const at::Tensor& A, const at::Tensor& B, bool left) {
  TORCH_CHECK(A.layout() == c10::kSparseCsr, "A must be a CSR matrix");
  TORCH_CHECK(B.layout() == c10::kStrided, "b must be a strided tensor");
  TORCH_CHECK(B.dim() == 1, "b must be a 1D tensor");
  TORCH_CHECK(B.size(0) == A.size(0), "linear system size mismatch.");
  TORCH_CHECK(A.dtype() == B.dtype(), "A, x, and b must have the same dtype");
  TORCH_CHECK(left, "only left == true is supported by the Sparse CSR backend");
  TORCH_CHECK_NOT_IMPLEMENTED(
      A.scalar_type() == at::kFloat || A.scalar_type() == at::kDouble, "\"create_matrix\" not implemented for '",
      A.scalar_type(), "'");
  return at::linalg_solve(A.to_dense(), B.contiguous());
}

void refuse_cpu_only(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "Could not run '", op.operator_name(),
      "' with arguments from the 'SparseCsrPrivateUse1' backend: CUDA has no kernel for it, so openreg refuses it "
      "as CUDA does (the CPU computes it)");
}

} // namespace
} // namespace openreg

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(flatten_indices_stub, &openreg::flatten_indices)
} // namespace at::native

namespace openreg {

void register_sparse_kernels(torch::Library& compressed_aten) {
  compressed_aten.impl("bmm.out", TORCH_FN(bmm_out));
  compressed_aten.impl("baddbmm.out", TORCH_FN(baddbmm_out));
  compressed_aten.impl("_spsolve", TORCH_FN(spsolve));
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || name.name.rfind("aten::", 0) != 0 || name.name == "aten::is_pinned" || name.name == "aten::_pin_memory") {
      continue;
    }
    if (op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrCPU) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrCUDA)) {
      std::string schema_name = name.name.substr(6);
      if (!name.overload_name.empty()) {
        schema_name += "." + name.overload_name;
      }
      compressed_aten.impl(schema_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&refuse_cpu_only>());
    }
  }
}

} // namespace openreg
