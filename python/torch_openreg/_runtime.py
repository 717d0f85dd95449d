"""Loads the Rust runtime and wires up the Python side (see the package's
docstring); imported by torch_openreg/__init__.py unless the conformance kit
tests another backend (Note [Conformance kit without openreg])."""

import atexit
import ctypes

import torch

from torch_openreg import library_path

# RTLD_GLOBAL: C++ extensions built against our headers resolve the C ABI
# (openreg.h) from this already-loaded copy.
_library = ctypes.CDLL(library_path(), mode=ctypes.RTLD_GLOBAL)

from torch_openreg import _C  # noqa: E402  (needs the library loaded first)
from torch_openreg import openreg  # noqa: E402

# Before the interpreter finalizes (atexit handlers run first, the latest
# registered first): queued kernels finish while Python is whole, and a
# kernel that runs later leaks its captured tensors instead of releasing
# their Python objects, which would abort the process (Note [Host exit] in
# src/runtime/lifecycle.rs).
atexit.register(_C._prepare_exit)


def _register_python_side() -> None:
    # The C++ side already registered the name "openreg"; renaming to the
    # same name is accepted and makes Python aware of it.
    torch.utils.rename_privateuse1_backend("openreg")
    torch._register_device_module("openreg", openreg)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


_register_python_side()

# torch.distributed on openreg tensors, over gloo (Note [Collectives over gloo]).
from torch_openreg import _distributed  # noqa: E402,F401

# openreg tensors through torch.multiprocessing (Note [Sharing device memory
# between processes]).
from torch_openreg import _multiprocessing  # noqa: E402,F401

# torch.compile: dynamo's device interface, registered when dynamo loads
# (Note [Registering with lazily imported torch modules]); Inductor's backend
# is registered by torch itself through torch.openreg._inductor_backend_init.
from torch_openreg import _after_import, _dynamo_interface  # noqa: E402

_after_import.after_import("torch._dynamo.device_interface", _dynamo_interface.register)

# Backward of openreg graphs on the calling thread, as for CPU tensors (on
# autograd's device thread, each op would be a hand-off between threads).
# Autograd's setting is per thread: this is the importing thread's, usually
# the main thread. OPENREG_AUTOGRAD_ON_CALLER=0 keeps autograd's default.
if openreg.options()["OPENREG_AUTOGRAD_ON_CALLER"]["value"] == "1":
    torch.autograd.set_multithreading_enabled(False)  # "can be used as a function"

# Lightning: Trainer(accelerator="openreg") and Fabric(accelerator="openreg"),
# registered when Lightning's accelerators load, from either of its packages
# (torch_openreg/_lightning.py).
from torch_openreg import _lightning  # noqa: E402

_after_import.after_import("pytorch_lightning.accelerators", _lightning.register_trainer)
_after_import.after_import("lightning_fabric.accelerators", _lightning.register_fabric)
_after_import.after_import("lightning.pytorch.accelerators", _lightning.register_trainer)
_after_import.after_import("lightning.fabric.accelerators", _lightning.register_fabric)

# HF accelerate and transformers' Trainer: one device for both (Note [HF
# Trainer's device with openreg]), and a warning where a launch of several
# processes would train each alone (Note [accelerate across processes with
# openreg]).
from torch_openreg import _huggingface  # noqa: E402

_after_import.after_import("transformers.training_args", _huggingface.default_trainer_device)
_after_import.after_import("accelerate.state", _huggingface.warn_undistributed)
