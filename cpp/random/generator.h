// The openreg generators as ATen sees them (generator.cpp). Their state
// (seed, offset) lives in Rust (src/runtime/generator.rs); a c10::GeneratorImpl here
// holds only a handle to it.
#pragma once

#include <optional>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include "torch_openreg/src/bridge/ffi.rs.h"

namespace openreg {

// Device `index`'s default generator (-1: the current device), created on
// first use with PyTorch's default seed. An invalid index is an error naming
// it and the device count.
const at::Generator& default_generator(c10::DeviceIndex index);

// A new generator of device `index` (-1: the current device) with the
// default seed, independent of every other.
at::Generator new_generator(c10::DeviceIndex index);

// The Rust state random kernels on `device` draw from: `generator`'s, or the
// device's default generator's when it is empty. A generator of any other
// device is an error naming both. Valid while `generator` is alive.
const ffi::Generator& generator_state(const std::optional<at::Generator>& generator, c10::Device device);

} // namespace openreg
