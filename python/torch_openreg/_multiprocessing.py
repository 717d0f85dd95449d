"""Sending openreg tensors to other processes through torch.multiprocessing.

Note [Sharing device memory between processes]: as with CUDA IPC, an
openreg tensor (storage, ``nn.Module`` parameter) sent through a
``torch.multiprocessing`` queue, pipe or ``spawn`` argument arrives as an
openreg tensor on the same device index that aliases the sender's device
memory. This module registers ForkingPickler reductions for
``torch.UntypedStorage`` (typed storages, tensors and parameters are pickled
through it by PyTorch's own reductions); storages of other devices go to
PyTorch's reduction.

- Memory: each device mapping is a shared mapping of a memory file (Note
  [Shareable device memory] in src/memory/device_memory.rs). A storage travels as that
  file's descriptor, the mapping's size, and the storage's offset and size
  in it; the receiver maps the same pages (``_C._ipc_open_storage``).
  Descriptors travel through multiprocessing's resource sharer, which holds
  a duplicate until the receiver asks for it, in queues and ``spawn``
  arguments alike (the ``DupFd`` of a spawning process would pass the
  sender's own descriptor at launch, so the sender could not close it).
- Lifetime (CUDA's ref_counter_handle): each send makes a pipe. The sender
  keeps its read end together with the storage; the message carries the
  write end, which the receiver's storage holds until it is released (its
  deleter closes it). Once every copy of the write end is closed — each
  receiver released the storage, or exited — the read end reports a hang-up
  and the sender lets go of the storage, at its next send or at
  ``torch.openreg.ipc_collect()``; the block then returns to the sender's
  allocator. A message that is never received keeps the storage until the
  sender exits, as with CUDA.
- Order (CUDA's event_sync_required): each send also puts a one-shot signal
  on the sender's current stream (a second pipe, written when the stream
  gets there); the receiver's current stream waits for it before any work
  on the storage, so work queued before the send is visible to the receiver.
  Each side sees the other's later writes after synchronizing with it.
- Sending on (CUDA's received_cuda flag): a storage received from another
  process is not sent again; ``reduce_storage`` raises CUDA's RuntimeError,
  naming openreg, for it and for every tensor, view or parameter over it
  (Note [Received storages are not sent on]). A clone is a storage of the
  receiver's own, and travels as any other.
"""

from __future__ import annotations

import os
import select
import threading
from multiprocessing.reduction import ForkingPickler
from multiprocessing.resource_sharer import DupFd

import torch
from torch.multiprocessing import reductions as torch_reductions
from torch.multiprocessing.reductions import StorageWeakRef

from torch_openreg import _C

_DEVICE_TYPE = "openreg"

_sent_lock = threading.Lock()
# (read end of a send's holder pipe, the storage it keeps alive).
_sent: list[tuple[int, torch.UntypedStorage]] = []


def _released_by_all(read_end: int) -> bool:
    """Whether every write end of the holder pipe is closed."""
    poller = select.poll()
    poller.register(read_end, 0)  # hang-ups are always reported
    return any(event & select.POLLHUP for _, event in poller.poll(0))


def ipc_collect() -> None:
    """Lets go of the sent storages that every receiver has released."""
    with _sent_lock:
        still_held = []
        for read_end, storage in _sent:
            if _released_by_all(read_end):
                os.close(read_end)
            else:
                still_held.append((read_end, storage))
        _sent[:] = still_held


def _sent_count() -> int:
    """How many sends still keep a storage alive (for tests)."""
    with _sent_lock:
        return len(_sent)


# Note [Received storages are not sent on]: the storages this process
# received, by the address of their StorageImpl (``storage._cdata``, the
# same for every Python storage, tensor, view and parameter over it). Each
# entry holds a weak reference: it keeps no memory alive (a released
# storage's data goes at once), but keeps the StorageImpl's address from being
# reused while the entry exists, so a live storage found here is one that was
# received. Entries of released storages are dropped at the next receive.
_received_lock = threading.Lock()
_received: dict[int, StorageWeakRef] = {}


def _remember_received(storage: torch.UntypedStorage) -> None:
    with _received_lock:
        for address in [address for address, ref in _received.items() if ref.expired()]:
            del _received[address]
        _received[storage._cdata] = StorageWeakRef(storage)


def _was_received(storage: torch.UntypedStorage) -> bool:
    with _received_lock:
        return storage._cdata in _received


def _rebuild_empty_storage(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device(_DEVICE_TYPE, device))


def _rebuild_storage(
    device: int, memory: DupFd, mapping_size: int, offset: int, nbytes: int, holder: DupFd, signal: DupFd
) -> torch.UntypedStorage:
    memory_fd, holder_fd, signal_fd = memory.detach(), holder.detach(), signal.detach()
    try:
        count = torch.openreg.device_count()
        if not 0 <= device < count:
            raise RuntimeError(
                f"received an openreg tensor of device {device}, but this process has {count} openreg devices"
            )
        storage = _C._ipc_open_storage(device, memory_fd, mapping_size, offset, nbytes, holder_fd)
    except BaseException:
        os.close(holder_fd)
        os.close(signal_fd)
        raise
    finally:
        os.close(memory_fd)
    _C._ipc_wait_for_signal(device, signal_fd)
    _remember_received(storage)
    return storage


def reduce_storage(storage: torch.UntypedStorage):
    """ForkingPickler's reduction of ``torch.UntypedStorage``."""
    if storage.device.type != _DEVICE_TYPE:
        return torch_reductions.reduce_storage(storage)
    if _was_received(storage):
        raise RuntimeError(
            "Attempted to send openreg tensor received from another process; "
            "this is not currently supported. Consider cloning before sending."
        )
    ipc_collect()
    device = storage.device.index
    if storage.nbytes() == 0:
        return (_rebuild_empty_storage, (device,))
    memory_fd, mapping_size, offset = _C._ipc_mem_handle(storage.data_ptr())
    holder_read, holder_write = os.pipe()
    signal_read, signal_write = os.pipe()
    try:
        _C._ipc_signal_when_reached(device, signal_write)  # owns signal_write
        message = (device, DupFd(memory_fd), mapping_size, offset, storage.nbytes(), DupFd(holder_write), DupFd(signal_read))
    except BaseException:
        os.close(holder_read)
        raise
    finally:
        os.close(holder_write)  # DupFd keeps duplicates until the receiver takes them
        os.close(signal_read)
    with _sent_lock:
        _sent.append((holder_read, storage))
    return (_rebuild_storage, message)


ForkingPickler.register(torch.UntypedStorage, reduce_storage)
