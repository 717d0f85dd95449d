"""PyTorch's front ends on openreg beside plain CPU PyTorch, in one run, as
ratios with their targets (issue "PyTorch's front ends on openreg"). The
CPU baselines run in a fresh child process of their own (this script with
--cpu-baseline), before any openreg work: compiled CPU code timed in the
process that then compiles and runs openreg code came out 2x slower or
faster from run to run, flipping the ratios.

  python3 benches/bench_frontends.py

Figures:
- an MLP train step (forward, backward, loss) compiled with the default
  Inductor backend: on openreg vs compiled on the CPU (target <= 1.2x), and
  compiled vs eager on openreg (reported, no target);
- the same MLP step under autocast (bfloat16): openreg autocast vs CPU
  autocast (target <= 1.3x, the eager MLP target of bench_models.py plus the
  cast overhead);
- a 2-layer nn.TransformerEncoder (d_model 64, 4 heads, batch 8x32) AdamW
  train step, whose attention runs the fused OVERRIDEABLE backend: openreg vs
  CPU (target <= 1.3x).
"""

import json
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_openreg  # noqa: F401
from timing import DEV, median_seconds, report

REPEAT = 50


def _model_and_data(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    return model.to(device), x.to(device), y.to(device)


def mlp_step(device, compiled=False, autocast=False):
    model, x, y = _model_and_data(device)
    device_type = torch.device(device).type

    def step():
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    fn = torch.compile(step) if compiled else step
    fn()  # compiles now, outside the timing
    return fn


def transformer_step(device):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 64).to(device)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return step


def cpu_baselines() -> dict[str, float]:
    """The CPU figures, measured in this process (the child's side)."""
    return {
        "compiled": median_seconds(mlp_step("cpu", compiled=True), REPEAT),
        "autocast": median_seconds(mlp_step("cpu", autocast=True), REPEAT),
        "transformer": median_seconds(transformer_step("cpu"), REPEAT),
    }


def cpu_baselines_in_child() -> dict[str, float]:
    child = subprocess.run(
        [sys.executable, __file__, "--cpu-baseline"], capture_output=True, text=True, check=True, timeout=900
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


def main():
    torch._inductor.config.fx_graph_cache = False  # time this install's code, not a cached one
    if "--cpu-baseline" in sys.argv:
        print(json.dumps(cpu_baselines()))
        return False
    cpu = cpu_baselines_in_child()
    cpu_compiled, cpu_autocast, cpu_transformer = cpu["compiled"], cpu["autocast"], cpu["transformer"]
    dev_compiled = median_seconds(mlp_step(DEV, compiled=True), REPEAT, device=DEV)
    dev_eager = median_seconds(mlp_step(DEV), REPEAT, device=DEV)
    dev_autocast = median_seconds(mlp_step(DEV, autocast=True), REPEAT, device=DEV)
    dev_transformer = median_seconds(transformer_step(DEV), REPEAT, device=DEV)
    rows = [
        ("MLP step, compiled: openreg vs CPU compiled", dev_compiled, cpu_compiled, dev_compiled / cpu_compiled, 1.2, False),
        ("MLP step, autocast bf16: openreg vs CPU autocast", dev_autocast, cpu_autocast, dev_autocast / cpu_autocast, 1.3, False),
        ("Transformer step (fused attention) vs CPU", dev_transformer, cpu_transformer, dev_transformer / cpu_transformer, 1.3, False),
    ]
    missed = report(rows)
    print(f"(openreg MLP step compiled {dev_compiled * 1e6:.1f}us vs eager {dev_eager * 1e6:.1f}us: "
          f"{dev_eager / dev_compiled:.2f}x faster compiled)")
    return missed


if __name__ == "__main__":
    raise SystemExit(main() and 1)
