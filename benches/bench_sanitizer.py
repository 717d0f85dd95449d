"""What the stream sanitizer costs, on and off, in one run.

  python3 benches/bench_sanitizer.py

Targets:
  (a) an MLP training step (3 x (Linear(256, 256) + ReLU), batch 64,
      cross-entropy, SGD: forward, backward, step) on openreg with the
      sanitizer on ("warn" mode, torch.openreg.sanitizer.enable("warn")) is
      <= 3x the same step with it off (batches of the two interleaved,
      medians), and the sanitizer makes no report during it (the step is
      correct);
  (c) a 1K-element add with the sanitizer off is within bench_tensors.py's
      target for it (<= 1.5x the CPU add): off, the sanitizer costs a launch
      one flag test (timed before the sanitizer is first turned on).
Reported beside them, informational: (b) the same step with the sanitizer
off against the CPU step (target <= 3x).
CPU baselines are timed first, before any openreg work (benches/timing.py).
Takes well under a minute.
"""

import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_openreg  # noqa: F401
from timing import DEV, median_seconds

ON_TARGET = 3.0  # (a) sanitizer on / off
STEP_CPU_TARGET = 3.0  # (b) informational
ADD_TARGET = 1.5  # (c) sanitizer off / CPU, as bench_tensors.py's "add, 1K float32"
BATCHES = 9
STEP_REPEAT = 20
ADD_REPEAT = 2000


def mlp_step(device):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).to(device), torch.randint(0, 256, (64,)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def add_1k(device):
    a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
    return lambda: a + b


def _batch(fn, repeat):
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.openreg.synchronize()
    return (time.perf_counter() - t0) / repeat


def off_and_on(san):
    """Medians of the per-step times of the openreg MLP step with the
    sanitizer off and on ("warn"), batches interleaved; and the number of
    reports made while it was on."""
    off_step = mlp_step(DEV)
    with san.enable("warn"):
        san.clear()
        on_step = mlp_step(DEV)  # its model and data are allocated with the sanitizer on
        on_step()
    off_step()
    torch.openreg.synchronize()
    off_times, on_times = [], []
    for _ in range(BATCHES):
        off_times.append(_batch(off_step, STEP_REPEAT))
        with san.enable("warn"):
            on_times.append(_batch(on_step, STEP_REPEAT))
    return statistics.median(off_times), statistics.median(on_times), san.report_count()


def verdict(met):
    return "met" if met else "MISSED"


def main() -> None:
    # --- CPU baselines, before any openreg work.
    cpu_step = median_seconds(mlp_step("cpu"), STEP_REPEAT)
    cpu_add = median_seconds(add_1k("cpu"), ADD_REPEAT)

    san = torch.openreg.sanitizer
    if san.is_enabled():
        print(f"note: the sanitizer started on ({san.mode()!r}, OPENREG_SANITIZER); turned off for the 'off' figures")
        san.disable()

    # --- (c) before the sanitizer is ever turned on in this process.
    add_off = median_seconds(add_1k(DEV), ADD_REPEAT, device=DEV)

    # --- (a) and (b).
    step_off, step_on, reports = off_and_on(san)

    on_ratio, step_cpu_ratio, add_ratio = step_on / step_off, step_off / cpu_step, add_off / cpu_add
    print("MLP train step (3 x (Linear(256, 256) + ReLU), batch 64, cross-entropy, SGD):")
    print(f"  CPU (plain PyTorch)        {cpu_step * 1e3:8.3f} ms")
    print(f"  openreg, sanitizer off     {step_off * 1e3:8.3f} ms")
    print(f"  openreg, sanitizer on      {step_on * 1e3:8.3f} ms  (\"warn\" mode)")
    print(f"  (a) sanitizer on vs off: {on_ratio:.2f}x (target <= {ON_TARGET:g}x) {verdict(on_ratio <= ON_TARGET)}")
    print(f"      reports during (a): {reports} (target 0: the step is correct) {verdict(reports == 0)}")
    print(
        f"  (b) sanitizer off vs CPU: {step_cpu_ratio:.2f}x (informational; target <= {STEP_CPU_TARGET:g}x) "
        f"{verdict(step_cpu_ratio <= STEP_CPU_TARGET)}"
    )
    print("add, 1K float32:")
    print(f"  CPU {cpu_add * 1e6:.2f} us; openreg, sanitizer off (never on yet) {add_off * 1e6:.2f} us")
    print(f"  (c) sanitizer off vs CPU: {add_ratio:.2f}x (target <= {ADD_TARGET:g}x) {verdict(add_ratio <= ADD_TARGET)}")
    results = [on_ratio <= ON_TARGET, reports == 0, add_ratio <= ADD_TARGET]
    met = sum(results)
    print(f"{met} of {len(results)} targets met" + ("" if met == len(results) else "; MISSED") + " ((b) is informational)")


if __name__ == "__main__":
    main()
