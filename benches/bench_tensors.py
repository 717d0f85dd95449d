"""Tensor work on openreg beside the same work on plain CPU PyTorch, in one
run, printed as ratios (openreg time / CPU time; bandwidth ratios are
openreg bandwidth / CPU bandwidth).

  python3 benches/bench_tensors.py

Targets (issue "Tensors on the device"): add 1K ≤ 1.5x, add 4M ≤ 1.1x,
H2D/D2H 64 MiB ≥ 0.7x of a CPU clone's bandwidth, 1 MiB alloc+free ≤ 1.5x,
MLP training step ≤ 1.5x.
"""

import torch
import torch_openreg  # noqa: F401
from timing import paired_medians

DEV = "openreg:0"


def bench_add(n: int, repeat: int):
    a_cpu, b_cpu = torch.randn(n), torch.randn(n)
    a_dev, b_dev = a_cpu.to(DEV), b_cpu.to(DEV)
    return paired_medians([lambda: a_dev + b_dev, lambda: a_cpu + b_cpu], repeat)


def bench_copies(nbytes: int, repeat: int):
    host = torch.randn(nbytes // 4)
    dev = host.to(DEV)
    out = torch.empty_like(host)
    return paired_medians([lambda: dev.copy_(host), lambda: out.copy_(dev), lambda: host.clone()], repeat)


def bench_alloc(nbytes: int, repeat: int):
    def dev_alloc():
        torch.empty(nbytes, dtype=torch.uint8, device=DEV)

    def cpu_alloc():
        torch.empty(nbytes, dtype=torch.uint8)

    return paired_medians([dev_alloc, cpu_alloc], repeat)


def bench_mlp_step(repeat: int):
    def setup(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(64, 256).to(device), torch.randint(0, 10, (64,)).to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    return paired_medians([setup(DEV), setup("cpu")], repeat)


def main() -> None:
    torch.set_num_threads(torch.get_num_threads())
    rows = []
    dev, cpu = bench_add(1024, 2000)
    rows.append(("add, 1K float32", dev, cpu, dev / cpu, "<= 1.5x"))
    dev, cpu = bench_add(4_000_000, 20)
    rows.append(("add, 4M float32", dev, cpu, dev / cpu, "<= 1.1x"))
    h2d, d2h, clone = bench_copies(64 << 20, 10)
    rows.append(("host->device copy, 64 MiB (vs CPU clone)", h2d, clone, clone / h2d, ">= 0.7x bw"))
    rows.append(("device->host copy, 64 MiB (vs CPU clone)", d2h, clone, clone / d2h, ">= 0.7x bw"))
    dev, cpu = bench_alloc(1 << 20, 2000)
    rows.append(("allocate+free 1 MiB (cache warm)", dev, cpu, dev / cpu, "<= 1.5x"))
    dev, cpu = bench_mlp_step(50)
    rows.append(("MLP 256-256-10 train step, batch 64", dev, cpu, dev / cpu, "<= 1.5x"))

    print(f"{'benchmark':44} {'openreg':>11} {'CPU':>11} {'ratio':>7}  target")
    for name, dev_s, cpu_s, ratio, target in rows:
        print(f"{name:44} {dev_s * 1e6:9.1f}us {cpu_s * 1e6:9.1f}us {ratio:6.2f}x  {target}")


if __name__ == "__main__":
    main()
