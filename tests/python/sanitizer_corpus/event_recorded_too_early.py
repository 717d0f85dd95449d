"""Event recorded before the work it should cover: a side stream pools
embeddings (``F.embedding`` + mean) for a classifier, but ``pooled_ready``
is recorded on the side stream before the pooling is launched. The default
stream waits on the event, which covers nothing of the pooling, and its
Linear reads the pooled features unordered: a race.

Fix: record the event after the work it marks.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(3)
    table, classifier = torch.randn(100, 24), nn.Linear(24, 5)
    tokens_cpu = torch.randint(0, 100, (8, 12))
    with torch.no_grad():
        expected = classifier(F.embedding(tokens_cpu, table).mean(1)).argmax(1)
        classifier.to(DEV)
        table = table.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        pooled_ready = torch.Event(device=DEV)
        tokens = tokens_cpu.to(DEV)
        side.wait_stream(main)
        with torch.openreg.stream(side):
            if not fixed:
                pooled_ready.record()
            pooled = F.embedding(tokens, table).mean(1)
            if fixed:
                pooled_ready.record()
        main.wait_event(pooled_ready)
        pooled.record_stream(main)
        labels = classifier(pooled).argmax(1).cpu()
    if fixed:
        assert torch.equal(labels, expected), (labels, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
