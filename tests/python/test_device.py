"""Devices: count, availability, the per-thread current device, lazy
initialization and contexts, device-wide synchronize, capability."""

import threading
import types

import pytest
import torch

from torch_openreg import _C
from _openreg_util import busy, elapsed, new_stream, run_threads, script

# A fresh process, to observe lazy initialization. The order matters: each
# step must not have been preceded by anything that initializes. In
# particular nothing reaches torch.accelerator before the timed
# torch.openreg.synchronize() (see test_synchronize_waits_as_first_call...).
FRESH = script(
    "fresh_device_state",
    """
    import torch, torch_openreg
    from torch_openreg import _C
    ctx = lambda: [_C._has_primary_context(i) for i in range(torch.openreg.device_count())]
    RESULT["options_count"] = torch.openreg.options()["OPENREG_DEVICE_COUNT"]["value"]
    RESULT["count"] = torch.openreg.device_count()
    RESULT["initialized_at_import"] = torch.openreg.is_initialized()
    RESULT["ctx_at_import"] = ctx()
    RESULT["available"] = torch.openreg.is_available()
    RESULT["initialized_after_available"] = torch.openreg.is_initialized()
    RESULT["ctx_after_available"] = ctx()
    torch.openreg.set_device(1)
    torch.openreg.set_device(1)
    RESULT["ctx_after_set_device"] = ctx()
    torch.openreg.init()
    RESULT["initialized_after_init"] = torch.openreg.is_initialized()
    torch.openreg.init()  # idempotent
    RESULT["ctx_after_init"] = ctx()
    # A stream operation on device 1 creates device 1's context only.
    torch.openreg._sleep(300)
    RESULT["ctx_after_stream_op"] = ctx()
    t0 = time.perf_counter()
    torch.openreg.synchronize()  # the current device, 1
    RESULT["first_synchronize_s"] = time.perf_counter() - t0
    RESULT["query_after_first_synchronize"] = torch.openreg.default_stream(1).query()
    torch.openreg.current_stream().synchronize()
    # torch.accelerator's availability queries create no context either.
    RESULT["accelerator_available"] = [torch.accelerator.is_available(), torch.accelerator.device_count()]
    RESULT["ctx_after_accelerator_available"] = ctx()
    torch.openreg.set_device(0)
    torch.Stream(device="openreg:0")
    RESULT["ctx_after_new_stream"] = ctx()
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_default_device_count_is_two():
    # In this process the count may come from the caller's environment;
    # FRESH runs with OPENREG_* removed.
    data = FRESH.result().check_ok()
    assert data["count"] == 2
    assert data["options_count"] == "2"
    assert torch.openreg.device_count() == torch.accelerator.device_count() >= 2


def test_is_available():
    assert torch.openreg.is_available() is True
    assert torch.accelerator.is_available() is True
    assert torch.accelerator.current_accelerator() == torch.device("openreg")


def test_set_device_and_current_device():
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(1)
    assert torch.openreg.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    assert _C._get_device() == 1
    torch.openreg.set_device(torch.device("openreg:0"))
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device("openreg:1")
    assert torch.openreg.current_device() == 1
    torch.openreg.set_device(-1)  # negative: ignored, like torch.cuda
    assert torch.openreg.current_device() == 1
    torch.openreg.set_device(1)  # the same device again is fine
    assert torch.openreg.current_device() == 1


def test_exchange_device_returns_previous():
    assert _C._exchange_device(1) == 0
    assert _C._exchange_device(1) == 1
    assert _C._exchange_device(0) == 1
    assert torch.openreg.current_device() == 0


def test_accelerator_set_device_index():
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    assert torch.openreg.current_device() == 1
    torch.accelerator.set_device_index(0)
    assert torch.openreg.current_device() == 0


def test_accelerator_device_index_context_manager():
    with torch.accelerator.device_index(1):
        assert torch.openreg.current_device() == 1
        with torch.accelerator.device_index(0):
            assert torch.openreg.current_device() == 0
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0


def test_device_context_manager_restores():
    with torch.openreg.device(1):
        assert torch.openreg.current_device() == 1
        with torch.openreg.device("openreg:0"):
            assert torch.openreg.current_device() == 0
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0

    with pytest.raises(KeyError):
        with torch.openreg.device(torch.device("openreg:1")):
            assert torch.openreg.current_device() == 1
            raise KeyError("inside")
    assert torch.openreg.current_device() == 0

    torch.openreg.set_device(1)
    with torch.openreg.device(None):  # no-op
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 1


def test_device_of():
    # No factory kernels yet: a stand-in with the Tensor attributes device_of reads.
    fake = types.SimpleNamespace(device=torch.device("openreg:1"), get_device=lambda: 1)
    with torch.openreg.device_of(fake):
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0

    torch.openreg.set_device(1)
    with torch.openreg.device_of(torch.zeros(2)):  # a CPU tensor changes nothing
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 1


def test_current_device_is_per_thread():
    barrier = threading.Barrier(2, timeout=10)
    seen = {}

    def worker(name, index):
        def body():
            assert torch.openreg.current_device() == 0  # every thread starts on 0
            torch.openreg.set_device(index)
            barrier.wait()  # both have set their device
            for _ in range(200):
                assert torch.openreg.current_device() == index
                assert torch.accelerator.current_device_index() == index
            barrier.wait()
            seen[name] = torch.openreg.current_device()

        return body

    torch.openreg.set_device(1)  # the main thread's choice leaks to no one
    errors = run_threads([worker("a", 1), worker("b", 0)], timeout=20)
    assert not errors, errors
    assert seen == {"a": 1, "b": 0}
    assert torch.openreg.current_device() == 1


def test_init_and_is_initialized():
    torch.openreg.init()
    assert torch.openreg.is_initialized() is True


@pytest.mark.subprocess
def test_lazy_init_in_fresh_process():
    data = FRESH.result().check_ok()
    assert data["initialized_at_import"] is False
    assert data["initialized_after_available"] is False
    assert data["initialized_after_init"] is True


@pytest.mark.subprocess
def test_primary_context_created_lazily():
    data = FRESH.result().check_ok()
    assert data["ctx_at_import"] == [False, False]
    # is_available() creates no context
    assert data["available"] is True
    assert data["ctx_after_available"] == [False, False]
    # making a device current creates no context
    assert data["ctx_after_set_device"] == [False, False]
    assert data["ctx_after_stream_op"] == [False, True]
    assert data["accelerator_available"] == [True, 2]
    assert data["ctx_after_accelerator_available"] == [False, True]
    assert data["ctx_after_new_stream"] == [True, True]


def test_has_primary_context_after_use():
    new_stream(0).query()
    new_stream(1).query()
    assert _C._has_primary_context(0) is True
    assert _C._has_primary_context(1) is True


def test_synchronize_waits_for_every_stream_of_the_device():
    a, b = new_stream(1), new_stream(1)
    assert a.stream_id != b.stream_id
    busy(a, 200)
    busy(b, 300)
    busy(torch.openreg.default_stream(1), 100)
    with torch.openreg.device(1):
        took = elapsed(torch.openreg.synchronize)  # device=None: the current device
    assert took >= 0.27
    assert a.query() and b.query() and torch.openreg.default_stream(1).query()


def test_synchronize_takes_a_device_argument():
    s1 = new_stream(1)
    busy(s1, 300)
    took = elapsed(lambda: torch.openreg.synchronize(0))
    assert s1.query() is False, "synchronize(0) must not wait for device 1"
    assert took < 0.25
    took = elapsed(lambda: torch.openreg.synchronize("openreg:1"))
    assert s1.query() is True
    assert took >= 0.05


@pytest.mark.subprocess
def test_synchronize_waits_as_first_call_in_fresh_process():
    data = FRESH.result().check_ok()
    assert data["first_synchronize_s"] >= 0.25, data
    assert data["query_after_first_synchronize"] is True


def test_accelerator_synchronize():
    s1 = new_stream(1)
    busy(s1, 250)
    took = elapsed(lambda: torch.accelerator.synchronize(0))
    assert s1.query() is False
    assert took < 0.2
    assert elapsed(lambda: torch.accelerator.synchronize(1)) >= 0.1
    assert s1.query() is True

    torch.openreg.set_device(1)
    busy(s1, 250)
    assert elapsed(torch.accelerator.synchronize) >= 0.2  # current device
    assert s1.query() is True


def test_device_capability():
    cap = torch.accelerator.get_device_capability("openreg:0")
    dtypes = cap["supported_dtypes"]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8):
        assert dtype in dtypes
    for dtype in (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4):
        assert dtype not in dtypes
    assert torch.accelerator.get_device_capability("openreg:1") == cap


def test_device_properties():
    props = torch.openreg.get_device_properties(1)
    assert props.index == 1
    assert "1" in props.name
    assert torch.openreg.get_device_name(0) != torch.openreg.get_device_name(1)


def test_options():
    opts = torch.openreg.options()
    for name in ("OPENREG_DEVICE_COUNT", "OPENREG_LAUNCH_BLOCKING", "OPENREG_WORKER_IDLE_MS"):
        assert name in opts
        assert set(opts[name]) == {"value", "source", "help"}
        assert opts[name]["help"]
        assert opts[name]["source"] in ("environment", "default")
    assert int(opts["OPENREG_DEVICE_COUNT"]["value"]) == torch.openreg.device_count()


def test_every_option_is_in_the_readme_table():
    import os

    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    missing = [name for name in torch.openreg.options() if f"| `{name}` |" not in readme]
    assert not missing, f"options missing from the README's Options table: {missing}"


def test_not_in_bad_fork():
    assert torch.openreg._is_in_bad_fork() is False
    assert _C._is_in_bad_fork() is False
