"""The dynamo ``DeviceInterface`` of openreg: how ``torch.compile`` (dynamo and
Inductor) reaches devices, streams, events and properties of a backend.

Registered for the device type ``openreg`` as soon as
``torch._dynamo.device_interface`` is imported (Note [Registering with
lazily imported torch modules]). Every method forwards to ``torch.openreg``
or to PyTorch's generic stream and event objects, i.e. to the Rust runtime.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_openreg import _C, openreg
from torch_openreg.openreg._device import _device_index

_DEVICE_TYPE = "openreg"

# Device properties and current device recorded in this process, for Inductor's
# compile workers (Worker below), as dynamo's own interfaces do.
_worker_properties: list[Any] = []
_worker_device: list[int] = []


def _make_interface():
    # Defined on first use: the base class lives in torch._dynamo.
    from torch._dynamo.device_interface import DeviceInterface

    class OpenRegEvent(torch.Event):
        """A ``torch.Event`` of the openreg device. The class satisfies dynamo's
        contract (a ``torch.Event`` subclass); its instances are plain
        ``torch.Event`` objects, since ``torch.Event.elapsed_time`` accepts no
        subclass instance as its argument."""

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
            return openreg.Event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    class OpenRegInterface(DeviceInterface):
        device = openreg.device
        Event = OpenRegEvent
        Stream = openreg.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                _worker_device[:] = [device]

            @staticmethod
            def current_device() -> int:
                return _worker_device[0] if _worker_device else openreg.current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                if not _worker_properties:
                    _worker_properties.extend(openreg.get_device_properties(i) for i in range(openreg.device_count()))
                index = OpenRegInterface.Worker.current_device() if device is None else _device_index(device, optional=True)
                return _worker_properties[index]

        current_device = staticmethod(openreg.current_device)
        set_device = staticmethod(openreg.set_device)
        device_count = staticmethod(openreg.device_count)
        is_available = staticmethod(openreg.is_available)
        stream = staticmethod(openreg.stream)
        current_stream = staticmethod(openreg.current_stream)
        set_stream = staticmethod(openreg.set_stream)
        synchronize = staticmethod(openreg.synchronize)
        get_device_properties = staticmethod(openreg.get_device_properties)
        memory_allocated = staticmethod(openreg.memory_allocated)
        is_bf16_supported = staticmethod(openreg.is_bf16_supported)

        @staticmethod
        def exchange_device(device: int) -> int:
            """Make ``device`` current and return the previous one; -1 changes nothing."""
            if device < 0:
                return -1
            return _C._exchange_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return OpenRegInterface.exchange_device(device)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            openreg.set_stream(openreg.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            """The native handle of the current stream of ``device_idx``."""
            return openreg.current_stream(device_idx).native_handle

        @staticmethod
        def get_compute_capability(device: Any = None) -> int:
            props = openreg.get_device_properties(device)
            return props.major * 10 + props.minor

        @staticmethod
        def is_gpu() -> bool:
            # Inductor generates C++ for openreg, as for the CPU (device memory
            # is host memory), not Triton: it must not take openreg for a GPU.
            return False

    return OpenRegInterface


_interface = None


def interface():
    """The ``DeviceInterface`` subclass of openreg (imports ``torch._dynamo``)."""
    global _interface
    if _interface is None:
        _interface = _make_interface()
    return _interface


def register(device_interface_module) -> None:
    device_interface_module.register_interface_for_device(_DEVICE_TYPE, interface())
