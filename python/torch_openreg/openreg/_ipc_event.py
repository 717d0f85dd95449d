"""``torch.openreg.Event(interprocess=True)``: an event that other processes
can open from its ``ipc_handle()`` (``Event.from_ipc_handle``) or receive
through torch.multiprocessing, to order their streams after this one's work
(as ``torch.cuda.Event(interprocess=True)``). Its state is a page of memory
shared between the processes (Note [Interprocess events] in
cpp/python/ipc.cpp); the handle names the creator's memory file, which the
opener reaches through ``/proc/<pid>/fd``, so it is valid while the
creating event lives (as a CUDA IPC event handle)."""

from __future__ import annotations

import os
from typing import Any

import torch

from torch_openreg import _C

from ._device import _DEVICE_TYPE, _device_index
from ._streams import StreamContext

_HANDLE_PREFIX = b"openreg-ipc-event:"


class InterprocessEvent:
    """An openreg event shared between processes. It takes no time stamps."""

    def __init__(self, device: Any = None, _handle: bytes | None = None) -> None:
        index = _device_index(device, optional=True)
        if _handle is None:
            self._fd = os.memfd_create("openreg-ipc-event", os.MFD_CLOEXEC)
            os.ftruncate(self._fd, 4096)
        else:
            pid, fd = _parse_handle(_handle)
            try:
                self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            except OSError as e:
                raise RuntimeError(
                    f"cannot open the interprocess event {_handle!r}: its creating process or event is gone ({e})"
                ) from None
        self._event = _C._ipc_event_open(self._fd)
        self.device = torch.device(_DEVICE_TYPE, index)

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: bytes) -> "InterprocessEvent":
        """The event of another process, from its ``ipc_handle()``."""
        return cls(device, _handle=handle)

    def ipc_handle(self) -> bytes:
        return _HANDLE_PREFIX + f"{os.getpid()}:{self._fd}".encode()

    def _check(self, stream: torch.Stream | None) -> torch.Stream | None:
        if stream is not None and stream.device != self.device:
            raise ValueError(f"the interprocess event is on {self.device}, the stream on {stream.device}")
        return stream

    def record(self, stream: torch.Stream | None = None) -> None:
        """Marks the point ``stream`` (default: current) has reached in its work."""
        with StreamContext(self._check(stream)):
            _C._ipc_event_record(self._event, self.device.index)

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Work queued later on ``stream`` waits for the latest record, in any process."""
        with StreamContext(self._check(stream)):
            _C._ipc_event_wait(self._event, self.device.index)

    def query(self) -> bool:
        return _C._ipc_event_query(self._event)

    def synchronize(self) -> None:
        _C._ipc_event_synchronize(self._event)

    def __reduce__(self):
        return (InterprocessEvent.from_ipc_handle, (self.device, self.ipc_handle()))

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"torch.openreg.Event(device={self.device}, interprocess=True)"


def _parse_handle(handle: bytes) -> tuple[int, int]:
    if not isinstance(handle, (bytes, bytearray)) or not handle.startswith(_HANDLE_PREFIX):
        raise ValueError(f"not an openreg interprocess event handle: {handle!r}")
    try:
        pid, fd = (int(part) for part in handle[len(_HANDLE_PREFIX) :].split(b":"))
    except ValueError:
        raise ValueError(f"not an openreg interprocess event handle: {handle!r}") from None
    return pid, fd
