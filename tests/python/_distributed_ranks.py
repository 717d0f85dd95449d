"""The per-rank bodies of the torch.distributed tests (test_distributed.py).

They run in processes started by ``torch.multiprocessing`` with the spawn
method, which imports them by module name: this module must stay importable
without pytest. ``launch`` runs one body on 2 ranks with a deadline; each
rank reports a JSON-able dict, and ``launch`` returns them in rank order.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp

WORLD_SIZE = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, body_name: str, out_dir: str, kwargs: dict) -> None:
    import torch_openreg  # noqa: F401

    # Gloo over loopback; each process group gets its port from `use_port`.
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    try:
        result = globals()[body_name](rank, **kwargs)
    except BaseException:  # noqa: B902 - reported to the test
        result = {"fatal": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def use_port(port: int) -> None:
    """The next init_process_group (env://) rendezvous on ``port``."""
    os.environ["MASTER_PORT"] = str(port)


def launch(body_name: str, deadline_s: float = 120, **kwargs) -> list[dict]:
    """Runs ``body_name(rank, **kwargs)`` on WORLD_SIZE spawned ranks; kills
    them after ``deadline_s`` (a hang is reported, never waited out). A
    ``ports`` argument gets that many free ports."""
    if "ports" in kwargs:
        kwargs["ports"] = [free_port() for _ in range(kwargs["ports"])]
    with tempfile.TemporaryDirectory(prefix="openreg-dist-") as out_dir:
        context = mp.start_processes(
            _rank_entry,
            args=(body_name, out_dir, kwargs),
            nprocs=WORLD_SIZE,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + deadline_s
        finished = False
        while not finished and time.monotonic() < deadline:
            finished = context.join(timeout=max(0.1, deadline - time.monotonic()))
        if not finished:
            for process in context.processes:
                process.kill()
            return [{"fatal": f"rank hung past {deadline_s}s"}] * WORLD_SIZE
        results = []
        for rank in range(WORLD_SIZE):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                results.append(json.load(f))
        return results


def _error_of(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__}: {e}"
    return None


def _values(t: torch.Tensor) -> list:
    return t.cpu().tolist()


# ------------------------------------------------------------------ bodies


def group_suite(rank: int, ports: list[int]) -> dict:
    """Everything that works, one process group after another: each way to
    choose the backend, every collective under two of them, devices that
    differ across ranks."""
    import torch.distributed as dist

    torch.openreg.set_device(rank)
    out: dict = {}
    ports = list(ports)
    for name, backend in [("none", None), ("gloo", "gloo"), ("mixed", "cpu:gloo,openreg:openreg_gloo")]:
        use_port(ports.pop())
        if backend is None:
            dist.init_process_group(rank=rank, world_size=WORLD_SIZE)
        else:
            dist.init_process_group(backend=backend, rank=rank, world_size=WORLD_SIZE)
        t = torch.full((3,), float(rank + 1), device=f"openreg:{rank}")
        dist.all_reduce(t)
        out[f"{name}/all_reduce"] = _values(t)
        cpu = torch.full((2,), float(rank + 1))
        out[f"{name}/cpu_error"] = _error_of(lambda: dist.all_reduce(cpu))
        out[f"{name}/cpu_all_reduce"] = cpu.tolist()
        if backend is not None:
            out[name] = collectives(rank)
            out[f"{name}/across_ranks"] = openreg_with_cpu_peer(rank)
        dist.destroy_process_group()
    return out


def training(rank: int, ports: list[int], steps: int) -> dict:
    """DDP and FSDP (fully_shard), each against one process."""
    torch.openreg.set_device(rank)
    use_port(ports[0])
    out = {"ddp": ddp(rank, steps)}
    use_port(ports[1])
    out["fsdp"] = fsdp(rank, steps)
    return out


def failures(rank: int, ports: list[int], timeout_s: float) -> dict:
    """A collective that one rank never joins times out; a rank that exits
    early makes the other's collective fail. Neither hangs."""
    import torch.distributed as dist

    torch.openreg.set_device(rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    out: dict = {}
    # Before the group forms: the first device tensor's one-time cost (Note
    # [One-time costs at the first device use]) must not eat into the time
    # rank 1 stays alive, or rank 1 leaves before rank 0's timeout.
    t = torch.ones(2, device=f"openreg:{rank}")
    use_port(ports[0])
    dist.init_process_group(rank=rank, world_size=WORLD_SIZE, timeout=timeout)
    if rank == 0:
        start = time.monotonic()
        out["missing_peer_error"] = _error_of(lambda: dist.all_reduce(t))
        out["missing_peer_seconds"] = time.monotonic() - start
    else:
        time.sleep(timeout_s + 2)  # alive, but never joins
    dist.destroy_process_group()

    use_port(ports[1])
    dist.init_process_group(rank=rank, world_size=WORLD_SIZE, timeout=timeout)
    if rank == 1:
        return out  # leaves without destroying the group, as a crashed rank
    start = time.monotonic()
    out["early_exit_error"] = _error_of(lambda: dist.all_reduce(t))
    out["early_exit_seconds"] = time.monotonic() - start
    return out


def collectives(rank: int) -> dict:
    """Every collective on openreg tensors, in the current process group."""
    import torch.distributed as dist

    dev = torch.device("openreg", rank)
    other = 1 - rank
    out: dict = {}

    t = torch.arange(4, dtype=torch.float32, device=dev) + 10 * rank
    dist.all_reduce(t)
    out["all_reduce"] = _values(t)

    t = torch.tensor([rank + 1.0, -rank - 1.0], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = _values(t)

    t = torch.full((5,), rank + 1, dtype=torch.int64, device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    out["all_reduce_async_int64"] = _values(t)

    # Zero copy: a slice of a bigger tensor is reduced in place.
    big = torch.zeros(8, device=dev)
    big[2:6] = rank + 1.0
    dist.all_reduce(big[2:6])
    out["all_reduce_slice"] = _values(big)

    t = torch.full((3,), float(rank), device=dev)
    dist.broadcast(t, src=1)
    out["broadcast"] = _values(t)

    t = torch.full((2,), float(rank + 1), device=dev)
    dist.reduce(t, dst=0)
    out["reduce"] = _values(t) if rank == 0 else None

    gathered = [torch.empty(2, device=dev) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, torch.full((2,), float(rank), device=dev))
    out["all_gather"] = [_values(g) for g in gathered]

    into = torch.empty(WORLD_SIZE * 2, device=dev)
    dist.all_gather_into_tensor(into, torch.full((2,), float(rank + 5), device=dev))
    out["all_gather_into_tensor"] = _values(into)

    result = torch.empty(2, device=dev)
    dist.reduce_scatter(result, [torch.full((2,), float(rank + 10 * j), device=dev) for j in range(WORLD_SIZE)])
    out["reduce_scatter"] = _values(result)

    result = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(result, torch.arange(4, dtype=torch.float32, device=dev) * (rank + 1))
    out["reduce_scatter_tensor"] = _values(result)

    outputs = [torch.empty(2, device=dev) for _ in range(WORLD_SIZE)]
    dist.all_to_all(outputs, [torch.full((2,), float(10 * rank + j), device=dev) for j in range(WORLD_SIZE)])
    out["all_to_all"] = [_values(o) for o in outputs]

    output = torch.empty(4, device=dev)
    dist.all_to_all_single(output, torch.arange(4, dtype=torch.float32, device=dev) + 100 * rank)
    out["all_to_all_single"] = _values(output)

    # Uneven splits: rank 0 sends 1 element to itself and 3 to rank 1;
    # rank 1 sends 2 and 2.
    send_splits = [[1, 3], [2, 2]][rank]
    recv_splits = [send_splits_of[rank] for send_splits_of in ([1, 3], [2, 2])]
    output = torch.empty(sum(recv_splits), device=dev)
    dist.all_to_all_single(
        output, torch.arange(4, dtype=torch.float32, device=dev) + 100 * rank, recv_splits, send_splits
    )
    out["all_to_all_single_uneven"] = _values(output)

    gather_list = [torch.empty(2, device=dev) for _ in range(WORLD_SIZE)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank + 7), device=dev), gather_list, dst=0)
    out["gather"] = [_values(g) for g in gather_list] if rank == 0 else None

    result = torch.empty(2, device=dev)
    scatter_list = [torch.full((2,), float(j + 20), device=dev) for j in range(WORLD_SIZE)] if rank == 0 else None
    dist.scatter(result, scatter_list, src=0)
    out["scatter"] = _values(result)

    dist.barrier()

    t = torch.full((3,), float(rank + 1), device=dev)
    if rank == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=1)
    else:
        received = torch.empty(3, device=dev)
        dist.recv(received, src=0)
        dist.send(received * 10, dst=0)
        t = received
    out["send_recv"] = _values(t)

    t = torch.full((2,), float(rank + 1), device=dev)
    peer = torch.empty(2, device=dev)
    works = [dist.isend(t, dst=other), dist.irecv(peer, src=other)]
    for w in works:
        w.wait()
    out["isend_irecv"] = _values(peer)

    # Stream order: the collective starts after work queued before it on the
    # current stream (a 300 ms kernel, then an add queued behind it), and work
    # queued after it sees its result.
    # (The same ops run first behind a busy stream: the first queued call of
    # an op may make the host wait for the stream, Note [Fallback], which
    # would hide a missing wait here.)
    t = torch.ones(4, device=dev)
    side = torch.openreg.Stream(dev)
    for stream in (torch.openreg.current_stream(dev), side):
        with torch.openreg.stream(stream):
            torch.openreg._sleep(1)
            t.add_(rank + 1).mul_(10).fill_(1.0)
    torch.openreg.synchronize(dev)
    torch.openreg._sleep(300)
    t.add_(rank + 1)
    dist.all_reduce(t)
    t.mul_(10)
    out["stream_order"] = _values(t)

    # On a side stream: the collective follows that stream's work.
    with torch.openreg.stream(side):
        t = torch.zeros(4, device=dev)
        torch.openreg._sleep(300)
        t.fill_(rank + 2.0)
        dist.all_reduce(t)
        out["side_stream"] = _values(t)

    # The future yields the openreg tensors (what DDP's reducer reads).
    t = torch.ones(2, device=dev)
    future = dist.all_reduce(t, async_op=True).get_future()
    value = future.wait()
    out["future_devices"] = [str(v.device) for v in value]
    out["future_values"] = [_values(v) for v in value]

    # Bad input: clear errors, raised before any communication (both ranks
    # raise alike, so the group stays usable).
    out["cpu_mixed_error"] = _error_of(
        lambda: dist.all_gather([torch.empty(2), torch.empty(2)], torch.ones(2, device=dev))
    )
    out["cpu_mixed_into_error"] = _error_of(lambda: dist.all_gather_into_tensor(torch.empty(4), torch.ones(2, device=dev)))
    out["two_devices_error"] = _error_of(
        lambda: dist.all_gather(
            [torch.empty(2, device="openreg:0"), torch.empty(2, device="openreg:1")], torch.ones(2, device=dev)
        )
    )
    t = torch.full((2,), 1.0, device=dev)
    dist.all_reduce(t)
    out["after_errors"] = _values(t)
    return out


def openreg_with_cpu_peer(rank: int) -> dict:
    """Rank 0 reduces an openreg tensor, rank 1 a CPU tensor: one gloo
    context serves both devices, as gloo does for CUDA and CPU."""
    import torch.distributed as dist

    t = torch.full((2,), float(rank + 1), device="openreg:0" if rank == 0 else "cpu")
    dist.all_reduce(t)
    return {"values": _values(t), "device": str(t.device)}


def _ddp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _ddp_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps, WORLD_SIZE * 4, 8, generator=generator)
    targets = torch.randn(steps, WORLD_SIZE * 4, 4, generator=generator)
    return inputs, targets


def ddp(rank: int, steps: int) -> dict:
    """DDP on openreg:<rank> against one process on the concatenated batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dev = torch.device("openreg", rank)
    dist.init_process_group(backend="gloo", rank=rank, world_size=WORLD_SIZE)
    inputs, targets = _ddp_data(steps)
    per_rank = inputs.shape[1] // WORLD_SIZE
    mine = slice(rank * per_rank, (rank + 1) * per_rank)

    model = DistributedDataParallel(_ddp_model().to(dev), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs[step, mine].to(dev)), targets[step, mine].to(dev))
        loss.backward()
        optimizer.step()
    trained = [p.detach().cpu() for p in model.module.parameters()]

    reference = _trained_in_one_process(inputs, targets, steps)
    initial = [p.detach() for p in _ddp_model().parameters()]
    out = {
        "max_difference": max((a - b).abs().max().item() for a, b in zip(trained, reference.parameters())),
        "moved": min((a - b).abs().max().item() for a, b in zip(trained, initial)),
        "devices": sorted({str(p.device) for p in model.module.parameters()}),
    }
    dist.destroy_process_group()
    return out


def _trained_in_one_process(inputs, targets, steps: int):
    """The reference: the same model and optimizer on the CPU, one process,
    the ranks' batches concatenated."""
    reference = _ddp_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(inputs[step]), targets[step]).backward()
        optimizer.step()
    return reference


def fsdp(rank: int, steps: int) -> dict:
    """fully_shard on openreg:<rank> against one process on the concatenated batch."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dev = torch.device("openreg", rank)
    dist.init_process_group(rank=rank, world_size=WORLD_SIZE)
    inputs, targets = _ddp_data(steps)
    per_rank = inputs.shape[1] // WORLD_SIZE
    mine = slice(rank * per_rank, (rank + 1) * per_rank)

    model = _ddp_model().to(dev)
    fully_shard(model[0])
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[step, mine].to(dev)), targets[step, mine].to(dev)).backward()
        optimizer.step()
    trained = [p.full_tensor().detach().cpu() for p in model.parameters()]
    shard_devices = sorted({str(p.to_local().device) for p in model.parameters()})

    reference = _trained_in_one_process(inputs, targets, steps)
    out = {
        "max_difference": max((a - b).abs().max().item() for a, b in zip(trained, reference.parameters())),
        "devices": shard_devices,
    }
    dist.destroy_process_group()
    return out
