"""all_reduce across 2 processes on openreg beside the same call on CPU
tensors, both on gloo over loopback, in one run.

  python3 benches/bench_distributed.py

Target (issue "Many processes"): the bus bandwidth of an all_reduce of
64 MiB of float32 on openreg is at least 0.9x that on CPU tensors (the
collective runs on zero-copy host views of device memory, Note
[Collectives over gloo]). Bus bandwidth = bytes * 2 (n - 1) / n / time, as
nccl-tests count it. CPU is measured first (benches/timing.py), and then
in turns with openreg, so that both see the same load on a shared machine.
"""

import os
import socket
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from timing import median_seconds, report

WORLD_SIZE = 2
NBYTES = 64 << 20
REPEAT = 5
ROUNDS = 3


def rank_main(rank: int, port: int, results) -> None:
    import torch_openreg  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.openreg.set_device(rank)
    dist.init_process_group(backend="gloo", rank=rank, world_size=WORLD_SIZE)  # one gloo context for both
    devices = {"cpu": "cpu", "openreg": f"openreg:{rank}"}
    tensors = {}
    seconds = {"cpu": [], "openreg": []}
    for _ in range(ROUNDS):
        for name, device in devices.items():  # CPU first: a clean baseline
            if name not in tensors:
                tensors[name] = torch.ones(NBYTES // 4, device=device)
            t = tensors[name]
            seconds[name].append(median_seconds(lambda: dist.all_reduce(t), REPEAT, device=device))
            dist.barrier()
    if rank == 0:
        results.put({name: statistics.median(values) for name, values in seconds.items()})
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(port, results), nprocs=WORLD_SIZE, start_method="spawn")
    seconds = results.get()
    bus_bytes = NBYTES * 2 * (WORLD_SIZE - 1) / WORLD_SIZE
    cpu, dev = seconds["cpu"], seconds["openreg"]
    print(f"bus bandwidth: openreg {bus_bytes / dev / 1e9:.2f} GB/s, CPU {bus_bytes / cpu / 1e9:.2f} GB/s")
    report([("all_reduce 64 MiB float32, 2 processes (bus bw)", dev, cpu, cpu / dev, 0.9, True)])


if __name__ == "__main__":
    main()
