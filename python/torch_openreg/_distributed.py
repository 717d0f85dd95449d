"""torch.distributed on openreg: collectives on gloo over zero-copy host views.

Note [Collectives over gloo]: openreg device memory is host memory (Note
[One door] in cpp/device/device_memory.h), so gloo, PyTorch's own CPU collective
engine, can run a collective directly on CPU tensors that alias the device
memory of the openreg tensors: nothing is copied, and the results land in
the openreg tensors. ``OpenRegGloo`` is a c10d backend (the C++
``Backend`` interface, which Python classes may implement) that does exactly
that around a ``ProcessGroupGloo``:

- Devices: every tensor of one collective is an openreg tensor of one device
  (a CPU tensor among them, or two devices, is a ``ValueError`` naming both).
- Stream order: the host waits for the current stream of that device before
  it hands the views to gloo, so the collective starts after the work queued
  before it (CUDA makes its communication stream wait; gloo has no stream,
  so the host does). Gloo runs the collective on its own threads; its
  ``Work`` is wrapped so that ``wait()`` returns once the results are in
  device memory: work queued after the wait (every synchronous collective
  waits before it returns) sees them. As with CUDA, work queued between an
  asynchronous collective and its ``wait()`` is not ordered after it.
- Lifetime: the views do not own the memory. The backend keeps the openreg
  tensors of each collective until gloo has finished with them, even if the
  caller drops the tensors and the handle (they are let go at a later
  collective, once finished).
- Futures: ``Work.get_future()`` (what DDP's reducer waits on) yields the
  openreg tensors, not the views. (Torch 2.15 hands the caller a holder of
  a Python backend's work that forwards ``wait()`` and ``get_future()``
  only: its ``is_completed()`` stays False, for every Python backend.)
- Memory protection: gloo's threads read and write device memory outside
  the runtime's own device operations, which OPENREG_MEMORY_PROTECT=1
  forbids; collectives on openreg tensors raise there.

Registration (through ``torch.distributed.Backend.register_backend`` only):
``"openreg_gloo"`` is the default backend of the openreg device, so
``init_process_group()`` without a backend picks it, and
``backend="cpu:gloo,openreg:openreg_gloo"`` names it. ``backend="gloo"``
serves openreg tensors too: gloo's registration is replaced by one that
calls PyTorch's own gloo creator and, besides the ``ProcessGroupGloo`` it
returns for CPU (and CUDA) tensors, registers an ``OpenRegGloo`` over that
same gloo context for openreg tensors (unless the group has an openreg
backend already; "cpu:gloo,openreg:openreg_gloo" then reuses it). CPU
collectives are untouched. One gloo context serving both devices means a
rank may pass CPU tensors where another passes openreg tensors, as gloo
allows for CUDA and CPU.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend, ProcessGroup

BACKEND_NAME = "openreg_gloo"

_DEVICE_TYPE = "openreg"


def _memory_protected() -> bool:
    from torch_openreg import openreg

    return openreg.options()["OPENREG_MEMORY_PROTECT"]["value"] == "1"


def _host_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same bytes as the openreg ``tensor`` (same
    storage, offset, sizes and strides); it does not own them."""
    storage = tensor.untyped_storage()
    host_storage = torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), torch.device("cpu"), storage.nbytes()
    )
    view = torch.empty(0, dtype=tensor.dtype)
    return view.set_(host_storage, tensor.storage_offset(), tensor.size(), tensor.stride())


class _Collective:
    """The openreg tensors of one collective: checks them and makes their views."""

    def __init__(self, name: str, *tensor_args: Any) -> None:
        self.name = name
        self.tensors: list[torch.Tensor] = []
        for arg in tensor_args:
            self._collect(arg)
        self.device = self._check_devices()

    def _collect(self, arg: Any) -> None:
        if isinstance(arg, torch.Tensor):
            self.tensors.append(arg)
        else:
            for item in arg:
                self._collect(item)

    def _check_devices(self) -> torch.device | None:
        device = None
        for t in self.tensors:
            if t.device.type != _DEVICE_TYPE:
                raise ValueError(
                    f"{BACKEND_NAME}: {self.name} got a tensor on {t.device} next to openreg tensors; "
                    "the tensors of one collective must all be on the same openreg device"
                )
            if t.layout != torch.strided:
                raise ValueError(f"{BACKEND_NAME}: {self.name} supports only dense (strided) tensors, got {t.layout}")
            if device is not None and t.device != device:
                raise ValueError(
                    f"{BACKEND_NAME}: {self.name} got tensors on {device} and {t.device}; "
                    "the tensors of one collective must all be on the same openreg device"
                )
            device = t.device
        if device is not None and _memory_protected():
            raise RuntimeError(
                f"{BACKEND_NAME}: {self.name} on openreg tensors is not supported with OPENREG_MEMORY_PROTECT=1: "
                "gloo's threads read and write device memory directly (Note [Collectives over gloo])"
            )
        return device

    def views(self, arg: Any) -> Any:
        """``arg`` (a tensor, or nested lists of them) with host views in place of tensors."""
        if isinstance(arg, torch.Tensor):
            return _host_view(arg)
        return [self.views(item) for item in arg]

    def wait_for_stream(self) -> None:
        """The collective starts after the work queued so far on the current stream."""
        if self.device is not None:
            torch.accelerator.current_stream(self.device).synchronize()


class _OpenRegWork(dist.Work):
    """Gloo's ``Work`` for a collective on views, as the openreg caller sees it:
    its future yields the openreg tensors (``results``)."""

    def __init__(self, gloo_work: dist.Work, results: list[torch.Tensor]) -> None:
        super().__init__()
        self._gloo_work = gloo_work
        self._results = results
        self._future: torch.futures.Future | None = None

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return self._gloo_work.wait(timeout)

    def is_completed(self) -> bool:
        return self._gloo_work.is_completed()

    def is_success(self) -> bool:
        return self._gloo_work.is_success()

    def exception(self) -> Any:
        return self._gloo_work.exception()

    def source_rank(self) -> int:
        return self._gloo_work.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._results

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            results = self._results

            def openreg_results(gloo_future: torch.futures.Future) -> list[torch.Tensor]:
                gloo_future.value()  # raises gloo's error, if any
                return results

            self._future = self._gloo_work.get_future().then(openreg_results)
        return self._future


class OpenRegGloo(C10dBackend):
    """A c10d backend for openreg tensors over a ``ProcessGroupGloo``
    (Note [Collectives over gloo]). Each collective has the signature of
    ``torch._C._distributed_c10d.Backend``'s method of the same name."""

    def __init__(self, gloo: dist.ProcessGroupGloo) -> None:
        super().__init__(gloo.rank(), gloo.size())
        self._gloo = gloo
        # (gloo work, the openreg tensors it reads or writes) until it finishes.
        self._in_flight: list[tuple[dist.Work, list[torch.Tensor]]] = []

    def getBackendName(self) -> str:  # noqa: N802  (the C++ method PyBackend overrides)
        return BACKEND_NAME

    # NB: torch 2.15's PyBackend answers these C++ capability queries by
    # reading the Python attribute of the same name, and a subclass that does
    # not define one finds Backend's own property, whose getter is that C++
    # query again: unbounded recursion (init_process_group(device_id=...)
    # reads supports_splitting). Each gives Backend's default.
    supports_splitting = property(lambda self: False)
    supports_coalescing = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)

    def _run(self, name: str, tensor_args: Sequence[Any], results: list[torch.Tensor], issue: Callable[..., dist.Work]) -> dist.Work:
        """Issues ``issue(*views of tensor_args)`` on gloo in stream order; the
        returned work's future yields ``results``."""
        self._in_flight = [(work, held) for work, held in self._in_flight if not work.is_completed()]
        collective = _Collective(name, *tensor_args)
        views = [collective.views(arg) for arg in tensor_args]
        collective.wait_for_stream()
        gloo_work = issue(*views)
        self._in_flight.append((gloo_work, collective.tensors))
        return _OpenRegWork(gloo_work, results)

    # Collectives, in the order of c10d's Backend.

    def broadcast(self, tensors, opts):
        return self._run("broadcast", [tensors], tensors, lambda v: self._gloo.broadcast(v, opts))

    def allreduce(self, tensors, opts):
        return self._run("all_reduce", [tensors], tensors, lambda v: self._gloo.allreduce(v, opts))

    def allreduce_coalesced(self, tensors, opts):
        return self._run("all_reduce_coalesced", [tensors], tensors, lambda v: self._gloo.allreduce_coalesced(v, opts))

    def reduce(self, tensors, opts):
        return self._run("reduce", [tensors], tensors, lambda v: self._gloo.reduce(v, opts))

    def allgather(self, output_lists, inputs, opts):
        outputs = [t for ts in output_lists for t in ts]
        return self._run("all_gather", [output_lists, inputs], outputs, lambda o, i: self._gloo.allgather(o, i, opts))

    def all_gather_single(self, output, input, opts):  # noqa: A002  (c10d's name)
        return self._run(
            "all_gather_into_tensor", [output, input], [output], lambda o, i: self._gloo.all_gather_single(o, i, opts)
        )

    def allgather_coalesced(self, output_lists, inputs, opts):
        outputs = [t for ts in output_lists for t in ts]
        return self._run(
            "all_gather_coalesced", [output_lists, inputs], outputs, lambda o, i: self._gloo.allgather_coalesced(o, i, opts)
        )

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self._run(
            "all_gather_into_tensor_coalesced",
            [outputs, inputs],
            outputs,
            lambda o, i: self._gloo.all_gather_single_coalesced(o, i, opts),
        )

    def gather(self, output_lists, inputs, opts):
        outputs = [t for ts in output_lists for t in ts]
        return self._run("gather", [output_lists, inputs], outputs, lambda o, i: self._gloo.gather(o, i, opts))

    def scatter(self, outputs, input_lists, opts):
        return self._run("scatter", [outputs, input_lists], outputs, lambda o, i: self._gloo.scatter(o, i, opts))

    def reduce_scatter(self, outputs, input_lists, opts):
        return self._run(
            "reduce_scatter", [outputs, input_lists], outputs, lambda o, i: self._gloo.reduce_scatter(o, i, opts)
        )

    def reduce_scatter_single(self, output, input, opts):  # noqa: A002
        return self._run(
            "reduce_scatter_tensor", [output, input], [output], lambda o, i: self._gloo.reduce_scatter_single(o, i, opts)
        )

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):  # noqa: A002
        return self._run(
            "all_to_all_single",
            [output, input],
            [output],
            lambda o, i: self._gloo.all_to_all_single(o, i, output_split_sizes, input_split_sizes, opts),
        )

    def alltoall(self, outputs, inputs, opts):
        return self._run("all_to_all", [outputs, inputs], outputs, lambda o, i: self._gloo.alltoall(o, i, opts))

    def send(self, tensors, dst_rank, tag):
        return self._run("send", [tensors], tensors, lambda v: self._gloo.send(v, dst_rank, tag))

    def recv(self, tensors, src_rank, tag):
        return self._run("recv", [tensors], tensors, lambda v: self._gloo.recv(v, src_rank, tag))

    def recv_anysource(self, tensors, tag):
        return self._run("recv", [tensors], tensors, lambda v: self._gloo.recv_anysource(v, tag))

    def barrier(self, opts):
        # No tensors: nothing to order. (The c10d front end gives a barrier a
        # one-byte tensor only when it runs it as an all_reduce.)
        return self._gloo.barrier(opts)


def _gloo_creator() -> Callable[..., Any]:
    """PyTorch's creator of gloo backends. Torch registers its built-in
    backends lazily (from entry points, at their first use): this does it now."""
    dist.Backend._ensure_backend_registered(dist.Backend.GLOO)
    return dist.Backend._plugins[dist.Backend.GLOO.upper()].creator_fn


def _register() -> None:
    create_gloo = _gloo_creator()
    openreg = torch.device(_DEVICE_TYPE)

    def create_openreg_gloo(opts: Any, backend_options: Any) -> Any:
        group = opts.process_group
        if group is not None and openreg.type in [d.type for d in group._device_types]:
            # "cpu:gloo,openreg:openreg_gloo": gloo, created first, already
            # serves openreg tensors over its context; no second context.
            return group._get_backend(openreg)
        return OpenRegGloo(create_gloo(opts, backend_options))

    def create_gloo_serving_openreg(opts: Any, backend_options: Any) -> Any:
        gloo = create_gloo(opts, backend_options)
        group = opts.process_group
        if group is not None and openreg.type not in [d.type for d in group._device_types]:
            group._register_backend(openreg, ProcessGroup.BackendType.CUSTOM, OpenRegGloo(gloo))
        return gloo

    dist.Backend.register_backend(BACKEND_NAME, create_openreg_gloo, extended_api=True, devices=[_DEVICE_TYPE])
    dist.Backend.register_backend(
        dist.Backend.GLOO,
        create_gloo_serving_openreg,
        extended_api=True,
        devices=dist.Backend.backend_capability[dist.Backend.GLOO],
        _backend_type=ProcessGroup.BackendType.GLOO,
    )


if dist.is_available() and dist.is_gloo_available():
    _register()
