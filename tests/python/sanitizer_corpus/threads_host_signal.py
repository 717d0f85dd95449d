"""Host-thread signalling taken as stream ordering: thread A computes
features (Linear + relu) on a side stream and sets a ``threading.Event``;
thread B waits for it and consumes the features on its default stream. The
Python event only says that A has *launched* the work: the default
stream's read is not ordered after the side stream's write (a race).

Fix: A also records a ``torch.Event`` on the side stream after the work,
and B's stream waits on it (``current_stream().wait_event(ready)``) before
consuming.
"""

import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(16)
    layer = nn.Linear(32, 48)
    x_cpu = torch.randn(24, 32)
    with torch.no_grad():
        expected = F.relu(layer(reference(x_cpu))).sum(1)
        layer.to(DEV)
        x = prepare(x_cpu)
    side = torch.Stream(device=DEV)
    side.wait_stream(torch.openreg.current_stream())
    launched = threading.Event()
    shared, errors = {}, []

    def producer():  # thread A
        with torch.openreg.stream(side), torch.no_grad():
            shared["features"] = F.relu(layer(x))
            if fixed:
                ready = torch.Event(device=DEV)
                ready.record()
                shared["ready"] = ready
        launched.set()

    def consumer():  # thread B: its current stream is the default stream
        launched.wait()
        current = torch.openreg.current_stream()
        features = shared["features"]
        if fixed:
            current.wait_event(shared["ready"])
            features.record_stream(current)
        shared["out"] = features.sum(1).cpu()

    def run(fn):
        try:
            fn()
        except BaseException as e:  # noqa: B902 - re-raised on the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (consumer, producer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    if fixed:
        check(shared["out"], expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
