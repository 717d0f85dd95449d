// openreg's c10::GeneratorImpl: a counter-based Philox generator whose state
// lives in Rust; every method forwards (see Note [Philox offsets] in
// src/runtime/generator.rs).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "torch_openreg/cpp/random/generator.h"

#include <cstring>
#include <mutex>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include "torch_openreg/cpp/checked.h"

namespace openreg {
namespace {

class OpenRegGenerator final : public c10::GeneratorImpl {
 public:
  OpenRegGenerator(c10::DeviceIndex device, rust::Box<ffi::Generator> state)
      : c10::GeneratorImpl(
            c10::Device(c10::kPrivateUse1, device),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        state_(std::move(state)) {}

  // What at::check_generator<OpenRegGenerator> compares against.
  static c10::DeviceType device_type() {
    return c10::kPrivateUse1;
  }

  const ffi::Generator& state() const {
    return *state_;
  }

  // Reseeds and restarts the sequence (offset 0), as CUDA does.
  void set_current_seed(uint64_t seed) override {
    ffi::set_generator_seed(*state_, seed);
  }

  // `offset` counts 32-bit draws and must be a multiple of 4.
  void set_offset(uint64_t offset) override {
    checked([&] { ffi::set_generator_offset(*state_, offset); });
  }

  uint64_t get_offset() const override {
    return ffi::generator_offset(*state_);
  }

  uint64_t current_seed() const override {
    return ffi::generator_seed(*state_);
  }

  // Reseeds from the OS's entropy and returns the seed.
  uint64_t seed() override {
    uint64_t seed = ffi::nondeterministic_seed();
    set_current_seed(seed);
    return seed;
  }

  // The state is a CPU uint8 tensor of 16 bytes: seed, then offset (as CUDA's).
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(
        new_state.device().is_cpu() && new_state.layout() == c10::kStrided &&
            new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
        "openreg RNG state must be a CPU torch.uint8 tensor (torch.ByteTensor), got ",
        new_state.dtype(), " on ", new_state.device());
    TORCH_CHECK(new_state.is_contiguous(), "openreg RNG state must be a contiguous tensor");
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    checked([&] {
      ffi::set_generator_state(*state_, rust::Slice<const uint8_t>(bytes, static_cast<size_t>(new_state.numel())));
    });
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    rust::Vec<uint8_t> bytes = ffi::generator_state(*state_);
    at::Tensor state = at::detail::empty_cpu(
        {static_cast<int64_t>(bytes.size())}, c10::kByte, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    return state.getIntrusivePtr();
  }

 private:
  OpenRegGenerator* clone_impl() const override {
    return new OpenRegGenerator(device_.index(), ffi::fork_generator(*state_));
  }

  rust::Box<ffi::Generator> state_;
};

c10::DeviceIndex checked_index(c10::DeviceIndex index) {
  c10::DeviceIndex device = index == -1 ? ffi::current_device() : index;
  checked([&] { ffi::check_device(device); });
  return device;
}

} // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  // One slot per device. The generators are handles: the state they share
  // with every other handle of the device's default generator is in Rust.
  static const size_t count = static_cast<size_t>(ffi::device_count());
  static std::vector<std::once_flag> created(count);
  static std::vector<at::Generator> generators(count);
  const c10::DeviceIndex device = checked_index(index);
  std::call_once(created[device], [&] {
    generators[device] = at::make_generator<OpenRegGenerator>(
        device, checked([&] { return ffi::default_generator(device); }));
  });
  return generators[device];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<OpenRegGenerator>(
      checked_index(index), ffi::new_generator(c10::default_rng_seed_val));
}

const ffi::Generator& generator_state(const std::optional<at::Generator>& generator, c10::Device device) {
  if (!generator.has_value() || !generator->defined()) {
    return at::check_generator<OpenRegGenerator>(default_generator(device.index()))->state();
  }
  TORCH_CHECK(
      generator->device() == device,
      "expected a generator of the tensor's device ", device, ", but got a generator of ", generator->device());
  return at::check_generator<OpenRegGenerator>(*generator)->state();
}

} // namespace openreg
