"""Device management: count, current device, initialization, sync."""

from __future__ import annotations

import uuid as _uuid
from typing import Any, NamedTuple

import torch

from torch_openreg import _C

_DEVICE_TYPE = "openreg"


def _device_index(device: Any, optional: bool = False) -> int:
    """The index named by an int, string or ``torch.device`` of openreg.

    ``None`` (and an index-less device when ``optional``) means the current
    device. Any other device type is a ``ValueError`` naming it.
    """
    if device is None:
        return _C._get_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != _DEVICE_TYPE:
            raise ValueError(f"expected an openreg device, but got {device}")
        if device.index is None:
            if not optional:
                raise ValueError(f"expected an openreg device with an index, but got {device}")
            return _C._get_device()
        return device.index
    if isinstance(device, int) and not isinstance(device, bool):
        if device >= _C._device_count():
            # Checked here: torch.device would silently truncate a huge index.
            _raise_out_of_range(device)
        return device
    raise TypeError(f"expected an int, str or torch.device naming an openreg device, but got {device!r}")


def _valid_index(device: Any) -> int:
    """``_device_index`` (``None`` or no index: the current device), checked
    to name an existing device."""
    index = _device_index(device, optional=True)
    if not 0 <= index < _C._device_count():
        _raise_out_of_range(index)
    return index


def _raise_out_of_range(index: int) -> None:
    count = _C._device_count()
    raise RuntimeError(f"openreg device index {index} is out of range: there are {count} devices")


def is_available() -> bool:
    """Whether any openreg device exists. Never initializes the runtime."""
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def init() -> None:
    """Initialize the runtime (it also initializes itself on first use)."""
    _C._init()


def is_initialized() -> bool:
    return _C._is_initialized()


def current_device() -> int:
    return _C._get_device()


def set_device(device: Any) -> None:
    """Make ``device`` current for this thread. Negative indices are ignored, as in ``torch.cuda``."""
    index = _device_index(device)
    if index >= 0:
        _C._set_device(index)


def synchronize(device: Any = None) -> None:
    """Wait for all work on every stream of ``device`` (default: current)."""
    _C._synchronize(_device_index(device, optional=True))


class _DeviceProperties(NamedTuple):
    name: str
    index: int
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    uuid: _uuid.UUID


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """Name, capability (major, minor), core count, capacity and UUID (stable
    for the device index, as a GPU's is for the physical device) of ``device``."""
    index = _device_index(device, optional=True)
    props = _C._get_device_properties(index)
    return _DeviceProperties(
        props["name"],
        index,
        props["major"],
        props["minor"],
        props["multi_processor_count"],
        props["total_memory"],
        _uuid.UUID(bytes=props["uuid"]),
    )


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) version of ``device``."""
    props = get_device_properties(device)
    return props.major, props.minor


def get_arch_list() -> list[str]:
    """The device architectures this build supports: the one simulated architecture."""
    props = _C._get_device_properties(0) if _C._device_count() > 0 else None
    return [] if props is None else [f"openreg_{props['major']}{props['minor']}"]


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Whether ``device`` can use memory of ``peer_device`` directly: true for
    any two openreg devices (their memory is host memory)."""
    return _C._can_device_access_peer(_valid_index(device), _valid_index(peer_device))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 tensors and kernels work on openreg (natively: no emulation)."""
    return is_available()


def is_tf32_supported() -> bool:
    """False: openreg kernels compute float32 in float32 (TF32 is a GPU matmul mode)."""
    return False


def utilization(device: Any = None) -> int:
    """Percent (0..100) of the last second during which a stream of ``device``
    had work, measured by the runtime (Note [Busy clock] in src/runtime/utilization.rs)."""
    return _C._utilization(_valid_index(device))


def stop_device(device: Any) -> None:
    """Stop ``device``, as if it went away (Note [Stopped devices] in
    src/runtime/device_stop.rs): work queued on its streams that has not started is
    abandoned (each stream's next synchronize raises, saying how many kernels
    were abandoned; a kernel already running finishes), and new work for it
    (a kernel, an allocation, an event record) raises a RuntimeError saying
    the device is stopped, until ``restart_device(device)``. Waiting,
    querying and freeing still work."""
    _C._stop_device(_valid_index(device))


def restart_device(device: Any) -> None:
    """Bring back a device that ``stop_device`` stopped. Tensors allocated on
    it before raise a RuntimeError when used (they can still be freed): make
    them again, e.g. from CPU copies taken before the stop."""
    _C._restart_device(_valid_index(device))


def is_device_stopped(device: Any = None) -> bool:
    """Whether ``stop_device`` stopped ``device`` (and no restart followed)."""
    return _C._is_device_stopped(_valid_index(device))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


class device:
    """Context manager that makes ``device`` current, restoring the previous one on exit."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *exc_info: object) -> None:
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == _DEVICE_TYPE else None)
