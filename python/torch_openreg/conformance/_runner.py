"""Runs the selected checks in child processes and collects their results.

Note [Conformance processes]
The runner never imports the backend under test: a backend that crashes on
import, or two PrivateUse1 backends in one process, must not take the runner
down. It imports torch with backend autoload off (for the checks' metadata)
and starts children (`_child.py`) that import the backend and run checks:
one child per area for the ordinary checks, one fresh child per `isolated`
check (out of memory, fork, spawn). A child reports each check's start and
result on a pipe. When it dies or runs past a check's timeout, that check
fails with the signal, exit status or timeout, the child is killed, and a new
child runs the area's remaining checks: a crash costs one check, not the
run. The environment children get: the caller's, with
TORCH_OPENREG_CONFORMANCE_DEVICE naming the device under test (so openreg's
own package stays unloaded when it is not the device under test, in the
children and in any process they start: see torch_openreg/__init__.py) and,
with --import, TORCH_DEVICE_BACKEND_AUTOLOAD=0 (the named module is the one
backend loaded).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from torch_openreg.conformance import _api

DEVICE_VARIABLE = "TORCH_OPENREG_CONFORMANCE_DEVICE"
_STDERR_TAIL_LINES = 3
# A child's import of the backend (which may JIT-build it) until it reports "ready".
IMPORT_TIMEOUT_S = 300.0
# From a check's result to the next check's start, or to the child's exit
# (which runs the backend's own teardown).
BETWEEN_CHECKS_S = 60.0


@dataclass
class Result:
    id: str
    area: str
    verdict: str
    expected: str
    detail: str
    seconds: float


@dataclass
class Options:
    device: str
    module: str | None
    full: bool
    timeout_s: float | None  # --timeout: every check's limit; None: the check's own, else DEFAULT_TIMEOUT_S
    progress: bool
    autoload: str | None  # the caller's TORCH_DEVICE_BACKEND_AUTOLOAD (the runner's own import has it off)


def select_checks(only: list[str] | None, full: bool) -> list[_api.Check]:
    """The checks a run covers: all, or those whose id or area is in `only`
    (an unknown name is a ValueError); a quick run leaves out full_only
    checks unless `only` names them by id."""
    checks = list(_api.registered().values())
    if only:
        known = {c.id for c in checks} | {c.area for c in checks}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise ValueError(f"no conformance check or area named {', '.join(unknown)}")
        return [c for c in checks if c.id in only or (c.area in only and (full or not c.full_only))]
    return [c for c in checks if full or not c.full_only]


def _groups(checks: list[_api.Check]) -> list[list[_api.Check]]:
    """Consecutive ordinary checks of one area share a process; an isolated check has its own."""
    groups: list[list[_api.Check]] = []
    for c in checks:
        if not c.isolated and groups and not groups[-1][0].isolated and groups[-1][0].area == c.area:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _child_environment(options: Options) -> dict:
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if options.autoload is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = options.autoload
    if options.module is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env[DEVICE_VARIABLE] = options.device
    return env


def _stderr_tail(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    return " | ".join(lines[-_STDERR_TAIL_LINES:])


def _death(status: int) -> str:
    if status < 0:
        return f"the check's process was killed by {signal.Signals(-status).name}"
    return f"the check's process exited with status {status} during the check"


class Runner:
    def __init__(self, options: Options):
        self.options = options
        self.started = time.monotonic()
        self.device_count: int | None = None  # from the first child that imported the backend
        self.import_problem: str | None = None
        self._line_open = False  # a progress line waits for its verdict

    def run(self, checks: list[_api.Check]) -> list[Result]:
        results: list[Result] = []
        for group in _groups(checks):
            results += self._run_group(group)
        return results

    def _progress_start(self, check: _api.Check) -> None:
        if self.options.progress:
            elapsed = time.monotonic() - self.started
            sys.stderr.write(f"[{elapsed:7.1f} s] {check.area:<12} {check.id} ... ")
            sys.stderr.flush()
            self._line_open = True

    def _progress_end(self, check: _api.Check, verdict: str, seconds: float) -> None:
        if self.options.progress:
            if not self._line_open:
                self._progress_start(check)
            sys.stderr.write(f"{verdict} ({seconds:.1f} s)\n")
            sys.stderr.flush()
            self._line_open = False

    def _not_run(self, group: list[_api.Check], why: str) -> list[Result]:
        return [Result(c.id, c.area, _api.ERROR, c.expected, f"not run: {why}", 0.0) for c in group]

    def _run_group(self, group: list[_api.Check]) -> list[Result]:
        if self.import_problem is not None:
            return self._not_run(group, self.import_problem)
        if self.device_count == 0 and group[0].area != "device":
            return self._not_run(group, "the backend reports no device")
        results: list[Result] = []
        remaining = list(group)
        while remaining:
            finished = self._run_child(remaining)
            results += finished
            remaining = remaining[len(finished) :]
            if self.import_problem is not None:
                results += self._not_run(remaining, self.import_problem)
                break
        return results

    def _run_child(self, checks: list[_api.Check]) -> list[Result]:
        """Runs `checks` in one child until it finishes them, dies or hangs;
        returns the results of the checks it got to (at least one, unless
        the backend failed to import or the child started no check)."""
        by_id = {c.id: c for c in checks}
        read_fd, write_fd = os.pipe()
        command = [sys.executable, "-m", "torch_openreg.conformance._child", "--device", self.options.device,
                   "--checks", ",".join(by_id), "--result-fd", str(write_fd)]
        if self.options.module:
            command += ["--import", self.options.module]
        if self.options.full:
            command.append("--full")
        with tempfile.NamedTemporaryFile("w", suffix=".stderr") as stderr:
            child = subprocess.Popen(command, env=_child_environment(self.options), pass_fds=(write_fd,),
                                     stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
            os.close(write_fd)
            try:
                return self._collect(child, read_fd, by_id, stderr.name)
            finally:
                os.close(read_fd)

    def _collect(self, child: subprocess.Popen, fd: int, by_id: dict, log_path: str) -> list[Result]:
        results: list[Result] = []
        buffer = b""
        current: _api.Check | None = None
        current_started = 0.0
        # Until "ready", the child is importing the backend (which may build it).
        ready = False
        deadline = time.monotonic() + IMPORT_TIMEOUT_S
        while True:
            wait = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([fd], [], [], wait)
            if not readable:  # the import, a check, or the time between checks ran past its limit
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                if not ready:
                    self.import_problem = f"importing the backend took more than {IMPORT_TIMEOUT_S:.0f} s"
                    return results
                if current is None:
                    if not results:
                        self.import_problem = f"the child process started no check within {BETWEEN_CHECKS_S:.0f} s"
                    # Otherwise the checks that did not start run in the next child.
                    return results
                results.append(self._result(current, _api.FAIL,
                                            f"timed out after {self._timeout(current):.0f} s (the process was killed)",
                                            time.monotonic() - current_started))
                return results
            chunk = os.read(fd, 65536)
            if not chunk:  # the child exited
                status = child.wait()
                if current is not None:
                    tail = _stderr_tail(log_path)
                    detail = _death(status) + (f"; its stderr ended: {tail}" if tail else "")
                    results.append(self._result(current, _api.FAIL, detail, time.monotonic() - current_started))
                elif not results and self.import_problem is None:
                    self.import_problem = f"the child process ended before running a check ({_death(status)}): " \
                                          f"{_stderr_tail(log_path)}"
                return results
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                kind = event["event"]
                if kind == "import_failed":
                    self.import_problem = event["detail"]
                elif kind == "ready":
                    ready = True
                    deadline = time.monotonic() + BETWEEN_CHECKS_S
                    if self.device_count is None:
                        self.device_count = event["device_count"]
                elif kind == "start":
                    current = by_id[event["id"]]
                    current_started = time.monotonic()
                    deadline = current_started + self._timeout(current)
                    self._progress_start(current)
                elif kind == "result":
                    results.append(self._result(current, event["verdict"], event["detail"], event["seconds"]))
                    current = None
                    deadline = time.monotonic() + BETWEEN_CHECKS_S

    def _timeout(self, check: _api.Check) -> float:
        if self.options.timeout_s is not None:
            return self.options.timeout_s
        return check.timeout_s if check.timeout_s is not None else _api.DEFAULT_TIMEOUT_S

    def _result(self, check: _api.Check, verdict: str, detail: str, seconds: float) -> Result:
        self._progress_end(check, verdict, seconds)
        return Result(check.id, check.area, verdict, check.expected, detail, seconds)
