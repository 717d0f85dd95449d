// Sparse openreg tensors: their member tensors, and sparse tensors rebuilt
// over other members (the fallback's CPU views and device results).
//
// Note [Sparse tensors]: as on CUDA, a sparse openreg tensor is PyTorch's own
// sparse TensorImpl, a SparseTensorImpl (COO, dispatch key SparsePrivateUse1)
// or a SparseCsrTensorImpl (CSR, CSC, BSR, BSC: SparseCsrPrivateUse1), whose
// members are ordinary dense openreg tensors in device memory: indices and
// values; compressed indices, plain indices and values. PyTorch registers
// its sparse kernels for SparseCPU/SparseCsrCPU and SparseCUDA/SparseCsrCUDA
// only, so the fallback serves both openreg keys (fallback.cpp) in one of
// two ways:
//  - as it is: ops that touch only the sparse structure run their CPU
//    kernel on the openreg tensor itself (runs_sparse_kernel_as_is): these
//    kernels read metadata (_nnz, sparse_dim, is_coalesced), return members
//    (_values, crow_indices) or build sparse tensors from dense ops on the
//    members (the constructors, clone, copy_, zero_, resize_), which reach
//    openreg as dense ops. Factories and copies between devices run so too;
//  - on views: every other op (a kernel with loops over the data: add, mm,
//    coalesce, to_dense...) runs the CPU kernel on a SparseCPU/SparseCsrCPU
//    view of each sparse argument (same structure, CPU views of the same
//    members) as stream work, inline or waited like nested and quantized
//    calls (routes 1 and 3 of Note [Fallback]). A sparse result comes back
//    with each member an argument's member, a view of one, or copied to new
//    device memory; a sparse argument the kernel changed (add_ with another
//    sparse tensor gives it new members) takes the new structure.
// A dense op whose CPU kernel returns a sparse tensor (to_sparse of a dense
// tensor) gets it back on the device the same way.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/Tensor.h>

namespace openreg {

inline bool is_sparse_coo(const at::Tensor& t) {
  return t.layout() == c10::kSparse;
}

inline bool is_sparse_compressed(const at::Tensor& t) {
  const c10::Layout layout = t.layout();
  return layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
      layout == c10::kSparseBsc;
}

inline bool is_sparse_any(const at::Tensor& t) {
  return is_sparse_coo(t) || is_sparse_compressed(t);
}

// The dense member tensors of a sparse tensor: COO (indices, values);
// compressed (compressed indices, plain indices, values).
inline std::vector<at::Tensor> sparse_members(const at::Tensor& sparse) {
  if (is_sparse_coo(sparse)) {
    const auto* impl = static_cast<const at::SparseTensorImpl*>(sparse.unsafeGetTensorImpl());
    return {impl->indices(), impl->values()};
  }
  const auto* impl = static_cast<const at::SparseCsrTensorImpl*>(sparse.unsafeGetTensorImpl());
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

// A COO tensor's coalesced flag, read without a dispatch.
inline bool coalesced_flag(const at::Tensor& coo) {
  return static_cast<const at::SparseTensorImpl*>(coo.unsafeGetTensorImpl())->coalesced();
}

// The elements a sparse tensor's members hold: the measure of an op's work
// on it (a sparse tensor's numel() counts its implicit zeros).
inline int64_t sparse_stored_elements(const at::Tensor& sparse) {
  int64_t elements = 0;
  for (const at::Tensor& member : sparse_members(sparse)) {
    elements += member.numel();
  }
  return elements;
}

// Calls `fn(tensor)` on `t` if dense, else on each of its members: the
// tensors whose memory an op on `t` touches.
template <typename Fn>
void for_each_dense_part(const at::Tensor& t, Fn&& fn) {
  if (!is_sparse_any(t)) {
    fn(t);
    return;
  }
  for (const at::Tensor& member : sparse_members(t)) {
    fn(member);
  }
}

// Gives the sparse tensor `target` the structure of `like` (sizes, sparse
// and dense dims, coalesced flag) over `members` (sparse_members order).
inline void set_sparse_structure(const at::Tensor& target, const at::Tensor& like, const std::vector<at::Tensor>& members) {
  if (is_sparse_coo(like)) {
    const auto* from = static_cast<const at::SparseTensorImpl*>(like.unsafeGetTensorImpl());
    auto* impl = static_cast<at::SparseTensorImpl*>(target.unsafeGetTensorImpl());
    impl->raw_resize_(from->sparse_dim(), from->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(from->coalesced());
    return;
  }
  auto* impl = static_cast<at::SparseCsrTensorImpl*>(target.unsafeGetTensorImpl());
  impl->set_layout(like.layout());
  impl->set_member_tensors(members[0], members[1], members[2], like.sizes());
}

// A new sparse tensor with `like`'s layout, dtype and structure over
// `members`, on the members' device (the CPU, or openreg).
inline at::Tensor sparse_over(const at::Tensor& like, const std::vector<at::Tensor>& members) {
  const at::Tensor& values = members.back();
  const bool host = values.is_cpu();
  at::Tensor sparse;
  if (is_sparse_coo(like)) {
    const auto key = host ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparsePrivateUse1;
    sparse = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(key), like.dtype());
  } else {
    const auto key = host ? c10::DispatchKey::SparseCsrCPU : c10::DispatchKey::SparseCsrPrivateUse1;
    sparse = at::detail::make_tensor<at::SparseCsrTensorImpl>(
        c10::DispatchKeySet(key), values.device(), like.layout(), like.dtype());
  }
  set_sparse_structure(sparse, like, members);
  return sparse;
}

// The SparseCPU/SparseCsrCPU key the CPU kernel of a sparse tensor runs
// under.
inline c10::DispatchKey sparse_cpu_key(const at::Tensor& sparse) {
  return is_sparse_coo(sparse) ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparseCsrCPU;
}

// Whether the sparse CPU kernel of `op_name` ("aten::_nnz") runs on the
// openreg tensors themselves (see the Note): it reads only metadata, returns
// members, or builds sparse tensors with dense ops on the members (each
// kernel was read in aten/src/ATen/native/sparse/SparseTensor.cpp and
// SparseCsrTensor.cpp).
inline bool runs_sparse_kernel_as_is(const std::string& op_name) {
  static const std::unordered_set<std::string> kOps{
      // metadata
      "aten::_nnz", "aten::_dimI", "aten::_dimV", "aten::sparse_dim", "aten::dense_dim", "aten::is_coalesced",
      "aten::_coalesced_", "aten::is_pinned",
      // members
      "aten::_indices", "aten::_values", "aten::indices", "aten::values", "aten::crow_indices",
      "aten::col_indices", "aten::ccol_indices", "aten::row_indices",
      // structure from dense ops on the members
      "aten::_sparse_coo_tensor_with_dims", "aten::_sparse_coo_tensor_with_dims_and_tensors", "aten::empty",
      "aten::empty_like", "aten::zeros", "aten::zero_", "aten::sparse_resize_", "aten::sparse_resize_and_clear_",
      "aten::resize_as_sparse_", "aten::resize_", "aten::copy_sparse_to_sparse_", "aten::copy_", "aten::clone",
      "aten::_pin_memory",
      // values().normal_(): it draws from the openreg generator, as CUDA's
      // kernel draws from CUDA's (randn_like of a compressed tensor)
      "aten::normal_"};
  return kOps.count(op_name) > 0;
}

} // namespace openreg
