"""torch_openreg: the simulated ``openreg`` accelerator for PyTorch.

Importing this package (or plain ``import torch``, through the
``torch.backends`` entry point) loads the Rust runtime, whose load-time
constructor registers the device guard, hooks and backend name with PyTorch,
and then wires up the Python side: ``torch.openreg`` and the generated
``Tensor.openreg()`` / ``Module.openreg()`` methods.
"""

import os
import sys


def _autoload() -> None:
    """Entry point of ``torch.backends``: importing this package is the work.

    Defined before ``import torch``: when this package is imported first,
    that import runs torch's backend autoload, which looks this function up
    on the partially imported package.
    """


# For C++ programs: CMake finds torch_openreg's package (find_package(
# torch_openreg), target torch_openreg::torch_openreg) under this prefix,
# as torch.utils.cmake_prefix_path does for torch's. An installed package
# only; see examples/cpp/README.md.
cmake_prefix_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake")


def library_path() -> str:
    """Path of the shared library, for ``torch.utils.cpp_extension`` users."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libtorch_openreg.so")


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



def _runtime_deferred() -> bool:
    """Note [Conformance kit without openreg]
    The conformance kit ships in this package, so `python -m
    torch_openreg.conformance --device NAME` imports this package before any
    of its code runs. The kit's runner never loads a backend, and a process
    testing another PrivateUse1 backend must not load openreg's runtime, which
    would take PrivateUse1 first: the runtime is left unloaded in the runner
    (launched as that module) and wherever TORCH_OPENREG_CONFORMANCE_DEVICE
    names another device (the kit's children and whatever they start: a
    spawned worker imports torch, whose backend autoload imports this
    package)."""
    device_under_test = os.environ.get("TORCH_OPENREG_CONFORMANCE_DEVICE")
    if device_under_test and device_under_test != "openreg":
        return True
    argv = getattr(sys, "orig_argv", [])
    for i, argument in enumerate(argv[1:], start=1):
        if argument == "-m":
            return argv[i + 1 : i + 2] == ["torch_openreg.conformance"]
        if argument.startswith("-m"):
            return argument == "-mtorch_openreg.conformance"
    return False


if not _runtime_deferred():
    from torch_openreg import _runtime  # noqa: F401  (loads the runtime, registers openreg)

__all__ = ["cmake_prefix_path", "library_path", "include_dir"]
