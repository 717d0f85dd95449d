// The dtype policy (Note [Dtype policy] in dtype_policy.h): the kernels that
// check a call's dtype against the generated table, and the recording the
// table is generated from.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/ops/dtype_policy.h"

#include <array>
#include <optional>
#include <unordered_map>
#include <vector>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>

#include "torch_openreg/cpp/generated/dtype_table.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"
#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {
namespace {

using c10::ScalarType;

constexpr size_t kDtypes = static_cast<size_t>(ScalarType::NumOptions);

ffi::DtypePolicy policy() {
  static const ffi::DtypePolicy chosen = ffi::dtype_policy();
  return chosen;
}

// The generated table by op ("mm.out", as torch::Library::impl names it).
const std::unordered_map<std::string, OpRules>& rules_by_op() {
  static const auto* table = [] {
    auto* rules = new std::unordered_map<std::string, OpRules>();
    constexpr std::string_view kAten = "aten::";
    for (const DtypeRule& rule : kDtypeRules) {
      const std::string_view op = rule.op;
      (*rules)[std::string(op.substr(kAten.size()))][static_cast<size_t>(rule.dtype)] = rule.compute;
    }
    return rules;
  }();
  return *table;
}

// The call's dtype: its first tensor argument's (a factory's: none).
std::optional<ScalarType> dispatch_dtype(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  for (const c10::IValue& argument : arguments_of(op, stack)) {
    std::optional<ScalarType> dtype;
    for_each_tensor(argument, [&](const at::Tensor& t) {
      if (!dtype) {
        dtype = t.scalar_type();
      }
    });
    if (dtype) {
      return dtype;
    }
  }
  return std::nullopt;
}

// "mm" for aten::mm.out, "convolution" for aten::convolution_overrideable:
// the op as CUDA's kernel names say it, without their "_cuda".
std::string kernel_name(const c10::OperatorHandle& op) {
  std::string name = op.operator_name().name;
  const size_t colons = name.find("::");
  if (colons != std::string::npos) {
    name = name.substr(colons + 2);
  }
  constexpr std::string_view kOverrideable = "_overrideable";
  if (name.size() > kOverrideable.size() && name.ends_with(kOverrideable)) {
    name.resize(name.size() - kOverrideable.size());
  }
  return name;
}

[[noreturn]] void refuse(const c10::OperatorHandle& op, ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "\"", kernel_name(op), "_openreg\" not implemented for '", c10::toString(dtype), "'");
}

// The dtype a result of dtype `computed` comes back as, when the call ran in
// `wide` instead of `narrow`: `wide` itself, and its complex or real kin (an
// FFT of half computes complex64, which is complex32 for half), as the
// corresponding narrow dtype; any other dtype as it is.
ScalarType narrowed(ScalarType computed, ScalarType narrow, ScalarType wide) {
  if (computed == wide) {
    return narrow;
  }
  if (c10::isComplexType(wide) && c10::isComplexType(narrow) && computed == c10::toRealValueType(wide)) {
    return c10::toRealValueType(narrow);
  }
  if (c10::isFloatingType(wide) && c10::isFloatingType(narrow) && computed == c10::toComplexType(wide)) {
    return c10::toComplexType(narrow);
  }
  return computed;
}

// Whether `argument` is a dtype (ScalarType or ScalarType?).
bool names_dtype(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.real_type();
  const c10::TypePtr element = type->kind() == c10::TypeKind::OptionalType
      ? type->castRaw<c10::OptionalType>()->getElementType()
      : type;
  return element->kind() == c10::TypeKind::ScalarTypeType;
}

// Runs the call with its tensors (and dtype arguments) of dtype `narrow`
// converted to `wide` (see the Note): each result comes back in its narrowed dtype, unless an
// argument already had the result's dtype (type promotion chose it);
// arguments the op writes get the written values; a result that is such an
// argument is the argument itself.
void run_widened(
    const c10::KernelFunction& kernel,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack,
    ScalarType narrow,
    ScalarType wide) {
  const auto& schema = op.schema();
  const size_t first = stack->size() - schema.arguments().size();
  // The conversions are device work, not part of the autograd graph: the
  // call is below autograd already.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, kDtypes> argument_dtypes{};
  std::vector<std::pair<at::Tensor, at::Tensor>> written; // (argument, its widened stand-in)
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    c10::IValue& value = (*stack)[first + i];
    if (value.isInt() && value.toInt() == static_cast<int64_t>(narrow) && names_dtype(argument)) {
      value = static_cast<int64_t>(wide); // prod(..., dtype=) computes in the wide dtype too
      continue;
    }
    const c10::AliasInfo* alias = argument.alias_info();
    const bool writes = alias != nullptr && alias->isWrite();
    map_tensors(value, [&](const at::Tensor& t) {
      argument_dtypes[static_cast<size_t>(t.scalar_type())] = true;
      if (t.scalar_type() != narrow) {
        return t;
      }
      at::Tensor stand_in = t.to(wide);
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        stand_in.unsafeGetTensorImpl()->set_wrapped_number(true);
      }
      if (writes) {
        written.emplace_back(t, stand_in);
      }
      return stand_in;
    });
  }
  kernel.callBoxed(op, keys, stack);
  for (auto& [argument, stand_in] : written) {
    if (argument.sizes() != stand_in.sizes()) {
      argument.resize_(stand_in.sizes());
    }
    argument.copy_(stand_in);
  }
  const size_t results = stack->size() - schema.returns().size();
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    map_tensors((*stack)[results + i], [&](const at::Tensor& t) {
      for (const auto& [argument, stand_in] : written) {
        if (t.unsafeGetTensorImpl() == stand_in.unsafeGetTensorImpl()) {
          return argument;
        }
      }
      const ScalarType dtype = narrowed(t.scalar_type(), narrow, wide);
      return dtype == t.scalar_type() || argument_dtypes[static_cast<size_t>(t.scalar_type())] ? t : t.to(dtype);
    });
  }
}

// A kernel of an op the table names: checks each call's dtype first.
class DtypeCheckedKernel final : public c10::OperatorKernel {
 public:
  DtypeCheckedKernel(c10::KernelFunction kernel, const OpRules& rules) : kernel_(std::move(kernel)), rules_(rules) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const std::optional<ScalarType> dtype = dispatch_dtype(op, *stack);
    const std::optional<ScalarType> rule = dtype ? rules_[static_cast<size_t>(*dtype)] : std::nullopt;
    if (!rule) {
      kernel_.callBoxed(op, keys, stack);
    } else if (*rule == ScalarType::Undefined) {
      refuse(op, *dtype);
    } else {
      run_widened(kernel_, op, keys, stack, *dtype, *rule);
    }
  }

 private:
  c10::KernelFunction kernel_;
  OpRules rules_;
};

// The dtypes to try, narrowest first, when the CPU kernel refuses `dtype`:
// integers exactly (64-bit integers, then double), floating and complex
// types through their wider kin.
std::vector<ScalarType> wider_dtypes(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Bool:
      return {ScalarType::Byte, ScalarType::Long};
    case ScalarType::Byte:
    case ScalarType::Char:
    case ScalarType::Short:
    case ScalarType::Int:
    case ScalarType::UInt16:
    case ScalarType::UInt32:
      return {ScalarType::Long, ScalarType::Double};
    case ScalarType::Long:
    case ScalarType::UInt64:
      return {ScalarType::Double};
    case ScalarType::Half:
    case ScalarType::BFloat16:
    case ScalarType::Float8_e5m2:
    case ScalarType::Float8_e4m3fn:
    case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e4m3fnuz:
      return {ScalarType::Float, ScalarType::Double};
    case ScalarType::Float:
      return {ScalarType::Double};
    case ScalarType::ComplexHalf:
      return {ScalarType::ComplexFloat, ScalarType::ComplexDouble};
    case ScalarType::ComplexFloat:
      return {ScalarType::ComplexDouble};
    default:
      return {};
  }
}

// Whether `e` is a CPU kernel's refusal of `dtype`: AT_DISPATCH's message,
// or a NotImplementedError in other words that name the dtype or, for a
// complex one, complex inputs or its component type (the FFT's "Unsupported
// dtype Half", nansum's "does not support complex inputs", MKL's "MKL FFT
// doesn't support tensors of type: Half" for a ComplexHalf transform), or a
// kernel's own dtype check that names it as what it got
// (sparse_sampled_addmm's "Expected self to be a floating-point or complex
// tensor, but got BFloat16").
bool refuses(const c10::Error& e, ScalarType dtype) {
  const std::string_view what = e.what_without_backtrace();
  const std::string name = c10::toString(dtype);
  if (what.find("not implemented for '" + name + "'") != std::string_view::npos ||
      what.ends_with("but got " + name)) {
    return true;
  }
  if (dynamic_cast<const c10::NotImplementedError*>(&e) == nullptr) {
    return false;
  }
  if (what.find(name) != std::string_view::npos) {
    return true;
  }
  return c10::isComplexType(dtype) &&
      (what.find("complex") != std::string_view::npos ||
       what.find(c10::toString(c10::toRealValueType(dtype))) != std::string_view::npos);
}

// Whether the op returns a view of an argument (view_as_complex).
bool returns_view(const c10::OperatorHandle& op) {
  for (const c10::Argument& result : op.schema().returns()) {
    if (result.alias_info() != nullptr && !result.alias_info()->isWrite()) {
      return true;
    }
  }
  return false;
}

void record(const c10::OperatorHandle& op, const char* layout, ScalarType dtype, ScalarType computed) {
  ffi::record_kernel_dtype(
      c10::toString(op.operator_name()) + layout, c10::toString(dtype), c10::toString(computed));
}

// A kernel registered under OPENREG_DTYPES=record.
class RecordingKernel final : public c10::OperatorKernel {
 public:
  explicit RecordingKernel(c10::KernelFunction kernel) : kernel_(std::move(kernel)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    run_recorded(kernel_, op, keys, stack);
  }

 private:
  c10::KernelFunction kernel_;
};

// Step `index` of an op's chain of fronts: that front, with the next step
// (or, after the last front, the fallback) as its `fallback`.
class FrontStep final : public c10::OperatorKernel {
 public:
  FrontStep(const FrontChain* chain, size_t index) : chain_(chain), index_(index) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

 private:
  const FrontChain* chain_;
  size_t index_;
};

} // namespace

// An op's fronts in registration order, before the fallback under the
// policy (KernelRegistrar::fallback). Made while the library loads, read
// only afterwards; the registrar keeps it for the life of the process.
struct FrontChain {
  std::vector<FallbackFront> fronts;
  std::vector<c10::BoxedKernel> steps; // steps[i] runs fronts[i]
  c10::BoxedKernel fallback;
};

namespace {

void FrontStep::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::BoxedKernel& next = index_ + 1 < chain_->steps.size() ? chain_->steps[index_ + 1] : chain_->fallback;
  chain_->fronts[index_](next, op, keys, stack);
}

} // namespace

c10::KernelFunction fallback_kernel() {
  return c10::KernelFunction::makeFromBoxedFunction<&run_fallback_unrecorded>();
}

bool recording_dtypes() {
  return policy() == ffi::DtypePolicy::Record;
}

bool cpu_dtypes() {
  return policy() == ffi::DtypePolicy::Cpu;
}

void run_recorded(
    const c10::KernelFunction& kernel,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack,
    const char* layout) {
  const std::optional<ScalarType> dtype = dispatch_dtype(op, *stack);
  if (!dtype) {
    kernel.callBoxed(op, keys, stack);
    return;
  }
  const size_t first = stack->size() - op.schema().arguments().size();
  const torch::jit::Stack arguments(stack->begin() + first, stack->end());
  const auto restore_arguments = [&] {
    stack->resize(first);
    stack->insert(stack->end(), arguments.begin(), arguments.end());
  };
  try {
    kernel.callBoxed(op, keys, stack);
    record(op, layout, *dtype, *dtype);
    return;
  } catch (const c10::Error& e) {
    if (!refuses(e, *dtype) || returns_view(op)) {
      throw; // a view cannot be computed in another dtype
    }
    for (ScalarType wide : wider_dtypes(*dtype)) {
      restore_arguments();
      try {
        run_widened(kernel, op, keys, stack, *dtype, wide);
        record(op, layout, *dtype, wide);
        return;
      } catch (const c10::Error& wider) {
        if (!refuses(wider, wide)) {
          throw;
        }
      }
    }
    throw;
  }
}

const OpRules* dtype_rules(const std::string& name) {
  if (policy() != ffi::DtypePolicy::Cuda) {
    return nullptr;
  }
  const auto found = rules_by_op().find(name);
  return found == rules_by_op().end() ? nullptr : &found->second;
}

c10::BoxedKernel dtype_checked(c10::KernelFunction kernel, const OpRules& rules) {
  return c10::BoxedKernel::makeFromFunctor(std::make_unique<DtypeCheckedKernel>(std::move(kernel), rules));
}

void KernelRegistrar::impl_boxed(const std::string& name, c10::KernelFunction kernel) {
  if (recording_dtypes()) {
    aten_.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<RecordingKernel>(kernel)));
  } else {
    aten_.impl(name.c_str(), torch::CppFunction::makeFromBoxedKernel(dtype_checked(std::move(kernel), *dtype_rules(name))));
  }
}

c10::BoxedKernel KernelRegistrar::fallback_under_policy(const std::string& name) {
  if (recording_dtypes()) {
    return c10::BoxedKernel::makeFromFunctor(std::make_unique<RecordingKernel>(fallback_kernel()));
  }
  if (const OpRules* rules = dtype_rules(name)) {
    return dtype_checked(fallback_kernel(), *rules);
  }
  return c10::BoxedKernel::makeFromFunction<&run_fallback>();
}

void KernelRegistrar::fallback(const std::string& name) {
  aten_.impl(name.c_str(), torch::CppFunction::makeFromBoxedKernel(fallback_under_policy(name)));
}

void KernelRegistrar::fallback(const std::string& name, FallbackFront front) {
  auto [found, first] = fronts_.try_emplace(name, std::make_shared<FrontChain>());
  FrontChain& chain = *found->second;
  chain.fronts.push_back(front);
  chain.steps.push_back(c10::BoxedKernel::makeFromFunctor(std::make_unique<FrontStep>(&chain, chain.fronts.size() - 1)));
  if (first) {
    chain.fallback = fallback_under_policy(name);
    aten_.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FrontStep>(&chain, 0)));
  }
}

void KernelRegistrar::finish() {
  if (policy() != ffi::DtypePolicy::Cuda) {
    return;
  }
  for (const auto& [name, rules] : rules_by_op()) {
    if (name.find('/') != std::string::npos) {
      continue; // a sparse kernel's (Note [Sparse dtype rules]): fallback.cpp registers it
    }
    if (!aten_op(name).hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      fallback(name); // served by the backend fallback until now
    }
  }
}

c10::OperatorHandle aten_op(const std::string& name) {
  const size_t dot = name.find('.');
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      ("aten::" + name.substr(0, dot)).c_str(), dot == std::string::npos ? "" : name.substr(dot + 1).c_str());
}

} // namespace openreg
