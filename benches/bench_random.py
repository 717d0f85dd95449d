"""Random number generation on openreg beside plain CPU PyTorch, in one run,
printed as ratios (openreg time / CPU time).

  python3 benches/bench_random.py

Targets (issue "Random numbers"): torch.randn(4_000_000) and
torch.rand(4_000_000) ≤ 1.0x CPU time, using every core; the cost of a
manual_seed call from Python (torch.openreg.manual_seed: device index,
_C._get_default_generator, Generator.manual_seed) is reported beside a CPU
torch.Generator's manual_seed.
"""

import torch
import torch_openreg  # noqa: F401
from timing import cpu_then_device

N = 4_000_000


def fill_case(fill, dtype):
    return lambda device: lambda: fill(N, device=device, dtype=dtype)


def seed_case(device):
    if device == "cpu":
        gen = torch.Generator()
        return lambda: gen.manual_seed(42)
    return lambda: torch.openreg.manual_seed(42)


def main() -> None:
    print(f"threads: torch {torch.get_num_threads()}, openreg kernel threads {torch.openreg.options()['OPENREG_KERNEL_THREADS']['value']} (0: all cores)")
    names, cases = [], []
    for name, fill in [("randn", torch.randn), ("rand", torch.rand)]:
        for dtype in (torch.float32, torch.float64):
            names.append(f"{name}({N:_}) {str(dtype)[6:]}")
            cases.append((fill_case(fill, dtype), 5))
    names.append("manual_seed")
    cases.append((seed_case, 2000))
    print(f"{'case':<28}{'openreg':>12}{'cpu':>12}{'ratio':>8}")
    for name, (cpu, dev) in zip(names, cpu_then_device(cases)):
        print(f"{name:<28}{dev * 1e6:>10.1f}us{cpu * 1e6:>10.1f}us{dev / cpu:>7.2f}x")


if __name__ == "__main__":
    main()
