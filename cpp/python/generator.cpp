// The parts of torch_openreg._C that need torch's Python bindings, kept out
// of module.cpp so that only this small unit pulls in torch's Python headers.
#include <Python.h>

#include <ATen/Context.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>

// _get_default_generator(index): the torch.Generator wrapping device
// `index`'s default generator, through ATen's context and so our hooks'
// getDefaultGenerator. An invalid index is a RuntimeError naming it.
extern "C" PyObject* openreg_get_default_generator(PyObject* self, PyObject* arg) {
  HANDLE_TH_ERRORS
  long long index = PyLong_AsLongLong(arg);
  if (index == -1 && PyErr_Occurred())
    return nullptr;
  TORCH_CHECK(
      index >= -1 && index <= std::numeric_limits<c10::DeviceIndex>::max(),
      "openreg device index ", index, " is out of range");
  const at::Generator& generator =
      at::globalContext().defaultGenerator(c10::Device(c10::kPrivateUse1, static_cast<c10::DeviceIndex>(index)));
  return THPGenerator_initDefaultGenerator(generator);
  END_HANDLE_TH_ERRORS
}

// Lets torch's device lazy-init machinery know about fork children (see
// torch/csrc/utils/device_lazy_init.h), as CUDA's module init does.
extern "C" void openreg_register_fork_handler() {
  torch::utils::register_fork_handler_for_device_init(c10::kPrivateUse1);
}
