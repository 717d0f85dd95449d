"""``Event.query()`` taken as covering work launched after the event was
recorded: a side stream computes hidden features, records ``ready``, and
then goes on to compute the output probabilities; the host polls
``while not ready.query()`` and then reads the probabilities on the default
stream. ``query()`` returning True only says that the work before the
record is done: the probabilities' write is not ordered before the read.

Fix: record the event after the last op whose result the host waits for.
(Polling ``query()`` until True is then a host synchronization with the
whole side-stream work, so the default stream needs no wait of its own.)
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, prepare, reference

EXPECTED = "query_misuse"


def _program(fixed: bool) -> None:
    torch.manual_seed(13)
    hidden, head = nn.Linear(32, 64), nn.Linear(64, 6)
    x_cpu = torch.randn(20, 32)
    with torch.no_grad():
        expected = F.softmax(head(F.relu(hidden(reference(x_cpu)))), dim=1).argmax(1)
        hidden.to(DEV), head.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        ready = torch.Event(device=DEV)
        x = prepare(x_cpu)
        side.wait_stream(main)
        with torch.openreg.stream(side):
            h = F.relu(hidden(x))
            if not fixed:
                ready.record()
            probs = F.softmax(head(h), dim=1)
            if fixed:
                ready.record()
        while not ready.query():
            pass
        labels = probs.argmax(1).cpu()  # on the default stream
    if fixed:
        assert torch.equal(labels, expected), (labels, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
