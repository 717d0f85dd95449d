"""toy: the smallest PrivateUse1 backend, broken on purpose (see README.md).

Importing this module builds toy_backend.cpp (once; torch.utils.cpp_extension
reuses the build while the source is unchanged) into $TOY_BACKEND_BUILD_DIR
(default: toy_backend under the system temp directory), loads it, and
registers the Python side: the device type is named "toy", `torch.toy` is the
device module below, and tensors and modules get `.toy()` / `.is_toy`.
"""

from __future__ import annotations

import os
import tempfile
import types

import torch
import torch.utils.cpp_extension

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_backend.cpp")
_BUILD_DIR = os.environ.get("TOY_BACKEND_BUILD_DIR") or os.path.join(tempfile.gettempdir(), "toy_backend")

# One backend holds PrivateUse1 per process, and loading a second one aborts
# the process (its registrations throw while the library loads): say so first.
_taken_by = torch._C._get_privateuse1_backend_name()
if _taken_by not in ("privateuseone", "toy"):
    raise ImportError(f"PrivateUse1 is already the {_taken_by!r} backend in this process; import toy with that "
                      f"backend unloaded (for openreg: TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
                      f"TORCH_OPENREG_CONFORMANCE_DEVICE=toy)")

os.makedirs(_BUILD_DIR, exist_ok=True)
# is_python_module=False: a plain shared library, whose static registrations
# (guard, allocator, hooks, kernels) run as it loads.
torch.utils.cpp_extension.load(name="toy_backend", sources=[_SOURCE], build_directory=_BUILD_DIR,
                               is_python_module=False)


# The device module, torch.toy: what torch.accelerator delegates to
# (device_count, is_available), what torch's storage moves use (device, as
# in torch.load), and what device-agnostic code looks for. No random-number
# functions: toy has no generator.


def device_count() -> int:
    return torch.ops.toy.device_count()


def is_available() -> bool:
    return device_count() > 0


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device) -> None:
    torch.accelerator.set_device_index(device)


def synchronize(device=None) -> None:
    torch.accelerator.synchronize(device)


def device(device):
    """Context manager: `device` (a torch.device, "toy:1" or an index) is current inside it."""
    index = device if isinstance(device, int) else torch.device(device).index
    return torch.accelerator.device_index(index)


device_module = types.ModuleType("torch.toy", "toy's device module")
for _function in (device_count, is_available, current_device, set_device, synchronize, device):
    setattr(device_module, _function.__name__, _function)

torch.utils.rename_privateuse1_backend("toy")
torch._register_device_module("toy", device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
