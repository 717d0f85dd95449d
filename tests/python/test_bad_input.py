"""Bad input: every misuse is a clear exception that names the problem —
never a crash, never silently ignored. Risky calls also run in a subprocess
whose return code is checked; environment options run in fresh processes."""

import re

import pytest
import torch

from torch_openreg import _C
from _openreg_util import clean_env, elapsed, new_stream, script

OPENREG = 20  # c10::DeviceType::PrivateUse1, as torch.Stream stores it


def _stream(stream_id, device_index):
    return torch.Stream(stream_id=stream_id, device_index=device_index, device_type=OPENREG)


# ------------------------------------------------------------ device indices


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.openreg.set_device(5),
        lambda: torch.accelerator.set_device_index(5),
        lambda: torch.openreg.device(5).__enter__(),
        lambda: torch.accelerator.device_index(5).__enter__(),
        lambda: torch.openreg.synchronize(5),
        lambda: torch.accelerator.synchronize(5),
        lambda: torch.openreg.current_stream(5),
        lambda: torch.accelerator.current_stream(5),
        lambda: torch.openreg.default_stream(5),
        lambda: torch.Stream(device="openreg:5"),
        lambda: torch.openreg.Stream(device=5),
        lambda: torch.accelerator.get_device_capability("openreg:5"),
        lambda: torch.openreg.get_device_properties(5),
        lambda: _C._has_primary_context(5),
        lambda: _C._set_device(5),
    ],
    ids=[
        "set_device",
        "set_device_index",
        "device_ctx",
        "device_index_ctx",
        "synchronize",
        "accelerator_synchronize",
        "current_stream",
        "accelerator_current_stream",
        "default_stream",
        "torch_Stream",
        "openreg_Stream",
        "device_capability",
        "device_properties",
        "has_primary_context",
        "C_set_device",
    ],
)
def test_device_index_out_of_range(call):
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    assert "index 5" in message and "2 devices" in message, message
    assert torch.openreg.current_device() == 0


def test_set_device_error_names_index_and_count():
    with pytest.raises(RuntimeError, match=r"index 5 .*2 devices"):
        torch.openreg.set_device(5)
    with pytest.raises(RuntimeError, match=r"index 2 .*2 devices"):
        torch.openreg.set_device(2)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: torch.openreg.set_device(2**32), id="set_device_2**32"),
        pytest.param(lambda: torch.openreg.set_device(2**32 + 1), id="set_device_2**32+1"),
        pytest.param(lambda: torch.openreg.Stream(device=2**32 + 1), id="Stream_2**32+1"),
        pytest.param(lambda: torch.openreg.synchronize(2**32), id="synchronize_2**32"),
        pytest.param(lambda: _C._has_primary_context(2**32), id="has_primary_context_2**32"),
        pytest.param(lambda: torch.openreg.default_stream(2**32), id="default_stream_2**32"),
    ],
)
def test_huge_device_index_is_rejected(call):
    with pytest.raises((RuntimeError, ValueError, OverflowError), match=r"4294967296|4294967297|out of range|too large"):
        call()
    assert torch.openreg.current_device() == 0


# ------------------------------------------------------- non-openreg devices


def test_stream_of_non_openreg_device():
    with pytest.raises(ValueError, match="openreg.*cpu|cpu.*openreg"):
        torch.openreg.Stream(device="cpu")
    with pytest.raises(ValueError, match="cuda"):
        torch.openreg.Stream(device=torch.device("cuda:0"))


def test_set_stream_with_non_openreg_stream():
    cpu_stream = torch.Stream(device="cpu")
    with pytest.raises(ValueError, match="openreg.*cpu|cpu.*openreg"):
        torch.openreg.set_stream(cpu_stream)
    with pytest.raises((RuntimeError, ValueError)):
        torch.accelerator.set_stream(cpu_stream)
    assert torch.openreg.current_stream(0) == torch.openreg.default_stream(0)
    assert torch.openreg.current_device() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.openreg.set_device("cpu"),
        lambda: torch.openreg.device("cpu"),
        lambda: torch.openreg.current_stream("cpu"),
        lambda: torch.openreg.synchronize(torch.device("cpu")),
        lambda: torch.accelerator.current_stream("cpu"),
        lambda: torch.accelerator.synchronize("cpu"),
    ],
    ids=["set_device", "device_ctx", "current_stream", "synchronize", "acc_current_stream", "acc_synchronize"],
)
def test_non_openreg_device_arguments(call):
    with pytest.raises(ValueError, match="cpu"):
        call()


def test_wrong_argument_types():
    with pytest.raises(TypeError, match="1.5"):
        torch.openreg.set_device(1.5)
    with pytest.raises(ValueError, match="0..600000"):
        torch.openreg._sleep(-1)
    with pytest.raises(ValueError, match="0..600000"):
        torch.openreg._sleep(float("nan"))


# -------------------------------------------------------- streams and events


@pytest.mark.parametrize("stream_id", [999, -3, 65])
def test_invalid_stream_id(stream_id):
    bad = _stream(stream_id, 0)
    for call in (bad.query, bad.synchronize, lambda: bad.native_handle, lambda: torch.openreg.set_stream(bad)):
        with pytest.raises(RuntimeError, match=rf"stream id {stream_id}\b.*device 0"):
            call()
    assert torch.openreg.current_stream(0) == torch.openreg.default_stream(0)


def test_stream_of_nonexistent_device():
    bad = _stream(1, 7)
    with pytest.raises(RuntimeError, match=r"index 7 .*2 devices"):
        bad.query()
    with pytest.raises(RuntimeError, match=r"index 7 .*2 devices"):
        torch.openreg.set_stream(bad)


def test_event_with_invalid_stream():
    e = torch.Event(device="openreg")
    with pytest.raises(RuntimeError, match="stream id 999"):
        e.record(_stream(999, 0))
    e.record(new_stream(0))
    with pytest.raises(RuntimeError, match="stream id 999"):
        e.wait(_stream(999, 0))
    with pytest.raises(RuntimeError, match="index 7"):
        e.wait(_stream(1, 7))


def test_cross_device_event_misuse_is_an_error():
    e = torch.Event(device="openreg")
    e.record(new_stream(1))
    e.wait(new_stream(0))  # allowed, as cudaStreamWaitEvent (test_events.py)
    with pytest.raises(RuntimeError, match=r"device 1"):
        e.record(new_stream(0))  # not allowed, as cudaEventRecord


def test_elapsed_time_misuse():
    s = new_stream(0)
    plain, timed, never = (torch.Event(device="openreg"), torch.Event(device="openreg", enable_timing=True),
                           torch.Event(device="openreg", enable_timing=True))
    plain.record(s)
    timed.record(s)
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        plain.elapsed_time(timed)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        timed.elapsed_time(never)


# ----------------------------------------------------- in a subprocess too

RISKY = script(
    "risky_calls",
    """
    import torch, torch_openreg
    from torch_openreg import _C
    S = lambda i, d: torch.Stream(stream_id=i, device_index=d, device_type=20)
    def busy(s, ms):
        with torch.openreg.stream(s):
            torch.openreg._sleep(ms)
    e0 = torch.Event(device="openreg"); e0.record(torch.Stream(device="openreg:0"))
    t_plain, t_timed = torch.Event(device="openreg"), torch.Event(device="openreg", enable_timing=True)
    t_plain.record(); t_timed.record()
    pending_a, pending_b = torch.Event(device="openreg", enable_timing=True), torch.Event(device="openreg", enable_timing=True)
    slow = torch.Stream(device="openreg:0")
    pending_a.record(slow); busy(slow, 300); pending_b.record(slow)
    calls = {
        "set_device_99": lambda: torch.openreg.set_device(99),
        "set_device_index_99": lambda: torch.accelerator.set_device_index(99),
        "C_set_device_-7": lambda: _C._set_device(-7),
        "C_exchange_device_9": lambda: _C._exchange_device(9),
        "C_live_worker_count_9": lambda: _C._live_worker_count(9),
        "stream_id_999_query": lambda: S(999, 0).query(),
        "stream_id_999_sync": lambda: S(999, 1).synchronize(),
        "stream_id_-1_handle": lambda: S(-1, 0).native_handle,
        "stream_dev_9_query": lambda: S(1, 9).query(),
        "set_stream_bad": lambda: torch.accelerator.set_stream(S(500, 0)),
        "record_bad_stream": lambda: torch.Event(device="openreg").record(S(500, 1)),
        # (waiting on an event of another device is legal: test_events.py)
        "wait_bad_stream": lambda: e0.wait(S(500, 1)),
        "record_other_device": lambda: e0.record(torch.Stream(device="openreg:1")),
        "elapsed_no_timing": lambda: t_plain.elapsed_time(t_timed),
        "elapsed_pending": lambda: pending_a.elapsed_time(pending_b),
        "sleep_negative": lambda: torch.openreg._sleep(-5),
        "sleep_huge": lambda: torch.openreg._sleep(1e12),
        "stream_cpu": lambda: torch.openreg.Stream(device="cpu"),
        "set_stream_cpu": lambda: torch.openreg.set_stream(torch.Stream(device="cpu")),
        "capability_9": lambda: torch.accelerator.get_device_capability("openreg:9"),
    }
    RESULT["errors"] = {name: error_of(call) for name, call in calls.items()}
    # Still fully usable afterwards.
    s = torch.Stream(device="openreg:1")
    busy(s, 20)
    s.synchronize()
    torch.openreg.synchronize(0)
    RESULT["usable"] = s.query() and slow.query() and torch.openreg.current_device() == 0
    # Destroying events (never throws), including never-recorded ones.
    for _ in range(10):
        torch.Event(device="openreg"); torch.Event(device="openreg", enable_timing=True)
    del e0, pending_a, pending_b
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_risky_calls_raise_and_never_crash():
    data = RISKY.result().check_ok()
    errors = data["errors"]
    missing = {name for name, err in errors.items() if err is None}
    assert not missing, f"no exception from: {sorted(missing)}"
    expect = {
        "set_device_99": r"RuntimeError: .*index 99 .*2 devices",
        "set_device_index_99": r"RuntimeError: .*index 99 .*2 devices",
        "C_set_device_-7": r"RuntimeError: .*index -7",
        "C_exchange_device_9": r"RuntimeError: .*index 9",
        "C_live_worker_count_9": r"RuntimeError: .*index 9",
        "stream_id_999_query": r"RuntimeError: stream id 999 .*device 0",
        "stream_id_999_sync": r"RuntimeError: stream id 999 .*device 1",
        "stream_id_-1_handle": r"RuntimeError: stream id -1 ",
        "stream_dev_9_query": r"RuntimeError: .*index 9",
        "set_stream_bad": r"RuntimeError: stream id 500",
        "record_bad_stream": r"RuntimeError: stream id 500",
        "wait_bad_stream": r"RuntimeError: stream id 500",
        "record_other_device": r"RuntimeError: .*device 0.*device 1|RuntimeError: .*device 1.*device 0",
        "elapsed_no_timing": r"(Runtime|Value)Error: .*enable_timing",
        "elapsed_pending": r"RuntimeError: .*complete",
        "sleep_negative": r"ValueError: .*-5",
        "sleep_huge": r"ValueError: _sleep",
        "stream_cpu": r"ValueError: .*cpu",
        "set_stream_cpu": r"ValueError: .*cpu",
        "capability_9": r"RuntimeError: .*index 9",
    }
    for name, pattern in expect.items():
        assert re.search(pattern, errors[name]), f"{name}: {errors[name]!r} does not match {pattern!r}"
    assert data["usable"] is True


# --------------------------------------------------- environment variables


def _count_script(value):
    return script(
        f"device_count={value}",
        """
        import re
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, torch_openreg
            RESULT["count"] = [torch.openreg.device_count(), torch.openreg.device_count()]
            RESULT["available"] = torch.openreg.is_available()
            RESULT["acc_count"] = torch.accelerator.device_count()
            RESULT["acc_available"] = torch.accelerator.is_available()
            RESULT["option"] = torch.openreg.options()["OPENREG_" + "DEVICE_COUNT"]["value"]
            RESULT["set_device"] = error_of(lambda: torch.openreg.set_device(0))
            RESULT["stream"] = error_of(lambda: torch.openreg.Stream())
            RESULT["sleep"] = error_of(lambda: torch.openreg._sleep(1))
            RESULT["current_stream"] = error_of(lambda: torch.openreg.current_stream())
            RESULT["init"] = error_of(torch.openreg.init)
        RESULT["py_warnings"] = [str(w.message) for w in caught]
        done(RESULT)
        """,
        env=clean_env(OPENREG_DEVICE_COUNT=value),
    )


BAD_COUNTS = {value: _count_script(value) for value in ("abc", "-1", "99")}
_COUNT_WARNING = re.compile(r"OPENREG_DEVICE_COUNT=\S*.*invalid")


def _count_warnings(result):
    data = result.data
    from_python = [w for w in data["py_warnings"] if _COUNT_WARNING.search(w)]
    from_stderr = [line for line in result.stderr.splitlines() if _COUNT_WARNING.search(line)]
    return from_python, from_stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("value", sorted(BAD_COUNTS))
def test_invalid_device_count_means_zero_devices(value):
    result = BAD_COUNTS[value].result()
    data = result.check_ok()  # no crash
    assert data["count"] == [0, 0]
    assert data["available"] is False
    assert data["acc_count"] == 0
    assert data["acc_available"] is False
    assert data["option"] == "0"
    for key in ("set_device", "stream", "sleep", "current_stream"):
        assert data[key] is not None and data[key].startswith("RuntimeError"), (key, data[key])
        assert "OPENREG_DEVICE_COUNT" in data[key] or "0 devices" in data[key], (key, data[key])


@pytest.mark.subprocess
@pytest.mark.parametrize("value", sorted(BAD_COUNTS))
def test_invalid_device_count_warns_once(value):
    result = BAD_COUNTS[value].result()
    result.check_ok()
    from_python, from_stderr = _count_warnings(result)
    warnings = from_python + from_stderr
    assert len(warnings) == 1, f"expected exactly one warning, got {warnings}\n{result.describe()}"
    assert value in warnings[0]


@pytest.mark.subprocess
def test_invalid_device_count_warning_is_a_python_warning():
    result = BAD_COUNTS["abc"].result()
    result.check_ok()
    from_python, _ = _count_warnings(result)
    assert len(from_python) == 1


# Every other option with a value it cannot take (Note [Invalid options] in
# src/base/options.rs): the package imports (here through torch's autoload, as a
# plain `import torch` does), options() shows the values as set, and each
# device use raises one error naming every variable, its value and what it
# accepts; nothing initializes.
BAD_OPTIONS = {
    "OPENREG_LAUNCH_BLOCKING": ("yes", "0 or 1"),
    "OPENREG_WORKER_IDLE_MS": ("1s", "a non-negative integer"),
    "OPENREG_DEVICE_MEMORY": ("4T", "a positive size in bytes"),
    "OPENREG_MEMORY_PROTECT": ("on", "0 or 1"),
    "OPENREG_AUTOGRAD_ON_CALLER": ("true", "0 or 1"),
    "OPENREG_KERNEL_THREADS": ("-2", "an integer from 0 (all cores) to 1024"),
    "OPENREG_SPLIT_ELEMENTS": ("0", "a positive integer"),
    "OPENREG_LOG": ("verbose", "one of error, warn, info, debug"),
    "OPENREG_EXIT_DRAIN_MS": ("forever", "a non-negative integer"),
    "OPENREG_SYNC_DEBUG": ("bogus", "one of default, warn, error"),
    "OPENREG_STREAM_POOL_SIZE": ("1025", "an integer from 1 to 1024"),
    "OPENREG_FAULT": ("disk:1", "kind[:after], kind one of alloc, kernel, event, enumerate"),
    "OPENREG_DTYPES": ("gpu", "one of cuda, cpu, record"),
}

INVALID_OPTIONS = script(
    "invalid_options",
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch  # autoloads torch_openreg
        RESULT["autoloaded"] = hasattr(torch, "openreg")
        RESULT["options"] = {name: [o["value"], o["source"]] for name, o in torch.openreg.options().items()}
        RESULT["count"] = [torch.openreg.device_count(), torch.accelerator.device_count()]
        RESULT["available"] = torch.openreg.is_available()
        RESULT["errors"] = [
            error_of(lambda: torch.empty(2, device="openreg")),
            error_of(lambda: torch.ones(2, device="openreg:1")),
            error_of(torch.openreg.init),
            error_of(lambda: torch.openreg.Stream()),
        ]
        RESULT["initialized"] = torch.openreg.is_initialized()
    RESULT["py_warnings"] = [str(w.message) for w in caught if "openreg" in str(w.message)]
    done(RESULT)
    """,
    env=clean_env(**{name: value for name, (value, _) in BAD_OPTIONS.items()}),
)


@pytest.mark.subprocess
def test_invalid_options_raise_at_first_use_naming_each_variable():
    result = INVALID_OPTIONS.result()
    data = result.check_ok()  # the import succeeded, nothing crashed
    assert data["autoloaded"] is True
    assert data["count"] == [2, 2] and data["available"] is True
    errors = data["errors"]
    assert all(e is not None and e.startswith("RuntimeError: openreg cannot initialize: invalid option values") for e in errors), errors
    assert len(set(errors)) == 1, errors  # one error, the same each time
    message = errors[0]
    for name, (value, accepted) in BAD_OPTIONS.items():
        assert f'{name}="{value}" (expected {accepted}' in message, (name, message)
        assert data["options"][name] == [value, "invalid"], name
    assert data["options"]["OPENREG_DEVICE_COUNT"] == ["2", "default"]
    assert data["initialized"] is False
    assert data["py_warnings"] == [], data["py_warnings"]  # the error is the report


UNKNOWN_OPTIONS = script(
    "unknown_options",
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch, torch_openreg
        RESULT["at_import"] = [str(w.message) for w in caught if "openreg" in str(w.message)]
        torch.ones(2, device="openreg")  # initializes the runtime
        torch.openreg.init()
        torch.ones(2, device="openreg:1")
    RESULT["warnings"] = [str(w.message) for w in caught if "openreg" in str(w.message)]
    RESULT["kernel_threads"] = torch.openreg.options()["OPENREG_KERNEL_THREADS"]["value"]
    done(RESULT)
    """,
    env=clean_env(OPENREG_RANDOM_THREADS="3", OPENREG_SANITISER="1", OPENREG_TORCH_DIR="/nowhere"),
)


@pytest.mark.subprocess
def test_unknown_options_warn_once_at_initialization_naming_the_close_ones():
    """Note [Unknown options] in src/base/options.rs: a typo or a renamed option
    gets one warning at the runtime's first initialization, naming what is
    close; a variable the build reads is no typo; nothing fails."""
    data = UNKNOWN_OPTIONS.result().check_ok()
    assert data["at_import"] == []
    warnings = [w.split(" (Triggered internally")[0] for w in data["warnings"]]
    assert warnings == [
        "openreg: OPENREG_RANDOM_THREADS is not an openreg option and is ignored; "
        "it was replaced by OPENREG_KERNEL_THREADS",
        "openreg: OPENREG_SANITISER is not an openreg option and is ignored; did you mean OPENREG_SANITIZER?",
    ], data["warnings"]
    assert data["kernel_threads"] == "0"  # the old name set nothing


# Non-default options: four devices, and synchronous launches.
OPTIONS = script(
    "device_count=4,launch_blocking=1",
    """
    import torch, torch_openreg
    from torch_openreg import _C
    opts = torch.openreg.options()
    RESULT["options"] = [opts["OPENREG_DEVICE_COUNT"]["value"], opts["OPENREG_LAUNCH_BLOCKING"]["value"]]
    RESULT["count"] = [torch.openreg.device_count(), torch.accelerator.device_count()]
    torch.openreg.set_device(3)
    RESULT["current"] = torch.openreg.current_device()
    s = torch.Stream(device="openreg:3")
    with torch.openreg.stream(s):
        t0 = time.perf_counter()
        torch.openreg._sleep(300)
        RESULT["sleep_s"] = time.perf_counter() - t0
        RESULT["query_after"] = s.query()
    RESULT["stream_device"] = s.device_index
    torch.openreg.set_device(0)
    t0 = time.perf_counter()
    torch.openreg._sleep(200)  # the default stream of device 0
    RESULT["default_sleep_s"] = time.perf_counter() - t0
    RESULT["default_query_after"] = torch.openreg.default_stream(0).query()
    RESULT["ctx"] = [_C._has_primary_context(i) for i in range(4)]
    RESULT["set_4"] = error_of(lambda: torch.openreg.set_device(4))
    done(RESULT)
    """,
    env=clean_env(OPENREG_DEVICE_COUNT="4", OPENREG_LAUNCH_BLOCKING="1"),
)


@pytest.mark.subprocess
def test_device_count_four():
    data = OPTIONS.result().check_ok()
    assert data["options"][0] == "4"
    assert data["count"] == [4, 4]
    assert data["current"] == 3
    assert data["stream_device"] == 3
    assert data["ctx"] == [True, False, False, True]
    assert "index 4" in data["set_4"] and "4 devices" in data["set_4"]


@pytest.mark.subprocess
def test_launch_blocking_makes_launches_synchronous():
    data = OPTIONS.result().check_ok()
    assert data["options"][1] == "1"
    assert data["sleep_s"] >= 0.29
    assert data["query_after"] is True
    assert data["default_sleep_s"] >= 0.19
    assert data["default_query_after"] is True


def test_launches_are_asynchronous_by_default():
    assert torch.openreg.options()["OPENREG_LAUNCH_BLOCKING"]["value"] == "0"
    s = new_stream(0)
    with torch.openreg.stream(s):
        assert elapsed(lambda: torch.openreg._sleep(300)) < 0.15
    assert s.query() is False
    s.synchronize()
