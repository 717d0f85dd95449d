// See meta_results.h (Note [Meta results]).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/ops/meta_results.h"

#include <bit>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

#include "torch_openreg/cpp/backend.h"
#include "torch_openreg/cpp/device/device_memory.h"
#include "torch_openreg/cpp/ops/ivalue_tensors.h"
#include "torch_openreg/cpp/ops/meta_kernels.h"
#include "torch_openreg/cpp/ops/sparse_tensors.h"

namespace openreg {
namespace {

// Ops whose Meta kernels cannot know their output shape (it depends on the
// data: they raise, or guess an upper bound).
bool has_data_dependent_shape(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::nonzero",   "aten::nonzero_numpy", "aten::masked_select",   "aten::unique_consecutive",
      "aten::_unique",   "aten::_unique2",      "aten::unique_dim",      "aten::unique_dim_consecutive",
      "aten::bincount",  "aten::histc",         "aten::repeat_interleave", "aten::_assert_async",
  };
  return ops.count(name.name) != 0;
}

bool is_generator(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return type->kind() == c10::TypeKind::GeneratorType;
}

bool is_tensor_like(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  if (type->kind() == c10::TypeKind::ListType) {
    return type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return type->kind() == c10::TypeKind::TensorType;
}

// Whether `op`'s results may be planned at all, by its schema and kernels.
bool plannable(const c10::OperatorHandle& op) {
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta) || has_data_dependent_shape(op.operator_name())) {
    return false;
  }
  const auto& schema = op.schema();
  return std::all_of(schema.returns().begin(), schema.returns().end(), [](const c10::Argument& r) {
           return is_tensor_like(r.type());
         }) &&
      std::none_of(schema.arguments().begin(), schema.arguments().end(), [](const c10::Argument& a) {
           return is_generator(a.type());
         });
}

} // namespace

bool results_depend_on_data(const c10::OperatorHandle& op) {
  const auto& returns = op.schema().returns();
  return has_data_dependent_shape(op.operator_name()) ||
      !std::all_of(returns.begin(), returns.end(), [](const c10::Argument& r) { return is_tensor_like(r.type()); });
}

namespace {

// The openreg tensor arguments of a call, in stack order (lists flattened).
using OpenregTensors = c10::SmallVector<at::Tensor, 8>;

OpenregTensors openreg_tensors(c10::ArrayRef<c10::IValue> arguments) {
  OpenregTensors tensors;
  for (const c10::IValue& value : arguments) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (t.is_privateuseone()) {
        tensors.push_back(t);
      }
    });
  }
  return tensors;
}

// The cache key of a call: everything a Meta kernel can read. False if an
// argument is of a kind the key cannot hold (the call is planned uncached).
// A lookup encodes one on every planned call, so it lives on the stack: the
// words of a call of a few tensors, and its storages, fit inline.
class Key {
 public:
  bool encode(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
    words_.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&op.schema())));
    words_.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
    for (const c10::IValue& value : arguments) {
      if (!encode(value)) {
        return false;
      }
    }
    return true;
  }

  bool operator==(const Key& other) const {
    return words_ == other.words_;
  }

  size_t hash() const {
    size_t h = words_.size();
    for (int64_t w : words_) {
      h ^= std::hash<int64_t>{}(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }

 private:
  enum Tag : int64_t { kNone = 1, kTensor, kUndefined, kTensorList, kOptionalTensorList, kInt, kDouble, kBool,
                       kComplex, kIntList, kDoubleList, kBoolList, kString, kDevice, kSparse };

  bool encode(const c10::IValue& value) {
    if (value.isNone()) {
      words_.push_back(kNone);
    } else if (value.isTensor()) {
      encode(value.toTensor());
    } else if (value.isTensorList()) {
      words_.push_back(kTensorList);
      words_.push_back(static_cast<int64_t>(value.toTensorList().size()));
      for (const at::Tensor& t : value.toTensorList()) {
        encode(t);
      }
    } else if (is_optional_tensor_list(value)) {
      words_.push_back(kOptionalTensorList);
      words_.push_back(static_cast<int64_t>(value.toListRef().size()));
      for (const c10::IValue& t : value.toListRef()) {
        encode(t.isTensor() ? t.toTensor() : at::Tensor());
      }
    } else if (value.isInt()) {
      push(kInt, value.toInt());
    } else if (value.isDouble()) {
      push(kDouble, std::bit_cast<int64_t>(value.toDouble()));
    } else if (value.isBool()) {
      push(kBool, value.toBool());
    } else if (value.isComplexDouble()) {
      const c10::complex<double> z = value.toComplexDouble();
      push(kComplex, std::bit_cast<int64_t>(z.real()));
      words_.push_back(std::bit_cast<int64_t>(z.imag()));
    } else if (value.isIntList()) {
      push(kIntList, static_cast<int64_t>(value.toIntList().size()));
      for (int64_t i : value.toIntList()) {
        words_.push_back(i);
      }
    } else if (value.isDoubleList()) {
      push(kDoubleList, static_cast<int64_t>(value.toDoubleList().size()));
      for (double d : value.toDoubleList()) {
        words_.push_back(std::bit_cast<int64_t>(d));
      }
    } else if (value.isBoolList()) {
      push(kBoolList, static_cast<int64_t>(value.toBoolList().size()));
      for (bool b : value.toBoolList()) {
        words_.push_back(b);
      }
    } else if (value.isString()) {
      const std::string& s = value.toStringRef();
      push(kString, static_cast<int64_t>(s.size()));
      for (char c : s) {
        words_.push_back(c);
      }
    } else if (value.isDevice()) {
      push(kDevice, static_cast<int64_t>(value.toDevice().type()));
      words_.push_back(value.toDevice().index());
    } else {
      return false;
    }
    return true;
  }

  void encode(const at::Tensor& t) {
    if (!t.defined()) {
      words_.push_back(kUndefined);
      return;
    }
    if (is_sparse_any(t)) { // its structure, then its members
      push(kSparse, static_cast<int64_t>(t.layout()));
      words_.push_back(static_cast<int64_t>(t.device().type()));
      words_.push_back(t.device().index());
      words_.push_back(static_cast<int64_t>(t.scalar_type()));
      words_.push_back(is_sparse_coo(t) && coalesced_flag(t));
      words_.push_back(t.dim());
      words_.insert(words_.end(), t.sizes().begin(), t.sizes().end());
      for (const at::Tensor& member : sparse_members(t)) {
        encode(member);
      }
      return;
    }
    push(kTensor, static_cast<int64_t>(t.device().type()));
    words_.push_back(t.device().index());
    words_.push_back(static_cast<int64_t>(t.scalar_type()));
    words_.push_back(t.unsafeGetTensorImpl()->is_wrapped_number() | t.is_conj() << 1 | t.is_neg() << 2);
    words_.push_back(t.dim());
    words_.insert(words_.end(), t.sizes().begin(), t.sizes().end());
    words_.insert(words_.end(), t.strides().begin(), t.strides().end());
    words_.push_back(t.storage_offset());
    // Aliasing: the first tensor of this call with the same memory.
    const c10::StorageImpl* storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    auto first = std::find(storages_.begin(), storages_.end(), storage);
    words_.push_back(static_cast<int64_t>(first - storages_.begin()));
    if (first == storages_.end()) {
      storages_.push_back(storage);
    }
  }

  void push(Tag tag, int64_t value) {
    words_.push_back(tag);
    words_.push_back(value);
  }

  c10::SmallVector<int64_t, 48> words_;
  // The call's distinct storages, in order of first appearance.
  c10::SmallVector<const c10::StorageImpl*, 8> storages_;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    return key.hash();
  }
};

// One planned result tensor.
struct PlannedTensor {
  enum class Kind : uint8_t { Undefined, New, Argument, ViewOfArgument };
  Kind kind = Kind::Undefined;
  size_t argument = 0; // index into openreg_tensors(arguments)
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
};

// One return of the op: a tensor, a list of tensors, or None.
struct PlannedReturn {
  enum class Kind : uint8_t { Tensor, TensorList, None };
  Kind kind = Kind::None;
  std::vector<PlannedTensor> tensors;
};

using Plan = std::vector<PlannedReturn>;
// Shared by the cache and its lookups: a lookup does not copy the plan.
using SharedPlan = std::shared_ptr<const Plan>;

// The plan of an op's returns `results`, each tensor planned by
// `plan_tensor` (nullopt: that tensor cannot be planned); nullopt if some
// return cannot be.
template <typename PlanTensor>
std::optional<Plan> plan_returns(c10::ArrayRef<c10::IValue> results, PlanTensor&& plan_tensor) {
  Plan plan;
  for (const c10::IValue& value : results) {
    PlannedReturn planned;
    if (value.isTensor()) {
      planned.kind = PlannedReturn::Kind::Tensor;
      std::optional<PlannedTensor> t = plan_tensor(value.toTensor());
      if (!t) {
        return std::nullopt;
      }
      planned.tensors.push_back(std::move(*t));
    } else if (value.isTensorList()) {
      planned.kind = PlannedReturn::Kind::TensorList;
      for (const at::Tensor& r : value.toTensorList()) {
        std::optional<PlannedTensor> t = plan_tensor(r);
        if (!t) {
          return std::nullopt;
        }
        planned.tensors.push_back(std::move(*t));
      }
    } else if (!value.isNone()) {
      return std::nullopt;
    }
    plan.push_back(std::move(planned));
  }
  return plan;
}

// Runs the Meta kernel on stand-ins of `arguments`; nullopt if it fails.
std::optional<Plan> plan_with_meta_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  std::unordered_map<c10::StorageImpl*, c10::Storage> storages;
  std::vector<at::Tensor> stand_ins; // in openreg_tensors order
  const auto stand_in = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.is_privateuseone()) {
      return t;
    }
    auto [it, inserted] = storages.try_emplace(t.storage().unsafeGetStorageImpl());
    if (inserted) {
      it->second = c10::Storage(
          c10::Storage::use_byte_size_t(), t.storage().nbytes(), c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
          c10::GetAllocator(c10::kMeta), /*resizable=*/true);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    stand_ins.emplace_back(std::move(impl));
    return stand_ins.back();
  };
  torch::jit::Stack stack(arguments.begin(), arguments.end());
  for (c10::IValue& value : stack) {
    retarget_device(value, c10::kMeta);
    map_tensors(value, stand_in);
  }
  // The Meta kernel only plans: the op's warnings are the CPU kernel's
  // (Note [Kernel warnings] in device_memory.h).
  struct DiscardWarnings final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } discard;
  c10::WarningUtils::WarningHandlerGuard no_warnings(&discard);
  try {
    const c10::DispatchKeySet meta(c10::DispatchKey::Meta);
    if (const c10::KernelFunction* cxx = cxx_meta_kernel_for(op)) {
      cxx->callBoxed(op, meta, &stack); // Note [C++ Meta kernels]
    } else {
      op.redispatchBoxed(meta, &stack);
    }
  } catch (const std::exception&) {
    return std::nullopt; // the CPU kernel, run instead, raises its own error
  }

  const auto plan_tensor = [&](const at::Tensor& result) -> std::optional<PlannedTensor> {
    PlannedTensor planned;
    if (!result.defined()) {
      return planned;
    }
    if (result.layout() != c10::kStrided) {
      return std::nullopt; // a sparse result is not planned: its size may depend on the data
    }
    planned.dtype = result.scalar_type();
    planned.sizes = result.sizes().vec();
    planned.strides = result.strides().vec();
    planned.storage_offset = result.storage_offset();
    planned.kind = PlannedTensor::Kind::New;
    for (size_t i = 0; i < stand_ins.size(); ++i) {
      if (result.unsafeGetTensorImpl() == stand_ins[i].unsafeGetTensorImpl()) {
        planned.kind = PlannedTensor::Kind::Argument;
        planned.argument = i;
        return planned;
      }
    }
    for (size_t i = 0; i < stand_ins.size(); ++i) {
      if (result.storage().unsafeGetStorageImpl() == stand_ins[i].storage().unsafeGetStorageImpl()) {
        planned.kind = PlannedTensor::Kind::ViewOfArgument;
        planned.argument = i;
        return planned;
      }
    }
    return planned;
  };
  return plan_returns(stack, plan_tensor);
}

} // namespace

// A plan not yet confirmed by the CPU kernel (see check_plan).
struct PlanToCheck {
  Key key;
  SharedPlan plan; // null: a plan to learn from the results (Note [Sparse plans])
  c10::OperatorName op;
  OpenregTensors arguments; // for a plan to learn: the call's openreg tensors
};

namespace {

// Plans by op: whether an op may be planned; plans by key, each trusted only
// once the CPU kernel, run for the same key, gave results of the planned
// dtypes and shapes (some Meta kernels size an output differently from the
// CPU kernel: native_batch_norm's saved statistics in eval mode). Bounded: a
// process with ever-changing shapes starts over rather than growing.
class PlanCache {
 public:
  enum class State : uint8_t { Unchecked, Usable, Unusable };

  // A checked plan, or null; `to_check` gets a plan that needs checking
  // (with `accept_unchecked`, that plan is returned instead).
  SharedPlan find(
      const c10::OperatorHandle& op,
      c10::ArrayRef<c10::IValue> arguments,
      std::shared_ptr<PlanToCheck>& to_check,
      bool accept_unchecked) {
    if (!is_plannable(op)) {
      return nullptr;
    }
    Key key;
    if (!key.encode(op, arguments)) {
      return nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = plans_.find(key);
      if (found != plans_.end()) {
        if (found->second.second == State::Usable ||
            (accept_unchecked && found->second.second == State::Unchecked)) {
          return found->second.first;
        }
        if (found->second.second == State::Unchecked) {
          to_check = std::make_shared<PlanToCheck>(PlanToCheck{std::move(key), found->second.first, op.operator_name(), {}});
        }
        return nullptr;
      }
    }
    std::optional<Plan> made = plan_with_meta_kernel(op, arguments);
    SharedPlan planned = made ? std::make_shared<const Plan>(std::move(*made)) : nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= kMaxPlans) {
      plans_.clear();
    }
    if (planned) {
      to_check = std::make_shared<PlanToCheck>(PlanToCheck{key, planned, op.operator_name(), {}});
    }
    plans_.emplace(std::move(key), std::make_pair(planned, planned ? State::Unchecked : State::Unusable));
    if (planned && accept_unchecked) {
      to_check = nullptr;
      return planned;
    }
    return nullptr;
  }

  bool is_plannable(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [judged, inserted] = plannable_.try_emplace(&op.schema(), false);
    if (inserted) {
      judged->second = plannable(op);
    }
    return judged->second;
  }

  // `relaid`: the plan as the CPU kernel laid its results out, to use
  // from now on instead of the Meta kernel's.
  void settle(const Key& key, bool usable, SharedPlan relaid = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(key);
    if (found != plans_.end() && found->second.second == State::Unchecked) {
      found->second.second = usable ? State::Usable : State::Unusable;
      if (relaid) {
        found->second.first = std::move(relaid);
      }
    }
  }

  // An op whose Meta kernel planned what its CPU kernel did not compute.
  void disagreed(const c10::OperatorName& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    disagreeing_.insert(op.name);
  }

  bool agrees(const c10::OperatorName& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    return disagreeing_.count(op.name) == 0;
  }

 private:
  static constexpr size_t kMaxPlans = 16384;
  std::mutex mutex_;
  std::unordered_map<const c10::FunctionSchema*, bool> plannable_;
  std::unordered_map<Key, std::pair<SharedPlan, State>, KeyHash> plans_;
  // Known to disagree (found by the op_db sweep behind queued work): the
  // batch norms' Meta kernels size the saved statistics of eval mode as
  // training mode's, where the CPU kernels return empty ones;
  // _embedding_bag_forward_only's sizes offset2bag as the indices and
  // max_indices empty, where the CPU kernel does the opposite (mode sum);
  // linalg_lu_solve's CPU kernel may conjugate its out= argument lazily,
  // by its bit, which no plan can say. Laid out otherwise than by the CPU
  // kernels (found by the op_db sweep's --memory-formats --busy): the Meta
  // kernels of pixel_shuffle, channel_shuffle and max_unpool2d give
  // contiguous results for channels_last inputs, as CUDA's kernels do
  // (_meta_registrations.py says so for pixel_shuffle), where CPU's keep
  // channels_last; replication_pad2d's with negative padding likewise;
  // linalg_eig's eigenvectors of a batch of one are row-major, CPU's
  // column-major.
  std::unordered_set<std::string> disagreeing_{"aten::linalg_lu_solve",
      "aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training",
      "aten::_batch_norm_no_update", "aten::_embedding_bag_forward_only", "aten::pixel_shuffle",
      "aten::channel_shuffle", "aten::max_unpool2d", "aten::replication_pad2d", "aten::linalg_eig"};
};

PlanCache& plan_cache() {
  static auto* cache = new PlanCache();
  return *cache;
}

// Note [Sparse plans]: no Meta kernel plans a call with sparse arguments
// (few ops have SparseMeta kernels), but a sparse op whose results are all
// dense (torch.sparse.mm, addmm, to_dense, a dense tensor plus a sparse one,
// a sum) gives results whose dtypes and shapes follow from the arguments'
// metadata: their sizes, layouts, dims, numbers of stored elements and
// coalesced flags, all in the key. So the first call of each key runs the
// CPU kernel where the host sees its results (inline on an idle stream, or
// waited, as a Meta plan's first check is) and the fallback learns the plan
// from them; later calls of the key are queued with
// that plan, like any planned call, and their kernels check it (a result
// of another shape fails the kernel, which the next synchronizing call
// reports). Not learned: a call with a sparse result (its number of stored
// elements may depend on the data, as coalesce's and sparse + sparse's do:
// those wait, as on CUDA), with a result viewing an argument's memory, a
// non-tensor result, or a kernel that warned.
class LearnedPlans {
 public:
  // The plan of `key`; null if none (yet, or ever: `never` says which).
  SharedPlan find(const Key& key, bool& never) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(key);
    never = found != plans_.end() && !found->second;
    return found == plans_.end() ? nullptr : found->second;
  }

  void add(Key key, SharedPlan plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= kMaxPlans) {
      plans_.clear();
    }
    plans_.emplace(std::move(key), std::move(plan));
  }

 private:
  static constexpr size_t kMaxPlans = 4096;
  std::mutex mutex_;
  std::unordered_map<Key, SharedPlan, KeyHash> plans_;
};

LearnedPlans& learned_plans() {
  static auto* plans = new LearnedPlans();
  return *plans;
}

// The plan `results` (the call's openreg results) show, if learnable (see
// the Note).
SharedPlan learn_plan(const OpenregTensors& arguments, c10::ArrayRef<c10::IValue> results) {
  const auto aliases_an_argument = [&](const at::Tensor& r) {
    for (const at::Tensor& a : arguments) {
      bool shared = false;
      for_each_dense_part(a, [&](const at::Tensor& part) {
        shared |= part.has_storage() && r.storage().is_alias_of(part.storage());
      });
      if (shared) {
        return true;
      }
    }
    return false;
  };
  const auto plan_tensor = [&](const at::Tensor& r) -> std::optional<PlannedTensor> {
    PlannedTensor planned;
    if (!r.defined()) {
      return planned;
    }
    if (is_sparse_any(r) || r.is_nested() || r.is_quantized()) {
      return std::nullopt;
    }
    planned.dtype = r.scalar_type();
    planned.sizes = r.sizes().vec();
    planned.strides = r.strides().vec();
    planned.storage_offset = r.storage_offset();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (r.unsafeGetTensorImpl() == arguments[i].unsafeGetTensorImpl()) {
        planned.kind = PlannedTensor::Kind::Argument;
        planned.argument = i;
        return planned;
      }
    }
    if (aliases_an_argument(r) || r.storage_offset() != 0) {
      return std::nullopt;
    }
    planned.kind = PlannedTensor::Kind::New;
    return planned;
  };
  std::optional<Plan> plan = plan_returns(results, plan_tensor);
  return plan ? std::make_shared<const Plan>(std::move(*plan)) : nullptr;
}

bool same_geometry(const at::Tensor& t, const PlannedTensor& planned) {
  return t.sizes() == c10::IntArrayRef(planned.sizes) && t.strides() == c10::IntArrayRef(planned.strides) &&
      t.storage_offset() == planned.storage_offset;
}

// An out= argument the op resizes: its openreg tensor takes the planned
// geometry now, its storage grown in stream order if needed.
void resize_argument(const at::Tensor& argument, const PlannedTensor& planned) {
  TORCH_CHECK(
      planned.dtype == argument.scalar_type(), "openreg fallback: the Meta kernel changed the dtype of an argument");
  grow_device_storage(
      argument.storage(),
      at::detail::computeStorageNbytes(planned.sizes, planned.strides, argument.dtype().itemsize(), planned.storage_offset));
  argument.unsafeGetTensorImpl()->set_sizes_and_strides(planned.sizes, planned.strides, planned.storage_offset);
}

at::Tensor materialize(const PlannedTensor& planned, const OpenregTensors& arguments, bool& any_new) {
  switch (planned.kind) {
    case PlannedTensor::Kind::Undefined:
      return at::Tensor();
    case PlannedTensor::Kind::Argument: {
      const at::Tensor& argument = arguments.at(planned.argument);
      if (!same_geometry(argument, planned)) {
        resize_argument(argument, planned);
      }
      return argument;
    }
    case PlannedTensor::Kind::ViewOfArgument:
      return alias_of(
          arguments.at(planned.argument), planned.dtype, planned.sizes, planned.strides, planned.storage_offset);
    case PlannedTensor::Kind::New:
      any_new = true;
      return at::detail::empty_strided_generic(
          planned.sizes, planned.strides, device_memory_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
          planned.dtype);
  }
  TORCH_CHECK(false, "unreachable");
}

PlannedResults materialize_plan(const Plan& plan, const OpenregTensors& tensors, c10::Device device) {
  c10::DeviceGuard guard(device);
  PlannedResults planned;
  for (const PlannedReturn& ret : plan) {
    switch (ret.kind) {
      case PlannedReturn::Kind::None:
        planned.results.emplace_back();
        break;
      case PlannedReturn::Kind::Tensor:
        planned.results.emplace_back(materialize(ret.tensors.at(0), tensors, planned.any_fresh));
        break;
      case PlannedReturn::Kind::TensorList: {
        c10::List<at::Tensor> list;
        for (const PlannedTensor& t : ret.tensors) {
          list.push_back(materialize(t, tensors, planned.any_fresh));
        }
        planned.results.emplace_back(std::move(list));
        break;
      }
    }
  }
  return planned;
}


} // namespace

PlanLookup plan_results(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> arguments,
    c10::Device device,
    bool accept_unchecked) {
  PlanLookup lookup;
  const OpenregTensors tensors = openreg_tensors(arguments);
  // Ops that reach the fallback with lazily conjugated or negated operands
  // (matmul, views: the Conjugate and Negative fallbacks let them through)
  // read the bits in the CPU kernel; a Meta stand-in does not carry them,
  // so it cannot say which bits a view result has. They run unplanned.
  for (const at::Tensor& t : tensors) {
    if (t.is_conj() || t.is_neg()) {
      return lookup;
    }
  }
  const SharedPlan plan = plan_cache().find(op, arguments, lookup.to_check, accept_unchecked);
  if (plan) {
    lookup.planned = materialize_plan(*plan, tensors, device);
  }
  return lookup;
}

namespace {

// The learned plan of a call with sparse arguments, or else (`to_learn`)
// the plan to learn from its results, if any may be.
SharedPlan find_learned_plan(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> arguments,
    std::shared_ptr<PlanToCheck>& to_learn) {
  if (results_depend_on_data(op) || !std::none_of(op.schema().arguments().begin(), op.schema().arguments().end(),
                                                 [](const c10::Argument& a) { return is_generator(a.type()); })) {
    return nullptr;
  }
  Key key;
  if (!key.encode(op, arguments)) {
    return nullptr;
  }
  bool never = false;
  SharedPlan plan = learned_plans().find(key, never);
  if (!plan && !never) {
    to_learn =
        std::make_shared<PlanToCheck>(PlanToCheck{std::move(key), nullptr, op.operator_name(), openreg_tensors(arguments)});
  }
  return plan;
}

} // namespace

PlanLookup plan_sparse_results(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, c10::Device device) {
  PlanLookup lookup;
  if (const SharedPlan plan = find_learned_plan(op, arguments, lookup.to_check)) {
    lookup.planned = materialize_plan(*plan, openreg_tensors(arguments), device);
  }
  return lookup;
}

std::shared_ptr<PlanToCheck> sparse_plan_to_learn(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  std::shared_ptr<PlanToCheck> to_learn;
  find_learned_plan(op, arguments, to_learn);
  return to_learn;
}


// Whether a new tensor planned as `ret` has the layout of the CPU kernel's
// `result`: the same strides along its dims of more than one element, where
// `result` is dense (any stride describes a dim of one, and the strides of
// a result that is not dense are the kernel's own business).
bool planned_layout_matches(const PlannedReturn& ret, const at::Tensor& result) {
  if (ret.kind != PlannedReturn::Kind::Tensor || ret.tensors.at(0).kind != PlannedTensor::Kind::New ||
      !result.defined() || !result.is_non_overlapping_and_dense()) {
    return true;
  }
  const PlannedTensor& planned = ret.tensors.at(0);
  for (int64_t d = 0; d < result.dim(); ++d) {
    if (result.size(d) > 1 && result.stride(d) != planned.strides.at(d)) {
      return false;
    }
  }
  return true;
}

// `plan` with each new tensor laid out as the CPU kernel's `results` (of the
// planned dtypes and shapes) are.
SharedPlan relaid_as(const Plan& plan, c10::ArrayRef<c10::IValue> results) {
  Plan relaid = plan;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].isTensor() && !planned_layout_matches(relaid[i], results[i].toTensor())) {
      relaid[i].tensors.at(0).strides = results[i].toTensor().strides().vec();
    }
  }
  return std::make_shared<const Plan>(std::move(relaid));
}

bool check_plan(const PlanToCheck& check, c10::ArrayRef<c10::IValue> results, bool kernel_warned) {
  if (!check.plan) { // Note [Sparse plans]
    learned_plans().add(check.key, kernel_warned ? nullptr : learn_plan(check.arguments, results));
    return true;
  }
  // A planned tensor matches a result of the same dtype and sizes; a view
  // (not computed, so not copied) must match its geometry too. A result
  // with a lazy conjugate or negative bit (linalg_lu_solve(left=False)
  // conjugates its out= argument by flipping the bit) has no plan: the
  // queued kernel's CPU view could not hand the bit back.
  const auto matches = [](const PlannedTensor& planned, const at::Tensor& t) {
    if (planned.kind == PlannedTensor::Kind::Undefined || !t.defined()) {
      return planned.kind == PlannedTensor::Kind::Undefined && !t.defined();
    }
    return planned.dtype == t.scalar_type() && t.sizes() == c10::IntArrayRef(planned.sizes) && !t.is_conj() &&
        !t.is_neg() &&
        (planned.kind != PlannedTensor::Kind::ViewOfArgument || same_geometry(t, planned));
  };
  bool usable = results.size() == check.plan->size();
  for (size_t i = 0; usable && i < results.size(); ++i) {
    const PlannedReturn& ret = (*check.plan)[i];
    const c10::IValue& value = results[i];
    switch (ret.kind) {
      case PlannedReturn::Kind::None:
        usable = value.isNone() || (value.isTensor() && !value.toTensor().defined());
        break;
      case PlannedReturn::Kind::Tensor:
        usable = value.isTensor() && matches(ret.tensors.at(0), value.toTensor());
        break;
      case PlannedReturn::Kind::TensorList: {
        usable = value.isTensorList() && value.toTensorList().size() == ret.tensors.size();
        for (size_t j = 0; usable && j < ret.tensors.size(); ++j) {
          usable = matches(ret.tensors[j], value.toTensorList().get(j));
        }
        break;
      }
    }
  }
  // Results that fit the plan but are laid out otherwise (a Meta kernel
  // whose strides differ from the CPU kernel's) are right this time, as
  // the kernel copies them into the planned tensors; the plan then takes
  // the CPU kernel's layout for later calls (Note [Memory format of
  // results] in result_format.h), and the op's new plans are checked before
  // they are used.
  bool same_layout = true;
  for (size_t i = 0; usable && i < results.size(); ++i) {
    same_layout = same_layout && (!results[i].isTensor() || planned_layout_matches((*check.plan)[i], results[i].toTensor()));
  }
  if (!usable || !same_layout) {
    plan_cache().disagreed(check.op);
  }
  // A kernel that warned runs where its caller waits from now on, so that
  // its warnings reach the caller each time (Note [Kernel warnings]).
  plan_cache().settle(check.key, usable && !kernel_warned, same_layout ? nullptr : relaid_as(*check.plan, results));
  return usable;
}

void settle_plan(const PlanToCheck& check, bool usable) {
  plan_cache().settle(check.key, usable);
}

bool may_use_unchecked(const c10::OperatorHandle& op) {
  return plan_cache().agrees(op.operator_name());
}

at::Tensor alias_of(
    const at::Tensor& original,
    c10::ScalarType dtype,
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides,
    int64_t storage_offset) {
  return at::empty({0}, original.options().dtype(dtype)).set_(original.storage(), storage_offset, sizes, strides);
}

} // namespace openreg
