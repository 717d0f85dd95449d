"""Random numbers on openreg: the generator path (torch.openreg → _C →
ATen's context → hooks → Rust Philox state), the native random kernels,
reproducibility, statistics and bad input."""

import inspect
import math

import pytest
import torch
from torch_openreg._op_db import c10_name

from _openreg_util import clean_env, script

DEV = "openreg:0"
DEFAULT_SEED = 67280421310721
N_STAT = 1_000_000


# The same tensors, whatever the process or the number of fill threads: the
# subprocesses run _sample's own source.
def _sample() -> str:
    import hashlib

    torch.openreg.manual_seed(1234)
    parts = [
        torch.randn(1_000_003, device="openreg"),
        torch.rand(300_001, device="openreg", dtype=torch.float64),
        torch.randint(-50, 50, (200_000,), device="openreg").float(),
        torch.empty(400_000, device="openreg").exponential_(2.0),
    ]
    return hashlib.sha256(b"".join(p.cpu().numpy().tobytes() for p in parts)).hexdigest()


_SAMPLE = (
    "import torch, torch_openreg\n"
    + inspect.getsource(_sample)
    + 'done({"digest": _sample(), "threads": torch.openreg.options()["OPENREG_KERNEL_THREADS"]["value"]})\n'
)
SAMPLE_SCRIPTS = {
    threads: script(f"random_sample_threads_{threads}", _SAMPLE, env=clean_env(OPENREG_KERNEL_THREADS=str(threads)))
    for threads in ("1", "2", "3")
}

FRESH_PROCESS = script(
    "random_fresh_process",
    """
import torch, torch_openreg
result = {"initialized_flag_at_import": torch.openreg._initialized}
result |= {
    "initial": [torch.openreg.initial_seed()],
    "state1": torch.openreg.get_rng_state(1).tolist(),
    "contexts": [torch_openreg._C._has_primary_context(i) for i in range(2)],
}
result["initialized_flag_after_generator_use"] = torch.openreg._initialized
torch.manual_seed(99)
result["after_torch_manual_seed"] = [torch_openreg._C._get_default_generator(i).initial_seed() for i in range(2)]
done(result)
""",
)


# ------------------------------------------------------------ generator path


def test_default_generator_is_per_device_and_reaches_rust_state():
    g0 = torch_openreg_C()._get_default_generator(0)
    assert g0.device == torch.device("openreg:0")
    assert torch_openreg_C()._get_default_generator(1).device == torch.device("openreg:1")
    g0.manual_seed(5)
    # Another wrapper of the same default generator sees the same state.
    assert torch_openreg_C()._get_default_generator(0).initial_seed() == 5
    assert torch.openreg.initial_seed() == 5


def torch_openreg_C():
    import torch_openreg

    return torch_openreg._C


def test_default_generator_bad_index_is_an_error():
    with pytest.raises(RuntimeError, match="out of range"):
        torch_openreg_C()._get_default_generator(7)
    with pytest.raises(RuntimeError, match="out of range"):
        torch_openreg_C()._get_default_generator(-3)


@pytest.mark.subprocess
def test_fresh_process_defaults_and_torch_manual_seed():
    data = FRESH_PROCESS.result().check_ok()
    assert data["initial"] == [DEFAULT_SEED]
    assert data["state1"][:8] == list(DEFAULT_SEED.to_bytes(8, "little"))
    assert data["state1"][8:] == [0] * 8
    # Reaching a default generator initializes the runtime (ATen's
    # lazyInitDevice, as for CUDA) but creates no device context.
    assert data["contexts"] == [False, False]
    # torch.openreg._initialized, read by torch.utils.checkpoint: Note
    # [torch.openreg._initialized].
    assert data["initialized_flag_at_import"] is False
    assert data["initialized_flag_after_generator_use"] is True
    assert data["after_torch_manual_seed"] == [99, 99]


def test_torch_manual_seed_seeds_every_device():
    torch.manual_seed(321)
    assert [torch.openreg.get_rng_state(i)[:8].tolist() for i in range(2)] == [list((321).to_bytes(8, "little"))] * 2
    a = torch.rand(10, device="openreg:1")
    torch.manual_seed(321)
    assert torch.equal(a.cpu(), torch.rand(10, device="openreg:1").cpu())


def test_manual_seed_all_and_seed_all():
    torch.openreg.manual_seed_all(17)
    assert [torch_openreg_C()._get_default_generator(i).initial_seed() for i in range(2)] == [17, 17]
    torch.openreg.seed_all()
    seeds = [torch_openreg_C()._get_default_generator(i).initial_seed() for i in range(2)]
    assert seeds[0] == seeds[1] != 17
    torch.openreg.seed()
    assert torch.openreg.initial_seed() != seeds[0]


def test_state_is_seed_and_offset():
    torch.openreg.manual_seed(0x0102030405060708)
    torch.rand(5, device=DEV)  # 5 draws, rounded up to a whole Philox block
    state = torch.openreg.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
    assert int.from_bytes(bytes(state[:8].tolist()), "little") == 0x0102030405060708
    assert int.from_bytes(bytes(state[8:].tolist()), "little") == 8
    torch.randn(3, device=DEV, dtype=torch.float64)  # 2 pairs x 2 draws x 2 values
    assert torch_openreg_C()._get_default_generator(0).get_offset() == 16


def test_state_save_restore_mid_sequence():
    torch.openreg.manual_seed(7)
    torch.randn(100, device=DEV)
    saved = torch.openreg.get_rng_state()
    after = [torch.randn(1000, device=DEV).cpu(), torch.rand(7, device=DEV).cpu()]
    torch.openreg.set_rng_state(saved)
    again = [torch.randn(1000, device=DEV).cpu(), torch.rand(7, device=DEV).cpu()]
    assert all(torch.equal(a, b) for a, b in zip(after, again))
    states = torch.openreg.get_rng_state_all()
    x = torch.rand(4, device="openreg:1").cpu()
    torch.openreg.set_rng_state_all(states)
    assert torch.equal(x, torch.rand(4, device="openreg:1").cpu())


def test_state_restored_while_random_kernels_are_queued_reproduces_them():
    # The offset moves when a kernel is launched, not when it runs (Note
    # [Philox offsets]), so a state read behind queued kernels already
    # counts them, and restoring it replays the draws that follow.
    torch.openreg.manual_seed(8)
    for device in ("openreg:0", "openreg:1"):
        with torch.openreg.device(device):
            torch.openreg._sleep(30)
            queued = torch.randn(50_000, device=device)
            saved = torch.openreg.get_rng_state(device)
            torch.openreg._sleep(30)
            first = [torch.randn(1000, device=device), torch.rand(9, device=device)]
            torch.openreg.set_rng_state(saved, device)
            again = [torch.randn(1000, device=device), torch.rand(9, device=device)]
            assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(first, again))
            assert not torch.equal(queued[:1000].cpu(), first[0].cpu())


def test_offset_set_get_and_clone():
    g = torch.Generator(device="openreg:1")
    assert g.device == torch.device("openreg:1") and g.initial_seed() == DEFAULT_SEED
    g.manual_seed(3)
    g.set_offset(40)
    assert g.get_offset() == 40
    first = torch.rand(6, device="openreg:1", generator=g).cpu()
    g.set_offset(40)
    assert torch.equal(first, torch.rand(6, device="openreg:1", generator=g).cpu())
    with pytest.raises(RuntimeError, match="multiple of 4"):
        g.set_offset(6)
    clone = g.clone_state()
    assert clone.get_offset() == g.get_offset() and clone.device == g.device
    assert torch.equal(torch.rand(5, device="openreg:1", generator=g).cpu(), torch.rand(5, device="openreg:1", generator=clone).cpu())
    # Independent after the clone.
    torch.rand(8, device="openreg:1", generator=g)
    assert clone.get_offset() != g.get_offset()


def test_accelerator_random_api():
    torch.openreg.manual_seed_all(11)
    assert torch.accelerator.random.initial_seed() == 11
    torch.rand(3, device="openreg:1")
    assert torch.equal(torch.accelerator.random.get_rng_state(1), torch.openreg.get_rng_state(1))
    assert len(torch.accelerator.random.get_rng_state_all()) == 2


def test_fork_rng_restores_state():
    torch.openreg.manual_seed(5)
    with torch.random.fork_rng(devices=[0, 1], device_type="openreg"):
        inside = [torch.rand(5, device=DEV).cpu(), torch.rand(5, device="openreg:1").cpu()]
    outside = [torch.rand(5, device=DEV).cpu(), torch.rand(5, device="openreg:1").cpu()]
    assert all(torch.equal(a, b) for a, b in zip(inside, outside))


# --------------------------------------------------------- reproducibility


def test_same_seed_same_tensors():
    for make in (
        lambda: torch.randn(12345, device=DEV),
        lambda: torch.rand(3, 5, device=DEV, dtype=torch.float64),
        lambda: torch.randint(0, 1000, (999,), device=DEV),
        lambda: torch.randperm(500, device=DEV),
        lambda: torch.empty(100, device=DEV, dtype=torch.half).normal_(),
    ):
        torch.openreg.manual_seed(42)
        a = make().cpu()
        torch.openreg.manual_seed(42)
        b = make().cpu()
        torch.openreg.manual_seed(43)
        c = make().cpu()
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_consecutive_draws_differ():
    torch.openreg.manual_seed(1)
    assert not torch.equal(torch.rand(8, device=DEV).cpu(), torch.rand(8, device=DEV).cpu())


def test_independent_devices():
    torch.openreg.manual_seed_all(100)
    b1 = torch.rand(16, device="openreg:1").cpu()
    torch.openreg.manual_seed_all(100)
    # Seeding or drawing on device 0 does not disturb device 1.
    torch.openreg.manual_seed(555)
    torch.rand(1000, device="openreg:0")
    assert torch.equal(torch.rand(16, device="openreg:1").cpu(), b1)
    assert torch.openreg.initial_seed() == 555


def test_explicit_generator_is_honoured_and_leaves_default_alone():
    torch.openreg.manual_seed(9)
    before = torch.openreg.get_rng_state()
    g = torch.Generator(device=DEV).manual_seed(9)
    a = torch.randn(100, device=DEV, generator=g).cpu()
    assert torch.equal(torch.openreg.get_rng_state(), before)
    assert torch.equal(a, torch.randn(100, device=DEV).cpu())  # same seed, same start
    g.manual_seed(9)
    assert torch.equal(torch.randperm(50, device=DEV, generator=g).cpu(), torch.randperm(50, device=DEV, generator=torch.Generator(device=DEV).manual_seed(9)).cpu())


def test_non_contiguous_and_other_dtypes():
    torch.openreg.manual_seed(3)
    t = torch.empty(40, 30, device=DEV).t()
    t.uniform_(2, 3)
    host = t.cpu()
    assert ((host >= 2) & (host < 3)).all() and host.unique().numel() > 1000
    for dtype in (torch.half, torch.bfloat16):
        v = torch.empty(1000, device=DEV, dtype=dtype).normal_(5, 0.1).cpu().float()
        assert abs(v.mean().item() - 5) < 0.05
    b = torch.empty(1000, device=DEV, dtype=torch.int32).bernoulli_(0.5).cpu()
    assert set(b.unique().tolist()) == {0, 1}


def test_inline_and_queued_launches_agree():
    """A small fill runs inline on an idle stream, a busy stream queues it:
    the values depend only on the reserved offset."""
    torch.openreg.manual_seed(8)
    inline = torch.rand(100, device=DEV).cpu()
    torch.openreg.manual_seed(8)
    torch.openreg._sleep(50)
    queued = torch.rand(100, device=DEV).cpu()
    assert torch.equal(inline, queued)


@pytest.mark.subprocess
def test_same_tensors_across_processes_and_thread_counts():
    results = {threads: s.result().check_ok() for threads, s in SAMPLE_SCRIPTS.items()}
    assert {r["threads"] for r in results.values()} == {"1", "2", "3"}
    digests = {r["digest"] for r in results.values()}
    assert len(digests) == 1, results
    # ... and equal to this process's, whatever its thread count.
    torch.set_num_threads(1)
    try:
        assert _sample() == digests.pop()
    finally:
        torch.set_num_threads(2)


# ------------------------------------------------------------- statistics


def _ks_statistic(samples: torch.Tensor, cdf) -> float:
    x, _ = samples.double().sort()
    n = x.numel()
    f = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


# Kolmogorov–Smirnov critical value at significance 0.001 for n = 10^6.
_KS_CRITICAL = 1.95 / math.sqrt(N_STAT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_statistics(dtype):
    torch.openreg.manual_seed(2024)
    u = torch.rand(N_STAT, device=DEV, dtype=dtype).cpu().double()
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.002
    assert abs(u.var().item() - 1 / 12) < 0.0005
    assert _ks_statistic(u, lambda x: x) < _KS_CRITICAL
    r = torch.empty(N_STAT, device=DEV, dtype=dtype).uniform_(-3, 5).cpu()
    assert r.min() >= -3 and r.max() < 5 and abs(r.double().mean().item() - 1) < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_statistics(dtype):
    torch.openreg.manual_seed(77)
    z = torch.randn(N_STAT, device=DEV, dtype=dtype).cpu().double()
    assert abs(z.mean().item()) < 0.005
    assert abs(z.var().item() - 1) < 0.006
    assert _ks_statistic(z, lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2)))) < _KS_CRITICAL
    shifted = torch.empty(N_STAT, device=DEV, dtype=dtype).normal_(10, 3).cpu().double()
    assert abs(shifted.mean().item() - 10) < 0.015 and abs(shifted.std().item() - 3) < 0.01


def test_bernoulli_frequency():
    torch.openreg.manual_seed(5)
    b = torch.empty(N_STAT, device=DEV).bernoulli_(0.3).cpu()
    assert set(b.unique().tolist()) == {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 0.0015
    p = torch.tensor([0.0, 0.25, 1.0], device=DEV).repeat(N_STAT // 3)
    t = torch.bernoulli(p).cpu().view(-1, 3)
    assert t[:, 0].sum() == 0 and (t[:, 2] == 1).all()
    assert abs(t[:, 1].mean().item() - 0.25) < 0.003


def test_other_distributions():
    torch.openreg.manual_seed(6)
    e = torch.empty(N_STAT, device=DEV).exponential_(4.0).cpu().double()
    assert e.min() >= 0 and abs(e.mean().item() - 0.25) < 0.002
    g = torch.empty(N_STAT, device=DEV).geometric_(0.2).cpu().double()
    assert g.min() >= 1 and (g == g.round()).all() and abs(g.mean().item() - 5) < 0.03
    ln = torch.empty(N_STAT, device=DEV).log_normal_(0.0, 0.5).cpu().double()
    assert ln.min() > 0 and abs(ln.log().mean().item()) < 0.003
    c = torch.empty(N_STAT, device=DEV).cauchy_(1.0, 2.0).cpu().double()
    assert abs(c.median().item() - 1) < 0.02
    assert abs(((c - 1).abs() < 2).double().mean().item() - 0.5) < 0.002


def test_random_integers():
    torch.openreg.manual_seed(12)
    r = torch.empty(100_000, device=DEV, dtype=torch.int64).random_(-5, 5).cpu()
    assert r.min() == -5 and r.max() == 4
    assert torch.bincount(r + 5).min() > 9_000
    to = torch.empty(10_000, device=DEV, dtype=torch.int16).random_(7).cpu()
    assert to.min() == 0 and to.max() == 6
    default = torch.empty(10_000, device=DEV, dtype=torch.uint8).random_().cpu()
    assert default.max() > 250 and default.min() < 5
    f = torch.empty(10_000, device=DEV).random_().cpu()
    assert (f == f.round()).all() and f.max() <= 2**24 and f.max() > 2**23
    full = torch.empty(1000, device=DEV, dtype=torch.int64).random_(-(2**63), None).cpu()
    assert (full < 0).any() and (full > 2**62).any()
    ints = torch.randint(3, 9, (10_000,), device=DEV).cpu()
    assert set(ints.unique().tolist()) == set(range(3, 9))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_dtypes_take_a_range_as_on_cuda(dtype):
    """uint16/32/64: random_(to) and random_(from, to) (so torch.randint and
    make_tensor) draw from the openreg generator, reproducibly; random_()
    and the full int64 range are refused, as CUDA's random_kernel and
    random_full_64_bits_range_kernel lack them (Note [random_ ranges]); bad
    bounds raise PyTorch's own errors, as on CPU."""
    torch.openreg.manual_seed(21)
    high = 60_000 if dtype == torch.uint16 else 2**31 + 7
    drawn = torch.empty(20_000, device=DEV, dtype=dtype).random_(5, high).cpu()
    assert drawn.dtype == dtype
    r = drawn.to(torch.int64)  # CPU's reductions lack the unsigned dtypes
    assert r.min() >= 5 and r.max() < high
    assert r.double().mean() > high * 0.45  # spread over the range
    torch.openreg.manual_seed(21)
    again = torch.empty(20_000, device=DEV, dtype=dtype).random_(5, high).cpu()
    assert torch.equal(again.to(torch.int64), r)
    to = torch.empty(1000, device=DEV, dtype=dtype).random_(3).cpu().to(torch.int64)
    assert set(to.tolist()) == {0, 1, 2}
    small = torch.randint(0, 4, (1000,), device=DEV, dtype=dtype).cpu()
    assert set(small.tolist()) == {0, 1, 2, 3}
    torch.openreg.manual_seed(22)
    made = torch.testing.make_tensor((64,), dtype=dtype, device=DEV, low=0, high=9)
    torch.openreg.manual_seed(22)
    made_again = torch.testing.make_tensor((64,), dtype=dtype, device=DEV, low=0, high=9)
    assert made.device.type == "openreg" and made.dtype == dtype
    assert torch.equal(made.cpu().to(torch.int64), made_again.cpu().to(torch.int64))
    assert made.cpu().to(torch.int64).max() <= 9 and len(made.cpu().to(torch.int64).unique()) > 5
    name = c10_name(dtype)
    with pytest.raises(NotImplementedError, match=f"\"random_kernel_openreg\" not implemented for '{name}'"):
        torch.empty(3, device=DEV, dtype=dtype).random_()
    torch.empty(0, device=DEV, dtype=dtype).random_()  # an empty tensor returns before the kernel
    with pytest.raises(
            NotImplementedError, match=f"\"random_full_64_bits_range_kernel_openreg\" not implemented for '{name}'"):
        torch.empty(3, device=DEV, dtype=dtype).random_(-(2**63), None)
    refused = [(-1, 7)] + ([(5, None)] if dtype == torch.uint64 else [(0, 2**40)])
    for bounds in refused:  # "from is out of bounds for ...", "to - 1 is out of bounds for ..."
        with pytest.raises(RuntimeError) as cpu_error:
            torch.empty(3, dtype=dtype).random_(*bounds)
        with pytest.raises(RuntimeError) as raised:
            torch.empty(3, device=DEV, dtype=dtype).random_(*bounds)
        assert str(raised.value) == str(cpu_error.value)
    if dtype != torch.uint64:  # up to the dtype's maximum
        top = torch.empty(20_000, device=DEV, dtype=dtype).random_(5, None).cpu().to(torch.int64)
        assert top.min() >= 5 and top.max() > torch.iinfo(dtype).max * 0.99


@pytest.mark.filterwarnings("ignore:.* is out of bounds \\[:UserWarning")
def test_random_bounds_and_ranges_are_pytorchs_for_every_dtype():
    """random_'s front end is PyTorch's (Note [random_ ranges]): the same
    errors as CPU (whose front end CUDA shares), and the full int64 range
    for the dtypes CUDA's random_full_64_bits_range_kernel draws."""
    dtypes = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64)
    for dtype in dtypes:
        for bounds in ((), (5, None), (-1, 7), (0, 2**40), (-(2**63), None), (2**62, None), (7,)):
            try:
                torch.empty(3, dtype=dtype).random_(*bounds)
            except (RuntimeError, NotImplementedError) as e:
                with pytest.raises(type(e)) as raised:
                    torch.empty(3, device=DEV, dtype=dtype).random_(*bounds)
                assert str(raised.value).replace("_openreg", "_cpu") == str(e), (dtype, bounds)
                continue
            torch.empty(3, device=DEV, dtype=dtype).random_(*bounds)
    torch.openreg.manual_seed(5)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        full = torch.empty(2000, device=DEV, dtype=dtype).random_(-(2**63), None).cpu().double()
        assert full.min() < -(2**61) and full.max() > 2**61, dtype
    f = torch.empty(2000, device=DEV, dtype=torch.float32).random_(0, 2**24 + 7).cpu().double()
    assert f.max() <= 2**24  # the end moved to a value float32 holds (update_to)


def test_randperm():
    torch.openreg.manual_seed(4)
    p = torch.randperm(10_000, device=DEV)
    assert p.device == torch.device(DEV) and p.dtype == torch.int64
    assert torch.equal(p.cpu().sort().values, torch.arange(10_000))
    assert not torch.equal(p.cpu(), torch.arange(10_000))
    f = torch.randperm(100, device=DEV, dtype=torch.float32).cpu()
    assert torch.equal(f.sort().values, torch.arange(100, dtype=torch.float32))
    assert torch.randperm(0, device=DEV).numel() == 0


def test_multinomial():
    torch.openreg.manual_seed(10)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3], device=DEV)
    s = torch.multinomial(probs, 200_000, replacement=True).cpu()
    freq = torch.bincount(s, minlength=4).double() / s.numel()
    assert freq[1] == 0
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.005)
    w = torch.multinomial(probs, 3).cpu()
    assert sorted(w.tolist()) == [0, 2, 3]
    batch = torch.multinomial(torch.tensor([[0.0, 1.0], [1.0, 0.0]], device=DEV), 1).cpu()
    assert batch.tolist() == [[1], [0]]
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(probs, 5)
    with pytest.raises(RuntimeError, match="element < 0"):
        torch.multinomial(torch.tensor([0.5, -1.0], device=DEV), 1)


def test_dropout():
    torch.openreg.manual_seed(13)
    x = torch.ones(N_STAT, device=DEV)
    y = torch.nn.functional.dropout(x, 0.25).cpu()
    kept = y != 0
    assert abs(kept.double().mean().item() - 0.75) < 0.002
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.75))
    assert torch.equal(torch.nn.functional.dropout(x, 0.25, training=False).cpu(), x.cpu())
    torch.openreg.manual_seed(13)
    assert torch.equal(torch.nn.functional.dropout(x, 0.25).cpu(), y)


def test_functional_normal_overloads():
    torch.openreg.manual_seed(14)
    mean = torch.full((N_STAT,), 3.0, device=DEV)
    a = torch.normal(mean, 2.0).cpu()
    assert abs(a.mean().item() - 3) < 0.01 and abs(a.std().item() - 2) < 0.01
    b = torch.normal(1.0, torch.full((N_STAT,), 0.5, device=DEV)).cpu()
    assert abs(b.mean().item() - 1) < 0.005 and abs(b.std().item() - 0.5) < 0.003
    c = torch.normal(torch.zeros(1000, 1, device=DEV), torch.ones(1, 1000, device=DEV))
    assert c.shape == (1000, 1000) and abs(c.cpu().std().item() - 1) < 0.01
    d = torch.normal(0.0, 1.0, (5,), device=DEV)
    assert d.device == torch.device(DEV)


# -------------------------------------------------------------- bad input


def test_set_rng_state_rejects_wrong_size_and_dtype():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.openreg.set_rng_state(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="uint8"):
        torch.openreg.set_rng_state(torch.zeros(16, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.openreg.set_rng_state(torch.tensor([0] * 8 + [3] + [0] * 7, dtype=torch.uint8))


def test_generator_of_wrong_device_is_an_error():
    with pytest.raises(RuntimeError, match="generator of the tensor's device openreg:0.*openreg:1"):
        torch.rand(3, device=DEV, generator=torch.Generator(device="openreg:1"))
    with pytest.raises(RuntimeError, match="generator"):
        torch.empty(3, device=DEV).normal_(generator=torch.Generator())
    with pytest.raises(RuntimeError, match="out of range"):
        torch.Generator(device="openreg:5")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: t.uniform_(1, 0), "from=1 > to=0"),
        (lambda t: t.bernoulli_(1.5), r"\[0, 1\]"),
        (lambda t: t.bernoulli_(-0.1), r"\[0, 1\]"),
        (lambda t: t.bernoulli_(torch.full((4,), 2.0, device=DEV)), r"\[0, 1\]"),
        (lambda t: t.random_(5, 2), "from=5 >= to=2"),
        (lambda t: t.normal_(0, -1), "std >= 0.0"),
        (lambda t: t.exponential_(-1), "lambda > 0.0"),
        (lambda t: t.geometric_(1.5), r"\(0, 1\)"),
        (lambda t: t.cauchy_(0, 0), "sigma > 0.0"),
        (lambda t: torch.randperm(-1, device=DEV), "negative"),
        (lambda t: torch.native_dropout(t, 1.5, True), "between 0 and 1"),
        (lambda t: torch.empty(4, dtype=torch.int64, device=DEV).uniform_(), "floating point"),
    ],
)
def test_invalid_ranges_are_clear_errors(call, message):
    torch.openreg.manual_seed(0)
    t = torch.empty(4, device=DEV)
    before = torch.openreg.get_rng_state()
    with pytest.raises(RuntimeError, match=message):
        call(t)
    # A rejected call reserves nothing.
    assert torch.equal(torch.openreg.get_rng_state(), before)
