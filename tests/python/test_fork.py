"""Fork awareness: a forked child of a process that initialized openreg gets
a clear error (never a hang); the parent carries on. Everything runs in a
subprocess with timeouts, and every child is waited for with a deadline."""

import pytest

from _openreg_util import script

FORK = script(
    "fork",
    """
    import signal
    import torch, torch_openreg

    def in_child(fn, deadline_s=20):
        '''Runs fn() in a forked child that exits normally (atexit handlers
        run); returns (fn's JSON result, exit code) or "hung".'''
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                out = fn()
            except BaseException as e:
                out = {"fatal": repr(e)}
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(out))
            sys.exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()  # EOF when the child exits (or closes its end)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            done_pid, status = os.waitpid(pid, os.WNOHANG)
            if done_pid:
                return json.loads(text or "null"), os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return json.loads(text or "null"), "hung"

    def uninitialized_child():
        out = {"bad_fork": torch.openreg._is_in_bad_fork()}
        def use():
            torch.openreg._sleep(1)
            torch.openreg.current_stream().synchronize()
        out["use"] = error_of(use)
        return out

    def child_after_init():
        # The first thing the child does is torch.openreg.synchronize().
        out = {"synchronize": error_of(torch.openreg.synchronize)}
        out["bad_fork"] = torch.openreg._is_in_bad_fork()
        out["stream_synchronize"] = error_of(lambda: torch.openreg.current_stream().synchronize())
        out["sleep"] = error_of(lambda: torch.openreg._sleep(1))
        out["new_stream"] = error_of(lambda: torch.openreg.Stream())
        out["event_record"] = error_of(lambda: torch.Event(device="openreg").record(torch.openreg.default_stream(0)))
        out["synchronize_again"] = error_of(torch.openreg.synchronize)
        out["device_count"] = torch.openreg.device_count()
        out["is_initialized"] = torch.openreg.is_initialized()
        return out

    # 1. A parent that never initialized openreg: its child may use it.
    RESULT["parent_initialized_before"] = torch.openreg.is_initialized()
    RESULT["uninitialized"] = in_child(uninitialized_child)

    # 2. Initialize, and fork while the parent's default stream is busy.
    # Only torch.openreg.init() and _sleep (no torch.accelerator call) before
    # the fork: exactly what the child inherits.
    torch.openreg.init()
    torch.openreg._sleep(300)
    RESULT["initialized"] = in_child(child_after_init)

    # 3. The parent carries on.
    RESULT["parent_bad_fork"] = torch.openreg._is_in_bad_fork()
    parent_stream = torch.openreg.default_stream(0)
    parent_stream.synchronize()
    t0 = time.perf_counter()
    torch.openreg._sleep(50)
    torch.openreg.current_stream().synchronize()
    RESULT["parent_sync_s"] = time.perf_counter() - t0
    torch.openreg.synchronize()
    RESULT["parent_ok"] = parent_stream.query() and torch.openreg.current_stream().query()
    done(RESULT)
    """,
    timeout=90,
)

FORK_MESSAGE = "RuntimeError: Cannot re-initialize openreg in forked subprocess. To use openreg with multiprocessing, you must use the 'spawn' start method"


@pytest.fixture(scope="module")
def fork_result():
    return FORK.result().check_ok()


@pytest.mark.subprocess
def test_child_of_uninitialized_parent_may_use_openreg(fork_result):
    assert fork_result["parent_initialized_before"] is False
    out, code = fork_result["uninitialized"]
    assert code == 0
    assert out == {"bad_fork": False, "use": None}


@pytest.mark.subprocess
def test_child_of_initialized_parent_gets_clear_errors(fork_result):
    out, code = fork_result["initialized"]
    assert code == 0, "the child must exit cleanly (and not hang)"
    assert "fatal" not in out, out
    assert out["bad_fork"] is True
    for key in ("stream_synchronize", "sleep", "new_stream", "event_record", "synchronize_again"):
        assert out[key] is not None and out[key].startswith(FORK_MESSAGE), (key, out[key])
        assert "fork" in out[key] and "spawn" in out[key]
    assert out["device_count"] == 2


@pytest.mark.subprocess
def test_child_first_synchronize_raises(fork_result):
    out, _ = fork_result["initialized"]
    assert out["synchronize"] is not None and out["synchronize"].startswith(FORK_MESSAGE), out["synchronize"]


@pytest.mark.subprocess
def test_parent_continues_after_fork(fork_result):
    assert fork_result["parent_bad_fork"] is False
    assert fork_result["parent_ok"] is True
    assert fork_result["parent_sync_s"] >= 0.04
