"""In-place foreach ops (torch.optim's foreach steps) on openreg: one fallback
call, one stream task, cut between whole tensors when large (Note [Foreach
ops] in cpp/ops/fallback.cpp, Note [List chunks] in cpp/ops/kernel_split.cpp);
calls of other dtypes or devices keep PyTorch's per-tensor loop. Either way the
results are CPU's, bit for bit."""

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

DEV = "openreg"
# 300*1024 + 1024 + 400*1024 + 7 elements: more than two chunks' work, so
# float32 calls are cut (into three chunks of whole tensors, by default).
SHAPES = [(300, 1024), (1024,), (400, 1024), (7,)]


def _lists(count, dtype=torch.float32, positive=False):
    g = torch.Generator().manual_seed(count)
    lists = []
    for _ in range(count):
        ts = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in SHAPES]
        lists.append([t.abs() + 0.5 for t in ts] if positive else ts)
    return lists


def _to_device(lists):
    return [[t.to(DEV) for t in ts] for ts in lists]


def _device_kernels(fn):
    """Names of the device activities (kernels) `fn` launched."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
        fn()
        torch.openreg.synchronize()
    return [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]


CALLS = {
    "add_ List": lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.5),
    "add_ Scalar": lambda a, b, c: torch._foreach_add_(a, 0.25),
    "mul_ ScalarList": lambda a, b, c: torch._foreach_mul_(a, [0.5, 1.5, -2.0, 3.0]),
    "addcdiv_ ScalarList": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, -0.2, 0.3, 0.5]),
    "addcmul_ Scalar": lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.1),
    "lerp_ Scalar": lambda a, b, c: torch._foreach_lerp_(a, b, 0.3),
    "sqrt_": lambda a, b, c: torch._foreach_sqrt_(c),
    "zero_": lambda a, b, c: torch._foreach_zero_(a),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("call", CALLS)
def test_in_place_foreach_equals_cpu(call, dtype):
    cpu = _lists(2, dtype) + _lists(1, dtype, positive=True)
    dev = _to_device(cpu)
    CALLS[call](*cpu)
    CALLS[call](*dev)
    for want, got in zip(cpu[0] + cpu[2], dev[0] + dev[2]):
        assert torch.equal(got.cpu(), want)


def test_a_float_foreach_call_is_one_kernel_and_other_dtypes_one_per_tensor():
    a, b, _ = _to_device(_lists(3))
    assert _device_kernels(lambda: torch._foreach_add_(a, b, alpha=0.5)) == ["aten::_foreach_add_"]
    h, k = ([t.half() for t in ts] for ts in (a, b))
    # float16 keeps the per-tensor loop, whose calls the dtype policy checks.
    assert _device_kernels(lambda: torch._foreach_add_(h, k)) == ["aten::add"] * len(SHAPES)


def test_a_list_naming_a_tensor_many_times_updates_it_each_time():
    # Chunks run at once: written tensors sharing memory keep the call whole
    # (cut, passes of eight chunks over one tensor lose updates).
    # The host waits at once (.cpu()), leaving every core to the chunks.
    x = torch.randn(1 << 21)
    d = x.to(DEV)
    torch._foreach_add_([d] * 8, [torch.ones_like(d)] * 8)
    got = d.cpu()
    torch._foreach_add_([x] * 8, [torch.ones_like(x)] * 8)
    assert torch.equal(got, x)
    halves = d[: 1 << 20], d[1 << 20 :]  # views of one storage, each read by the other's chunk
    torch._foreach_add_(list(halves), [halves[1], halves[0]])
    got = d.cpu()
    halves_cpu = x[: 1 << 20], x[1 << 20 :]
    torch._foreach_add_(list(halves_cpu), [halves_cpu[1], halves_cpu[0]])
    assert torch.equal(got, x)


def test_tensors_on_two_devices_or_the_host_behave_as_on_cuda():
    p = [torch.ones(3, device="openreg:0"), torch.ones(3, device="openreg:1")]
    torch._foreach_add_(p, [torch.ones(3, device="openreg:0"), torch.ones(3, device="openreg:1")])
    assert [t.device for t in p] == [torch.device("openreg:0"), torch.device("openreg:1")]
    assert all(torch.equal(t.cpu(), torch.full((3,), 2.0)) for t in p)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch._foreach_add_([torch.ones(3, device=DEV)], [torch.ones(3)])


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
], ids=["sgd_momentum", "adam"])
def test_foreach_optimizer_steps_equal_cpu(make):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 256))
    device_model = copy.deepcopy(model).to(DEV)
    x = torch.randn(32, 256)
    opts = make(model.parameters()), make(device_model.parameters())
    for _ in range(3):
        for m, opt, inp in ((model, opts[0], x), (device_model, opts[1], x.to(DEV))):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
    for want, got in zip(model.parameters(), device_model.parameters()):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
