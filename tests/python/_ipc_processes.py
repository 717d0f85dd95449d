"""Processes for test_multiprocessing.py: a parent (``main``) that sends
openreg tensors to spawned children through torch.multiprocessing, and the
children. Spawned children import this module by name, so it must stay
importable without pytest. Every wait has a deadline: a hang is a failure
reported to the test, never waited out."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

DEADLINE_S = 60
N = 1 << 18  # 1 MiB of float32


def _get(q):
    return q.get(timeout=DEADLINE_S)


def consumer(inbox, outbox) -> None:
    """Receives a tensor, reports what it sees, doubles it in place when
    told, and lets go of it when told ("drop", or "exit" without letting go)."""
    import torch_openreg  # noqa: F401

    torch.ones(4, device="openreg:1")[:2].sum().tolist()  # initialized, warm
    outbox.put("ready")
    t = _get(inbox)
    outbox.put(
        {
            "device": str(t.device),
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            "first": t[:4].tolist(),
            "sum": t.sum().item(),
        }
    )
    while True:
        command = _get(inbox)
        if command == "double":
            t.mul_(2)
            torch.openreg.synchronize(t.device)
            outbox.put("doubled")
        elif command == "drop":
            del t
            outbox.put("dropped")
            return
        elif command == "exit":
            import os

            os._exit(0)  # still holding it, as a crashed process


def train_in_child(model, inbox, outbox) -> None:
    """Receives a module as a spawn argument: reports its parameters, then
    updates them in place."""
    import torch_openreg  # noqa: F401

    outbox.put(
        {
            "types": sorted({type(p).__name__ for p in model.parameters()}),
            "devices": sorted({str(p.device) for p in model.parameters()}),
            "requires_grad": all(p.requires_grad for p in model.parameters()),
        }
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.openreg.synchronize()
    outbox.put("updated")
    _get(inbox)  # keep the parameters until the parent has looked


def event_consumer(inbox, outbox) -> None:
    """Receives a tensor, then an event (as a handle, then as an object):
    its stream waits for the event before reading the tensor."""
    import torch_openreg  # noqa: F401

    t = _get(inbox)
    for _ in range(2):
        handle_or_event = _get(inbox)
        if isinstance(handle_or_event, bytes):
            event = torch.openreg.Event.from_ipc_handle(t.device, handle_or_event)
        else:
            event = handle_or_event
        event.wait()
        outbox.put({"sum": t.sum().item(), "query": event.query(), "type": type(event).__name__})
    _get(inbox)


def resender(inbox, outbox) -> None:
    """Receives a tensor, a storage and a parameter, tries to send each of
    them (and a view of the tensor) on, reports how each attempt ends, then
    sends a clone of the tensor back."""
    from multiprocessing.reduction import ForkingPickler

    import torch_openreg  # noqa: F401

    received = {"tensor": _get(inbox), "storage": _get(inbox), "parameter": _get(inbox)}
    received["view"] = received["tensor"][2:]
    attempts = {}
    for kind, value in received.items():
        try:
            ForkingPickler.dumps(value)  # what a queue's feeder thread does
            attempts[kind] = "sent"
        except Exception as e:
            attempts[kind] = f"{type(e).__name__}: {e}"
    outbox.put(attempts)
    outbox.put(received["tensor"].clone())
    _get(inbox)  # keep the clone until the parent has looked


def _start(target, *args):
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = context.Process(target=target, args=(*args, inbox, outbox), daemon=True)
    process.start()
    return process, inbox, outbox


def _finish(process) -> int | str:
    process.join(DEADLINE_S)
    if process.is_alive():
        process.kill()
        return "hung"
    return process.exitcode


def main() -> dict:
    import torch_openreg  # noqa: F401
    from torch_openreg import _multiprocessing

    out: dict = {}
    dev = torch.device("openreg", 1)
    torch.openreg.set_device(dev)  # _sleep runs on the current device

    # 1. Aliasing and stream order: the tensor is put on the queue while a
    # 300 ms kernel and an add behind it are still queued on the sender's
    # stream; the receiver must see the add. Then the receiver doubles it in
    # place and the sender sees that.
    process, inbox, outbox = _start(consumer)
    t = torch.arange(N, dtype=torch.float32, device=dev)
    t.add_(0)  # the add's first call may wait for the stream (Note [Fallback])
    torch.openreg.synchronize(dev)
    out["ready"] = _get(outbox)  # the receiver takes the tensor at once
    torch.openreg._sleep(500)
    t.add_(1)
    inbox.put(t)
    out["received"] = _get(outbox)
    inbox.put("double")
    out["doubled"] = _get(outbox)
    out["sender_sees"] = t[:4].tolist()
    inbox.put("drop")
    out["dropped"] = _get(outbox)
    out["exit_1"] = _finish(process)
    del t

    # 2. The producer deletes its tensor right after sending: the memory
    # stays allocated while the receiver holds it and is released after.
    torch.openreg.synchronize(dev)
    _multiprocessing.ipc_collect()
    baseline = torch.openreg.memory_allocated(dev)
    process, inbox, outbox = _start(consumer)
    _get(outbox)
    t = torch.full((N,), 3.0, device=dev)
    inbox.put(t)
    del t
    out["deleted_received"] = _get(outbox)
    torch.openreg.ipc_collect()
    out["held_while_received"] = torch.openreg.memory_allocated(dev) - baseline
    inbox.put("drop")
    out["deleted_dropped"] = _get(outbox)
    out["exit_2"] = _finish(process)
    torch.openreg.ipc_collect()
    out["after_release"] = torch.openreg.memory_allocated(dev) - baseline
    out["sends_held"] = _multiprocessing._sent_count()

    # 3. A receiver that exits without letting go releases it too.
    process, inbox, outbox = _start(consumer)
    _get(outbox)
    t = torch.ones(N, device=dev)
    inbox.put(t)
    del t
    _get(outbox)
    inbox.put("exit")
    out["exit_3"] = _finish(process)
    torch.openreg.ipc_collect()
    out["after_crashed_receiver"] = torch.openreg.memory_allocated(dev) - baseline

    # 4. An nn.Module as a spawn argument: its parameters, in place.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("openreg:0")
    before = [p.detach().cpu() for p in model.parameters()]
    process, inbox, outbox = _start(train_in_child, model)
    out["module"] = _get(outbox)
    out["module_updated"] = _get(outbox)
    after = [p.detach().cpu() for p in model.parameters()]
    out["module_delta"] = [(a - b).tolist() == torch.ones_like(a).tolist() for a, b in zip(after, before)]
    inbox.put("bye")
    out["exit_4"] = _finish(process)

    # 5. Interprocess events: the receiver's stream waits for work the
    # sender queued after the tensor was sent, through the event.
    torch.openreg.set_device(0)
    process, inbox, outbox = _start(event_consumer)
    t = torch.zeros(N, device="openreg:0")
    inbox.put(t)
    event = torch.openreg.Event(interprocess=True)
    out["event_repr"] = repr(event)
    for value, send in ((7.0, event.ipc_handle), (9.0, lambda: event)):
        torch.openreg._sleep(300)
        t.fill_(value)
        event.record()
        out[f"event_query_while_busy_{value}"] = event.query()
        inbox.put(send())
        out[f"event_{value}"] = _get(outbox)
    event.synchronize()
    out["event_query_after"] = event.query()
    inbox.put("bye")
    out["exit_event"] = _finish(process)

    # 6. CPU tensors still go through PyTorch's own reduction.
    process, inbox, outbox = _start(consumer)
    _get(outbox)
    inbox.put(torch.full((8,), 2.0))
    out["cpu_received"] = _get(outbox)
    inbox.put("drop")
    _get(outbox)
    out["exit_5"] = _finish(process)

    # 7. What a process received it does not send on, as with CUDA; a clone
    # of it is its own memory and travels. The sender's add after it got the
    # clone back does not show in the clone.
    process, inbox, outbox = _start(resender)
    t = torch.arange(6.0, device="openreg:0")
    inbox.put(t)
    inbox.put(torch.full((4,), 5.0, device="openreg:0").untyped_storage())
    inbox.put(torch.nn.Parameter(torch.ones(3, device="openreg:0")))
    out["resend_attempts"] = _get(outbox)
    clone = _get(outbox)
    t.add_(1)
    out["resent_clone"] = {"device": str(clone.device), "values": clone.tolist()}
    inbox.put("bye")
    out["exit_resend"] = _finish(process)
    return out
