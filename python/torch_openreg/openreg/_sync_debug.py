"""Sync-debug mode: host-blocking operations (``.item()``, ``.cpu()``,
blocking copies, data-dependent shapes, device/stream/event synchronize)
warn or raise, naming the operation (Note [Sync debug] in
src/sync_debug.rs). The initial mode is ``OPENREG_SYNC_DEBUG``."""

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
