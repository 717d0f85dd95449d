"""Helpers shared by the openreg Python tests.

Subprocess scripts: many contracts can only be observed in a fresh process
(lazy initialization, environment options read once, fork, autoload) or are
risky (a crash must show up as a return code, not kill the test run). Each
test module declares its scripts at import time with ``script(...)``; the
session fixture in conftest.py starts them all at once in the background,
a few at a time, so their ``import torch`` (about 3 s of CPU each) overlaps
with the in-process tests, which mostly wait on sleeping kernels.

A script reports what it saw by calling ``done(RESULT)``: one JSON line on
stdout that ``ScriptResult.data`` parses back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

_MARK = "@@OPENREG_RESULT@@"

# Prepended to every script.
_PRELUDE = f"""\
import json, os, sys, time, warnings
RESULT = {{}}
def done(result):
    sys.stdout.write({_MARK!r} + json.dumps(result) + "\\n")
    sys.stdout.flush()
def error_of(fn):
    '''None if fn() succeeds, else "TypeName: message".'''
    try:
        fn()
    except BaseException as e:  # noqa: B902 - report everything
        return type(e).__name__ + ": " + str(e)
    return None
"""

# Subprocess launches in flight at once: 2 cores, each import is CPU bound.
_MAX_PARALLEL = 2


@dataclass
class ScriptResult:
    name: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool

    @property
    def data(self) -> dict:
        for line in self.stdout.splitlines():
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK):])
        raise AssertionError(f"script {self.name!r} reported no result\n{self.describe()}")

    def describe(self) -> str:
        return (
            f"--- script {self.name}: rc={self.returncode} timed_out={self.timed_out} "
            f"wall={self.wall_s:.1f}s\n--- stdout:\n{self.stdout[-4000:]}\n--- stderr:\n{self.stderr[-4000:]}"
        )

    def check_ok(self) -> dict:
        """Asserts a clean exit (no crash, no hang) and returns the data."""
        assert not self.timed_out, f"script hung\n{self.describe()}"
        assert self.returncode == 0, f"script failed\n{self.describe()}"
        return self.data


def clean_env(**overrides: str | None) -> dict[str, str]:
    """This process's environment without OPENREG_* knobs, plus overrides
    (``None`` removes a variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_")}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class Script:
    def __init__(self, name: str, code: str, env: dict[str, str] | None, timeout: float):
        self.name = name
        self.code = _PRELUDE + textwrap.dedent(code)
        self.env = clean_env() if env is None else env
        self.timeout = timeout
        self._future: Future | None = None
        self._lock = threading.Lock()

    def start(self, executor: ThreadPoolExecutor | None = None) -> None:
        with self._lock:
            if self._future is not None:
                return
            if executor is None:
                self._future = Future()
                self._future.set_result(self._run())
            else:
                self._future = executor.submit(self._run)

    def result(self) -> ScriptResult:
        self.start()
        assert self._future is not None
        return self._future.result(timeout=self.timeout + 120)

    def _run(self) -> ScriptResult:
        start = time.monotonic()
        # A neutral working directory: nothing there can shadow the installed package.
        with tempfile.TemporaryDirectory(prefix="openreg-test-") as cwd:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", self.code],
                    cwd=cwd,
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                )
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
                return ScriptResult(self.name, None, out, err, time.monotonic() - start, True)
        return ScriptResult(self.name, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, False)


_REGISTRY: list[Script] = []
_EXECUTOR: ThreadPoolExecutor | None = None


def script(name: str, code: str, env: dict[str, str] | None = None, timeout: float = 60) -> Script:
    """Declares a subprocess script (started in the background by conftest)."""
    s = Script(name, code, env, timeout)
    _REGISTRY.append(s)
    return s


def start_all_scripts() -> None:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(max_workers=_MAX_PARALLEL, thread_name_prefix="openreg-script")
    for s in _REGISTRY:
        s.start(_EXECUTOR)


def shutdown_scripts() -> None:
    global _EXECUTOR
    if _EXECUTOR is not None:
        _EXECUTOR.shutdown(wait=True, cancel_futures=True)
        _EXECUTOR = None


# ---------------------------------------------------------------- in-process


def busy(stream: torch.Stream, ms: float) -> None:
    """Queues a kernel that keeps ``stream`` busy for ``ms`` milliseconds."""
    with torch.openreg.stream(stream):
        torch.openreg._sleep(ms)


def new_stream(device: int = 0, priority: int = 0) -> torch.Stream:
    return torch.Stream(device=f"openreg:{device}", priority=priority)


def elapsed(fn) -> float:
    """Seconds ``fn()`` took."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(attempts: int, measure) -> float:
    """The smallest of ``attempts`` measurements. For upper bounds on time:
    a loaded machine (other jobs on 2 cores) can stretch a measurement but
    never shrink it, and an implementation that is really serial can never
    produce a small one, so retrying hides no bug."""
    return min(measure() for _ in range(attempts))


def run_threads(targets, timeout: float = 30.0) -> list[BaseException]:
    """Runs each callable in its own thread; asserts that all finish within
    ``timeout`` (no deadlock) and returns the exceptions they raised."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def wrap(fn):
        def body():
            try:
                fn()
            except BaseException as e:  # noqa: B902
                with lock:
                    errors.append(e)

        return body

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {timeout}s (deadlock?): {alive}"
    return errors


# ------------------------------------------------------------ parity sweeps


@dataclass
class SweepReport:
    """What a parity sweep script (tests/opinfo_parity.py,
    tests/module_parity.py) reported, keyed by 'DTYPE NAME'; the lines are
    those of tests/parity_harness.py."""

    passed: set[str]
    failed: dict[str, str]
    unsupported: dict[str, str]
    stdout: str


def run_sweep(script: str, *args: str, timeout: float = 1800, env: dict[str, str] | None = None) -> SweepReport:
    """Runs a parity sweep script with -v (in `env`, default this process's)
    and parses its report."""
    run = subprocess.run(
        [sys.executable, script, "-v", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    summary = re.search(r"^(\d+) passed, (\d+) failed, (\d+) unsupported on openreg$", run.stdout, re.MULTILINE)
    assert summary, run.stdout[-2000:] + run.stderr[-2000:]
    return SweepReport(
        passed=set(re.findall(r"^ok   (\S+\s+\S+)$", run.stdout, re.MULTILINE)),
        failed=dict(re.findall(r"^FAIL (\S+\s+\S+): (.*)$", run.stdout, re.MULTILINE)),
        unsupported=dict(re.findall(r"^UNSUPPORTED (\S+\s+\S+): (.*)$", run.stdout, re.MULTILINE)),
        stdout=run.stdout,
    )


def check_known_failures(report: SweepReport, known_failure, what: str) -> None:
    """Every failure is a documented one (`known_failure(label)` gives its
    reason, None for an undocumented one) and every documented one that ran
    still fails: a fixed one must be taken off its list."""
    unexpected = {label: why for label, why in report.failed.items() if not known_failure(label)}
    fixed = sorted(label for label in report.passed if known_failure(label))
    assert not unexpected, f"{what} that differ from CPU: {unexpected}"
    assert not fixed, f"known failures that now pass (take them off the list): {fixed}"
