"""Injected faults (torch.openreg._inject_fault): each surfaces as a Python
exception naming what failed, and normal work succeeds right after."""

import pytest
import torch


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
