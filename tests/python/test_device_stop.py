"""torch.openreg.stop_device / restart_device (Note [Stopped devices] in
src/runtime/device_stop.rs, Note [Device memory generations] in src/runtime/allocator.rs).

Each scenario runs in a fresh process: a restart makes every tensor of the
device from before it unusable, which would break the tests that share this
process's tensors."""

import pytest
import torch

from _openreg_util import script

STOP_AND_RESTART = script(
    "stop_and_restart",
    """
    import torch, torch_openreg
    from torch_openreg import _C
    x = torch.arange(4.0, device="openreg:1")
    kept = x.cpu()
    other = torch.ones(3, device="openreg:0")
    s = torch.openreg.Stream(device=1)
    with torch.openreg.stream(s):
        torch.openreg._sleep(300)  # running when the device stops
        y = x + 1                  # queued behind it: abandoned
        z = y * 2
    time.sleep(0.05)
    torch.openreg.stop_device("openreg:1")
    RESULT["stopped"] = [torch.openreg.is_device_stopped(1), torch.openreg.is_device_stopped(0)]
    RESULT["rejected"] = {
        "new tensor": error_of(lambda: torch.ones(2, device="openreg:1")),
        "kernel": error_of(lambda: x + 1),
        "copy to host": error_of(lambda: x.cpu()),
        "copy to device": error_of(lambda: kept.to("openreg:1")),
        "event record": error_of(lambda: torch.Event(device="openreg:1").record(s)),
        "stop again": error_of(lambda: torch.openreg.stop_device(1)),
    }
    RESULT["other_device"] = (other * 2).sum().item()
    t0 = time.perf_counter()
    RESULT["first_sync"] = error_of(s.synchronize)
    RESULT["first_sync_s"] = time.perf_counter() - t0
    RESULT["second_sync"] = error_of(s.synchronize)
    RESULT["device_sync"] = error_of(lambda: torch.openreg.synchronize(1))
    RESULT["query"] = s.query()

    torch.openreg.restart_device(1)
    RESULT["after_restart"] = torch.openreg.is_device_stopped(1)
    RESULT["stale"] = {
        "kernel": error_of(lambda: x + 1),
        "in-place": error_of(lambda: x.add_(1)),
        "copy to host": error_of(lambda: x.cpu()),
        "item": error_of(lambda: x[0].item()),
        "restart again": error_of(lambda: torch.openreg.restart_device(1)),
    }
    fresh = kept.to("openreg:1")
    RESULT["fresh"] = (fresh + 1).cpu().tolist()
    allocated_with_stale = torch.openreg.memory_allocated(1)
    del x, y, z  # stale tensors can be freed
    RESULT["freed_stale"] = allocated_with_stale - torch.openreg.memory_allocated(1)
    RESULT["still_fresh"] = (fresh * 2).sum().item()
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_stop_rejects_new_work_and_abandons_queued_work():
    r = STOP_AND_RESTART.result().check_ok()
    assert r["stopped"] == [True, False]
    for what, error in r["rejected"].items():
        if what == "stop again":
            assert error == "RuntimeError: stop_device: openreg device 1 is already stopped (torch.openreg.restart_device(1) brings it back)"
        else:
            assert error is not None and error.startswith(
                "RuntimeError: openreg device 1 is stopped (torch.openreg.stop_device(1)): it accepts no new work until "
                "torch.openreg.restart_device(1)"
            ), (what, error)
    assert r["other_device"] == 6  # other devices are unaffected
    # The running kernel finished; the two queued behind it were abandoned,
    # reported once by the next synchronize.
    assert r["first_sync"] == (
        "RuntimeError: openreg stream 1 on device 1: 2 queued kernels were abandoned because openreg device 1 "
        "was stopped (torch.openreg.stop_device)"
    ), r["first_sync"]
    assert r["second_sync"] is None and r["device_sync"] is None and r["query"] is True


@pytest.mark.subprocess
def test_restart_accepts_work_and_old_tensors_raise():
    r = STOP_AND_RESTART.result().check_ok()
    assert r["after_restart"] is False
    for what, error in r["stale"].items():
        if what == "restart again":
            assert error == "RuntimeError: restart_device: openreg device 1 is not stopped (torch.openreg.stop_device(1) stops it first)"
        else:
            assert error is not None and error.startswith("RuntimeError: this openreg tensor's memory (16 bytes at 0x"), (what, error)
            assert "was allocated on device 1 before torch.openreg.restart_device(1)" in error, (what, error)
    assert r["fresh"] == [1.0, 2.0, 3.0, 4.0]
    assert r["freed_stale"] == 3 * 512  # x, y and z: one block each
    assert r["still_fresh"] == 12


# A kernel still running when its device restarts writes into memory of the
# old generation: that memory stays mapped until freed, so nothing crashes
# (the process's exit code says so), and the kernel's stream still orders work.
RUNNING_ACROSS_RESTART = script(
    "kernel_running_across_restart",
    """
    import torch, torch_openreg
    a = torch.ones(2000, 2000, device="openreg:1")
    big = torch.ones(4000, 4000, device="openreg:1")
    s = torch.openreg.Stream(device=1)
    with torch.openreg.stream(s):
        a @ a  # the first of a shape runs while the host waits (Note [Fallback])
        big @ big
        t0 = time.perf_counter()
        a @ a  # queued, as the next one is: how long one runs
        s.synchronize()
        took = time.perf_counter() - t0
        # Eight times that work: it runs on across the restart even when the
        # product timed above was slowed by other processes and this one is not.
        product = big @ big
    time.sleep(took / 4)  # its worker has started it, and it runs on
    torch.openreg.stop_device(1)
    torch.openreg.restart_device(1)
    RESULT["running"] = not s.query()
    RESULT["sync"] = error_of(s.synchronize)
    RESULT["use"] = error_of(lambda: product.sum())
    del a, big, product
    with torch.openreg.stream(s):
        RESULT["after"] = torch.full((2,), 3.0, device="openreg:1").sum().item()
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_a_kernel_running_across_a_restart_does_not_crash():
    r = RUNNING_ACROSS_RESTART.result().check_ok()
    assert r["running"] is True, r
    assert r["sync"] is None  # nothing was queued behind it to abandon
    assert "before torch.openreg.restart_device(1)" in r["use"]
    assert r["after"] == 6


BAD_CALLS = script(
    "stop_device_bad_calls",
    """
    import torch, torch_openreg
    RESULT["errors"] = [
        error_of(lambda: torch.openreg.stop_device(5)),
        error_of(lambda: torch.openreg.restart_device(-1)),
        error_of(lambda: torch.openreg.stop_device("cpu")),
        error_of(lambda: torch.openreg.restart_device(0)),
        error_of(lambda: torch.openreg.is_device_stopped(2)),
    ]
    # Stopping and restarting an unused device creates no context.
    torch.openreg.stop_device(1)
    torch.openreg.restart_device(1)
    from torch_openreg import _C
    RESULT["context"] = _C._has_primary_context(1)
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_bad_stop_and_restart_calls():
    r = BAD_CALLS.result().check_ok()
    out_of_range, negative, wrong_type, not_stopped, no_device = r["errors"]
    assert out_of_range == "RuntimeError: openreg device index 5 is out of range: there are 2 devices"
    assert negative.startswith("RuntimeError: openreg device index -1 is out of range"), negative
    assert wrong_type == "ValueError: expected an openreg device, but got cpu"
    assert not_stopped.startswith("RuntimeError: restart_device: openreg device 0 is not stopped"), not_stopped
    assert no_device.startswith("RuntimeError: openreg device index 2 is out of range"), no_device
    assert r["context"] is False


def test_devices_run_here():
    # This process never stops a device (see the module docstring).
    assert not any(torch.openreg.is_device_stopped(i) for i in range(torch.openreg.device_count()))
