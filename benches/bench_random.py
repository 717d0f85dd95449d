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
from timing import paired_medians

DEV = "openreg:0"
N = 4_000_000


def main() -> None:
    print(f"threads: torch {torch.get_num_threads()}, openreg options {torch.openreg.options()['OPENREG_RANDOM_THREADS']['value']} (0: all cores)")
    rows = []
    for name, make in [("randn", torch.randn), ("rand", torch.rand)]:
        for dtype in (torch.float32, torch.float64):
            dev, cpu = paired_medians([lambda: make(N, device=DEV, dtype=dtype), lambda: make(N, dtype=dtype)], 5)
            rows.append((f"{name}({N:_}) {str(dtype)[6:]}", dev, cpu))
    gen_cpu = torch.Generator()
    dev, cpu = paired_medians([lambda: torch.openreg.manual_seed(42), lambda: gen_cpu.manual_seed(42)], 2000)
    rows.append(("manual_seed", dev, cpu))
    print(f"{'case':<28}{'openreg':>12}{'cpu':>12}{'ratio':>8}")
    for name, dev, cpu in rows:
        print(f"{name:<28}{dev * 1e6:>10.1f}us{cpu * 1e6:>10.1f}us{dev / cpu:>7.2f}x")


if __name__ == "__main__":
    main()
