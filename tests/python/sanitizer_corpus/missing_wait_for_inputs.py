"""The side stream does not wait for its inputs: a batch is normalized on
the default stream and a side stream runs the model on it at once, without
``side.wait_stream(main)``. The side stream's Linear reads the batch whose
write (on the default stream) is not ordered before the read: a race. (The
classic mirror image of a missing wait on the consumer side.)

Fix: ``side.wait_stream(main)`` before launching work on the side stream.
"""

import torch
import torch.nn as nn

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 8))
    x_cpu = torch.randn(32, 48)
    with torch.no_grad():
        expected = model(reference(x_cpu)).log_softmax(1)
        model.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        x = prepare(x_cpu)  # on the default stream
        if fixed:
            side.wait_stream(main)
        with torch.openreg.stream(side):
            logp = model(x).log_softmax(1)
        main.wait_stream(side)
        logp.record_stream(main)
        out = logp.cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
