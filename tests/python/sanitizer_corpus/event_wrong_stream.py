"""Event waited on the wrong stream: attention weights are computed on a
side stream, which records ``ready`` after them; the program then waits on
``ready`` from its copy stream (``ready.wait(copy_stream)``) although the
consumer, ``weights @ v``, runs on the default stream. Nothing orders the
default stream's read of the weights after their write: a race.

Fix: the stream that consumes waits: ``ready.wait(main)``.
"""

import math

import torch

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _attention_weights(q, k):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def _program(fixed: bool) -> None:
    torch.manual_seed(2)
    q_cpu, k_cpu, v_cpu = torch.randn(3, 4, 16, 32).unbind(0)
    expected = _attention_weights(reference(q_cpu), reference(k_cpu)) @ reference(v_cpu)
    main = torch.openreg.current_stream()
    side, copy_stream = torch.Stream(device=DEV), torch.Stream(device=DEV)
    ready = torch.Event(device=DEV)
    q, k, v = prepare(q_cpu), prepare(k_cpu), prepare(v_cpu)
    side.wait_stream(main)
    with torch.openreg.stream(side):
        weights = _attention_weights(q, k)
        ready.record()
    ready.wait(main if fixed else copy_stream)
    if fixed:
        weights.record_stream(main)
    out = (weights @ v).cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
