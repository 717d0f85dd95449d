"""``wait_stream`` issued before the work it should wait for: the program
sets up the ordering of its two streams once, right after creating the
side stream (``main.wait_stream(side)``), and only then launches the side
stream's work (a 1-D convolution + max-pool). A wait covers what the
stream has been given *at the time of the call*, here nothing: the default
stream's Linear reads the pooled features unordered (a race).

Fix: call ``main.wait_stream(side)`` after launching the side stream's
work, right before the consumer.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _features(conv, x):
    return F.max_pool1d(F.relu(conv(x)), 2).flatten(1)


def _program(fixed: bool) -> None:
    torch.manual_seed(17)
    conv, head = nn.Conv1d(4, 8, 3, padding=1), nn.Linear(8 * 16, 3)
    x_cpu = torch.randn(10, 4, 32)
    with torch.no_grad():
        expected = head(_features(conv, reference(x_cpu)))
        conv.to(DEV), head.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        x = prepare(x_cpu)
        side.wait_stream(main)
        if not fixed:
            main.wait_stream(side)  # too early: the side stream has nothing yet
        with torch.openreg.stream(side):
            feats = _features(conv, x)
        if fixed:
            main.wait_stream(side)
        feats.record_stream(main)
        out = head(feats).cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
