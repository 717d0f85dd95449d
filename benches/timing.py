"""The timing rule every Python benchmark here uses, so their figures compare."""

import statistics
import time

import torch


def median_seconds(fn, repeat: int, batches: int = 7) -> float:
    """Median over batches of the per-call time of `fn`, each batch ending
    with a synchronize of the current openreg device (queued work counts)."""
    fn()
    torch.openreg.synchronize()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.openreg.synchronize()
        samples.append((time.perf_counter() - t0) / repeat)
    return statistics.median(samples)
