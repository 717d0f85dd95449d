"""Note [Split kernels]: a large kernel runs as chunks on the kernel pool,
with boundaries that depend only on shapes, so its bits never depend on the
thread count (OPENREG_KERNEL_THREADS) or on whether it ran inline or queued;
and split kernels equal CPU."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

from _openreg_util import clean_env, script

DIGESTS = os.path.join(os.path.dirname(__file__), "..", "split_digests.py")
THREAD_COUNTS = ("1", "2", "4")


def _digest_script(threads: str):
    out = f"/tmp/openreg_split_digests_{os.getpid()}_{threads}.json"
    body = f"""
import runpy, sys
sys.path.insert(0, {os.path.dirname(DIGESTS)!r})
sys.argv = [{DIGESTS!r}, {out!r}]
try:
    runpy.run_path({DIGESTS!r}, run_name="__main__")
except SystemExit:
    pass
RESULT.update(json.load(open({out!r})))
os.remove({out!r})
done(RESULT)
"""
    # Chunks of 16 elements: op_db's samples are small, and must split too.
    env = clean_env(OPENREG_KERNEL_THREADS=threads, OPENREG_SPLIT_ELEMENTS="16")
    return script(f"split_digests_{threads}_threads", body, env=env, timeout=1500)


DIGEST_RUNS = {threads: _digest_script(threads) for threads in THREAD_COUNTS}


@pytest.mark.subprocess
def test_op_db_float32_bits_do_not_depend_on_threads_or_route():
    runs = {threads: run.result().check_ok() for threads, run in DIGEST_RUNS.items()}
    one = runs["1"]["digests"]
    assert len(one) > 500, "the sweep covered too few ops"
    for threads, data in runs.items():
        assert data["inline_differs"] == [], f"{threads} threads: inline and queued runs differ"
        differ = sorted(op for op, digest in data["digests"].items() if one.get(op) != digest)
        assert differ == [], f"{threads} threads: bits differ from 1 thread's"


_LARGE = """
import hashlib
import torch, torch_openreg
torch.manual_seed(0)
x = torch.randn(1024, 1024)
img = torch.randn(16, 3, 32, 32)
conv = torch.nn.Conv2d(3, 8, 3)
maps = torch.randn(32, 8, 28, 28)
bn_weight, bn_bias = torch.randn(8), torch.randn(8)
bn_probe = torch.randn(32, 8, 28, 28)  # the loss's weights: a well-conditioned gradient
# The small CNN's second pooling: 100K elements, split by its work (8 per element).
pool_maps = torch.randn(32, 16, 14, 14)
dev = lambda t: t.to("openreg")
outs = {}
def run(route):
    if route == "queued":
        torch.openreg._sleep(5)
    d = dev(x)
    outs[route + " add"] = d + d.T
    outs[route + " sin"] = d.sin()
    outs[route + " mm"] = d @ d
    # 64 rows, 256 columns: cut by columns, two chunks of 128 (Note [Matrix
    # chunks]), a bias cut alike where it spans them.
    outs[route + " mm 64 rows"] = d[:64, :256] @ d[:256, :256]
    outs[route + " addmm 64 rows"] = torch.addmm(d[0, :256], d[:64, :256], d[:256, :256])
    outs[route + " addmm 64 rows, bias 64x1"] = torch.addmm(d[:64, :1], d[:64, :256], d[:256, :256])
    outs[route + " softmax"] = d.softmax(-1)
    outs[route + " sum"] = d.sum(1)
    outs[route + " layer_norm"] = torch.nn.functional.layer_norm(d, (1024,))
    outs[route + " copy"] = d.T.contiguous()
    outs[route + " fill"] = torch.full((2048, 1024), 0.5, device="openreg")
    outs[route + " randn"] = torch.randn(1 << 20, device="openreg", generator=torch.Generator("openreg").manual_seed(3))
    c = conv.to("openreg")
    i = dev(img).requires_grad_()
    y = c(i)
    y.square().sum().backward()
    outs[route + " conv"] = y
    outs[route + " conv grad_input"] = i.grad
    outs[route + " conv grad_weight"] = c.weight.grad
    c.weight.grad = None
    mean, var = torch.zeros(8, device="openreg"), torch.ones(8, device="openreg")
    m, w, b = (dev(t).requires_grad_() for t in (maps, bn_weight, bn_bias))
    normalized = torch.nn.functional.batch_norm(m, mean, var, w, b, training=True)
    (normalized * dev(bn_probe)).sum().backward()
    outs[route + " batch_norm"] = normalized
    outs[route + " batch_norm running_mean"], outs[route + " batch_norm running_var"] = mean, var
    outs[route + " batch_norm grad_input"] = m.grad
    outs[route + " batch_norm grad_weight"], outs[route + " batch_norm grad_bias"] = w.grad, b.grad
    p = dev(pool_maps).requires_grad_()
    pooled, indices = torch.nn.functional.max_pool2d(p, 2, return_indices=True)
    pooled.square().sum().backward()
    outs[route + " max_pool2d"], outs[route + " max_pool2d indices"] = pooled, indices
    outs[route + " max_pool2d grad"] = p.grad
    # An in-place foreach op, cut between whole tensors (Note [List chunks]).
    params = [d[:300].clone(), d[0].clone(), d[300:700].clone(), d[1, :7].clone()]
    torch._foreach_addcdiv_(params, [t.sin() for t in params], [t.cos().abs() + 1 for t in params], [0.1, -0.2, 0.3, 0.5])
    outs[route + " foreach"] = torch.cat([t.flatten() for t in params])
    torch.openreg.synchronize()
run("inline")
run("queued")
RESULT["digests"] = {k: hashlib.sha256(v.detach().cpu().numpy().tobytes()).hexdigest() for k, v in outs.items()}
torch.save({k: v.detach().cpu() for k, v in outs.items() if k.startswith("queued")}, os.environ["OUT"])
done(RESULT)
"""


def _large_script(threads: str):
    out = f"/tmp/openreg_split_large_{os.getpid()}_{threads}.pt"
    return out, script(f"split_large_{threads}_threads", _LARGE, env=clean_env(OPENREG_KERNEL_THREADS=threads, OUT=out))


LARGE_RUNS = {threads: _large_script(threads) for threads in THREAD_COUNTS}


@pytest.mark.subprocess
def test_large_kernels_split_with_the_same_bits_at_every_thread_count():
    digests = {threads: run.result().check_ok()["digests"] for threads, (_, run) in LARGE_RUNS.items()}
    for threads, got in digests.items():
        for name, digest in got.items():
            route, op = name.split(" ", 1)
            assert digest == got[f"queued {op}"], f"{threads} threads: {op} inline differs from queued"
            assert digest == digests["1"][name], f"{op}: {threads} threads differ from 1"


@pytest.mark.subprocess
def test_large_split_kernels_equal_cpu():
    path, run = LARGE_RUNS["2"]
    run.result().check_ok()
    got = torch.load(path)
    os.remove(path)
    torch.manual_seed(0)
    x = torch.randn(1024, 1024)
    img = torch.randn(16, 3, 32, 32)
    conv = torch.nn.Conv2d(3, 8, 3)
    maps = torch.randn(32, 8, 28, 28).requires_grad_()
    bn_weight, bn_bias = torch.randn(8).requires_grad_(), torch.randn(8).requires_grad_()
    bn_probe = torch.randn(32, 8, 28, 28)
    p = torch.randn(32, 16, 14, 14).requires_grad_()
    pooled, indices = F.max_pool2d(p, 2, return_indices=True)
    pooled.square().sum().backward()
    mean, var = torch.zeros(8), torch.ones(8)
    normalized = F.batch_norm(maps, mean, var, bn_weight, bn_bias, training=True)
    (normalized * bn_probe).sum().backward()
    i = img.clone().requires_grad_()
    y = conv(i)
    y.square().sum().backward()
    params = [x[:300].clone(), x[0].clone(), x[300:700].clone(), x[1, :7].clone()]
    torch._foreach_addcdiv_(params, [t.sin() for t in params], [t.cos().abs() + 1 for t in params], [0.1, -0.2, 0.3, 0.5])
    want = {
        "add": x + x.T, "sin": x.sin(), "mm": x @ x, "mm 64 rows": x[:64, :256] @ x[:256, :256],
        "addmm 64 rows": torch.addmm(x[0, :256], x[:64, :256], x[:256, :256]),
        "addmm 64 rows, bias 64x1": torch.addmm(x[:64, :1], x[:64, :256], x[:256, :256]), "softmax": x.softmax(-1), "sum": x.sum(1),
        "layer_norm": F.layer_norm(x, (1024,)), "copy": x.T.contiguous(), "fill": torch.full((2048, 1024), 0.5),
        "conv": y, "conv grad_input": i.grad, "conv grad_weight": conv.weight.grad,
        "batch_norm": normalized, "batch_norm running_mean": mean, "batch_norm running_var": var,
        "batch_norm grad_input": maps.grad, "batch_norm grad_weight": bn_weight.grad, "batch_norm grad_bias": bn_bias.grad,
        "max_pool2d": pooled, "max_pool2d indices": indices, "max_pool2d grad": p.grad,
        "foreach": torch.cat([t.flatten() for t in params]),
    }
    for op, value in want.items():
        # Sums (the weight gradient, thousands) round in another order than
        # CPU's two threads: tolerances scale with the values.
        scale = value.abs().max().item()
        torch.testing.assert_close(
            got[f"queued {op}"], value.detach(), rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{op}: {m}"
        )
    assert got["queued randn"].shape == (1 << 20,)


def test_a_failing_chunk_fails_its_kernel_once():
    # remainder of integers by zero raises in the CPU kernel: here in the
    # last of the split kernel's chunks, a check of contents. Once the
    # call's plan is trusted (the first call of these shapes waits for its
    # kernel: Note [Errors at the call]), the kernel is queued and fails
    # (every chunk has finished), the next synchronizing call reports it,
    # naming the op, and the device goes on.
    n = 1 << 20
    divisor = torch.ones(n, dtype=torch.int64)
    divisor[-1] = 0
    a = torch.arange(n, device="openreg")
    d = divisor.to("openreg")
    torch.remainder(a, d + 1)
    torch.openreg._sleep(5)
    torch.remainder(a, d)
    with pytest.raises(RuntimeError, match='kernel "aten::remainder" .*ZeroDivisionError'):
        torch.openreg.synchronize()
    torch.testing.assert_close(torch.remainder(a, d + 1).cpu(), torch.remainder(a.cpu(), divisor + 1))
