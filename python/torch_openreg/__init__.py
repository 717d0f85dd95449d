"""torch_openreg: the simulated ``openreg`` accelerator for PyTorch.

Importing this package (or plain ``import torch``, through the
``torch.backends`` entry point) loads the Rust runtime, whose load-time
constructor registers the device guard, hooks and backend name with PyTorch,
and then wires up the Python side: ``torch.openreg`` and the generated
``Tensor.openreg()`` / ``Module.openreg()`` methods.
"""

import atexit
import ctypes
import os


def _autoload() -> None:
    """Entry point of ``torch.backends``: importing this package is the work.

    Defined before ``import torch``: when this package is imported first,
    that import runs torch's backend autoload, which looks this function up
    on the partially imported package.
    """


import torch  # noqa: E402

_LIBRARY_PATH = os.path.join(os.path.dirname(__file__), "lib", "libtorch_openreg.so")

# RTLD_GLOBAL: C++ extensions built against our headers resolve the C ABI
# (openreg.h) from this already-loaded copy.
_library = ctypes.CDLL(_LIBRARY_PATH, mode=ctypes.RTLD_GLOBAL)

from torch_openreg import _C  # noqa: E402  (needs the library loaded first)
from torch_openreg import openreg  # noqa: E402

# Before the interpreter finalizes (atexit handlers run first, the latest
# registered first): queued kernels finish while Python is whole, and a
# kernel that runs later leaks its captured tensors instead of releasing
# their Python objects, which would abort the process (Note [Host exit] in
# src/lifecycle.rs).
atexit.register(_C._prepare_exit)


# For C++ programs: CMake finds torch_openreg's package (find_package(
# torch_openreg), target torch_openreg::torch_openreg) under this prefix,
# as torch.utils.cmake_prefix_path does for torch's. An installed package
# only; see examples/cpp/README.md.
cmake_prefix_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake")


def library_path() -> str:
    """Path of the shared library, for ``torch.utils.cpp_extension`` users."""
    return _LIBRARY_PATH


def include_dir() -> str:
    """Directory of the public headers: ``openreg.h`` (the C ABI) and
    ``torch_openreg/kernel.h`` (custom C++ kernels), for
    ``torch.utils.cpp_extension``'s ``extra_include_paths``.

    An installed package ships them as ``torch_openreg/include``; an editable
    install or a source checkout uses the repository's ``include/``.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "include"), os.path.normpath(os.path.join(here, "..", "..", "include"))]
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "openreg.h")):
            return candidate
    raise RuntimeError(
        "torch_openreg: the public headers (openreg.h) are in none of "
        + ", ".join(candidates)
        + "; reinstall torch_openreg (pip install .) to ship them"
    )


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

__all__ = ["cmake_prefix_path", "library_path", "include_dir"]
