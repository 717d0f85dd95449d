"""``torch.openreg.sanitizer``: the stream sanitizer.

It reports every stream-ordering bug the first time the program makes it,
whatever the timing: an access to memory whose last write on another stream
is not ordered before it, a write while another stream's read is not
ordered before it, memory freed while another stream used it (without
``record_stream``) and then reused, the host touching pinned memory that a
pending non-blocking copy uses, and ``query()`` taken as covering work
launched after the event was recorded. Ordering is CUDA's: stream order,
event record and wait (``wait_stream``, ``wait_event``, across devices), and
the host synchronizations the user asks for. See Note [Stream sanitizer] in
src/diagnostics/sanitizer.rs and docs/sanitizer-and-diagnostics.md.

``OPENREG_SANITIZER=1`` (or ``raise``) turns it on at start, and the
offending op raises ``RuntimeError("openreg sanitizer: ...")``;
``OPENREG_SANITIZER=warn`` collects the reports and prints them at exit.
"""

from __future__ import annotations

import os

import torch

import torch_openreg
from torch_openreg import _C

_MODES = {"off": 0, "raise": 1, "warn": 2}
_NAMES = {code: name for name, code in _MODES.items()}


class _Restore:
    """What ``enable`` returns: used as a context manager, its exit puts
    back the mode in force before the call."""

    def __init__(self, previous: str) -> None:
        self._previous = previous

    def __enter__(self) -> "_Restore":
        return self

    def __exit__(self, *exc_info) -> None:
        _C._sanitizer_set_mode(_MODES[self._previous])


def enable(mode: str = "raise") -> _Restore:
    """Turns the sanitizer on now: ``"raise"`` (the offending op raises) or
    ``"warn"`` (reports are collected, and printed at exit). Returns a
    context manager whose exit restores the previous mode::

        with torch.openreg.sanitizer.enable("warn"):
            ...
    """
    if mode not in ("raise", "warn"):
        raise ValueError(f'torch.openreg.sanitizer.enable: mode must be "raise" or "warn", got {mode!r}')
    previous = _NAMES[_C._sanitizer_mode()]
    _C._sanitizer_set_mode(_MODES[mode])
    return _Restore(previous)


def disable() -> None:
    """Turns the sanitizer off; reports so far are kept."""
    _C._sanitizer_set_mode(0)


def is_enabled() -> bool:
    return _C._sanitizer_mode() != 0


def mode() -> str:
    """``"off"``, ``"raise"`` or ``"warn"``."""
    return _NAMES[_C._sanitizer_mode()]


def reports() -> list[str]:
    """Every report so far (since the last ``clear``), oldest first."""
    return _C._sanitizer_reports()


def report_count() -> int:
    return sum(counts().values())


def counts() -> dict[str, int]:
    """Reports so far by kind: ``race``, ``write_after_read``,
    ``freed_in_use``, ``pinned_host_access``, ``query_misuse``."""
    return _C._sanitizer_counts()


def clear() -> None:
    """Drops the reports and counts (what the sanitizer knows about
    streams and memory stays)."""
    _C._sanitizer_clear()


# Reports name the user's line that allocated a tensor or launched an op:
# the innermost frame outside these packages.
_C._sanitizer_set_library_roots(
    [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(torch_openreg.__file__) + os.sep]
)
