"""Tensor work on openreg beside the same work on plain CPU PyTorch, in one
run, printed as ratios (openreg time / CPU time; bandwidth ratios are
openreg bandwidth / CPU bandwidth). CPU baselines first (benches/timing.py).

  python3 benches/bench_tensors.py

Targets (issue "Tensors on the device"): add 1K ≤ 1.5x, add 4M ≤ 1.1x,
H2D/D2H 64 MiB ≥ 0.7x of a CPU clone's bandwidth, 1 MiB alloc+free ≤ 1.5x.
The training steps are in bench_models.py.
"""

import torch
import torch_openreg  # noqa: F401
from timing import DEV, cpu_then_device, median_seconds, report


def add(n: int):
    def make(device):
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        return lambda: a + b

    return make


def alloc(nbytes: int):
    def make(device):
        return lambda: torch.empty(nbytes, dtype=torch.uint8, device=device)

    return make


def main() -> None:
    (add_1k, add_4m, allocs) = cpu_then_device([(add(1024), 2000), (add(4_000_000), 20), (alloc(1 << 20), 2000)])
    host = torch.randn((64 << 20) // 4)
    clone = median_seconds(host.clone, 10)  # CPU work, before the copies below
    dev = host.to(DEV)
    out = torch.empty_like(host)
    h2d = median_seconds(lambda: dev.copy_(host), 10, device=DEV)
    d2h = median_seconds(lambda: out.copy_(dev), 10, device=DEV)
    rows = [
        ("add, 1K float32", add_1k[1], add_1k[0], add_1k[1] / add_1k[0], 1.5, False),
        ("add, 4M float32", add_4m[1], add_4m[0], add_4m[1] / add_4m[0], 1.1, False),
        ("host->device copy, 64 MiB (vs CPU clone, bw)", h2d, clone, clone / h2d, 0.7, True),
        ("device->host copy, 64 MiB (vs CPU clone, bw)", d2h, clone, clone / d2h, 0.7, True),
        ("allocate+free 1 MiB (cache warm)", allocs[1], allocs[0], allocs[1] / allocs[0], 1.5, False),
    ]
    report(rows)


if __name__ == "__main__":
    main()
