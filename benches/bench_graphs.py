"""Graph capture and replay on openreg beside the same work issued eagerly,
on openreg and on plain CPU PyTorch, in one run (issue 10, "Graph capture
and replay").

  python3 benches/bench_graphs.py

Target: replaying a graph of 200 small elementwise ops (1K float32
tensors) is >= 10x faster than issuing the same 200 ops eagerly from Python
on openreg (eager and replay batches interleaved, medians).
Target (issue 12, "reduce-overhead"): a 200-op model compiled with
torch.compile(backend="openreg_graphs") runs >= 5x faster than the same
model eagerly on openreg (inference, 1K-element tensors, medians of
interleaved batches).
Reported beside them, without targets: replay against the same 200 ops eager
on CPU tensors; the replay overhead per recorded node (a 200-node graph on
1-element tensors, replay time / 200); the capture time of a small MLP
training step (3 x Linear(256, 256), batch 64, SGD), beside its eager step
time on openreg and on the CPU, and its replay time.
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

OPS = 200
N = 1024
TARGET = 10.0
COMPILED_TARGET = 5.0
BATCHES = 9
EAGER_REPEAT = 10  # iterations of the 200 ops per eager batch
REPLAY_REPEAT = 100  # replays per replay batch
CAPTURES = 5


def elementwise_ops(x):
    """200 in-place elementwise ops; x*1.0001 - 0.0001 keeps 1.0 at 1.0, so
    values stay bounded however often they run."""
    for _ in range(OPS // 2):
        x.mul_(1.0001)
        x.add_(-0.0001)


def _batch(fn, repeat):
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.openreg.synchronize()
    return (time.perf_counter() - t0) / repeat


def interleaved(eager, replay):
    """Medians of per-call times over alternating eager and replay batches,
    each batch ending with a device synchronize."""
    eager()
    replay()
    torch.openreg.synchronize()
    eager_times, replay_times = [], []
    for _ in range(BATCHES):
        eager_times.append(_batch(eager, EAGER_REPEAT))
        replay_times.append(_batch(replay, REPLAY_REPEAT))
    return statistics.median(eager_times), statistics.median(replay_times)


def capture(fn, stream):
    """A graph of `fn()` captured on `stream` (after one eager warm-up)."""
    fn()
    torch.openreg.synchronize()
    g = torch.accelerator.Graph()
    with stream, g:
        fn()
    return g


def mlp_step(device):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).to(device), torch.randint(0, 256, (64,)).to(device)

    def body():
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def step():
        opt.zero_grad(set_to_none=True)
        body()

    return opt, body, step


def mlp_capture(stream):
    """Median capture time of the openreg MLP step over CAPTURES captures,
    its eager step time, and the last graph's replay time."""
    opt, body, step = mlp_step(DEV)
    eager = median_seconds(step, 20, device=DEV)
    # Warm-up on a side stream, as CUDA's docs do before capturing a network.
    stream.wait_stream(torch.accelerator.current_stream())
    with stream:
        for _ in range(3):
            step()
    torch.accelerator.current_stream().wait_stream(stream)
    times = []
    g = None
    for _ in range(CAPTURES):
        # Drops the last graph's grads (its pool is then freed by reset);
        # backward allocates new ones from the new graph's pool.
        opt.zero_grad(set_to_none=True)
        if g is not None:
            g.reset()
        g = torch.accelerator.Graph()
        t0 = time.perf_counter()
        with stream, g:
            body()
        times.append(time.perf_counter() - t0)
    replay = median_seconds(g.replay, 20, device=DEV)
    return statistics.median(times), eager, replay


class ElementwiseModel(nn.Module):
    """200 elementwise ops: 100 times x * w_i + b_i on 1K-element tensors."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = nn.ParameterList(nn.Parameter(1 + 0.001 * torch.randn(N, generator=g)) for _ in range(OPS // 2))
        self.b = nn.ParameterList(nn.Parameter(0.001 * torch.randn(N, generator=g)) for _ in range(OPS // 2))

    def forward(self, x):
        for w, b in zip(self.w, self.b):
            x = x * w + b
        return x


def compiled_model():
    """Eager vs torch.compile(backend="openreg_graphs") of ElementwiseModel on
    openreg, inference, interleaved medians; and whether they agree exactly."""
    model = ElementwiseModel().to(DEV)
    compiled = torch.compile(model, backend="openreg_graphs")
    x = torch.rand(N, generator=torch.Generator().manual_seed(2)).to(DEV)
    with torch.no_grad():
        for _ in range(3):  # compile, warm up, capture
            compiled(x)
        same = torch.equal(compiled(x).cpu(), model(x).cpu())
        eager, graphed = interleaved(lambda: model(x), lambda: compiled(x))
    return eager, graphed, same


def verdict(met):
    return "ok" if met else "MISSED"


def main() -> None:
    # --- CPU baselines, before any openreg work.
    x_cpu = torch.ones(N)
    cpu_ops = median_seconds(lambda: elementwise_ops(x_cpu), EAGER_REPEAT)
    _, _, cpu_step = mlp_step("cpu")
    cpu_mlp = median_seconds(cpu_step, 20)

    # --- openreg: 200 ops on 1K float32, eager vs replay, interleaved.
    stream = torch.Stream(device=DEV)
    start = torch.rand(N, generator=torch.Generator().manual_seed(0)) + 0.5
    x_eager, x_graph = start.to(DEV), start.to(DEV)
    g = capture(lambda: elementwise_ops(x_graph), stream)
    x_eager.copy_(start)
    x_graph.copy_(start)
    elementwise_ops(x_eager)
    g.replay()
    same = torch.equal(x_eager.cpu(), x_graph.cpu())
    eager, replay = interleaved(lambda: elementwise_ops(x_eager), g.replay)

    # --- overhead per node: 200 ops on 1-element tensors.
    x1_eager, x1_graph = torch.ones(1, device=DEV), torch.ones(1, device=DEV)
    g1 = capture(lambda: elementwise_ops(x1_graph), stream)
    eager1, replay1 = interleaved(lambda: elementwise_ops(x1_eager), g1.replay)

    # --- MLP training step capture.
    capture_s, eager_mlp, replay_mlp = mlp_capture(stream)

    # --- torch.compile(backend="openreg_graphs") of a 200-op model.
    model_eager, model_graphed, model_same = compiled_model()

    speedup = eager / replay
    print(f"{OPS} elementwise ops on {N} float32 (per iteration of all {OPS}):")
    print(f"  CPU eager (plain PyTorch)  {cpu_ops * 1e6:10.1f} us")
    print(f"  openreg eager              {eager * 1e6:10.1f} us   ({eager / cpu_ops:.2f}x the CPU time)")
    print(f"  openreg graph replay       {replay * 1e6:10.1f} us")
    print(f"  replay vs eager: {speedup:.1f}x faster (target >= {TARGET:g}x) {verdict(speedup >= TARGET)}")
    print(f"  replay vs CPU eager: {cpu_ops / replay:.2f}x faster (no target)")
    print(f"  replay result bit-identical to eager: {'yes' if same else 'NO'}")
    print(
        f"replay overhead per node ({OPS} nodes on 1-element tensors): {replay1 / OPS * 1e9:.0f} ns "
        f"(no target; eager per op {eager1 / OPS * 1e9:.0f} ns)"
    )
    print("MLP train step (3 x Linear(256, 256), batch 64, SGD):")
    print(f"  capture: {capture_s * 1e3:.2f} ms (median of {CAPTURES}, incl. Graph.__enter__'s synchronize and empty_cache; no target)")
    print(f"  eager step: openreg {eager_mlp * 1e3:.2f} ms, CPU {cpu_mlp * 1e3:.2f} ms; capture = {capture_s / eager_mlp:.1f} eager steps")
    print(f"  replay: {replay_mlp * 1e3:.2f} ms ({eager_mlp / replay_mlp:.2f}x faster than eager openreg, {cpu_mlp / replay_mlp:.2f}x than CPU; no target)")
    compiled_speedup = model_eager / model_graphed
    print(f'{OPS}-op model (100 x "x * w + b", 1K float32), inference:')
    print(f"  eager openreg {model_eager * 1e6:.1f} us; torch.compile(backend=\"openreg_graphs\") {model_graphed * 1e6:.1f} us")
    print(f"  compiled vs eager: {compiled_speedup:.1f}x faster (target >= {COMPILED_TARGET:g}x) {verdict(compiled_speedup >= COMPILED_TARGET)}")
    print(f"  compiled result bit-identical to eager: {'yes' if model_same else 'NO'}")
    results = [speedup >= TARGET and same, compiled_speedup >= COMPILED_TARGET and model_same]
    met = sum(results)
    print(f"{met} of {len(results)} targets met" + ("" if met == len(results) else "; MISSED"))


if __name__ == "__main__":
    main()
