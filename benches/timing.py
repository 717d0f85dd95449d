"""The timing rule every Python benchmark here uses, so their figures compare.

CPU baselines are clean: every CPU case is made and timed before the
benchmark does any openreg work, since device work done earlier in a process
could slow the CPU work after it (Note [Kernel threads] in
cpp/device/device_memory.h; bench_models.py measures exactly that).
"""

import statistics
import time

import torch

DEV = "openreg:0"


def _batch_seconds(fn, repeat: int, sync) -> float:
    """Per-call time of `fn` over one batch of `repeat` calls, ending with
    `sync` (queued device work counts)."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeat


def median_seconds(fn, repeat: int, batches: int = 7, device: str = "cpu") -> float:
    """Median over batches of the per-call time of `fn` (after one warm-up
    call); on an openreg device each batch ends with a synchronize."""
    sync = torch.openreg.synchronize if device.startswith("openreg") else (lambda: None)
    fn()
    sync()
    return statistics.median(_batch_seconds(fn, repeat, sync) for _ in range(batches))


def cpu_then_device(cases, device: str = DEV) -> list[tuple[float, float]]:
    """`cases` is a list of `(make, repeat)`, where `make(device)` builds the
    work and returns the function to time. Times all CPU cases first, then
    all device cases; returns `(cpu_seconds, device_seconds)` per case."""
    cpu = [median_seconds(make("cpu"), repeat) for make, repeat in cases]
    dev = [median_seconds(make(device), repeat, device=device) for make, repeat in cases]
    return list(zip(cpu, dev))


def report(rows) -> int:
    """Prints `(name, device_s, cpu_s, ratio, limit, higher_is_better)` rows
    with their targets and whether each is met; returns the number missed."""
    missed = 0
    print(f"{'benchmark':48} {'openreg':>11} {'CPU':>11} {'ratio':>7}  target")
    for name, dev_s, cpu_s, ratio, limit, higher_is_better in rows:
        met = ratio >= limit if higher_is_better else ratio <= limit
        missed += not met
        target = f"{'>=' if higher_is_better else '<='} {limit}x"
        verdict = "met" if met else "MISSED"
        print(f"{name:48} {dev_s * 1e6:9.1f}us {cpu_s * 1e6:9.1f}us {ratio:6.2f}x  {target:9} {verdict}")
    print(f"{len(rows) - missed} of {len(rows)} targets met" + ("" if not missed else f"; {missed} MISSED"))
    return missed
