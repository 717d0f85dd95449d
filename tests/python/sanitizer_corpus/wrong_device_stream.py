"""A stream of the wrong device orders the work: a two-stage pipeline runs
stage 0 on a stream of openreg:0 and stage 1 on a stream of openreg:1. The
driver code runs with openreg:1 current, so before stage 0 it calls
``s0.wait_stream(torch.openreg.current_stream())``, which is openreg:1's
stream: stage 0's Linear then reads the batch, normalized on openreg:0's
current stream, unordered (a race).

Fix: wait on the stream of the device that made the batch,
``torch.openreg.current_stream(x.device)``. The hand-off to stage 1 is a
correct cross-device wait in both versions: ``s1.wait_stream(s0)`` (a
stream of openreg:1 waiting on one of openreg:0), then the result is read
on openreg:1's current stream after it waits on ``s1``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, DEV1, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(4)
    stage0, stage1 = nn.Linear(32, 64), nn.Linear(64, 10)
    x_cpu = torch.randn(16, 32)
    with torch.no_grad():
        expected = F.log_softmax(stage1(F.relu(stage0(reference(x_cpu)))), dim=1)
        stage0.to(DEV), stage1.to(DEV1)
        s0, s1 = torch.Stream(device=DEV), torch.Stream(device=DEV1)
        x = prepare(x_cpu)  # on openreg:0's current stream
        with torch.openreg.device(1):  # the driver works on device 1
            s0.wait_stream(torch.openreg.current_stream(x.device) if fixed else torch.openreg.current_stream())
            with torch.openreg.stream(s0):
                h = F.relu(stage0(x))
                # The copy to device 1 runs on the source device's current stream (s0).
                h1 = h.to(DEV1, non_blocking=True)
            s1.wait_stream(s0)  # across devices
            with torch.openreg.stream(s1):
                logp = F.log_softmax(stage1(h1), dim=1)
            torch.openreg.current_stream().wait_stream(s1)
            logp.record_stream(torch.openreg.current_stream())
            out = logp.cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
