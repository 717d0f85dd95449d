"""Compute on openreg tensors: every ATen op without an openreg kernel runs
PyTorch's CPU kernel on zero-copy CPU views of device memory, in stream order
(Note [Fallback]). Results are checked against the same op on the CPU."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from _openreg_util import clean_env, new_stream, script

DEV = "openreg:1"  # not the current device: results must follow the inputs

# OPENREG_LAUNCH_BLOCKING=1: every launch returns only once it has run.
LAUNCH_BLOCKING = script(
    "launch_blocking",
    """
    import torch, torch_openreg
    R = RESULT
    R["option"] = torch.openreg.options()["OPENREG_LAUNCH_BLOCKING"]["value"]
    side = torch.Stream(device="openreg:0")
    t0 = time.perf_counter()
    with torch.openreg.stream(side):
        torch.openreg._sleep(300)
    R["sleep_s"] = time.perf_counter() - t0
    R["idle_after_sleep"] = side.query()
    big = torch.empty(1 << 22, device="openreg:1")   # too big to run inline: queued
    big.fill_(2.0)
    R["idle_after_fill"] = torch.openreg.current_stream(1).query()
    src = torch.arange(8.0, device="openreg:0")
    dst = torch.zeros(8).pin_memory()
    with torch.openreg.stream(side):
        torch.openreg._sleep(100)
        dst.copy_(src, non_blocking=True)
        R["pinned_right_after_copy"] = dst.tolist()
    R["sum"] = big.sum().item()
    done(RESULT)
    """,
    env=clean_env(OPENREG_LAUNCH_BLOCKING="1"),
)


def _inputs():
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(4, 5, generator=g)
    return {
        "a": a,
        "b": torch.randn(4, 5, generator=g),
        "pos": torch.rand(4, 5, generator=g) + 0.5,
        "m": torch.randn(5, 3, generator=g),
        "v": torch.randn(5, generator=g),
        "b1": torch.randn(2, 4, 5, generator=g),
        "b2": torch.randn(2, 5, 3, generator=g),
        "ints": torch.randint(-10, 10, (4, 5), generator=g),
        "idx": torch.tensor([3, 0, 2]),
        "col_idx": torch.randint(0, 5, (4, 2), generator=g),
        "mask": a > 0,
        "img": torch.randn(2, 3, 6, 6, generator=g),
        "labels": torch.tensor([1, 0, 4, 2]),
        "dup": torch.tensor([3, 1, 3, 0, 1, 7, 0]),
        "sq": torch.randn(4, 4, generator=g) + 4 * torch.eye(4),
    }


CASES = {
    # elementwise
    "add": lambda t: t["a"] + t["b"],
    "add_alpha": lambda t: torch.add(t["a"], t["b"], alpha=-2.5),
    "sub_scalar": lambda t: t["a"] - 3,
    "mul": lambda t: t["a"] * t["b"],
    "div": lambda t: t["a"] / t["pos"],
    "floor_divide": lambda t: t["ints"] // 3,
    "remainder": lambda t: t["ints"] % 4,
    "pow": lambda t: t["pos"] ** 1.7,
    "exp_log": lambda t: torch.log(t["pos"]) + torch.exp(t["a"]),
    "trig": lambda t: torch.sin(t["a"]) * torch.cos(t["b"]) + torch.atan2(t["a"], t["b"]),
    "sqrt_rsqrt": lambda t: torch.sqrt(t["pos"]) - torch.rsqrt(t["pos"]),
    "sigmoid_tanh": lambda t: torch.sigmoid(t["a"]) + torch.tanh(t["b"]),
    "relu_gelu": lambda t: F.relu(t["a"]) + F.gelu(t["b"]),
    "abs_neg_sign": lambda t: (-t["a"]).abs() * torch.sign(t["b"]),
    "clamp": lambda t: torch.clamp(t["a"], -0.5, 0.5),
    "lerp": lambda t: torch.lerp(t["a"], t["b"], 0.3),
    "int_ops": lambda t: (t["ints"] * 3 + 1) & 0xF,
    "type_promotion": lambda t: t["ints"] + t["a"],
    "to_dtype": lambda t: (t["a"] * 10).to(torch.int32),
    "to_float64": lambda t: t["a"].double() * 1.5,
    "half": lambda t: t["a"].half() + 1,
    "bfloat16": lambda t: t["a"].bfloat16() * 2,
    "complex": lambda t: torch.complex(t["a"], t["b"]) * (1 + 2j),
    "cpu_scalar_tensor": lambda t: t["a"] * torch.tensor(2.5),
    "comparisons": lambda t: (t["a"] > t["b"]) | (t["a"] == 0),
    "logical": lambda t: torch.logical_xor(t["mask"], t["b"] > 0),
    "isnan": lambda t: torch.isnan(t["a"] / t["a"].abs().clamp(max=0)),
    "where": lambda t: torch.where(t["mask"], t["a"], t["b"]),
    "where_scalar": lambda t: torch.where(t["a"] > 0, t["a"], 0.0),
    "masked_fill": lambda t: t["a"].masked_fill(t["mask"], -1.0),
    # reductions
    "sum": lambda t: t["a"].sum(),
    "sum_dim": lambda t: t["a"].sum(dim=1, keepdim=True),
    "mean_std_var": lambda t: torch.stack([t["a"].mean(), t["a"].std(), t["b"].var(dim=0).sum()]),
    "prod": lambda t: t["pos"].prod(dim=0),
    "max_min": lambda t: (t["a"].max(), t["a"].min(dim=1)),
    "argmax_argmin": lambda t: (t["a"].argmax(), t["a"].argmin(dim=0)),
    "any_all": lambda t: (t["mask"].any(), t["mask"].all(dim=1)),
    "cumsum_cumprod": lambda t: (t["a"].cumsum(dim=1), t["pos"].cumprod(dim=0)),
    "logsumexp": lambda t: torch.logsumexp(t["a"], dim=1),
    "norm": lambda t: (torch.linalg.vector_norm(t["a"]), t["a"].norm(dim=0)),
    "count_nonzero": lambda t: torch.count_nonzero(t["ints"]),
    # linear algebra
    "matmul": lambda t: t["a"] @ t["m"],
    "mv": lambda t: t["a"] @ t["v"],
    "mm": lambda t: torch.mm(t["a"].t(), t["b"]),
    "bmm": lambda t: torch.bmm(t["b1"], t["b2"]),
    "batched_matmul": lambda t: t["b1"] @ t["m"],
    "addmm": lambda t: torch.addmm(t["v"][:3], t["a"], t["m"], beta=0.5, alpha=2.0),
    "einsum": lambda t: torch.einsum("bij,bjk->bik", t["b1"], t["b2"]),
    "dot_outer": lambda t: (torch.dot(t["v"], t["v"]), torch.outer(t["v"], t["v"][:3])),
    "linalg_solve": lambda t: torch.linalg.solve(t["sq"], t["a"]),
    "inverse": lambda t: torch.linalg.inv(t["sq"]),
    # indexing
    "index_cpu_indices": lambda t: t["a"][t["idx"].cpu()],
    "index_device_indices": lambda t: t["a"][t["idx"]],
    "index_2d": lambda t: t["a"][t["idx"], t["idx"]],
    "index_mask": lambda t: t["a"][t["mask"]],
    "index_cpu_mask": lambda t: t["a"][t["mask"].cpu()],
    "index_select": lambda t: torch.index_select(t["a"], 1, t["idx"]),
    "gather": lambda t: torch.gather(t["a"], 1, t["col_idx"]),
    "scatter_add": lambda t: torch.zeros(4, 5, device=t["a"].device).scatter_add(1, t["col_idx"], t["a"][:, :2]),
    "masked_select": lambda t: torch.masked_select(t["a"], t["mask"]),
    "nonzero": lambda t: torch.nonzero(t["ints"] > 3),
    "take": lambda t: torch.take(t["a"], t["idx"]),
    "slice_step": lambda t: t["a"][::2, 1::2],
    "negative_index": lambda t: t["a"][-1, -2],
    # shapes and joins
    "cat": lambda t: torch.cat([t["a"], t["b"], t["pos"]], dim=0),
    "cat_dim1": lambda t: torch.cat([t["a"], t["b"]], dim=1),
    "stack": lambda t: torch.stack([t["a"], t["b"]], dim=1),
    "split": lambda t: torch.split(t["a"], [1, 3], dim=0),
    "chunk": lambda t: t["a"].chunk(2, dim=1),
    "unbind": lambda t: t["a"].unbind(1),
    "flip_roll": lambda t: (t["a"].flip(0), t["a"].roll(2, dims=1)),
    "repeat": lambda t: t["a"].repeat(2, 3),
    "repeat_interleave": lambda t: t["v"].repeat_interleave(3),
    "expand_contiguous": lambda t: t["v"].expand(3, 5).contiguous(),
    "permute_contiguous": lambda t: t["b1"].permute(2, 0, 1).contiguous(),
    "tril_triu": lambda t: (t["a"].tril(), t["a"].triu(1)),
    "diag": lambda t: (torch.diag(t["v"]), t["sq"].diagonal().sum()),
    "pad": lambda t: F.pad(t["a"], (1, 2, 0, 1), value=3.0),
    "meshgrid": lambda t: torch.meshgrid(t["v"], t["v"][:3], indexing="ij"),
    # sorting
    "sort": lambda t: torch.sort(t["a"], dim=1, descending=True),
    "argsort": lambda t: torch.argsort(t["b"], dim=0),
    "topk": lambda t: torch.topk(t["a"].flatten(), 5),
    "kthvalue": lambda t: torch.kthvalue(t["a"], 2, dim=1),
    "unique": lambda t: torch.unique(t["dup"], return_counts=True),
    "median": lambda t: t["a"].median(dim=1),
    # neural network
    "softmax": lambda t: torch.softmax(t["a"], dim=1),
    "log_softmax": lambda t: F.log_softmax(t["a"], dim=0),
    "cross_entropy": lambda t: F.cross_entropy(t["a"], t["labels"]),
    "layer_norm": lambda t: F.layer_norm(t["a"], (5,)),
    "embedding": lambda t: F.embedding(t["idx"], t["a"]),
    "linear": lambda t: F.linear(t["a"], t["m"].t(), t["m"][0].clone()),
    "conv2d": lambda t: F.conv2d(t["img"], torch.ones(4, 3, 3, 3, device=t["img"].device) * 0.1, padding=1),
    "max_pool2d": lambda t: F.max_pool2d(t["img"], 2),
    "avg_pool2d": lambda t: F.avg_pool2d(t["img"], 3, stride=1),
    "interpolate": lambda t: F.interpolate(t["img"], scale_factor=2, mode="nearest"),
    "batch_norm_eval": lambda t: F.batch_norm(t["img"], torch.zeros(3, device=t["img"].device),
                                               torch.ones(3, device=t["img"].device), training=False),
    "dropout_eval": lambda t: F.dropout(t["a"], 0.5, training=False),
    # factories on the device
    "arange": lambda t: torch.arange(10, device=t["a"].device) * 2,
    "zeros_ones_full": lambda t: (torch.zeros(2, 3, device=t["a"].device), torch.ones(3, dtype=torch.int64, device=t["a"].device),
                                  torch.full((2, 2), 7.5, device=t["a"].device)),
    "linspace": lambda t: torch.linspace(0, 1, 7, device=t["a"].device),
    "eye": lambda t: torch.eye(3, device=t["a"].device),
    "like": lambda t: (torch.zeros_like(t["a"]), torch.ones_like(t["ints"]), torch.full_like(t["a"], 2.0)),
    "tensor_ctor": lambda t: torch.tensor([[1, 2], [3, 4]], dtype=torch.float64, device=t["a"].device),
}


def _flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in _flatten(item)]
    raise TypeError(type(x))


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_cpu(name):
    fn = CASES[name]
    cpu_inputs = _inputs()
    dev_inputs = {k: v.to(DEV) for k, v in cpu_inputs.items()}
    expected = _flatten(fn(cpu_inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _flatten(fn(dev_inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.device == torch.device(DEV), g.device
        assert g.dtype == e.dtype
        assert g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, rtol=1e-6, atol=1e-6, equal_nan=True)
    # The inputs were not modified.
    for k, v in dev_inputs.items():
        assert torch.equal(v.cpu(), cpu_inputs[k]), k


def test_results_land_on_the_inputs_device_not_the_current_one(exact_memory):
    before0 = torch.openreg.memory_allocated(0)
    x = torch.ones(100, device="openreg:1")
    y = (x * 2).sum(0, keepdim=True)
    assert y.device == torch.device("openreg:1")
    assert torch.openreg.memory_allocated(0) == before0
    with torch.openreg.device(1):
        z = torch.ones(3, device="openreg:0") + 1
    assert z.device == torch.device("openreg:0")


# ------------------------------------------------------- in-place and out=


def test_in_place_ops_return_the_same_tensor():
    t = torch.arange(6.0, device=DEV)
    ref = torch.arange(6.0)
    for op in ("add_", "mul_", "sub_", "div_"):
        r = getattr(t, op)(2.0)
        getattr(ref, op)(2.0)
        assert r is t, op
    r = t.clamp_(min=1.0)
    ref.clamp_(min=1.0)
    assert r is t
    r = t.exp_()
    ref.exp_()
    assert r is t
    r = t.index_fill_(0, torch.tensor([1, 3], device=DEV), -1.0)
    ref.index_fill_(0, torch.tensor([1, 3]), -1.0)
    assert r is t
    r = t.masked_fill_(t > 100, 0.0)
    ref.masked_fill_(ref > 100, 0.0)
    assert r is t
    data_ptr = t.data_ptr()
    r = t.copy_(t.flip(0))
    ref.copy_(ref.flip(0))
    assert r is t and t.data_ptr() == data_ptr
    torch.testing.assert_close(t.cpu(), ref)


def test_in_place_with_index_put_cpu_and_device_indices():
    t = torch.zeros(5, 3, device=DEV)
    ref = torch.zeros(5, 3)
    t[torch.tensor([0, 4])] = 1.5
    ref[torch.tensor([0, 4])] = 1.5
    t[torch.tensor([1, 2], device=DEV), torch.tensor([2, 0], device=DEV)] = torch.tensor([7.0, 8.0], device=DEV)
    ref[torch.tensor([1, 2]), torch.tensor([2, 0])] = torch.tensor([7.0, 8.0])
    t.index_put_((torch.tensor([3]),), torch.tensor([9.0], device=DEV), accumulate=True)
    ref.index_put_((torch.tensor([3]),), torch.tensor([9.0]), accumulate=True)
    t[t > 7.5] = -2.0
    ref[ref > 7.5] = -2.0
    assert torch.equal(t.cpu(), ref)


def test_out_variants_write_into_the_given_tensor():
    a = torch.randn(3, 4).to(DEV)
    b = torch.randn(3, 4).to(DEV)
    out = torch.empty(3, 4, device=DEV)
    ptr = out.data_ptr()
    r = torch.add(a, b, out=out)
    assert r is out and out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu())

    mm_out = torch.empty(3, 3, device=DEV)
    r = torch.mm(a, b.t(), out=mm_out)
    assert r is mm_out
    torch.testing.assert_close(mm_out.cpu(), a.cpu() @ b.cpu().t())

    values, indices = torch.empty(3, 4, device=DEV), torch.empty(3, 4, dtype=torch.int64, device=DEV)
    r = torch.sort(a, dim=1, out=(values, indices))
    assert r[0] is values and r[1] is indices
    ref = torch.sort(a.cpu(), dim=1)
    assert torch.equal(values.cpu(), ref.values) and torch.equal(indices.cpu(), ref.indices)

    s = torch.empty((), device=DEV)
    r = torch.sum(a, dim=(0, 1), out=s)
    assert r is s
    torch.testing.assert_close(s.cpu(), a.cpu().sum())


def test_out_of_zero_elements_is_resized_on_the_device():
    a = torch.randn(3, 4).to(DEV)
    out = torch.empty(0, device=DEV)
    r = torch.mul(a, 2, out=out)
    assert r is out
    assert out.shape == (3, 4) and out.device == torch.device(DEV)
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)
    cat_out = torch.empty(0, device=DEV)
    torch.cat([a, a], out=cat_out)
    assert cat_out.shape == (6, 4) and cat_out.device == torch.device(DEV)
    torch.testing.assert_close(cat_out.cpu(), torch.cat([a.cpu(), a.cpu()]))
    # The resized out tensor owns device memory on DEV.
    assert torch.openreg.memory_allocated(1) >= 2 * 6 * 4 * 4


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_out_of_the_wrong_shape_is_resized_like_on_cpu():
    a = torch.ones(2, 2)
    out_cpu = torch.zeros(4)
    torch.sum(a, 0, out=out_cpu)
    out = torch.zeros(4, device=DEV)
    r = torch.sum(a.to(DEV), 0, out=out)
    assert r is out
    assert out.shape == out_cpu.shape == (2,)
    assert torch.equal(out.cpu(), out_cpu)


# ------------------------------------------------------------------- views


def test_modifying_a_view_changes_the_base():
    base = torch.zeros(4, 5, device=DEV)
    ref = torch.zeros(4, 5)
    for t in (base, ref):
        t[1:3].add_(1.0)  # slice view, fallback in-place
        t.t()[0].fill_(5.0)  # transposed view, fill_ kernel
        t.diagonal().mul_(-1.0)
        t.view(-1)[7] = 9.0
        t[:, 4] = torch.arange(4.0).to(t.device)  # copy into a strided view
        t.narrow(0, 3, 1).zero_()
        t.unfold(1, 2, 2)[0].sub_(0.5)
        for row in t.unbind(0)[:2]:
            row.clamp_(max=4.0)
    assert torch.equal(base.cpu(), ref)


def test_views_share_storage():
    base = torch.arange(20.0, device=DEV).reshape(4, 5)
    storage_ptr = base.untyped_storage().data_ptr()
    views = [base[1], base[:, 2], base.t(), base.view(5, 4), base.reshape(20), base.permute(1, 0),
             base.unsqueeze(0), base.expand(2, 4, 5), base.as_strided((2, 2), (5, 1), 3), base.narrow(1, 1, 3),
             base.select(0, 3), base.diagonal(), *base.split(2), *base.chunk(5, dim=1), base.unflatten(1, (5, 1))]
    for v in views:
        assert v.untyped_storage().data_ptr() == storage_ptr
        assert v.device == torch.device(DEV)
    ref = torch.arange(20.0).reshape(4, 5)
    assert torch.equal(base.as_strided((2, 2), (5, 1), 3).cpu(), ref.as_strided((2, 2), (5, 1), 3))
    assert torch.equal(base.t().cpu(), ref.t())
    assert torch.equal(base[:, 2].cpu(), ref[:, 2])


def test_non_contiguous_inputs():
    a = torch.randn(6, 8)
    d = a.to(DEV)
    for f in (lambda x: x.t() @ x, lambda x: x[::2, 1::3].exp(), lambda x: x.t().contiguous().sum(0),
              lambda x: torch.cat([x.t(), x.t()], 1), lambda x: x[:, ::2].softmax(0)):
        torch.testing.assert_close(f(d).cpu(), f(a))


@pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss, F.l1_loss, F.huber_loss])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_losses_match_cpu_without_warnings(loss, reduction):
    x = torch.randn(8, 4, requires_grad=True)
    y = torch.randn(8, 4)
    dx = x.detach().to(DEV).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = loss(dx, y.to(DEV), reduction=reduction)
        out.sum().backward()
    expected = loss(x, y, reduction=reduction)
    expected.sum().backward()
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(dx.grad.cpu(), x.grad)


def test_inline_elementwise_ops_over_changing_operands_match_cpu():
    # Inline kernels reuse their CPU views (Note [Scratch views]): each call
    # re-points them at other memory, dtypes, shapes, strides and offsets.
    base = torch.arange(96, dtype=torch.float64).reshape(8, 12)
    cases = [
        (base, base),
        (base.float(), base.float().t().contiguous().t()),
        (base[1:, 2:], base[:-1, :-2]),
        (base.int()[::2, ::3], base.int()[1::2, 1::3]),
        (base[0], torch.tensor(2.5)),
        (base.half().reshape(2, 48), base.half().reshape(2, 48).flip(1)),
        (base.bool(), base.bool()),
        (base[:, :1], base[:1, :]),
        (torch.empty(0), torch.empty(0)),
    ]
    for a, b in cases:
        da = a.to(DEV)
        db = b if b.dim() == 0 else b.to(DEV)
        for op in (torch.add, torch.mul, torch.div):
            torch.testing.assert_close(op(da, db).cpu(), op(a, b), equal_nan=True)
        if a.dtype != torch.bool:
            torch.testing.assert_close((da - db).cpu(), a - b)


# ------------------------------------------------------------ stream order


def test_ops_run_in_stream_order():
    s = new_stream(1)
    x = torch.zeros(1000, device=DEV)
    with torch.openreg.stream(s):
        torch.openreg._sleep(200)
        x.fill_(3.0)  # queued behind the sleep
        y = x * 2 + 1  # must see the fill
        y.add_(x)
        z = y.sum()
        # Read on s: as on CUDA, the default stream is not ordered after s.
        assert z.item() == 1000 * 10.0


def test_item_waits_for_queued_work():
    x = torch.zeros((), device=DEV)
    with torch.openreg.device(1):
        torch.openreg._sleep(200)
    x.fill_(4.25)
    assert x.item() == 4.25
    assert x.tolist() == 4.25
    assert bool(x) is True
    i = torch.tensor([7], dtype=torch.int64, device=DEV)
    assert int(i) == 7 and isinstance(i.item(), int)
    assert torch.tensor(True, device=DEV).item() is True


@pytest.mark.subprocess
def test_launch_blocking_makes_every_launch_synchronous():
    data = LAUNCH_BLOCKING.result().check_ok()
    assert data["option"] == "1"
    assert data["sleep_s"] >= 0.29, data
    assert data["idle_after_sleep"] is True
    assert data["idle_after_fill"] is True
    assert data["pinned_right_after_copy"] == [float(i) for i in range(8)]
    assert data["sum"] == 2.0 * (1 << 22)


def test_launches_are_asynchronous_by_default():
    """The control for the test above."""
    if torch.openreg.options()["OPENREG_LAUNCH_BLOCKING"]["value"] != "0":
        pytest.skip("this run has OPENREG_LAUNCH_BLOCKING set")
    s = new_stream(0)
    with torch.openreg.stream(s):
        torch.openreg._sleep(300)
    assert not s.query()
    s.synchronize()


# Note [Composites that differ from CPU] (cpp/ops/fallback.cpp): ops with their
# own CPU kernel and a default-backend composite reach the CPU kernel, so
# low-precision results are the CPU's bit for bit.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_norms_and_addr_compute_as_cpu(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 8, generator=g).to(dtype)
    w, b = torch.randn(8, generator=g).to(dtype), torch.randn(8, generator=g).to(dtype)
    cases = [
        lambda d: torch.nn.functional.layer_norm(x.to(d), (8,), w.to(d), b.to(d)),
        lambda d: torch.nn.functional.group_norm(x.to(d), 2, torch.ones(6, dtype=dtype).to(d)),
        lambda d: torch.addr(x[0, 0].to(d), x[1, 1].to(d), x[2, 2].to(d), beta=0.5, alpha=2),
    ]
    for case in cases:
        assert torch.equal(case("openreg").cpu(), case("cpu"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", [F.silu, F.mish], ids=["silu", "mish"])
def test_activation_gradients_compute_as_cpu(dtype, activation):
    # silu_backward and mish_backward have a CPU kernel and a decomposition;
    # openreg runs the CPU kernel, so the float16 rounding is the CPU's.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g).to(dtype)
    grad_out = torch.randn(64, generator=g).to(dtype)
    grads = []
    for device in ("cpu", "openreg"):
        leaf = x.to(device).requires_grad_()
        (grad,) = torch.autograd.grad(activation(leaf), leaf, grad_out.to(device))
        grads.append(grad.cpu())
    assert torch.equal(grads[0], grads[1])
