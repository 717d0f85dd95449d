"""Sync-debug mode: host-blocking operations warn or raise, naming the
operation; the mode starts as OPENREG_SYNC_DEBUG."""

import warnings

import pytest
import torch

from _openreg_util import clean_env, script


@pytest.fixture
def mode():
    yield torch.openreg.set_sync_debug_mode
    torch.openreg.set_sync_debug_mode("default")


BLOCKING = {
    "Tensor.item()": lambda x: x.sum().item(),
    "blocking copy": lambda x: x.cpu(),
    # Data-dependent shapes are reported when they must wait (Note [Sync debug]).
    "nonzero": lambda x: (torch.openreg._sleep(20), torch.nonzero(x)),
    "device synchronize": lambda x: torch.openreg.synchronize(),
    "Stream.synchronize()": lambda x: torch.openreg.current_stream().synchronize(),
    "Event.synchronize()": lambda x: torch.openreg.current_stream().record_event().synchronize(),
}


@pytest.mark.parametrize("name", sorted(BLOCKING))
def test_error_mode_raises_naming_the_operation(mode, name):
    x = torch.ones(8, device="openreg")
    mode("error")
    assert torch.openreg.get_sync_debug_mode() == 2
    with pytest.raises(RuntimeError, match="sync debug mode is \"error\"") as info:
        BLOCKING[name](x)
    assert name in str(info.value)
    mode("default")
    BLOCKING[name](x)  # the runtime stays usable


@pytest.mark.parametrize("name", sorted(BLOCKING))
def test_warn_mode_warns_and_proceeds(mode, name):
    x = torch.ones(8, device="openreg")
    mode(1)
    assert torch.openreg.get_sync_debug_mode() == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        BLOCKING[name](x)
    messages = [str(w.message) for w in caught]
    assert any("host-blocking" in m and name in m for m in messages), messages


def test_asynchronous_work_is_not_reported(mode):
    x = torch.ones(8, device="openreg")
    pinned = torch.empty(8).pin_memory()
    mode("error")
    y = x * 2 + 1
    y.add_(x)
    pinned.copy_(y, non_blocking=True)
    x.copy_(pinned, non_blocking=True)
    torch.ones(4, device="openreg:1").copy_(y[:4])
    s = torch.openreg.Stream()
    s.wait_stream(torch.openreg.current_stream())
    mode("default")
    torch.openreg.synchronize()
    assert pinned.tolist() == [4.0] * 8


def test_a_plans_first_check_is_not_reported(mode):
    """The first call of a fallback op with new shapes on a busy stream,
    with operands too large for a trial on stand-ins (Note [Trial on
    stand-ins] in cpp/ops/fallback.cpp), waits once to check its planned
    results (Note [Meta results]): the runtime's own wait, which CUDA would
    not make, so error mode lets it through."""
    x = torch.rand(80, 70, device="openreg")
    mode("error")
    torch.openreg._sleep(20)
    y = torch.special.erfcx(x).cumsum(0).sort(dim=1).values
    mode("default")
    torch.testing.assert_close(y.cpu(), torch.special.erfcx(x.cpu()).cumsum(0).sort(dim=1).values)


def test_default_mode_is_silent(mode):
    x = torch.ones(8, device="openreg")
    mode("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in BLOCKING.values():
            fn(x)


def test_bad_modes(mode):
    for bad in ("loud", 3, -1, None, True):
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            mode(bad)
    assert torch.openreg.get_sync_debug_mode() == 0


ENV_MODE = script(
    "sync_debug_env",
    """
    import torch, torch_openreg
    RESULT["mode"] = torch.openreg.get_sync_debug_mode()
    RESULT["source"] = torch.openreg.options()["OPENREG_SYNC_DEBUG"]["source"]
    RESULT["item"] = error_of(lambda: torch.ones(2, device="openreg").sum().item())
    done(RESULT)
    """,
    env=clean_env(OPENREG_SYNC_DEBUG="error"),
)


@pytest.mark.subprocess
def test_option_sets_the_initial_mode():
    r = ENV_MODE.result().check_ok()
    assert r["mode"] == 2 and r["source"] == "environment"
    assert r["item"].startswith("RuntimeError") and "Tensor.item()" in r["item"]


@pytest.fixture
def op_timeout():
    yield torch.openreg.set_op_timeout_ms
    torch.openreg.set_op_timeout_ms(None)


def test_op_timeout_ends_waits_for_a_long_kernel(op_timeout):
    import time

    s = torch.openreg.Stream(device=1)
    op_timeout(300)
    assert torch.openreg.get_op_timeout_ms() == 300
    with torch.openreg.stream(s):
        torch.openreg._sleep(6000)
    t0 = time.perf_counter()
    # The error names the kernel (_sleep queues one called torch.openreg._sleep).
    with pytest.raises(
        RuntimeError,
        match=r'op timeout: kernel "torch\.openreg\._sleep" running on openreg stream \d+ on device 1 has run for \d+ ms',
    ):
        s.synchronize()
    with pytest.raises(RuntimeError, match="op timeout"):
        torch.openreg.synchronize(1)
    # Both gave up long before the 6 s kernel ended, however loaded the machine.
    assert time.perf_counter() - t0 < 4.5
    # Short kernels are unaffected; without a timeout the wait completes.
    assert torch.ones(3, device="openreg:0").sum().item() == 3
    op_timeout(0)
    s.synchronize()
    assert s.query()


def test_op_timeout_names_an_aten_kernel(op_timeout):
    # A matmul of 2 x 2500^3 flops runs for a good fraction of a second on
    # one core (Note [Kernel threads]): far past the 50 ms timeout. The
    # first one of a shape runs while the host waits (route 3 of Note
    # [Fallback]); the second is queued.
    s = torch.openreg.Stream(device=0)
    with torch.openreg.stream(s):
        a = torch.ones(2500, 2500, device="openreg")
        a @ a
        s.synchronize()
        op_timeout(50)
        product = a @ a
    with pytest.raises(RuntimeError, match=r'op timeout: kernel "aten::mm" running on openreg stream \d+ on device 0'):
        s.synchronize()
    op_timeout(0)
    s.synchronize()
    assert product[0, 0].item() == 2500


def test_op_timeout_bad_values(op_timeout):
    for bad in (-1, 1.5, "1s", True):
        with pytest.raises(ValueError, match="set_op_timeout_ms"):
            op_timeout(bad)
    assert torch.openreg.get_op_timeout_ms() == 0
