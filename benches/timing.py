"""The timing rule every Python benchmark here uses, so their figures compare."""

import statistics
import time

import torch


def _batch_seconds(fn, repeat: int) -> float:
    """Per-call time of `fn` over one batch of `repeat` calls, ending with a
    synchronize of the current openreg device (queued work counts)."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.openreg.synchronize()
    return (time.perf_counter() - t0) / repeat


def median_seconds(fn, repeat: int, batches: int = 7) -> float:
    """Median over batches of the per-call time of `fn`."""
    return paired_medians([fn], repeat, batches)[0]


def paired_medians(fns, repeat: int, batches: int = 7) -> list[float]:
    """Median over batches of the per-call time of each of `fns`, their
    batches interleaved (one of each, then the next of each...): a change in
    the machine's load during the run affects all of them alike, so their
    ratios hold even on a shared, noisy machine."""
    for fn in fns:
        fn()
    torch.openreg.synchronize()
    samples = [[] for _ in fns]
    for _ in range(batches):
        for fn, times in zip(fns, samples):
            times.append(_batch_seconds(fn, repeat))
    return [statistics.median(times) for times in samples]
