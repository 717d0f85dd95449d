"""What the parity sweeps (tests/opinfo_parity.py, tests/module_parity.py) share:
running one unit of work (an op, a module) in a forked child, so a crash or
a hang is that unit's counted failure and not the end of the sweep, and the
report lines their pytest entries parse:

  ok   DTYPE NAME            (with --verbose)
  FAIL DTYPE NAME: WHY
  UNSUPPORTED DTYPE NAME: WHY
  N passed, N failed, N unsupported on openreg

The parent must not have touched the openreg device before forking (a fork of
an initialized process is refused, as with CUDA); children do.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

_MESSAGE_LIMIT = 300


class Unsupported(Exception):
    """openreg raised its documented "not supported on openreg" error."""


@dataclass
class Outcome:
    status: str  # "ok", "unsupported" or "failed"
    detail: str  # ok: what the work returned; otherwise why


def first_line(e: BaseException) -> str:
    """'TypeName: first line of the message'."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def in_fork(work: Callable[[], str | None], timeout_s: float) -> Outcome:
    """Runs `work` in a forked child. ok (detail: what `work` returned) when
    it returns; unsupported when it raises Unsupported; failed with the
    exception's first line when it raises anything else, with 'timeout' when
    it runs past `timeout_s` (the child is killed), with 'crash: SIGNAL' when
    the child dies."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            message = "ok:" + (work() or "")
        except Unsupported as e:
            message = f"unsupported:{e}"
        except BaseException as e:  # noqa: B902 - everything is the unit's failure
            message = f"failed:{first_line(e)}"
        os.write(w, message[:_MESSAGE_LIMIT].encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return Outcome("failed", "timeout")
        time.sleep(0.005)
    text = os.read(r, 4096).decode()
    os.close(r)
    if os.WIFSIGNALED(status):
        return Outcome("failed", f"crash: {signal.Signals(os.WTERMSIG(status)).name}")
    if not text:
        return Outcome("failed", "no result")
    status_word, _, detail = text.partition(":")
    return Outcome(status_word, detail)


class Tally:
    """Prints one report line per outcome and counts them."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.passed = self.failed = self.unsupported = 0

    def record(self, label: str, outcome: Outcome) -> None:
        """`label` is 'DTYPE NAME' (each without spaces)."""
        if outcome.status == "ok":
            self.passed += 1
            if self.verbose:
                print(f"ok   {label}")
        elif outcome.status == "unsupported":
            self.unsupported += 1
            print(f"UNSUPPORTED {label}: {outcome.detail}")
        else:
            self.failed += 1
            print(f"FAIL {label}: {outcome.detail}")

    def summary(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.unsupported} unsupported on openreg"
