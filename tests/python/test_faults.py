"""Injected faults (torch.openreg._inject_fault, or OPENREG_FAULT): each
surfaces as a Python exception naming what failed, and normal work succeeds
right after."""

import re
import textwrap

import pytest
import torch

from _openreg_util import clean_env, script


def test_alloc_fault_is_an_out_of_memory_error():
    torch.openreg._inject_fault("alloc", after=1)
    first = torch.empty(100, device="openreg:1")  # one allowed to succeed
    with pytest.raises(torch.OutOfMemoryError, match=r"injected fault \(alloc\).*device 1"):
        torch.empty(100, device="openreg:1")
    again = torch.ones(100, device="openreg:1")
    assert again.sum().item() == 100 and first.numel() == 100


def test_kernel_fault_surfaces_at_the_next_synchronize():
    x = torch.ones(8, device="openreg")
    torch.openreg._inject_fault("kernel")
    y = x + 1  # the failing kernel: launched without an error
    with pytest.raises(RuntimeError, match=r"injected fault \(kernel\): a kernel on openreg stream 0 on device 0 failed"):
        torch.openreg.synchronize()
    torch.openreg.synchronize()  # reported once
    assert (x * 3).cpu().tolist() == [3.0] * 8
    del y


def test_kernel_fault_on_a_queued_kernel():
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        torch.openreg._sleep(50)
        torch.openreg._inject_fault("kernel")
        torch.openreg._sleep(1)  # queued behind the first: runs on the worker
    with pytest.raises(RuntimeError, match="injected fault"):
        s.synchronize()
    s.synchronize()


def test_event_fault():
    torch.openreg._inject_fault("event")
    event = torch.Event(device="openreg")
    with pytest.raises(RuntimeError, match=r"injected fault \(event\): recording an event on openreg stream"):
        event.record()
    event.record()
    event.synchronize()
    assert event.query()


def test_enumerate_fault_reports_no_devices_once():
    torch.openreg._inject_fault("enumerate", after=2)
    counts = [torch.openreg.device_count() for _ in range(4)]
    assert counts == [2, 2, 0, 2]
    assert torch.ones(1, device="openreg:1").item() == 1


def test_bad_fault_arguments():
    with pytest.raises(ValueError, match="unknown fault kind \"disk\": expected one of alloc, kernel, event, enumerate"):
        torch.openreg._inject_fault("disk")
    with pytest.raises(ValueError, match="after must be a non-negative int"):
        torch.openreg._inject_fault("alloc", after=-1)
    with pytest.raises(TypeError):
        torch.openreg._inject_fault(3)


# OPENREG_FAULT=kind[:after] arms a fault from the start of the process
# (Note [Injected faults]): one fresh process per kind. Each reports the
# option as options() shows it, the error of the operation that fails, and
# normal work afterwards.
FAULT_OPTION_CASES = {
    # after=1: the process's first allocation succeeds, the second fails.
    "alloc:1": """
        first = torch.empty(4, device="openreg")
        RESULT["error"] = error_of(lambda: torch.empty(4, device="openreg"))
    """,
    # The very first kernel (the fill of ones) fails; its stream reports it.
    "kernel:0": """
        x = torch.ones(8, device="openreg")
        RESULT["error"] = error_of(torch.openreg.synchronize)
        RESULT["again"] = error_of(torch.openreg.synchronize)
    """,
    "event:0": """
        RESULT["error"] = error_of(lambda: torch.Event(device="openreg").record())
    """,
    "enumerate:2": """
        RESULT["counts"] = [torch.openreg.device_count() for _ in range(4)]
        RESULT["error"] = None
    """,
}


def _fault_option_script(spec: str, case: str):
    code = (
        textwrap.dedent(
            """
            import torch, torch_openreg
            opt = torch.openreg.options()["OPENREG_FAULT"]
            RESULT["option"] = [opt["value"], opt["source"]]
            """
        )
        + textwrap.dedent(case)
        + textwrap.dedent(
            """
            try:
                RESULT["sum"] = torch.ones(3, device="openreg:1").sum().item()
                torch.openreg.synchronize()
            except Exception as e:
                RESULT["sum"] = f"{type(e).__name__}: {e}"
            done(RESULT)
            """
        )
    )
    return script(f"OPENREG_FAULT={spec}", code, env=clean_env(OPENREG_FAULT=spec))


FAULT_OPTION_SCRIPTS = {spec: _fault_option_script(spec, case) for spec, case in FAULT_OPTION_CASES.items()}

EXPECTED_OPTION_ERRORS = {
    "alloc:1": r"OutOfMemoryError: injected fault \(alloc\): allocating 16 bytes on openreg device 0 failed \(OPENREG_FAULT\)",
    "kernel:0": r"RuntimeError: injected fault \(kernel\): a kernel on openreg stream 0 on device 0 failed \(OPENREG_FAULT\)",
    "event:0": r"RuntimeError: injected fault \(event\): recording an event on openreg stream 0 on device 0 failed \(OPENREG_FAULT\)",
    "enumerate:2": None,
}


@pytest.mark.subprocess
@pytest.mark.parametrize("spec", list(FAULT_OPTION_CASES))
def test_fault_option_surfaces_once_and_the_runtime_stays_usable(spec):
    data = FAULT_OPTION_SCRIPTS[spec].result().check_ok()
    assert data["option"] == [spec, "environment"]
    expected = EXPECTED_OPTION_ERRORS[spec]
    if expected is None:
        assert data["error"] is None
    else:
        assert data["error"] is not None and re.fullmatch(expected, data["error"]), data["error"]
    if spec == "enumerate:2":
        assert data["counts"] == [2, 2, 0, 2]
    if spec == "kernel:0":
        assert data["again"] is None  # reported once
    # Normal work right after the fault.
    assert data["sum"] == 3


def test_fault_option_is_listed_and_unset_here():
    opt = torch.openreg.options()["OPENREG_FAULT"]
    assert (opt["value"], opt["source"]) == ("", "default")
    assert "alloc, kernel, event or enumerate" in opt["help"]


@pytest.mark.parametrize(
    "wait",
    ["item", "cpu", "tolist", "blocking_copy", "event_synchronize", "stream_synchronize", "nonzero"],
)
def test_a_failed_kernel_is_reported_by_every_kind_of_wait(wait):
    """Note [Sticky kernel failures]: the first call that waits for the
    stream raises, whichever it is, idle stream or busy."""
    x = torch.ones(8, device="openreg")
    torch.openreg._inject_fault("kernel")
    y = x + 1  # the failing kernel
    calls = {
        "item": lambda: y.sum().item(),
        "cpu": lambda: y.cpu(),
        "tolist": lambda: y.tolist(),
        "blocking_copy": lambda: torch.empty(8).copy_(y),
        "event_synchronize": lambda: torch.openreg.current_stream().record_event().synchronize(),
        "stream_synchronize": lambda: torch.openreg.current_stream().synchronize(),
        "nonzero": lambda: y.nonzero(),
    }
    with pytest.raises(RuntimeError, match=r"injected fault \(kernel\)"):
        calls[wait]()
    torch.openreg.synchronize()  # reported once
    assert (x * 2).sum().item() == 16


def test_a_failed_queued_kernel_is_reported_by_item():
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        x = torch.ones(8, device="openreg")
        torch.openreg._sleep(30)
        torch.openreg._inject_fault("kernel")
        y = x + 1
        with pytest.raises(RuntimeError, match=r"injected fault \(kernel\)"):
            y.sum().item()
