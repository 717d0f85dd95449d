"""Registration: loading the library (by import, by autoload, by ctypes
alone) registers the openreg backend with PyTorch."""

import importlib.util
import os

import pytest
import torch

import torch_openreg
from _openreg_util import clean_env, script

# Plain `import torch`: the torch.backends entry point must load torch_openreg.
AUTOLOAD = script(
    "autoload",
    """
    import torch
    RESULT["has_module"] = hasattr(torch, "openreg")
    RESULT["backend"] = torch._C._get_privateuse1_backend_name()
    RESULT["imported"] = "torch_openreg" in sys.modules
    RESULT["count"] = torch.openreg.device_count() if hasattr(torch, "openreg") else None
    RESULT["stream"] = str(torch.Stream(device="openreg:1").device)
    done(RESULT)
    """,
    env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD=None),
)

# `import torch_openreg` before torch: importing torch from inside our package
# runs the autoload entry point on the half-imported package.
IMPORT_FIRST = script(
    "import_first",
    """
    import torch_openreg
    import torch
    RESULT["backend"] = torch._C._get_privateuse1_backend_name()
    RESULT["count"] = torch.openreg.device_count()
    RESULT["sum"] = torch.ones(3, device="openreg:1").sum().item()
    done(RESULT)
    """,
    env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD=None),
)

# Autoload off: nothing is registered by `import torch`; then loading the
# shared library with ctypes alone (no `import torch_openreg`) registers the
# backend name, the device guard and the hooks.
CTYPES_ONLY = script(
    "ctypes_only",
    """
    import ctypes, importlib.util
    import torch
    RESULT["has_module"] = hasattr(torch, "openreg")
    RESULT["backend_before"] = torch._C._get_privateuse1_backend_name()
    spec = importlib.util.find_spec("torch_openreg")
    path = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_openreg.so")
    RESULT["path_exists"] = os.path.exists(path)
    ctypes.CDLL(path)
    RESULT["imported"] = "torch_openreg" in sys.modules
    RESULT["backend_after"] = torch._C._get_privateuse1_backend_name()
    RESULT["device"] = str(torch.device("openreg:1"))
    # The guard: a stream from the pool of device 1, and work through it.
    s = torch.Stream(device="openreg:1")
    RESULT["stream"] = [str(s.device), s.stream_id]
    e = torch.Event(device="openreg")
    e.record(s)
    e.synchronize()
    RESULT["event_query"] = e.query()
    RESULT["stream_query"] = s.query()
    RESULT["imported_at_end"] = "torch_openreg" in sys.modules
    done(RESULT)
    """,
    env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
)


def test_backend_name_is_openreg():
    assert torch._C._get_privateuse1_backend_name() == "openreg"


def test_torch_openreg_module_registered():
    assert torch.openreg is torch_openreg.openreg
    assert torch.get_device_module("openreg") is torch.openreg
    assert torch.get_device_module(torch.device("openreg:1")) is torch.openreg


def test_device_objects():
    d = torch.device("openreg:1")
    assert d.type == "openreg" and d.index == 1
    d = torch.device("openreg")
    assert d.type == "openreg" and d.index is None
    assert str(torch.device("openreg", 0)) == "openreg:0"


def test_generated_tensor_and_module_methods():
    assert callable(getattr(torch.Tensor, "openreg", None))
    assert callable(getattr(torch.nn.Module, "openreg", None))
    assert callable(getattr(torch.UntypedStorage, "openreg", None))
    assert torch.zeros(1).is_openreg is False
    module = torch.nn.Module()  # no parameters: nothing needs copying
    assert module.openreg() is module


def test_library_path_matches_installed_package():
    spec = importlib.util.find_spec("torch_openreg")
    expected = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_openreg.so")
    assert os.path.samefile(torch_openreg.library_path(), expected)


@pytest.mark.subprocess
def test_plain_import_torch_autoloads_openreg():
    data = AUTOLOAD.result().check_ok()
    assert data["has_module"] is True
    assert data["backend"] == "openreg"
    assert data["imported"] is True
    assert data["count"] == 2
    assert data["stream"] == "openreg:1"


@pytest.mark.subprocess
def test_importing_torch_openreg_before_torch_works():
    data = IMPORT_FIRST.result().check_ok()
    assert data == {"backend": "openreg", "count": 2, "sum": 3.0}


@pytest.mark.subprocess
def test_autoload_disabled_leaves_torch_alone():
    data = CTYPES_ONLY.result().check_ok()
    assert data["has_module"] is False
    assert data["backend_before"] == "privateuseone"


@pytest.mark.subprocess
def test_ctypes_load_alone_registers_backend():
    data = CTYPES_ONLY.result().check_ok()
    assert data["path_exists"] is True
    assert data["imported"] is False
    assert data["backend_after"] == "openreg"
    assert data["device"] == "openreg:1"
    assert data["stream"][0] == "openreg:1" and data["stream"][1] > 0
    assert data["event_query"] is True and data["stream_query"] is True
    assert data["imported_at_end"] is False


def test_after_import_leaves_the_other_finders_asked():
    """A registration waiting for a module (Note [Registering with lazily
    imported torch modules]) takes itself out once that module is looked up,
    without making the import system skip the finder after it."""
    import importlib.abc
    import sys

    from torch_openreg._after_import import after_import

    asked = []

    class Probe(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname == "openreg_no_such_module":
                asked.append(fullname)
            return None

    probe = Probe()
    after_import("openreg_no_such_module", lambda module: None)
    sys.meta_path.insert(1, probe)  # right after the waiting registration
    try:
        with pytest.raises(ImportError):
            import openreg_no_such_module  # noqa: F401
    finally:
        sys.meta_path.remove(probe)
    assert asked == ["openreg_no_such_module"]
    assert not any(type(f).__module__ == "torch_openreg._after_import" and getattr(f, "_name", None) == "openreg_no_such_module" for f in sys.meta_path)
