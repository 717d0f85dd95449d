"""Lifecycle: a bounded drain at exit (OPENREG_EXIT_DRAIN_MS), finalize in
priority order, explicit torch.openreg._finalize(), spawn-started
children, and options() reporting where each value comes from. Every
process runs with a time bound."""

import os
import subprocess
import sys
import threading
import time

import pytest

from _openreg_util import clean_env, script

_MARK = "@@DONE@@"


class ExitRun:
    """A script whose exit is timed: the tail is the time from its last
    statement to the end of the process (interpreter teardown included)."""

    def __init__(self, code: str, **env: str):
        self.code = code + f"\nprint({_MARK!r}, time.time(), flush=True)\n"
        self.env = clean_env(**env)
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time, threading\n" + self.code],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        ended = time.time()
        done = [line for line in out.splitlines() if line.startswith(_MARK)]
        tail = ended - float(done[0].split()[1]) if done else None
        self.result = (proc.returncode, tail, out, err)

    def get(self):
        self.thread.join(timeout=150)
        assert self.result is not None, "the exit script did not finish"
        return self.result


_QUEUE_LONG = """
import torch, torch_openreg
torch.openreg._sleep({ms})
for _ in range(20):
    torch.openreg._sleep(1)  # queued behind the long kernel
"""

_FROM_A_THREAD = """
import torch, torch_openreg
started = threading.Event()
def work():
    with torch.openreg.device(1):
        torch.openreg._sleep(60_000)
        for _ in range(5):
            torch.openreg._sleep(1)
    started.set()
t = threading.Thread(target=work, daemon=True)
t.start()
started.wait(30)
"""


@pytest.fixture(scope="module")
def exits():
    # Started together: each spends most of its time importing torch.
    return {
        "bounded": ExitRun(_QUEUE_LONG.format(ms=60_000), OPENREG_EXIT_DRAIN_MS="200"),
        "default": ExitRun(_QUEUE_LONG.format(ms=60_000)),
        "thread": ExitRun(_FROM_A_THREAD, OPENREG_EXIT_DRAIN_MS="200"),
        "generous": ExitRun(_QUEUE_LONG.format(ms=1500), OPENREG_EXIT_DRAIN_MS="20000"),
    }


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["bounded", "default", "thread"])
def test_exit_does_not_wait_for_a_long_kernel(exits, name):
    code, tail, out, err = exits[name].get()
    assert code == 0, err[-3000:]
    # The kernel sleeps 60 s; exit waits at most the bound (200 ms, or the
    # default 500 ms) plus the interpreter's teardown, which takes seconds
    # on a loaded machine: far less than the kernel either way.
    assert tail is not None and tail < 30, (tail, err[-2000:])
    abandoned = 5 if name == "thread" else 20
    assert f"{abandoned} queued kernels were abandoned" in err and "OPENREG_EXIT_DRAIN_MS" in err, err[-2000:]


@pytest.mark.subprocess
def test_exit_waits_for_queued_work_within_the_bound(exits):
    code, tail, out, err = exits["generous"].get()
    assert code == 0, err[-3000:]
    assert tail is not None and tail >= 1.4, tail
    assert "abandoned" not in err


FINALIZE = script(
    "finalize",
    """
    import torch, torch_openreg
    x = torch.ones(4, device="openreg")
    torch.openreg._sleep(300)
    event = torch.Event(device="openreg")
    event.record()
    t0 = time.perf_counter()
    torch.openreg._finalize()
    RESULT["finalize_s"] = time.perf_counter() - t0
    RESULT["event_done"] = event.query()
    RESULT["launch_after"] = error_of(lambda: torch.openreg._sleep(1))
    RESULT["op_after"] = error_of(lambda: x.add_(1))
    torch.openreg._finalize()  # idempotent
    done(RESULT)
    """,
    env=clean_env(OPENREG_LOG="debug"),
)


@pytest.mark.subprocess
def test_explicit_finalize_drains_releases_in_order_and_refuses_work():
    result = FINALIZE.result()
    r = result.check_ok()
    assert r["finalize_s"] >= 0.25, "finalize must wait for the queued work"
    assert r["event_done"] is True
    assert r["launch_after"] and "finalizing" in r["launch_after"]
    assert r["op_after"] and "finalizing" in r["op_after"]
    steps = [line for line in result.stderr.splitlines() if "finalize: releasing" in line]
    assert steps == [
        "openreg [debug]: finalize: releasing sanitizer reports",
        "openreg [debug]: finalize: releasing stream workers",
        "openreg [debug]: finalize: releasing cached device memory",
    ], result.stderr[-2000:]


SPAWN = script(
    "spawn",
    """
    import tempfile
    import torch, torch_openreg
    import torch.multiprocessing as mp

    # Spawned children import the function by module name: write it to a file.
    module_dir = tempfile.mkdtemp()
    child_source = chr(10).join([
        "import torch",
        "def child(rank, results):",
        "    device = torch.device('openreg', rank % torch.openreg.device_count())",
        "    x = torch.arange(10, dtype=torch.float32, device=device) * (rank + 1)",
        "    results.put((rank, str(x.device), x.sum().item(), torch.openreg._is_in_bad_fork()))",
    ])
    with open(os.path.join(module_dir, "openreg_spawn_child.py"), "w") as f:
        f.write(child_source + chr(10))
    sys.path.insert(0, module_dir)
    import openreg_spawn_child

    torch.ones(3, device="openreg").sum().item()  # the parent is initialized
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(openreg_spawn_child.child, args=(results,), nprocs=2, join=True, start_method="spawn")
    RESULT["children"] = sorted(results.get() for _ in range(2))
    done(RESULT)
    """,
    timeout=150,
)


@pytest.mark.subprocess
def test_spawned_children_use_openreg():
    r = SPAWN.result().check_ok()
    assert r["children"] == [[0, "openreg:0", 45.0, False], [1, "openreg:1", 90.0, False]]


OPTIONS = script(
    "options_sources",
    """
    import torch, torch_openreg
    opts = torch.openreg.options()
    RESULT["opts"] = {name: [o["value"], o["source"]] for name, o in opts.items()}
    RESULT["first_use"] = error_of(lambda: torch.empty(1, device="openreg"))
    done(RESULT)
    """,
    env=clean_env(OPENREG_LOG="INFO", OPENREG_EXIT_DRAIN_MS="250", OPENREG_SYNC_DEBUG="bogus"),
)


@pytest.mark.subprocess
def test_options_show_value_and_source():
    result = OPTIONS.result()
    opts = result.check_ok()["opts"]
    assert opts["OPENREG_LOG"] == ["info", "environment"]
    assert opts["OPENREG_EXIT_DRAIN_MS"] == ["250", "environment"]
    assert opts["OPENREG_DEVICE_COUNT"] == ["2", "default"]
    # An invalid value shows as set; the first device use raises, naming the
    # variable and the accepted values (tests/python/test_bad_input.py).
    assert opts["OPENREG_SYNC_DEBUG"] == ["bogus", "invalid"]
    assert result.data["first_use"] == (
        'RuntimeError: openreg cannot initialize: invalid option value: '
        'OPENREG_SYNC_DEBUG="bogus" (expected one of default, warn, error); fix or unset this variable'
    ), result.data["first_use"]
    for name in ("OPENREG_LOG", "OPENREG_EXIT_DRAIN_MS", "OPENREG_SYNC_DEBUG"):
        assert name in open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
