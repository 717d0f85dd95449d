"""Streams and events: ``torch.openreg.Stream`` / ``Event`` are PyTorch's
generic ``torch.Stream`` / ``torch.Event`` bound to openreg, so their methods
go through the registered device guard into the Rust runtime."""

from __future__ import annotations

from typing import Any

import torch

from ._device import _DEVICE_TYPE, _device_index, _valid_index


class Stream(torch.Stream):
    """An openreg stream taken from the device's pool (round-robin, like CUDA).

    ``priority`` 0 is normal, -1 high; other values are clamped.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # wrapping an existing stream
            return super().__new__(cls, **kwargs)
        index = _device_index(device, optional=True)
        return super().__new__(cls, device=torch.device(_DEVICE_TYPE, index), priority=priority)

    @classmethod
    def _wrap(cls, s: torch.Stream) -> "Stream":
        return cls(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Any:  # noqa: N802
    """An openreg event: a ``torch.Event`` of the openreg device.

    ``enable_timing=True`` allows ``elapsed_time``. A factory rather than a
    subclass: ``torch.Event.elapsed_time`` accepts only exact ``torch.Event``
    objects as its argument. ``interprocess=True`` makes an event other
    processes can wait on (``InterprocessEvent``: ``ipc_handle()``,
    ``Event.from_ipc_handle(device, handle)``), without time stamps, as CUDA's.
    """
    if interprocess:
        if enable_timing:
            raise ValueError("an interprocess event cannot take time stamps (enable_timing=True), as with CUDA")
        from ._ipc_event import InterprocessEvent

        return InterprocessEvent()
    return torch.Event(device=_DEVICE_TYPE, enable_timing=enable_timing, blocking=blocking)


def _event_from_ipc_handle(device: Any, handle: bytes) -> Any:
    """The interprocess event of another process, from its ``ipc_handle()``."""
    from ._ipc_event import InterprocessEvent

    return InterprocessEvent.from_ipc_handle(device, handle)


Event.from_ipc_handle = _event_from_ipc_handle


def current_stream(device: Any = None) -> Stream:
    """This thread's current stream on ``device`` (default: current device)."""
    return Stream._wrap(torch.accelerator.current_stream(torch.device(_DEVICE_TYPE, _device_index(device, optional=True))))


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of ``device`` (default: current device)."""
    return Stream(stream_id=0, device_index=_valid_index(device), device_type=_PRIVATEUSE1_TYPE_CODE)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` current for its device on this thread, and make its
    device current, as ``torch.cuda.set_stream`` does. (The guard's
    ``exchangeStream`` is what leaves the current device alone.)"""
    if stream is None:
        return
    if stream.device.type != _DEVICE_TYPE:
        raise ValueError(f"expected an openreg stream, but got a stream of {stream.device}")
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current (and its device current) inside a ``with`` block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self._saved: tuple[int, torch.Stream, torch.Stream] | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        prev_device = torch.openreg.current_device()
        target_device = self.stream.device_index
        # Like torch.cuda.StreamContext: remember the current streams of both
        # the previous and the stream's device, restore both on exit.
        prev_stream_on_prev = current_stream(prev_device)
        torch.openreg.set_device(target_device)
        prev_stream_on_target = current_stream(target_device)
        set_stream(self.stream)
        self._saved = (prev_device, prev_stream_on_prev, prev_stream_on_target)
        return self.stream

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is None:
            return
        prev_device, prev_stream_on_prev, prev_stream_on_target = self._saved
        set_stream(prev_stream_on_target)
        set_stream(prev_stream_on_prev)
        torch.openreg.set_device(prev_device)
        self._saved = None


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.openreg.stream(s):`` runs the block with ``s`` current."""
    return StreamContext(stream)


# torch.Stream stores its device type as the integer code of c10::DeviceType.
_PRIVATEUSE1_TYPE_CODE = 20


class ExternalStream(Stream):
    """Wraps a stream given by its native handle (``Stream.native_handle``, an
    ``orStream_t`` of the C ABI in ``openreg.h``), as ``torch.cuda.ExternalStream``
    wraps a ``cudaStream_t``. The handle must name an openreg stream (its
    device is the stream's own; a ``device`` argument must agree)."""

    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs: Any) -> "ExternalStream":
        from torch_openreg import _C

        if kwargs:
            raise TypeError(f"ExternalStream: unexpected arguments {sorted(kwargs)}")
        index, stream_id = _C._stream_of_handle(stream_ptr)
        if device is not None and _valid_index(device) != index:
            raise ValueError(f"ExternalStream: handle {stream_ptr:#x} is a stream of openreg device {index}, not of {device}")
        return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_PRIVATEUSE1_TYPE_CODE)


def get_stream_from_external(data_ptr: int, device: Any = None) -> Stream:
    """An openreg stream from its native handle (see ``ExternalStream``)."""
    return ExternalStream(data_ptr, device)
