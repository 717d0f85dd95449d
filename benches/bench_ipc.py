"""Round trip of an openreg tensor to another process and back through
torch.multiprocessing queues: the tensor travels as a handle to its device
memory, never as a copy (Note [Sharing device memory between processes]).

  python3 benches/bench_ipc.py

Target (issue "Many processes"): the round trip time does not depend on
the size: 64 MiB takes at most 1.5x the time of 4 KiB. CPU tensors that are
already in shared memory (PyTorch's own path after their first send) are
shown beside it, measured first (benches/timing.py).
"""

import statistics
import time

import torch
import torch.multiprocessing as mp

ROUND_TRIPS = 10
ROUNDS = 3


def echo(inbox, outbox) -> None:
    import torch_openreg  # noqa: F401

    while True:
        item = inbox.get()
        if item is None:
            return
        outbox.put(item)
        del item


def round_trips(tensors: dict, inbox, outbox) -> dict:
    """Median round trip per tensor, measured in turns (ROUNDS times each),
    so that a shared machine's load falls on every size alike."""
    seconds = {name: [] for name in tensors}
    for _ in range(ROUNDS):
        for name, tensor in tensors.items():
            seconds[name].append(round_trip_seconds(tensor, inbox, outbox))
    return {name: statistics.median(values) for name, values in seconds.items()}


def round_trip_seconds(tensor, inbox, outbox) -> float:
    """Median seconds of one trip there and back (after a warm-up trip)."""
    times = []
    for _ in range(ROUND_TRIPS + 1):
        start = time.perf_counter()
        inbox.put(tensor)
        back = outbox.get()
        times.append(time.perf_counter() - start)
        del back
    return statistics.median(times[1:])


def main() -> None:
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = context.Process(target=echo, args=(inbox, outbox), daemon=True)
    process.start()
    sizes = {"4 KiB": 4 << 10, "64 MiB": 64 << 20}
    cpu = round_trips({name: torch.ones(n // 4).share_memory_() for name, n in sizes.items()}, inbox, outbox)
    import torch_openreg  # noqa: F401

    dev = round_trips({name: torch.ones(n // 4, device="openreg:0") for name, n in sizes.items()}, inbox, outbox)
    torch.openreg.ipc_collect()
    inbox.put(None)
    process.join()

    print(f"{'round trip':36} {'openreg':>11} {'CPU (shm)':>11}")
    for name in sizes:
        print(f"{name:36} {dev[name] * 1e6:9.1f}us {cpu[name] * 1e6:9.1f}us")
    ratio = dev["64 MiB"] / dev["4 KiB"]
    verdict = "met" if ratio <= 1.5 else "MISSED"
    print(f"openreg 64 MiB / 4 KiB round trip: {ratio:.2f}x  target <= 1.5x  {verdict}")


if __name__ == "__main__":
    main()
