"""Training steps and stream overlap on openreg beside plain CPU PyTorch, in
one run, printed as ratios with their targets (issue "One door for device
work"). CPU baselines are taken first, before any openreg work
(benches/timing.py); the same CPU work is timed again at the end, after the
device work, to show that openreg leaves CPU speed untouched.

  python3 benches/bench_models.py

Targets: add 1K ≤ 1.3x; MLP train step ≤ 1.2x; a small CNN (BatchNorm,
max-pool, log_softmax, NLL loss) train step ≤ 1.3x; a 2-layer
nn.TransformerEncoder (d_model 64) train step ≤ 1.3x; CPU speed after
openreg work ≥ 0.95x of before; two streams each running 20 ms of fallback
ops finish together in ≤ 1.3x the time of one.
"""

import json
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_openreg  # noqa: F401
from timing import DEV, cpu_then_device, median_seconds, report

ROUNDS = 5


def add_1k(device):
    a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
    return lambda: a + b


def train_step(model, x, y, loss_fn, set_to_none=True):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=set_to_none)
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def mlp(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    return train_step(model, x.to(device), y.to(device), F.cross_entropy)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def cnn(device):
    torch.manual_seed(0)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    return train_step(SmallCNN().to(device), x.to(device), y.to(device), F.nll_loss)


def transformer(device):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Flatten(), nn.Linear(16 * 64, 10)).to(device)
    x, y = torch.randn(16, 16, 64), torch.randint(0, 10, (16,))
    return train_step(model, x.to(device), y.to(device), F.cross_entropy)


def cpu_matmuls(device="cpu"):
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def work():
        for _ in range(200):
            a @ b

    return work


def fallback_work(stream, x, ops):
    with torch.openreg.stream(stream):
        for _ in range(ops):
            torch.cumsum(x, 0)


def overlap(ops_for_20ms: int):
    """Seconds for one stream's 20 ms of fallback ops, and for two streams'
    (each 20 ms) queued together."""
    x = torch.randn(1 << 20, device=DEV)
    s1, s2 = torch.Stream(device=DEV), torch.Stream(device=DEV)

    def one():
        fallback_work(s1, x, ops_for_20ms)
        s1.synchronize()

    def two():
        fallback_work(s1, x, ops_for_20ms)
        fallback_work(s2, x, ops_for_20ms)
        s1.synchronize()
        s2.synchronize()

    return median_seconds(one, 3, device=DEV), median_seconds(two, 3, device=DEV)


def calibrate_20ms() -> int:
    """How many fallback ops of `overlap` take about 20 ms on one stream."""
    x = torch.randn(1 << 20, device=DEV)
    s = torch.Stream(device=DEV)
    t0 = time.perf_counter()
    fallback_work(s, x, 10)
    s.synchronize()
    per_op = (time.perf_counter() - t0) / 10
    return max(1, round(0.020 / per_op))


NAMES = [
    ("add, 1K float32", 1.3, False),
    ("MLP 256-256-10 train step, batch 64", 1.2, False),
    ("CNN (conv, BatchNorm, max-pool, NLL) step, batch 32", 1.3, False),
    ("TransformerEncoder 2 layers, d_model 64, step", 1.3, False),
    ("CPU 200 matmuls 64x64 after openreg work (speed)", 0.95, True),
    ("two streams' cumsum(1M) work vs one stream's (time)", 1.3, False),
]


def one_round() -> list[tuple[float, float]]:
    """(openreg or 'after' seconds, CPU or 'before' seconds) per row of NAMES,
    in a process that has done no openreg work yet."""
    cpu_before = median_seconds(cpu_matmuls(), 10)
    times = cpu_then_device([(add_1k, 2000), (mlp, 50), (cnn, 10), (transformer, 10)])
    cpu_after = median_seconds(cpu_matmuls(), 10)
    one, two = overlap(calibrate_20ms())
    return [(dev, cpu) for cpu, dev in times] + [(cpu_after, cpu_before), (two, one)]


def main() -> None:
    if sys.argv[1:] == ["--one-round"]:
        print(json.dumps(one_round()))
        return
    # Each round in a fresh process: clean CPU baselines, and this machine's
    # per-process speed changes average out over the rounds.
    rounds = [
        json.loads(subprocess.run([sys.executable, __file__, "--one-round"], capture_output=True, text=True, check=True).stdout)
        for _ in range(ROUNDS)
    ]
    rows = []
    for i, (name, limit, higher_is_better) in enumerate(NAMES):
        ratios = [(cpu / dev if higher_is_better else dev / cpu) for dev, cpu in (r[i] for r in rounds)]
        middle = sorted(range(ROUNDS), key=lambda k: ratios[k])[ROUNDS // 2]
        dev, cpu = rounds[middle][i]
        rows.append((name, dev, cpu, ratios[middle], limit, higher_is_better))
    print(f"median of {ROUNDS} rounds, each in a fresh process")
    report(rows)


if __name__ == "__main__":
    main()
