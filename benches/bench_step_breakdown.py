"""Where a training step's time goes, on openreg and on plain CPU PyTorch
(issue "Speed at the limit", item 2: the breakdown of a step).

  python3 benches/bench_step_breakdown.py            # 5 rounds
  python3 benches/bench_step_breakdown.py --rounds 9

Two tables, each the median of the rounds; a round is a fresh CPU process
followed by a fresh openreg process, so the two alternate and share the
machine's drifts:

1. Per step of the MLP, small CNN and transformer steps of run_all.py: the
   wall time, and the CPU time each kind of thread spent, read from the
   kernel's per-thread run time (/proc/self/task/*/schedstat, in ns): the
   host (the Python thread), openreg's stream workers (openreg-d*), its kernel
   pool (openreg-kernel-*) and any other (CPU PyTorch's OpenMP team). "cores"
   is their sum over the wall time: near the machine's core count, a step is
   limited by the work itself, not by waits, and can only get faster by
   doing less of it.
2. The host's time per call of the MLP step's ops queued behind a busy
   stream (what the Python thread pays for dispatch, planning and the
   hand-off, the device's work excluded), beside the same call's whole time
   on CPU (dispatch and compute).

A report, not a test: no targets (run_all.py checks those).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

STEPS = {"mlp": 50, "cnn": 10, "transformer": 10}


def thread_kind(name: str) -> str:
    if name.startswith("openreg-kernel"):
        return "kernel pool"
    if name.startswith("openreg-d"):
        return "stream workers"
    return "other"


def cpu_seconds_by_kind(host_tid: int) -> dict[str, float]:
    """CPU seconds so far of this process's live threads, by kind."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran_ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        kind = "host" if int(tid) == host_tid else thread_kind(name)
        out[kind] = out.get(kind, 0.0) + ran_ns / 1e9
    return out


def measure_step(model: str, device: str) -> dict[str, float]:
    """Microseconds per step: wall time and CPU time by kind of thread."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run_all
    import torch

    step = {"mlp": run_all._mlp, "cnn": run_all._benches()[1].cnn,
            "transformer": run_all._benches()[1].transformer}[model](device)
    sync = torch.openreg.synchronize if device == "openreg" else (lambda: None)
    calls = STEPS[model] * 4
    for _ in range(calls // 4):
        step()
    sync()
    host = threading.get_native_id()
    before, t0 = cpu_seconds_by_kind(host), time.perf_counter()
    for _ in range(calls):
        step()
    sync()
    wall, after = time.perf_counter() - t0, cpu_seconds_by_kind(host)
    row = {kind: (after[kind] - before.get(kind, 0.0)) / calls * 1e6 for kind in after}
    row["wall"] = wall / calls * 1e6
    return row


def measure_host_per_op(device: str) -> dict[str, float]:
    """Microseconds the host spends per call of each op (best of 5 batches);
    on openreg, queued behind a kernel that keeps the stream busy."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(64, 256, device=device)
    w = torch.randn(256, 256, device=device)
    b = torch.randn(256, device=device)
    y = torch.randint(0, 256, (64,), device=device)
    ops = {
        "addmm (Linear)": lambda: torch.addmm(b, x, w.t()),
        "mm (backward)": lambda: x.t() @ x,
        "relu": lambda: F.relu(x),
        "threshold_backward": lambda: torch.ops.aten.threshold_backward(x, x, 0.0),
        "sum(0) (bias grad)": lambda: x.sum(0),
        "log_softmax": lambda: F.log_softmax(x, 1),
        "nll_loss": lambda: F.nll_loss(x, y),
        "_foreach_add_ (SGD)": lambda: torch._foreach_add_([w, b], [w, b], alpha=0.0),
    }
    calls = 200
    out = {}
    for name, op in ops.items():
        for _ in range(20):
            op()
        best = float("inf")
        for _ in range(5):
            if device == "openreg":
                torch.openreg.synchronize()
                torch.openreg._sleep(50)  # the calls below only queue
            t0 = time.perf_counter()
            for _ in range(calls):
                op()
            best = min(best, (time.perf_counter() - t0) / calls)
        if device == "openreg":
            torch.openreg.synchronize()
        out[name] = best * 1e6
    return out


def child(what: str, device: str) -> None:
    import torch  # noqa: F401

    if device == "openreg":
        import torch_openreg  # noqa: F401
    if what == "ops":
        print(json.dumps(measure_host_per_op(device)))
    else:
        print(json.dumps(measure_step(what, device)))


def run_child(what: str, device: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", what, device],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for r in rows for k in r)  # first-seen order
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}


def alternated(what: str, rounds: int) -> dict[str, dict[str, float]]:
    """Per device, the medians of `what` over `rounds` rounds of a CPU child
    then an openreg child."""
    rows: dict[str, list[dict[str, float]]] = {"cpu": [], "openreg": []}
    for _ in range(rounds):
        for device, measured in rows.items():
            measured.append(run_child(what, device))
    return {device: medians(measured) for device, measured in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    kinds = ["host", "stream workers", "kernel pool", "other"]
    print(f"Per step, us (median of {args.rounds} rounds of a CPU then an openreg process)")
    print(f"{'step':12} {'device':8} {'wall':>8} " + " ".join(f"{k:>15}" for k in kinds) + f" {'cores':>6}")
    for model in STEPS:
        for device, m in alternated(model, args.rounds).items():
            busy = sum(m.get(k, 0.0) for k in kinds)
            print(f"{model:12} {device:8} {m['wall']:8.0f} "
                  + " ".join(f"{m.get(k, 0.0):15.0f}" for k in kinds) + f" {busy / m['wall']:6.2f}")
    print(f"\nHost time per call, us (median of {args.rounds} rounds; openreg: queued behind a busy stream)")
    per_device = alternated("ops", args.rounds)
    cpu, dev = per_device["cpu"], per_device["openreg"]
    print(f"{'op':22} {'CPU call':>9} {'openreg host':>13} {'ratio':>6}")
    for name in cpu:
        print(f"{name:22} {cpu[name]:9.2f} {dev[name]:13.2f} {dev[name] / cpu[name]:6.2f}")


if __name__ == "__main__":
    main()
