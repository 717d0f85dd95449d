// FFTs in half precision on openreg, as cuFFT computes them.
//
// Note [Half-precision FFTs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The torch.fft functions are composites (aten/src/ATen/native/SpectralOps.cpp)
// that promote their input before any kernel runs (promote_type_fft): they
// accept float16 only on CUDA (and meta) by device name, where a float16 or
// complex32 transform computes in half precision, and promote bfloat16 to
// float32. For any other device, real float16 and bfloat16 inputs are refused
// ("Unsupported dtype Half"). openreg registers its own kernels for the 18
// composites (fft_fft ... fft_ihfftn, and their out= forms) and for stft and
// istft, under PrivateUse1 and AutogradPrivateUse1, which give CUDA's
// results:
//  - float16 and complex32 inputs are computed by the composite on the input
//    converted to float32 / complex64, and the results are rounded once to
//    float16 / complex32, the dtypes CUDA returns. This is the dtype policy's
//    "compute wider, round back" (Note [Dtype policy]) applied to a whole
//    transform: hfft2 and hfftn are two transforms, and stft weights its
//    frames before transforming them, each step rounded on CUDA;
//  - a real bfloat16 input to a torch.fft function is converted to float32,
//    as CUDA's promotion does, and the results stay float32 / complex64;
//  - stft and istft promote nothing: bfloat16 and bcomplex32 (complex
//    bfloat16, torch 2.15) inputs are computed as float16 and complex32 are,
//    rounded back to bcomplex32 / bfloat16 as cuFFT's bfloat16 transforms
//    return them; so is a bcomplex32 input to a torch.fft function;
//  - every other input goes to the composite unchanged.
// Gradients flow through the conversions and the wider transform, with the
// dtypes CUDA's have.
//
// cuFFT computes in half (and bfloat16) precision only for signal sizes that
// are powers of two (ATen/native/cuda/CuFFTPlanCache.h) and raises otherwise;
// openreg raises the same error, at the call. The check sits where CUDA's
// does, in the transform kernels _fft_c2c, _fft_r2c and _fft_c2r (and their
// out= forms). A transform computed wider for a narrow one (above) runs in a
// TransformPrecision scope, which tells the check the precision the
// transform stands for. torch.compile traces these kernels (fake tensors
// dispatch to them as well) and runs the same way. Left as the CPU has it: a
// direct call of a transform kernel in half precision (none of the front
// ends above makes one on openreg) is refused by the CPU kernel.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <ATen/native/Resize.h>
#include <ATen/ops/fft_fft2_native.h>
#include <ATen/ops/fft_fft_native.h>
#include <ATen/ops/fft_fftn_native.h>
#include <ATen/ops/fft_hfft2_native.h>
#include <ATen/ops/fft_hfft_native.h>
#include <ATen/ops/fft_hfftn_native.h>
#include <ATen/ops/fft_ifft2_native.h>
#include <ATen/ops/fft_ifft_native.h>
#include <ATen/ops/fft_ifftn_native.h>
#include <ATen/ops/fft_ihfft2_native.h>
#include <ATen/ops/fft_ihfft_native.h>
#include <ATen/ops/fft_ihfftn_native.h>
#include <ATen/ops/fft_irfft2_native.h>
#include <ATen/ops/fft_irfft_native.h>
#include <ATen/ops/fft_irfftn_native.h>
#include <ATen/ops/fft_rfft2_native.h>
#include <ATen/ops/fft_rfft_native.h>
#include <ATen/ops/fft_rfftn_native.h>
#include <ATen/ops/istft_native.h>
#include <ATen/ops/stft_native.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"

namespace openreg {
namespace {

using c10::ScalarType;

// The precision (Half or BFloat16) the transforms running on this thread
// stand for, while a composite computes a narrow transform wider.
thread_local std::optional<ScalarType> transform_precision;

class TransformPrecision {
 public:
  explicit TransformPrecision(ScalarType precision) : saved_(transform_precision) {
    transform_precision = precision;
  }
  ~TransformPrecision() {
    transform_precision = saved_;
  }
  TransformPrecision(const TransformPrecision&) = delete;
  TransformPrecision& operator=(const TransformPrecision&) = delete;

 private:
  std::optional<ScalarType> saved_;
};

// The half precision cuFFT computes a transform of `dtype` in, if any.
std::optional<ScalarType> half_precision_of(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Half:
    case ScalarType::ComplexHalf:
      return ScalarType::Half;
    case ScalarType::BFloat16:
    case ScalarType::BComplex32:
      return ScalarType::BFloat16;
    default:
      return std::nullopt;
  }
}

bool is_power_of_two(int64_t size) {
  return (size & (size - 1)) == 0; // as cuFFT's check: 0 passes
}

// _fft_c2c / _fft_r2c / _fft_c2r (self, dim, normalization, forward |
// onesided | last_dim_size, ...): the signal is the input's sizes at `dim`,
// but a complex-to-real transform's last is the output's, last_dim_size.
void check_half_precision_signal(const c10::OperatorHandle& op, const c10::IValue* arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  const std::optional<ScalarType> precision =
      transform_precision ? transform_precision : half_precision_of(self.scalar_type());
  if (!precision) {
    return;
  }
  std::vector<int64_t> signal;
  for (const int64_t dim : arguments[1].toDimVector()) {
    signal.push_back(self.size(c10::maybe_wrap_dim(dim, self.dim())));
  }
  if (op.schema().name() == "aten::_fft_c2r" && !signal.empty()) {
    signal.back() = arguments[3].toInt();
  }
  for (const int64_t size : signal) {
    TORCH_CHECK(
        is_power_of_two(size),
        "cuFFT only supports dimensions whose sizes are powers of two when computing in ",
        *precision == ScalarType::Half ? "half" : "bfloat16",
        " precision, but got a signal size of",
        c10::IntArrayRef(signal));
  }
}

// A transform kernel: cuFFT's check, then the fallback.
void checked_transform(
    const c10::BoxedKernel& fallback,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  check_half_precision_signal(op, arguments_of(op, *stack).data());
  fallback.callBoxed(op, keys, stack);
}

// A tensor of a half-precision dtype in float32 / complex64; others as they
// are.
at::Tensor widened(const at::Tensor& t) {
  if (!half_precision_of(t.scalar_type())) {
    return t;
  }
  return t.to(t.is_complex() ? ScalarType::ComplexFloat : ScalarType::Float);
}

// `compute`'s results (computed wider, its transforms standing for ones in
// `precision`) rounded once to `precision` or its complex kin.
template <typename Compute>
at::Tensor computed_in(ScalarType precision, Compute&& compute) {
  const at::Tensor result = [&] {
    TransformPrecision in_precision(precision);
    return compute();
  }();
  return result.to(result.is_complex() ? c10::toComplexType(precision) : precision);
}

// Whether a transform takes a real input only (rfft, ihfft and their 2-D
// and n-D forms): a complex one goes to the composite as it is, whose error
// names the caller's dtype, not the wider one.
enum class Input { Real, Any };

// `transform` (a torch.fft composite on its input) computed as CUDA computes
// it for `self`'s dtype (see the Note).
template <Input input, typename Transform>
at::Tensor as_cuda_computes(const at::Tensor& self, Transform&& transform) {
  if (self.scalar_type() == ScalarType::BFloat16) {
    return transform(self.to(ScalarType::Float)); // promote_type_fft's promotion
  }
  const std::optional<ScalarType> precision = half_precision_of(self.scalar_type());
  if (!precision || (input == Input::Real && self.is_complex())) {
    return transform(self);
  }
  return computed_in(*precision, [&] { return transform(widened(self)); });
}

// stft and istft (composites that transform frames of the input, weighted by
// a window) as CUDA computes them: without promotion, so float16, bfloat16
// and their complex kin are computed wider and rounded once, the window
// widened with the input.
template <typename Transform>
at::Tensor framed_as_cuda_computes(
    const at::Tensor& self,
    const std::optional<at::Tensor>& window,
    Transform&& transform) {
  const std::optional<ScalarType> precision = half_precision_of(self.scalar_type());
  if (!precision) {
    return transform(self, window);
  }
  return computed_in(*precision, [&] {
    return transform(widened(self), window ? std::optional<at::Tensor>(widened(*window)) : std::nullopt);
  });
}

// An out= form: for the dtypes the Note widens, the result computed as above
// is written into `out` as the transforms' out= kernels write theirs (resized,
// then copied); otherwise the composite's out= form runs.
template <Input input, typename Transform, typename TransformOut>
at::Tensor& as_cuda_computes_out(
    const at::Tensor& self,
    at::Tensor& out,
    Transform&& transform,
    TransformOut&& transform_out) {
  if (self.scalar_type() != ScalarType::BFloat16 && !half_precision_of(self.scalar_type())) {
    return transform_out(self, out);
  }
  const at::Tensor result = as_cuda_computes<input>(self, std::forward<Transform>(transform));
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}

// The composites by signature: one-dimensional (n, dim), two-dimensional
// (s, dim = {-2, -1}) and n-dimensional (s, dim).
using Norm = std::optional<c10::string_view>;
using Transform1d = at::Tensor (*)(const at::Tensor&, std::optional<c10::SymInt>, int64_t, Norm);
using Transform1dOut = at::Tensor& (*)(const at::Tensor&, std::optional<c10::SymInt>, int64_t, Norm, at::Tensor&);
using Transform2d = at::Tensor (*)(const at::Tensor&, at::OptionalSymIntArrayRef, at::IntArrayRef, Norm);
using Transform2dOut =
    at::Tensor& (*)(const at::Tensor&, at::OptionalSymIntArrayRef, at::IntArrayRef, Norm, at::Tensor&);
using TransformNd = at::Tensor (*)(const at::Tensor&, at::OptionalSymIntArrayRef, at::OptionalIntArrayRef, Norm);
using TransformNdOut =
    at::Tensor& (*)(const at::Tensor&, at::OptionalSymIntArrayRef, at::OptionalIntArrayRef, Norm, at::Tensor&);

template <Input input, Transform1d composite>
at::Tensor transform_1d(const at::Tensor& self, std::optional<c10::SymInt> n, int64_t dim, Norm norm) {
  return as_cuda_computes<input>(self, [&](const at::Tensor& x) { return composite(x, n, dim, norm); });
}

template <Input input, Transform1d composite, Transform1dOut composite_out>
at::Tensor& transform_1d_out(
    const at::Tensor& self,
    std::optional<c10::SymInt> n,
    int64_t dim,
    Norm norm,
    at::Tensor& out) {
  return as_cuda_computes_out<input>(
      self, out, [&](const at::Tensor& x) { return composite(x, n, dim, norm); },
      [&](const at::Tensor& x, at::Tensor& o) -> at::Tensor& { return composite_out(x, n, dim, norm, o); });
}

template <Input input, Transform2d composite>
at::Tensor transform_2d(const at::Tensor& self, at::OptionalSymIntArrayRef s, at::IntArrayRef dim, Norm norm) {
  return as_cuda_computes<input>(self, [&](const at::Tensor& x) { return composite(x, s, dim, norm); });
}

template <Input input, Transform2d composite, Transform2dOut composite_out>
at::Tensor& transform_2d_out(
    const at::Tensor& self,
    at::OptionalSymIntArrayRef s,
    at::IntArrayRef dim,
    Norm norm,
    at::Tensor& out) {
  return as_cuda_computes_out<input>(
      self, out, [&](const at::Tensor& x) { return composite(x, s, dim, norm); },
      [&](const at::Tensor& x, at::Tensor& o) -> at::Tensor& { return composite_out(x, s, dim, norm, o); });
}

template <Input input, TransformNd composite>
at::Tensor transform_nd(const at::Tensor& self, at::OptionalSymIntArrayRef s, at::OptionalIntArrayRef dim, Norm norm) {
  return as_cuda_computes<input>(self, [&](const at::Tensor& x) { return composite(x, s, dim, norm); });
}

template <Input input, TransformNd composite, TransformNdOut composite_out>
at::Tensor& transform_nd_out(
    const at::Tensor& self,
    at::OptionalSymIntArrayRef s,
    at::OptionalIntArrayRef dim,
    Norm norm,
    at::Tensor& out) {
  return as_cuda_computes_out<input>(
      self, out, [&](const at::Tensor& x) { return composite(x, s, dim, norm); },
      [&](const at::Tensor& x, at::Tensor& o) -> at::Tensor& { return composite_out(x, s, dim, norm, o); });
}

at::Tensor stft(
    const at::Tensor& self,
    int64_t n_fft,
    std::optional<int64_t> hop_length,
    std::optional<int64_t> win_length,
    const std::optional<at::Tensor>& window,
    bool normalized,
    std::optional<bool> onesided,
    std::optional<bool> return_complex,
    std::optional<bool> align_to_window) {
  return framed_as_cuda_computes(self, window, [&](const at::Tensor& x, const std::optional<at::Tensor>& w) {
    return at::native::stft(
        x, n_fft, hop_length, win_length, w, normalized, onesided, return_complex, align_to_window);
  });
}

at::Tensor stft_center(
    const at::Tensor& self,
    int64_t n_fft,
    std::optional<int64_t> hop_length,
    std::optional<int64_t> win_length,
    const std::optional<at::Tensor>& window,
    bool center,
    c10::string_view pad_mode,
    bool normalized,
    std::optional<bool> onesided,
    std::optional<bool> return_complex,
    std::optional<bool> align_to_window) {
  return framed_as_cuda_computes(self, window, [&](const at::Tensor& x, const std::optional<at::Tensor>& w) {
    return at::native::stft(
        x, n_fft, hop_length, win_length, w, center, pad_mode, normalized, onesided, return_complex,
        align_to_window);
  });
}

at::Tensor istft(
    const at::Tensor& self,
    int64_t n_fft,
    std::optional<int64_t> hop_length,
    std::optional<int64_t> win_length,
    const std::optional<at::Tensor>& window,
    bool center,
    bool normalized,
    std::optional<bool> onesided,
    std::optional<int64_t> length,
    bool return_complex) {
  return framed_as_cuda_computes(self, window, [&](const at::Tensor& x, const std::optional<at::Tensor>& w) {
    return at::native::istft(x, n_fft, hop_length, win_length, w, center, normalized, onesided, length, return_complex);
  });
}

#define OPENREG_TRANSFORM(library, kind, name, input)                                                     \
  library.impl("fft_" #name, TORCH_FN((transform_##kind<Input::input, &at::native::fft_##name##_symint>)));  \
  library.impl(                                                                                            \
      "fft_" #name ".out",                                                                                 \
      TORCH_FN((transform_##kind##_out<                                                                    \
                Input::input, &at::native::fft_##name##_symint, &at::native::fft_##name##_symint_out>)));

void register_transforms(torch::Library& library) {
  OPENREG_TRANSFORM(library, 1d, fft, Any)
  OPENREG_TRANSFORM(library, 1d, ifft, Any)
  OPENREG_TRANSFORM(library, 1d, rfft, Real)
  OPENREG_TRANSFORM(library, 1d, irfft, Any)
  OPENREG_TRANSFORM(library, 1d, hfft, Any)
  OPENREG_TRANSFORM(library, 1d, ihfft, Real)
  OPENREG_TRANSFORM(library, 2d, fft2, Any)
  OPENREG_TRANSFORM(library, 2d, ifft2, Any)
  OPENREG_TRANSFORM(library, 2d, rfft2, Real)
  OPENREG_TRANSFORM(library, 2d, irfft2, Any)
  OPENREG_TRANSFORM(library, 2d, hfft2, Any)
  OPENREG_TRANSFORM(library, 2d, ihfft2, Real)
  OPENREG_TRANSFORM(library, nd, fftn, Any)
  OPENREG_TRANSFORM(library, nd, ifftn, Any)
  OPENREG_TRANSFORM(library, nd, rfftn, Real)
  OPENREG_TRANSFORM(library, nd, irfftn, Any)
  OPENREG_TRANSFORM(library, nd, hfftn, Any)
  OPENREG_TRANSFORM(library, nd, ihfftn, Real)
  library.impl("stft", TORCH_FN(stft));
  library.impl("stft.center", TORCH_FN(stft_center));
  library.impl("istft", TORCH_FN(istft));
}

#undef OPENREG_TRANSFORM

} // namespace

void register_half_precision_fft(KernelRegistrar& kernels) {
  if (cpu_dtypes()) {
    return; // the CPU kernels' dtypes: half-precision transforms are refused, as on the CPU
  }
  for (const char* name :
       {"_fft_c2c", "_fft_c2c.out", "_fft_r2c", "_fft_r2c.out", "_fft_c2r", "_fft_c2r.out"}) {
    kernels.fallback(name, &checked_transform);
  }
  // Kept for the life of the process: destroying a Library deregisters it.
  for (const c10::DispatchKey key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1}) {
    register_transforms(*new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__));
  }
}

} // namespace openreg
