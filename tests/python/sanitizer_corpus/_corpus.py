"""Shared bits of the stream-sanitizer corpus (not a program itself: the
harness, tests/python/test_sanitizer_corpus.py, runs the modules whose names
do not start with an underscore).

Every program module has a docstring (the bug, and how its twin fixes it),
``EXPECTED`` (the kind of report, a key of
``torch.openreg.sanitizer.counts()``, that ``buggy()`` must make), and
``buggy()`` and ``fixed()``, each running the program once. The twins are
correct CUDA code once ``openreg`` reads ``cuda``: the sanitizer must never
report them. The bugs are in program order (the sanitizer checks each op at
its launch), so none of them depends on timing.

Inputs are made on the CPU with a seeded CPU generator, so each twin can
check its result against the same computation on the CPU. A blocking copy
to the device (``x.to(DEV)`` from pageable memory) is a host sync, which
orders it before everything launched after it; the programs' device inputs
are therefore normalized on the device (``prepare``), which is ordinary
asynchronous work on the current stream, as real input pipelines do.
"""

import torch
import torch.nn.functional as F

DEV = "openreg:0"
DEV1 = "openreg:1"


def prepare(x_cpu: torch.Tensor, device: str = DEV) -> torch.Tensor:
    """``x_cpu`` on ``device``, layer-normalized there on the current stream
    (asynchronous device work, unlike the blocking copy before it)."""
    return F.layer_norm(x_cpu.to(device), x_cpu.shape[-1:])


def reference(x_cpu: torch.Tensor) -> torch.Tensor:
    """What ``prepare`` computes, on the CPU."""
    return F.layer_norm(x_cpu, x_cpu.shape[-1:])


def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """``actual`` (already on the CPU) matches the CPU reference. Loose
    enough for kernels that ran single-threaded on a stream worker against
    the multi-threaded CPU ones."""
    assert actual.device.type == "cpu", actual.device
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
