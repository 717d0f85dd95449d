"""``torch.openreg.amp``: automatic mixed precision on openreg, as ``torch.cuda.amp``.

``torch.autocast("openreg", dtype=...)`` is the generic entry point; it asks
this backend which dtypes it supports (:func:`get_amp_supported_dtype`) and
turns on the AutocastPrivateUse1 kernels the library registers at load, which
follow CUDA's op policy (Note [Autocast policy] in
``cpp/frontends/autocast.cpp``). ``autocast``, ``GradScaler``, ``custom_fwd``
and ``custom_bwd`` here are the generic ``torch.amp`` classes and decorators
bound to the openreg device, for code written against ``torch.cuda.amp``. The
loss scaler's inf/NaN check
(``torch._amp_foreach_non_finite_check_and_unscale_``) and scale update
(``torch._amp_update_scale_``) run as device kernels on the current stream.
"""

from __future__ import annotations

import functools

import torch

_DEVICE_TYPE = "openreg"


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("openreg", dtype=...)`` accepts; others
    get torch's warning and disable autocast, as on CUDA."""
    return [torch.float16, torch.bfloat16]


def is_autocast_enabled() -> bool:
    """Whether an enabled ``torch.autocast("openreg")`` region is active on this thread."""
    return torch.is_autocast_enabled(_DEVICE_TYPE)


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled(_DEVICE_TYPE, enabled)


def get_autocast_dtype() -> torch.dtype:
    """The lower precision dtype of openreg autocast (``torch.float16`` unless set)."""
    return torch.get_autocast_dtype(_DEVICE_TYPE)


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype(_DEVICE_TYPE, dtype)


class autocast(torch.amp.autocast):
    """``torch.autocast("openreg", ...)``, with ``torch.cuda.amp.autocast``'s signature."""

    def __init__(
        self,
        enabled: bool = True,
        dtype: torch.dtype = torch.float16,
        cache_enabled: bool = True,
    ) -> None:
        super().__init__(_DEVICE_TYPE, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("openreg", ...)``, with ``torch.cuda.amp.GradScaler``'s signature."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            _DEVICE_TYPE,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type=_DEVICE_TYPE)
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type=_DEVICE_TYPE)

__all__ = [
    "GradScaler",
    "autocast",
    "custom_bwd",
    "custom_fwd",
    "get_amp_supported_dtype",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
]
