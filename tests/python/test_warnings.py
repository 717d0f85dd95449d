"""A kernel's warnings reach Python's `warnings` as many times as on CPU
(Note [Kernel warnings] in cpp/device/device_memory.h), whether the op runs
inline, queued or on a busy stream, first call or cached plan."""

import warnings

import pytest
import torch


def _count_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def _uint8_mask_indexing(device):
    y = torch.randn(10, device=device)
    mask = torch.ones(10, dtype=torch.uint8, device=device)
    y.index_put_((mask,), y[mask], accumulate=True)
    return y


@pytest.mark.parametrize("busy", [False, True])
def test_uint8_mask_warns_as_often_as_on_cpu(busy):
    expected = _count_warnings(lambda: _uint8_mask_indexing("cpu"))
    assert len(expected) == 2
    for _ in range(3):  # first call (plan made) and cached plans alike
        if busy:
            torch.openreg._sleep(20)
        got = _count_warnings(lambda: _uint8_mask_indexing("openreg"))
        assert got == expected


def test_warning_of_a_kernel_on_a_worker_reaches_the_caller():
    x = torch.randn(4, 4, device="openreg")
    for _ in range(3):
        torch.openreg._sleep(20)  # the kernel runs on the stream's worker
        got = _count_warnings(lambda: torch.ones(8, device="openreg")[torch.ones(8, dtype=torch.uint8, device="openreg")])
        assert len(got) == 1 and "uint8" in got[0]
    del x
