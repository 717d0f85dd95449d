"""Pinned device-to-host copy read too early: class probabilities are
copied into a pinned host buffer with ``non_blocking=True`` and the host
reads the buffer (``argmax`` on the CPU) without synchronizing first: the
copy may still be writing it. Reported when the host touches the pinned
memory.

Fix: record an event after the copy and ``synchronize()`` it before the
host reads the buffer.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "pinned_host_access"


def _program(fixed: bool) -> None:
    torch.manual_seed(10)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x_cpu = torch.randn(64, 32)
    with torch.no_grad():
        expected = F.softmax(model(reference(x_cpu)), dim=1)
        model.to(DEV)
        probs = F.softmax(model(prepare(x_cpu)), dim=1)
        host_probs = torch.empty(64, 10, pin_memory=True)
        host_probs.copy_(probs, non_blocking=True)
        if fixed:
            copied = torch.Event(device=DEV)
            copied.record()
            copied.synchronize()
        labels = host_probs.argmax(1)  # on the host
    if fixed:
        check(host_probs, expected)
        assert torch.equal(labels, expected.argmax(1))


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
