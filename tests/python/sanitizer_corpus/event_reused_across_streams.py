"""One event reused for two producers: two branches of a model (a Linear +
GELU each) run on two side streams, and the program records the same
``torch.Event`` after each branch. A record replaces the event's previous
point, so the default stream's ``wait_event`` covers only the branch
recorded last; concatenating the branches reads the first branch's output
unordered (a race).

Fix: one event per producer, each waited on by the consumer.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(18)
    branch_a, branch_b, head = nn.Linear(32, 16), nn.Linear(32, 16), nn.Linear(32, 4)
    x_cpu = torch.randn(12, 32)
    with torch.no_grad():
        x_ref = reference(x_cpu)
        expected = head(torch.cat([F.gelu(branch_a(x_ref)), F.gelu(branch_b(x_ref))], dim=1))
        for m in (branch_a, branch_b, head):
            m.to(DEV)
        main = torch.openreg.current_stream()
        s_a, s_b = torch.Stream(device=DEV), torch.Stream(device=DEV)
        x = prepare(x_cpu)
        s_a.wait_stream(main)
        s_b.wait_stream(main)
        done_a = torch.Event(device=DEV)
        done_b = torch.Event(device=DEV) if fixed else done_a  # the bug: one event for both
        with torch.openreg.stream(s_a):
            a = F.gelu(branch_a(x))
            done_a.record()
        with torch.openreg.stream(s_b):
            b = F.gelu(branch_b(x))
            done_b.record()
        main.wait_event(done_a)
        if fixed:
            main.wait_event(done_b)
        a.record_stream(main)
        b.record_stream(main)
        out = head(torch.cat([a, b], dim=1)).cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
