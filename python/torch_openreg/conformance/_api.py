"""What a conformance check is, and what it is given.

A check is a function of one argument, the `Backend` under test, registered
with `@check(expected)` in an area module (`AREA = "device"`, ...). Its id is
`AREA.function_name`: stable, since reports and tests name checks by it. The
function returns one line saying what happened (a pass), raises
`NotSupported` when the backend does not offer what the check needs (a
backend may lack priorities or graphs and still be correct), raises `Failed`
when the contract is broken; any other exception is an `error`: the check met
something it did not expect (usually the backend raising where the contract
promises a result). A crash or a hang of the check's process is a `fail`,
with the signal or the timeout (see _runner.py).

Checks use torch's public Python API only, so they hold for any PrivateUse1
backend; where torch offers a function only as `torch.<name>.*` (the device
module a backend registers with `torch._register_device_module`), the check
asks `Backend.module_function`, which raises NotSupported when it is missing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

PASS = "pass"
FAIL = "fail"
NOT_SUPPORTED = "not supported"
ERROR = "error"
VERDICTS = (PASS, FAIL, NOT_SUPPORTED, ERROR)

DEFAULT_TIMEOUT_S = 60.0


class NotSupported(Exception):
    """The backend does not offer what this check needs; the message says what."""


class Failed(AssertionError):
    """The contract is broken; the message says what happened instead."""


def expect(condition: bool, happened: str) -> None:
    """Raises Failed(happened) unless `condition`."""
    if not condition:
        raise Failed(happened)


@dataclass(frozen=True)
class Check:
    id: str
    area: str
    expected: str  # one line: what the contract promises
    function: Callable
    isolated: bool  # runs alone in a fresh process (it may crash, fork or exhaust memory)
    full_only: bool  # only in --full runs
    timeout_s: float | None  # None: the run's default


_REGISTRY: dict[str, Check] = {}


def check(expected: str, *, isolated: bool = False, full_only: bool = False, timeout_s: float | None = None):
    """Registers the decorated function as check `AREA.name` of its module."""

    def register(function: Callable) -> Callable:
        module = sys.modules[function.__module__]
        area = module.AREA
        check_id = f"{area}.{function.__name__}"
        if check_id in _REGISTRY:
            raise RuntimeError(f"conformance check {check_id} is defined twice")
        _REGISTRY[check_id] = Check(check_id, area, expected, function, isolated, full_only, timeout_s)
        return function

    return register


# The area modules, in report order; each defines AREA and its checks.
AREA_MODULES = ("device", "streams", "rng", "memory", "tensors", "ops", "frontends", "stream_order")


def registered() -> dict[str, Check]:
    """Every check, in area order, then in definition order within an area."""
    import importlib

    for module in AREA_MODULES:
        importlib.import_module(f"torch_openreg.conformance.{module}")
    return dict(_REGISTRY)


class Backend:
    """The PrivateUse1 backend under test, as the checks see it."""

    def __init__(self, name: str, full: bool, import_name: str | None = None):
        import torch

        self.name = name
        self.full = full
        # The module named by --import (None: the backend autoloads); a check
        # that starts processes of its own imports it there too.
        self.import_name = import_name
        self.module = getattr(torch, name, None)
        self.device_count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0

    def device(self, index: int = 0):
        import torch

        return torch.device(self.name, index)

    def require_devices(self, count: int) -> None:
        if self.device_count < count:
            raise NotSupported(f"needs {count} devices; the backend has {self.device_count}")

    def module_function(self, name: str) -> Callable:
        """torch.<name>.<function>, or NotSupported naming what is missing."""
        function = getattr(self.module, name, None) if self.module is not None else None
        if function is None:
            raise NotSupported(f"torch.{self.name}.{name} is not defined")
        return function


def first_line(error: BaseException) -> str:
    """'TypeName: first line of the message', for one-line reports."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
