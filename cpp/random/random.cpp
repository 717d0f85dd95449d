// Native random kernels. Each reserves its draws from the generator on the
// host, at launch (Note [Philox offsets] in src/runtime/generator.rs), then fills a
// contiguous float32/float64/int64 buffer in Rust as a kernel on the current
// stream (Note [Philox draw layout]). A tensor of another dtype or layout
// gets a contiguous temporary that the same kernel copies in.
//
// Factories (rand, randn, randint, *_like, normal.float_float, bernoulli)
// decompose into empty + these in-place kernels; dropout reaches
// native_dropout; multinomial and the functional normal overloads compose
// them with ordinary device ops.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include <cmath>

#include <ATen/ExpandUtils.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/DistributionTemplates.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/view_as_real.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_openreg/cpp/checked.h"
#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/dtype_policy.h"
#include "torch_openreg/cpp/random/generator.h"

namespace openreg {
namespace {

using Gen = std::optional<at::Generator>;

c10::ScalarType native_dtype(ffi::RandomElement element) {
  switch (element) {
    case ffi::RandomElement::F32:
      return c10::kFloat;
    case ffi::RandomElement::F64:
      return c10::kDouble;
    default:
      return c10::kLong;
  }
}

// The buffer type a float distribution is drawn in for `self`: float64
// tensors get 53-bit uniforms, every other dtype float32's 24 bits.
ffi::RandomElement float_element(const at::Tensor& self) {
  return self.scalar_type() == c10::kDouble ? ffi::RandomElement::F64 : ffi::RandomElement::F32;
}

void check_floating(const at::Tensor& self, const char* op) {
  TORCH_CHECK(
      c10::isFloatingType(self.scalar_type()), op, " expects a floating point openreg tensor, but got ",
      self.scalar_type());
}

// Fills `self` with `fill`; see the file comment.
at::Tensor& generate(at::Tensor& self, const ffi::RandomFill& fill, const Gen& gen) {
  TORCH_CHECK(self.is_privateuseone(), "expected an openreg tensor, got one on ", self.device());
  c10::DeviceGuard guard(self.device());
  const ffi::Generator& state = generator_state(gen, self.device());
  const int64_t numel = self.numel();
  // Validates the parameters even for an empty tensor.
  const ffi::RandomSlice slice = checked([&] { return ffi::reserve_random(state, fill, numel); });
  if (numel == 0) {
    return self;
  }
  const c10::ScalarType dtype = native_dtype(fill.element);
  const bool direct = self.scalar_type() == dtype && self.is_contiguous();
  at::Tensor buffer = direct ? self : at::empty({numel}, self.options().dtype(dtype));
  launch(
      self.device().index(),
      [self = kernel_operand(self), buffer = kernel_operand(buffer), fill, slice, numel, direct] {
        checked([&] {
          ffi::random_fill(reinterpret_cast<uintptr_t>(buffer.data_ptr()), numel, fill, slice);
        });
        if (!direct) {
          self.copy_(buffer.view(self.sizes()));
        }
      },
      launch_mode_for(numel),
      KernelInfo("random fill", {}, {self}));
  return self;
}

at::Tensor& generate_float(at::Tensor& self, ffi::RandomKind kind, double a, double b, const Gen& gen) {
  return generate(self, ffi::RandomFill{kind, float_element(self), a, b, 0, 0}, gen);
}

// Complex tensors are filled as PyTorch fills them: their real view, real
// and imaginary parts drawn alike; a complex normal's variance is split
// evenly between the two parts.
at::Tensor& uniform_(at::Tensor& self, double from, double to, Gen gen) {
  if (self.is_complex()) {
    at::Tensor parts = at::view_as_real(self);
    generate_float(parts, ffi::RandomKind::Uniform, from, to, gen);
    return self;
  }
  check_floating(self, "uniform_");
  return generate_float(self, ffi::RandomKind::Uniform, from, to, gen);
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, Gen gen) {
  if (self.is_complex()) {
    at::Tensor parts = at::view_as_real(self);
    generate_float(parts, ffi::RandomKind::Normal, mean, std / std::sqrt(2.0), gen);
    return self;
  }
  check_floating(self, "normal_");
  return generate_float(self, ffi::RandomKind::Normal, mean, std, gen);
}

at::Tensor& log_normal_(at::Tensor& self, double mean, double std, Gen gen) {
  check_floating(self, "log_normal_");
  // log_normal_impl_'s check (aten/src/ATen/native/DistributionTemplates.h), at the call.
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  return generate_float(self, ffi::RandomKind::LogNormal, mean, std, gen);
}

at::Tensor& exponential_(at::Tensor& self, double lambda, Gen gen) {
  check_floating(self, "exponential_");
  return generate_float(self, ffi::RandomKind::Exponential, lambda, 0, gen);
}

at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, Gen gen) {
  check_floating(self, "cauchy_");
  return generate_float(self, ffi::RandomKind::Cauchy, median, sigma, gen);
}

// Integral results are fine here (the number of trials).
at::Tensor& geometric_(at::Tensor& self, double p, Gen gen) {
  return generate_float(self, ffi::RandomKind::Geometric, p, 0, gen);
}

at::Tensor& bernoulli_scalar(at::Tensor& self, double p, Gen gen) {
  return generate_float(self, ffi::RandomKind::Bernoulli, p, 0, gen);
}

// self[i] = u[i] < p[i] for uniforms u; p broadcasts to self.
at::Tensor& bernoulli_tensor(at::Tensor& self, const at::Tensor& p, Gen gen) {
  TORCH_CHECK(
      p.device() == self.device() || (p.is_cpu() && p.dim() == 0),
      "bernoulli_: expected p on ", self.device(), ", but got p on ", p.device());
  TORCH_CHECK(c10::isFloatingType(p.scalar_type()), "bernoulli_ expects p to be floating point, got ", p.scalar_type());
  c10::DeviceGuard guard(self.device());
  TORCH_CHECK(
      p.ge(0).logical_and(p.le(1)).all().item<bool>(),
      "bernoulli_ expects every probability in p to be in [0, 1]");
  at::Tensor u = at::empty(self.sizes(), self.options().dtype(p.scalar_type() == c10::kDouble ? c10::kDouble : c10::kFloat));
  generate_float(u, ffi::RandomKind::Uniform, 0, 1, gen);
  launch(
      self.device().index(),
      [self = kernel_operand(self), u = kernel_operand(u), p = kernel_operand(p)]() mutable {
        at::lt_out(self, u, p);
      },
      launch_mode_for(self.numel()),
      KernelInfo("aten::bernoulli_", {u, p}, {self}));
  return self;
}

// Note [random_ ranges]: random_, random_(to) and random_(from, to) run
// PyTorch's own front ends (random_impl and random_from_to_impl in
// ATen/native/DistributionTemplates.h, which CPU's and CUDA's kernels share):
// they check `from` and `to` against the dtype, move a floating range's ends
// to values the dtype holds, return early for an empty tensor, and hand the
// kernels below a range [base, base + range) (a range of 0 stands for 2^64).
// The kernels accept the dtypes CUDA's do (aten/src/ATen/native/cuda/
// DistributionTemplates.h), with their errors in openreg's spelling:
//  - random_from_to_kernel: every integral dtype and bool, uint16/uint32/
//    uint64 included (so torch.randint and make_tensor draw them), float32,
//    float64, float16 and bfloat16 (not the float8 dtypes, which the front
//    end refuses first);
//  - random_kernel (`random_()`: [0, 2^digits] for floating dtypes, every
//    integer the mantissa holds exactly, [0, max] for integral ones): not
//    uint16/uint32/uint64, NotImplementedError;
//  - random_full_64_bits_range_kernel (`random_(INT64_MIN, None)`): int64,
//    float64, float32 and bfloat16, RuntimeError for the other dtypes it
//    dispatches, NotImplementedError for the rest.
// Each draws int64s from the openreg generator (Note [Philox draw layout])
// and converts them to the tensor's dtype, as CUDA's transformations do.

// The largest value `random_()` draws for `dtype`; the dtypes CUDA's
// random_kernel does not dispatch are refused.
int64_t max_value(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kBool:
      return 1;
    case c10::kByte:
      return 255;
    case c10::kChar:
      return 127;
    case c10::kShort:
      return 32767;
    case c10::kInt:
      return 2147483647;
    case c10::kLong:
      return std::numeric_limits<int64_t>::max();
    case c10::kHalf:
      return int64_t{1} << 11;
    case c10::kBFloat16:
      return int64_t{1} << 8;
    case c10::kFloat:
      return int64_t{1} << 24;
    case c10::kDouble:
      return int64_t{1} << 53;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "\"random_kernel_openreg\" not implemented for '", dtype, "'");
  }
}

at::Tensor& random_integers(at::Tensor& self, int64_t from, uint64_t range, Gen gen) {
  return generate(self, ffi::RandomFill{ffi::RandomKind::Integers, ffi::RandomElement::I64, 0, 0, from, range}, gen);
}

// The kernels PyTorch's front ends call. They are templates on a generator
// type, as the front ends expect (one instantiation per generator class);
// openreg has one generator, so `Unused` is not read.
template <typename Unused>
struct RandomKernel {
  // [0, max_value]; AT_DISPATCH_ALL_TYPES_AND3(Half, BFloat16, Bool).
  void operator()(at::TensorIteratorBase& iter, Gen gen) {
    at::Tensor self = iter.tensor(0);
    random_integers(self, 0, static_cast<uint64_t>(max_value(self.scalar_type())) + 1, gen);
  }
};

template <typename Unused>
struct RandomFromToKernel {
  // [base, base + range), a range of 0 standing for 2^64; AT_ALL_TYPES, bool,
  // half, bfloat16 and uint16/uint32/uint64.
  void operator()(at::TensorIteratorBase& iter, uint64_t range, int64_t base, Gen gen) {
    at::Tensor self = iter.tensor(0);
    const c10::ScalarType dtype = self.scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(
        is_all_types(dtype) || dtype == c10::kBool || dtype == c10::kHalf || dtype == c10::kBFloat16 ||
            dtype == c10::kUInt16 || dtype == c10::kUInt32 || dtype == c10::kUInt64,
        "\"random_from_to_kernel_openreg\" not implemented for '", dtype, "'");
    random_integers(self, base, range, gen);
  }

  // [INT64_MIN, INT64_MAX]; AT_DISPATCH_ALL_TYPES_AND(BFloat16), of which
  // only int64, float64, float32 and bfloat16 draw.
  void operator()(at::TensorIteratorBase& iter, Gen gen) {
    at::Tensor self = iter.tensor(0);
    const c10::ScalarType dtype = self.scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(
        is_all_types(dtype) || dtype == c10::kBFloat16,
        "\"random_full_64_bits_range_kernel_openreg\" not implemented for '", dtype, "'");
    TORCH_CHECK(
        dtype == c10::kLong || dtype == c10::kDouble || dtype == c10::kFloat || dtype == c10::kBFloat16,
        "random_full_64_bits_range_kernel_openreg handles only int64, double, float and bfloat16");
    random_integers(self, std::numeric_limits<int64_t>::min(), 0, gen);
  }
};

at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to, Gen gen) {
  return at::native::templates::random_from_to_impl<RandomFromToKernel, void>(self, from, to, std::move(gen));
}

at::Tensor& random_to(at::Tensor& self, int64_t to, Gen gen) {
  return random_from(self, 0, to, std::move(gen));
}

at::Tensor& random_(at::Tensor& self, Gen gen) {
  return at::native::templates::random_impl<RandomKernel, void>(self, std::move(gen));
}

at::Tensor& randperm_out(int64_t n, Gen gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  TORCH_CHECK(out.is_privateuseone(), "randperm: expected an openreg out tensor, got one on ", out.device());
  c10::DeviceGuard guard(out.device());
  out.resize_({n});
  const ffi::RandomSlice slice =
      checked([&] { return ffi::reserve_randperm(generator_state(gen, out.device()), static_cast<uint64_t>(n)); });
  if (n == 0) {
    return out;
  }
  const bool direct = out.scalar_type() == c10::kLong && out.is_contiguous();
  at::Tensor buffer = direct ? out : at::empty({n}, out.options().dtype(c10::kLong));
  launch(
      out.device().index(),
      [out = kernel_operand(out), buffer = kernel_operand(buffer), slice, n, direct] {
        ffi::random_permutation(reinterpret_cast<uintptr_t>(buffer.data_ptr()), static_cast<size_t>(n), slice);
        if (!direct) {
          out.copy_(buffer);
        }
      },
      ffi::LaunchMode::Queue, // serial: never on the caller's thread
      KernelInfo("aten::randperm", {}, {out}));
  return out;
}

// multinomial_out's checks of its arguments' metadata, in its order and
// words (Distributions.cpp, shared by CPU and CUDA): they run at the call,
// before anything reads the probabilities.
void check_multinomial(const at::Tensor& self, int64_t n, bool replacement, const at::Tensor& out) {
  TORCH_CHECK(out.device() == self.device(), "multinomial arguments must have the same device");
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(c10::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  TORCH_CHECK(out.scalar_type() == c10::kLong, "multinomial expects Long tensor out, got: ", out.scalar_type());
  TORCH_CHECK(n > 0, "cannot sample n_sample <= 0 samples");
  const int64_t categories = self.size(-1);
  TORCH_CHECK(replacement || n <= categories,
              "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  // The largest consecutive integer a float32 holds: CUDA's kernels index
  // categories through float.
  constexpr int64_t kFloat32ConsecutiveInts = int64_t{1} << 24;
  TORCH_CHECK(categories <= kFloat32ConsecutiveInts, "number of categories cannot exceed 2^24");
}

// As PyTorch's: without replacement (or for one sample) the largest keys
// p / q with q ~ Exp(1) (exponential races); with replacement an inverse-CDF
// lookup of uniforms. `self` passed check_multinomial.
at::Tensor sample_multinomial(const at::Tensor& self, int64_t n, bool replacement, Gen gen) {
  const int64_t categories = self.size(-1);
  c10::DeviceGuard guard(self.device());
  TORCH_CHECK(
      !self.lt(0).logical_or(self.isinf()).logical_or(self.isnan()).any().item<bool>(),
      "probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(self.sum(-1).gt(0).all().item<bool>(), "invalid multinomial distribution (sum of probabilities <= 0)");
  if (!replacement || n == 1) {
    at::Tensor q = at::empty_like(self);
    exponential_(q, 1, gen);
    at::Tensor keys = self / q;
    return n == 1 ? keys.argmax(-1, /*keepdim=*/true) : std::get<1>(keys.topk(n));
  }
  at::Tensor cdf = self.to(c10::kDouble).cumsum(-1);
  cdf = cdf / cdf.narrow(-1, categories - 1, 1);
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  shape.back() = n;
  at::Tensor u = at::empty(shape, self.options().dtype(c10::kDouble));
  uniform_(u, 0, 1, gen);
  return at::searchsorted(cdf, u, /*out_int32=*/false, /*right=*/true).clamp_max_(categories - 1);
}

at::Tensor& multinomial_out(const at::Tensor& self, int64_t n, bool replacement, Gen gen, at::Tensor& out) {
  check_multinomial(self, n, replacement, out);
  out.resize_(self.dim() == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{self.size(0), n});
  if (out.numel() == 0) {
    return out;
  }
  return out.copy_(sample_multinomial(self, n, replacement, gen));
}

at::Tensor multinomial(const at::Tensor& self, int64_t n, bool replacement, Gen gen) {
  at::Tensor out = at::empty({0}, self.options().dtype(c10::kLong));
  return multinomial_out(self, n, replacement, gen, out);
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  c10::DeviceGuard guard(input.device());
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(c10::kBool))};
  }
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  bernoulli_scalar(mask, 1 - p, std::nullopt);
  const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  return {input * mask * scale, mask};
}

void check_std(const at::Tensor& std) {
  TORCH_CHECK(!std.lt(0).any().item<bool>(), "normal expects all elements of std >= 0.0");
}

at::Tensor normal_tensor_float(const at::Tensor& mean, double std, Gen gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  c10::DeviceGuard guard(mean.device());
  at::Tensor out = at::empty_like(mean, at::MemoryFormat::Contiguous);
  normal_(out, 0, std, gen);
  return out.add_(mean);
}

at::Tensor normal_float_tensor(double mean, const at::Tensor& std, Gen gen) {
  c10::DeviceGuard guard(std.device());
  check_std(std);
  at::Tensor out = at::empty_like(std, at::MemoryFormat::Contiguous);
  normal_(out, 0, 1, gen);
  return out.mul_(std).add_(mean);
}

at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std, Gen gen) {
  c10::DeviceGuard guard(mean.device());
  check_std(std);
  at::Tensor out = at::empty(at::infer_size(mean.sizes(), std.sizes()), mean.options());
  normal_(out, 0, 1, gen);
  return out.mul_(std).add_(mean);
}

} // namespace

void register_random(KernelRegistrar& kernels) {
  kernels.impl("uniform_", TORCH_FN(uniform_));
  kernels.impl("normal_", TORCH_FN(normal_));
  kernels.impl("log_normal_", TORCH_FN(log_normal_));
  kernels.impl("exponential_", TORCH_FN(exponential_));
  kernels.impl("cauchy_", TORCH_FN(cauchy_));
  kernels.impl("geometric_", TORCH_FN(geometric_));
  kernels.impl("bernoulli_.float", TORCH_FN(bernoulli_scalar));
  kernels.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor));
  kernels.impl("random_", TORCH_FN(random_));
  kernels.impl("random_.to", TORCH_FN(random_to));
  kernels.impl("random_.from", TORCH_FN(random_from));
  kernels.impl("randperm.generator_out", TORCH_FN(randperm_out));
  kernels.impl("multinomial", TORCH_FN(multinomial));
  kernels.impl("multinomial.out", TORCH_FN(multinomial_out));
  kernels.impl("native_dropout", TORCH_FN(native_dropout));
  kernels.impl("normal.Tensor_float", TORCH_FN(normal_tensor_float));
  kernels.impl("normal.float_Tensor", TORCH_FN(normal_float_tensor));
  kernels.impl("normal.Tensor_Tensor", TORCH_FN(normal_tensor_tensor));
}

} // namespace openreg
