// The ATen ops that refuse an openreg tensor by its device while CUDA
// computes them, each given the path CUDA takes.
//
// Note [Ops refused by device name]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op reaches openreg's fallback (Note [Fallback] in fallback.cpp) or,
// without a CPU kernel, runs its composite kernel on the openreg tensors
// themselves. Either way some ATen code asks the device and refuses a device
// it does not name, where CUDA, being named or having its own kernel, gets a
// result. Each op below, the check it meets, and why openreg may take CUDA's
// path instead:
//  - mode.values (torch.mode(..., out=)): the composite mode_out
//    (aten/src/ATen/native/Sorting.cpp) checks "mode only supports CPU, CUDA
//    and XPU device type", then calls mode_stub for the tensor's device. The
//    functional mode has CPU and CUDA kernels, so torch.mode(x) worked. It
//    runs the fallback: the same composite on CPU views of the device
//    memory, so out= is written with CPU's (= CUDA's) rules: dtype and
//    device checks, resize_output's warning, a 0-dim input's resize.
//  - conj_physical_ (Tensor.conj_physical_()): a composite that calls
//    conj_physical_stub for the tensor's device ("DispatchStub: missing
//    kernel for privateuse1"); CUDA registers the stub. Runs the fallback.
//  - kaiser_window (torch.kaiser_window(..., device=)): a composite factory
//    that fills the window through kaiser_window_stub, likewise. Runs the
//    fallback (computed on the CPU, copied to the device in stream order),
//    each of its three overloads (they call the composite directly).
//  - _softmax / _log_softmax with half_to_float=True, and
//    _softmax_backward_data / _log_softmax_backward_data with a float
//    gradient and input_dtype=Half (what autograd calls for them), each with
//    its out= form: CPU's kernels refuse the conversion ("softmax with half
//    to float conversion is not supported on CPU"; the backward's CPU kernel
//    fails reading a Half result as Float), CUDA's compute the Half input in
//    float (host_softmax and host_softmax_backward in
//    aten/src/ATen/native/cuda/SoftMax.cu). Here: the float op on the Half
//    input converted to float (exact), and for the backward its float
//    gradient rounded once to Half. CUDA's own refusals are kept: the
//    conversion for a non-Half input ("conversion is supported for Half type
//    only"), a gradient whose dtype differs from input_dtype other than
//    Float for Half ("expected input and grad types to match, ...").
//  - linalg_lu_factor_ex and linalg_lu with pivot=False (so linalg.lu_factor,
//    torch.lu, linalg.lu), with their out= forms: CPU's LAPACK kernel refuses
//    ("LU without pivoting is not implemented on the CPU"), CUDA factors
//    with cuSOLVER/MAGMA's getrf without row exchanges and returns the
//    trivial pivots 1..k (lu_factor in
//    aten/src/ATen/native/cuda/linalg/BatchLinearAlgebra.cpp). Here: the
//    unblocked right-looking elimination LAPACK's getf2 performs, with no row
//    exchange (lu_without_pivoting), then linalg_lu unpacks it with
//    lu_unpack as linalg_lu_out does. Where the input is one CPU refuses for
//    another reason or has no elements, the call goes to the fallback.
//  - _linalg_svd with driver= (linalg.svd, linalg.svdvals): _linalg_svd_out
//    refuses a driver unless svd_uses_cusolver(A) ("keyword argument
//    `driver=` is only supported on CUDA inputs with cuSOLVER backend"). The
//    driver picks one of cuSOLVER's algorithms for the same decomposition;
//    openreg has only the CPU's, so it checks the name as svd_cusolver does
//    (gesvd, gesvdj, gesvda; "unknown svd driver" otherwise, and not for an
//    empty input, which returns before) and computes without it.
// The fronts see a call before the dtype policy (Note [Dtype policy]), and
// every op they call goes through it. Out= forms check their out= tensors
// as a structured kernel's resize_out does, before any work is queued.
//
// How they were found, on the torch 2.15 wheel: (1) the error messages in
// libtorch_cpu.so that name devices ("only supports CPU", "on the CPU",
// "device type", "Expected tensor to have CPU Backend"...), each site read
// and tried on openreg; (2) every composite kernel (the
// at::composite*autograd:: functions) whose code reaches a DispatchStub call
// within four calls (objdump of libtorch_cpu.so: a stub has no kernel for
// PrivateUse1), each tried on openreg; (3) every op_db op's out= form on
// openreg against CPU, and the samples op_db gives CUDA only (lu with
// pivot=False, softmax backward with a Half input_dtype). The tests are in
// tests/python/test_device_named_ops.py. Checked and left as they are:
//  - refused on CUDA as well: _batch_norm_no_update (a composite calling
//    batch_norm_cpu: "Expected tensor to have CPU Backend"), linalg.lstsq
//    with a driver other than gels (CUDA refuses it; openreg, running the
//    CPU kernel, accepts every LAPACK driver and defaults to gelsy where
//    CUDA defaults to gels), sort/topk of complex or bool tensors;
//  - naming openreg already: std/var, _pdist_forward/_backward, nested
//    tensors' storage, the unpickler's devices;
//  - float8 _scaled_mm with row-wise or block-wise scales (CPU: "only
//    supports per-tensor scaling for CPU backend", "CPU does not support
//    swizzle"): CUDA's checks depend on the scaling recipe and the GPU, not
//    mirrored here;
//  - sparse addmm's layout combinations CPU refuses ("addmm: computation
//    on CPU is not implemented for Strided + SparseCsc @ SparseCsr"...):
//    sparse parity is Note [Sparse tensors]'s (in cpp/ops/sparse_tensors.h);
//  - Python checks with no PrivateUse1 hook: FlexAttention
//    (torch/nn/attention/flex_attention.py refuses devices other than
//    cuda, cpu, xpu, hpu, mps), the quantized SDPA's descale tensors
//    (nn/attention/experimental), the philox RNG prims of functionalized
//    RNG (torch/_prims/rng_prims.py: cuda only, CPU refused too).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <string_view>
#include <vector>

#include <ATen/native/Resize.h>
#include <c10/core/WrapDimMinimal.h>
#include <ATen/ops/_linalg_check_errors.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/lu_unpack.h>
#include <ATen/ops/zeros.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

// Whether the call is the op's out= form: more arguments than the
// functional form's `functional_arguments`.
bool is_out_form(const c10::OperatorHandle& op, size_t functional_arguments) {
  return op.schema().arguments().size() > functional_arguments;
}

void return_results(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::vector<at::Tensor> results) {
  torch::jit::drop(*stack, op.schema().arguments().size());
  for (at::Tensor& result : results) {
    torch::jit::push(*stack, std::move(result));
  }
}

// The checks a structured out= kernel makes on `out` before computing into
// it (resize_out in the codegen's RegisterCUDA.cpp).
void check_out(const at::Tensor& out, c10::ScalarType dtype, c10::Device device) {
  TORCH_CHECK(
      out.scalar_type() == dtype, "Expected out tensor to have dtype ", c10::scalarTypeToTypeMeta(dtype), ", but got ",
      out.dtype(), " instead");
  TORCH_CHECK(
      out.device() == device, "Expected out tensor to have device ", device, ", but got ", out.device(), " instead");
}

// `result` written into a checked `out` as resize_out writes: resized when
// its shape differs (resize_output warns if it had elements), then given
// `strides` if it was resized and they are given.
void write_out(const at::Tensor& out, const at::Tensor& result, c10::IntArrayRef strides = {}) {
  if (at::native::resize_output(out, result.sizes()) && !strides.empty()) {
    out.as_strided_(result.sizes(), strides);
  }
  out.copy_(result);
}

// _softmax/_log_softmax(Tensor self, int dim, bool half_to_float) and their
// out= forms.
template <bool log>
void softmax_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  if (!args[2].toBool()) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const at::Tensor self = args[0].toTensor();
  const int64_t dim = args[1].toInt();
  c10::maybe_wrap_dim(dim, self.dim()); // the meta function's check, first as on CUDA
  const bool out_form = is_out_form(op, 3);
  if (out_form) {
    check_out(args[3].toTensor(), c10::kFloat, self.device());
  }
  TORCH_CHECK(self.scalar_type() == c10::kHalf, "conversion is supported for Half type only");
  const at::Tensor input = self.to(c10::kFloat);
  if (out_form) {
    at::Tensor out = args[3].toTensor();
    log ? at::_log_softmax_out(out, input, dim, false) : at::_softmax_out(out, input, dim, false);
    return_results(op, stack, {out});
  } else {
    return_results(op, stack, {log ? at::_log_softmax(input, dim, false) : at::_softmax(input, dim, false)});
  }
}

// _softmax_backward_data/_log_softmax_backward_data(Tensor grad_output,
// Tensor output, int dim, ScalarType input_dtype) and their out= forms.
template <bool log>
void softmax_backward_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  const at::Tensor grad = args[0].toTensor();
  const c10::ScalarType input_dtype = args[3].toScalarType();
  if (grad.scalar_type() == input_dtype) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const at::Tensor output = args[1].toTensor();
  const int64_t dim = args[2].toInt();
  c10::maybe_wrap_dim(dim, grad.dim()); // the meta function's check, first as on CUDA
  const bool half_to_float = grad.scalar_type() == c10::kFloat && input_dtype == c10::kHalf;
  const bool out_form = is_out_form(op, 4);
  if (out_form) {
    // The Meta kernel's result dtype: Half for a Float gradient of a Half
    // input, the gradient's otherwise.
    check_out(args[4].toTensor(), half_to_float ? c10::kHalf : grad.scalar_type(), grad.device());
  }
  TORCH_CHECK(
      half_to_float, "expected input and grad types to match, or input to be at::Half and grad to be at::Float");
  at::Tensor grad_input = (log ? at::_log_softmax_backward_data(grad, output, dim, c10::kFloat)
                               : at::_softmax_backward_data(grad, output, dim, c10::kFloat))
                              .to(c10::kHalf);
  if (out_form) {
    at::Tensor out = args[4].toTensor();
    write_out(out, grad_input);
    grad_input = out;
  }
  return_results(op, stack, {grad_input});
}

// Whether a pivot=False LU is computed here: a strided matrix (or batch) of
// a dtype CPU's LAPACK kernel takes, with elements. Any other call goes to
// the fallback, which reports CPU's (= CUDA's meta function's) errors or
// returns the empty results.
bool lu_computed_here(const at::Tensor& A) {
  const c10::ScalarType dtype = A.scalar_type();
  return A.dim() >= 2 && A.numel() > 0 && A.layout() == c10::kStrided &&
      (dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kComplexFloat ||
       dtype == c10::kComplexDouble);
}

struct Factorization {
  at::Tensor LU;
  at::Tensor pivots;
  at::Tensor info;
};

// The LU factorization of each matrix of A (..., m, n) without row
// exchanges, as LAPACK's getf2 computes it when every pivot stays in place:
// for each column j < min(m, n), the entries below the diagonal are divided
// by the pivot U[j, j] (left as they are when it is exactly zero, and info
// records the first such j, 1-based), then the trailing block loses their
// outer product with row j. LU is batched column-major, as the meta function
// plans it; the pivots are CUDA's trivial permutation 1..k.
Factorization lu_without_pivoting(const at::Tensor& A) {
  const int64_t m = A.size(-2);
  const int64_t n = A.size(-1);
  const int64_t k = std::min(m, n);
  const std::vector<int64_t> batch(A.sizes().begin(), A.sizes().end() - 2);
  at::Tensor LU = A.mT().clone(c10::MemoryFormat::Contiguous).mT();
  at::Tensor info = at::zeros(batch, A.options().dtype(c10::kInt));
  for (int64_t j = 0; j < k; ++j) {
    const at::Tensor pivot = LU.select(-2, j).select(-1, j);
    const at::Tensor zero_pivot = pivot.eq(0);
    info.masked_fill_(zero_pivot.logical_and(info.eq(0)), j + 1);
    if (j + 1 == m) {
      continue;
    }
    at::Tensor below = LU.select(-1, j).narrow(-1, j + 1, m - j - 1);
    below.div_(pivot.masked_fill(zero_pivot, 1).unsqueeze(-1));
    if (j + 1 < n) {
      const at::Tensor right = LU.select(-2, j).narrow(-1, j + 1, n - j - 1);
      LU.narrow(-2, j + 1, m - j - 1).narrow(-1, j + 1, n - j - 1).sub_(below.unsqueeze(-1).mul(right.unsqueeze(-2)));
    }
  }
  std::vector<int64_t> pivots_size = batch;
  pivots_size.push_back(k);
  at::Tensor pivots = at::arange(1, k + 1, A.options().dtype(c10::kInt)).expand(pivots_size).clone();
  return {LU, pivots, info};
}

// linalg_lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False)
// and its out= form (LU, pivots, info).
void lu_factor_ex_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  const at::Tensor A = args[0].toTensor();
  if (args[1].toBool() || !lu_computed_here(A)) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const bool check_errors = args[2].toBool();
  const bool out_form = is_out_form(op, 3);
  if (out_form) {
    check_out(args[3].toTensor(), A.scalar_type(), A.device());
    check_out(args[4].toTensor(), c10::kInt, A.device());
    check_out(args[5].toTensor(), c10::kInt, A.device());
  }
  Factorization f = lu_without_pivoting(A);
  if (out_form) {
    write_out(args[3].toTensor(), f.LU, f.LU.strides());
    write_out(args[4].toTensor(), f.pivots);
    write_out(args[5].toTensor(), f.info);
    f = {args[3].toTensor(), args[4].toTensor(), args[5].toTensor()};
  }
  if (check_errors) {
    at::_linalg_check_errors(f.info, "torch.linalg.lu_factor_ex", A.dim() == 2);
  }
  return_results(op, stack, {f.LU, f.pivots, f.info});
}

// linalg_lu(Tensor A, *, bool pivot=True) and its out= form (P, L, U): P is
// empty without pivoting, as the meta function plans it.
void lu_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  const at::Tensor A = args[0].toTensor();
  if (args[1].toBool() || !lu_computed_here(A)) {
    fallback.callBoxed(op, keys, stack);
    return;
  }
  const bool out_form = is_out_form(op, 2);
  if (out_form) {
    for (int i = 2; i < 5; ++i) {
      check_out(args[i].toTensor(), A.scalar_type(), A.device());
    }
  }
  const Factorization f = lu_without_pivoting(A);
  auto [P, L, U] = at::lu_unpack(f.LU, f.pivots, /*unpack_data=*/true, /*unpack_pivots=*/false);
  std::vector<at::Tensor> results{P, L, U};
  if (out_form) {
    for (int i = 0; i < 3; ++i) {
      write_out(args[2 + i].toTensor(), results[i]);
      results[i] = args[2 + i].toTensor();
    }
  }
  return_results(op, stack, std::move(results));
}

// _linalg_svd(Tensor A, bool full_matrices=False, bool compute_uv=True, *,
// str? driver=None) and its out= form (U, S, Vh).
void svd_driver_front(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::ArrayRef<c10::IValue> args = arguments_of(op, *stack);
  if (!args[3].isNone()) {
    const at::Tensor A = args[0].toTensor();
    // svd_cusolver's check, reached after the meta function's (a floating or
    // complex matrix) and only for an input with elements.
    if (A.dim() >= 2 && A.numel() > 0 && (A.is_floating_point() || A.is_complex())) {
      const std::string_view driver = args[3].toStringView();
      TORCH_CHECK(
          driver == "gesvd" || driver == "gesvdj" || driver == "gesvda", "torch.linalg.svd: unknown svd driver ",
          driver, " in svd_cusolver computation. ",
          "Check doc at https://pytorch.org/docs/stable/generated/torch.linalg.svd.html");
    }
    torch::jit::peek(*stack, 3, args.size()) = c10::IValue();
  }
  fallback.callBoxed(op, keys, stack);
}

} // namespace

void register_device_named_ops(KernelRegistrar& kernels) {
  for (const char* name :
       {"mode.values", "conj_physical_", "kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"}) {
    kernels.fallback(name);
  }
  for (const char* name : {"_softmax", "_softmax.out"}) {
    kernels.fallback(name, &softmax_front</*log=*/false>);
  }
  for (const char* name : {"_log_softmax", "_log_softmax.out"}) {
    kernels.fallback(name, &softmax_front</*log=*/true>);
  }
  for (const char* name : {"_softmax_backward_data", "_softmax_backward_data.out"}) {
    kernels.fallback(name, &softmax_backward_front</*log=*/false>);
  }
  for (const char* name : {"_log_softmax_backward_data", "_log_softmax_backward_data.out"}) {
    kernels.fallback(name, &softmax_backward_front</*log=*/true>);
  }
  for (const char* name : {"linalg_lu_factor_ex", "linalg_lu_factor_ex.out"}) {
    kernels.fallback(name, &lu_factor_ex_front);
  }
  for (const char* name : {"linalg_lu", "linalg_lu.out"}) {
    kernels.fallback(name, &lu_front);
  }
  for (const char* name : {"_linalg_svd", "_linalg_svd.U"}) {
    kernels.fallback(name, &svd_driver_front);
  }
}

} // namespace openreg
