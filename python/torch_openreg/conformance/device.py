"""Device and guard: what `torch.accelerator` and a device guard promise."""

from __future__ import annotations

import torch

from torch_openreg.conformance._api import Failed, NotSupported, check, expect

AREA = "device"


@check("torch.accelerator is available and its current accelerator is the backend's device type")
def available(b):
    expect(torch.accelerator.is_available(), "torch.accelerator.is_available() is False")
    current = torch.accelerator.current_accelerator()
    expect(current is not None and current.type == b.name, f"current_accelerator() is {current}")
    if b.module is not None and hasattr(b.module, "is_available"):
        expect(b.module.is_available(), f"torch.{b.name}.is_available() is False")
    return f"current_accelerator() is {current}"


@check("at least one device; torch.accelerator.device_count() equals torch.NAME.device_count()")
def count(b):
    n = torch.accelerator.device_count()
    expect(n >= 1, f"device_count() is {n}")
    if b.module is not None and hasattr(b.module, "device_count"):
        expect(b.module.device_count() == n, f"torch.{b.name}.device_count() is {b.module.device_count()}, "
                                             f"torch.accelerator's {n}")
    return f"{n} devices"


@check("set_device_index(i) makes i current for every device; device_index(i) restores the previous one")
def current_and_set(b):
    original = torch.accelerator.current_device_index()
    try:
        for i in range(b.device_count):
            torch.accelerator.set_device_index(i)
            now = torch.accelerator.current_device_index()
            expect(now == i, f"after set_device_index({i}) the current device is {now}")
        torch.accelerator.set_device_index(0)
        for i in range(b.device_count):
            with torch.accelerator.device_index(i):
                now = torch.accelerator.current_device_index()
                expect(now == i, f"inside device_index({i}) the current device is {now}")
            now = torch.accelerator.current_device_index()
            expect(now == 0, f"after leaving device_index({i}) the current device is {now}, not 0")
        with torch.accelerator.device_index(None):
            expect(torch.accelerator.current_device_index() == 0, "device_index(None) changed the device")
    finally:
        torch.accelerator.set_device_index(original)
    return f"devices 0-{b.device_count - 1}"


@check("a tensor made under device_index(i) without an index lands on device i; torch.device(NAME, i) places it")
def placement(b):
    for i in range(b.device_count):
        with torch.accelerator.device_index(i):
            t = torch.ones(3, device=b.name)
            expect(t.device == b.device(i), f"torch.ones(device={b.name!r}) under device_index({i}) is on {t.device}")
        u = torch.zeros(2, device=b.device(i)) + 1
        expect(u.device == b.device(i), f"a result of an op on {b.device(i)} is on {u.device}")
        expect(u.is_privateuseone if hasattr(u, "is_privateuseone") else True, "is_privateuseone is False")
    return f"{b.device_count} devices"


def _raises(action, what: str) -> str:
    try:
        action()
    except (RuntimeError, ValueError, IndexError, AssertionError) as error:
        return type(error).__name__
    raise Failed(f"{what} did not raise")


@check("an index past the last device, or below -1, raises where a device is made current or used")
def bad_index_raises(b):
    n = b.device_count
    raised = [
        _raises(lambda: torch.empty(1, device=b.device(n)), f"torch.empty(1, device='{b.name}:{n}')"),
        _raises(lambda: torch.accelerator.set_device_index(n), f"set_device_index({n})"),
        _raises(lambda: torch.accelerator.synchronize(n), f"torch.accelerator.synchronize({n})"),
        _raises(lambda: torch.ones(1).to(b.device(n + 3)), f"tensor.to('{b.name}:{n + 3}')"),
    ]
    expect(torch.accelerator.current_device_index() in range(n), "a refused index changed the current device")
    return f"each raised ({', '.join(sorted(set(raised)))})"


@check("torch.accelerator.synchronize() and synchronize(i) return, for every device, after work there")
def synchronize(b):
    for i in range(b.device_count):
        doubled = torch.ones(1 << 16, device=b.device(i)) * 2
        torch.accelerator.synchronize(i)
        torch.accelerator.synchronize(b.device(i))
        expect(bool((doubled.cpu() == 2).all()), f"work on device {i} gave wrong values after synchronize({i})")
    torch.accelerator.synchronize()
    return f"{b.device_count} devices"


@check("torch.NAME offers the device functions torch.cuda offers device-agnostic code "
       "(random-state functions are the random area's)")
def device_module(b):
    if b.module is None:
        raise NotSupported(f"no torch.{b.name} module is registered (torch._register_device_module)")
    wanted = ["is_available", "device_count", "current_device", "set_device", "synchronize"]
    missing = [name for name in wanted if not hasattr(b.module, name)]
    expect(not missing, f"torch.{b.name} lacks {', '.join(missing)}")
    expect(b.module.current_device() == torch.accelerator.current_device_index(),
           f"torch.{b.name}.current_device() disagrees with torch.accelerator")
    return f"torch.{b.name} has {len(wanted)} of {len(wanted)}"
