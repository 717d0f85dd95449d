"""Bad input to tensor operations: each is a clear exception naming the
problem, the process stays usable, and nothing leaks."""

import gc

import pytest
import torch

from _openreg_util import script

MiB = 1 << 20


def _raises(exc, pattern, fn):
    with pytest.raises(exc, match=pattern):
        fn()


@pytest.fixture(autouse=True)
def _no_leak(exact_memory):
    torch.empty(1, device="openreg:0")
    torch.empty(1, device="openreg:1")
    before = (torch.openreg.memory_allocated(0), torch.openreg.memory_allocated(1))
    yield
    gc.collect(0)  # what the test left in reference cycles (tracebacks) is young
    assert (torch.openreg.memory_allocated(0), torch.openreg.memory_allocated(1)) == before
    # Still usable.
    assert torch.ones(2, device="openreg:0").sum().item() == 2.0


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: torch.empty(-1, device="openreg:0"), r"negative dimension -1: \[-1\]"),
        (lambda: torch.empty(2, -3, device="openreg:1"), r"negative dimension -3: \[2, -3\]"),
        (lambda: torch.zeros(-2, device="openreg:0"), r"zeros: Dimension size must be non-negative"),
        (lambda: torch.ones(3, -1, device="openreg:0"), r"negative dimension -1: \[3, -1\]"),
        (lambda: torch.full((-4,), 1.0, device="openreg:0"), r"negative dimension -4"),
        (lambda: torch.empty_strided((2, -3), (1, 1), device="openreg:0"), r"negative dimension -3"),
        (lambda: torch.ones(3, device="openreg:0").new_empty((-1,)), r"negative dimension -1"),
        (lambda: torch.ones(3, device="openreg:1").new_zeros((5, -2)), r"negative dimension -2"),
    ],
    ids=["empty", "empty_2d", "zeros", "ones", "full", "empty_strided", "new_empty", "new_zeros"],
)
def test_negative_sizes(call, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_negative_strides_are_rejected():
    _raises(RuntimeError, "stride|overflow", lambda: torch.empty_strided((2, 3), (-1, 2), device="openreg:0"))


def test_out_on_the_wrong_device():
    a = torch.ones(3, device="openreg:0")
    b = torch.ones(3, device="openreg:0")
    # openreg inputs, CPU out
    _raises(RuntimeError, r"same device.*openreg:0 and cpu", lambda: torch.add(a, b, out=torch.empty(3)))
    # CPU inputs, openreg out
    _raises(RuntimeError, r"same device.*openreg:0 and cpu", lambda: torch.add(torch.ones(3), torch.ones(3), out=a))
    # openreg:0 inputs, openreg:1 out
    _raises(RuntimeError, r"same device.*openreg:0 and openreg:1",
            lambda: torch.add(a, b, out=torch.empty(3, device="openreg:1")))
    _raises(RuntimeError, r"same device", lambda: torch.mm(torch.ones(2, 2), torch.ones(2, 2), out=torch.empty(2, 2, device="openreg:0")))
    _raises(RuntimeError, r"same device", lambda: torch.cat([a, b], out=torch.empty(6)))
    assert a.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_zero_dim_cpu_out_for_openreg_inputs_is_rejected():
    a = torch.ones(3, device="openreg:0")
    out = torch.empty(())
    with pytest.raises(RuntimeError, match=r"device"):
        torch.add(a, a, out=out)


def test_mixing_devices_in_one_op():
    x0 = torch.ones(3, 3, device="openreg:0")
    x1 = torch.ones(3, 3, device="openreg:1")
    pattern = r"same device.*openreg:0 and openreg:1"
    for call in [
        lambda: x0 + x1,
        lambda: x0 @ x1,
        lambda: torch.cat([x0, x1]),
        lambda: torch.stack([x0, x1]),
        lambda: torch.where(x0 > 0, x0, x1),
        lambda: x0.add_(x1),
        lambda: x0.index_select(0, torch.tensor([0], device="openreg:1")),
    ]:
        with pytest.raises(RuntimeError, match=pattern):
            call()
    # CPU and openreg tensors (not 0-dim scalars) do not mix either.
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and cpu"):
        x0 + torch.ones(3, 3)
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and cpu"):
        torch.ones(3, 3).add_(x0)
    # Indices on another openreg device.
    with pytest.raises(RuntimeError, match=r"indices should be either on cpu or on the same device"):
        x0[torch.tensor([0, 1], device="openreg:1")]
    assert x0.sum().item() == 9.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.ones(3).to("openreg:5"),
        lambda: torch.ones(3, device="openreg:0").to("openreg:5"),
        lambda: torch.ones(3, device="openreg:1").to("openreg:2"),
        lambda: torch.empty(3, device="openreg:5"),
        lambda: torch.zeros(3, device="openreg:2"),
        lambda: torch.ones(3).openreg(7),
        lambda: torch.empty(3, device="openreg:5").copy_(torch.ones(3)),
    ],
    ids=["cpu_to_5", "dev0_to_5", "dev1_to_2", "empty_on_5", "zeros_on_2", "openreg_7", "empty_copy"],
)
def test_device_index_that_does_not_exist(call):
    with pytest.raises(RuntimeError, match=r"openreg device index \d+ is out of range: there are 2 devices"):
        call()


def test_copy_to_a_missing_device_leaves_the_source_intact():
    x = torch.arange(3.0, device="openreg:1")
    with pytest.raises(RuntimeError, match="index 5"):
        x.to("openreg:5", non_blocking=True)
    assert x.tolist() == [0.0, 1.0, 2.0]


def test_out_of_memory_is_a_clear_error():
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(8 << 30, dtype=torch.uint8, device="openreg:1")
    message = str(info.value)
    for part in ("device 1", "8.00 GiB", "8589934592 bytes", "allocated", "reserved", "free"):
        assert part in message, (part, message)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(torch.OutOfMemoryError, match=r"device 0.*free"):
        torch.ones(1 << 31, device="openreg:0")  # 8 GiB of float32
    with pytest.raises(torch.OutOfMemoryError, match="device 1"):
        torch.zeros(1).expand(1 << 31).to("openreg:1")  # a copy whose destination does not fit


def test_bad_memory_fraction():
    with pytest.raises(RuntimeError, match=r"fraction 1.5 .*device 0.*0..=1"):
        torch.openreg.set_per_process_memory_fraction(1.5)
    with pytest.raises(RuntimeError, match=r"fraction -0.1 .*device 1"):
        torch.openreg.set_per_process_memory_fraction(-0.1, 1)
    with pytest.raises(RuntimeError, match="fraction"):
        torch.openreg.set_per_process_memory_fraction(float("nan"))
    with pytest.raises(TypeError, match="fraction must be a float"):
        torch.openreg.set_per_process_memory_fraction("0.5")
    with pytest.raises(RuntimeError, match=r"index 5 .*2 devices"):
        torch.openreg.set_per_process_memory_fraction(0.5, 5)
    # A rejected fraction leaves the limit alone: a 3 GiB request still fits.
    x = torch.empty(3 << 30, dtype=torch.uint8, device="openreg:0")
    del x
    torch.openreg.empty_cache()


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.openreg.memory_stats(5),
        lambda: torch.openreg.memory_allocated(2),
        lambda: torch.openreg.max_memory_reserved("openreg:3"),
        lambda: torch.openreg.mem_get_info(7),
        lambda: torch.openreg.reset_peak_memory_stats(9),
        lambda: torch.accelerator.memory_stats(5),
        lambda: torch.accelerator.get_memory_info(5),
    ],
    ids=["stats", "allocated", "max_reserved", "mem_get_info", "reset_peak", "acc_stats", "acc_info"],
)
def test_memory_functions_reject_missing_devices(call):
    with pytest.raises(RuntimeError, match=r"index \d .*out of range: there are 2 devices"):
        call()


def test_other_misuse():
    x = torch.ones(3, device="openreg:0")
    _raises(RuntimeError, "only CPU memory can be pinned", lambda: torch.empty(3, device="openreg:0", pin_memory=True))
    _raises(RuntimeError, r"6 elements cannot be converted to Scalar", lambda: torch.ones(2, 3, device="openreg:0").item())
    _raises(RuntimeError, r"set_: expected openreg storage, got storage on cpu",
            lambda: torch.empty(0, device="openreg:0").set_(torch.ones(3).untyped_storage(), 0, (3,), (1,)))
    _raises(RuntimeError, r"shape '\[-1, 4\]' is invalid for input of size 3", lambda: x.view(-1, 4))
    _raises(IndexError, r"index 5 is out of bounds", lambda: x[torch.tensor([0, 5])])
    _raises(RuntimeError, r"can't be cast", lambda: torch.add(x, x, out=torch.empty(3, dtype=torch.int64, device="openreg:0")))
    assert x.tolist() == [1.0, 1.0, 1.0]


# A negative storage size must be refused (CPU raises); it must never corrupt
# the allocator. Run in a subprocess: the corruption aborts the process later.
NEGATIVE_STORAGE_RESIZE = script(
    "negative_storage_resize",
    """
    import torch, torch_openreg
    s = torch.empty(3, device="openreg:0").untyped_storage()
    RESULT["error"] = error_of(lambda: s.resize_(-5))
    RESULT["nbytes"] = s.nbytes()
    RESULT["allocated"] = torch.openreg.memory_allocated(0)
    for _ in range(3):
        a = torch.empty(100, device="openreg:0")
        del a
    del s
    RESULT["after"] = torch.openreg.memory_allocated(0)
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_negative_storage_resize_is_refused():
    data = NEGATIVE_STORAGE_RESIZE.result().check_ok()
    assert data["error"] is not None and data["error"].startswith("RuntimeError"), data
    assert data["nbytes"] == 12
    assert data["allocated"] == 512
    assert data["after"] == 0
