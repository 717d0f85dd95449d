"""Debugging host waits: sync-debug mode, where host-blocking operations
(``.item()``, ``.cpu()``, blocking copies, data-dependent shapes,
device/stream/event synchronize) warn or raise, naming the operation (Note
[Sync debug] in src/diagnostics/sync_debug.rs; the initial mode is
``OPENREG_SYNC_DEBUG``), and the op timeout, which ends a wait for a kernel
that runs too long (Note [Op timeout] in src/runtime/op_timeout.rs)."""

from __future__ import annotations

from torch_openreg import _C

_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """``"default"`` (or 0): silent; ``"warn"`` (1): each host-blocking
    operation warns; ``"error"`` (2): each one raises instead of waiting."""
    if isinstance(debug_mode, str):
        if debug_mode not in _MODES:
            raise RuntimeError(f'invalid value of debug_mode {debug_mode!r}: expected "default", "warn" or "error"')
        debug_mode = _MODES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int) or debug_mode not in _MODES.values():
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}: expected 0, 1, 2 or their names")
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """0 (default), 1 (warn) or 2 (error)."""
    return _C._get_sync_debug_mode()


def set_op_timeout_ms(ms: int | None) -> None:
    """Synchronizing calls (synchronize, ``.item()``, blocking copies) raise
    a timeout error naming the stream when the kernel they wait for has run
    longer than ``ms`` milliseconds, instead of waiting on; the kernel keeps
    running. ``0`` or ``None`` waits forever (the default)."""
    ms = 0 if ms is None else ms
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise ValueError(f"set_op_timeout_ms: expected a non-negative int of milliseconds or None, got {ms!r}")
    _C._set_op_timeout_ms(ms)


def get_op_timeout_ms() -> int:
    """The op timeout in milliseconds (0: none)."""
    return _C._get_op_timeout_ms()
