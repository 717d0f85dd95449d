"""Missing ``wait_stream``: a hidden layer (Linear + relu) is computed on a
side stream and consumed by the output layer (Linear + softmax) on the
default stream, which never waits for the side stream. The output layer
reads activations whose write is not ordered before the read: a race.

Fix: ``main.wait_stream(side)`` before the consumer, and
``h.record_stream(main)`` since the default stream now uses memory that was
allocated on the side stream.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(0)
    hidden, head = nn.Linear(32, 64), nn.Linear(64, 10)
    x_cpu = torch.randn(16, 32)
    with torch.no_grad():
        expected = F.softmax(head(F.relu(hidden(reference(x_cpu)))), dim=1)
        hidden.to(DEV), head.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        x = prepare(x_cpu)
        side.wait_stream(main)  # the side stream reads x, made on the default stream
        with torch.openreg.stream(side):
            h = F.relu(hidden(x))
        if fixed:
            main.wait_stream(side)
            h.record_stream(main)
        probs = F.softmax(head(h), dim=1)
        out = probs.cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
