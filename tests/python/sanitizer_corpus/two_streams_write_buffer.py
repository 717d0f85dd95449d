"""Write after write: two classifier heads share one scratch buffer for
their logits. Head A runs on a side stream, ``torch.matmul(f, w_a,
out=buf)`` then a softmax of ``buf``; head B runs on the default stream,
``torch.matmul(f, w_b, out=buf)``, without waiting for the side stream:
its write to ``buf`` is not ordered after head A's write (a race; head A's
pending read of ``buf`` is overwritten too).

Fix: ``main.wait_stream(side)`` before head B reuses the buffer.
"""

import torch

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(6)
    f_cpu, w_a_cpu, w_b_cpu = torch.randn(32, 64), torch.randn(64, 12), torch.randn(64, 12)
    f_ref = reference(f_cpu)
    expected_a, expected_b = torch.softmax(f_ref @ w_a_cpu, 1), torch.softmax(f_ref @ w_b_cpu, 1)
    main = torch.openreg.current_stream()
    side = torch.Stream(device=DEV)
    w_a, w_b = w_a_cpu.to(DEV), w_b_cpu.to(DEV)
    f = prepare(f_cpu)
    buf = torch.empty(32, 12, device=DEV)
    side.wait_stream(main)
    with torch.openreg.stream(side):
        torch.matmul(f, w_a, out=buf)
        probs_a = torch.softmax(buf, 1)
    if fixed:
        main.wait_stream(side)
    torch.matmul(f, w_b, out=buf)
    probs_b = torch.softmax(buf, 1)
    main.wait_stream(side)  # for probs_a
    probs_a.record_stream(main)
    got_a, got_b = probs_a.cpu(), probs_b.cpu()
    if fixed:
        check(got_a, expected_a)
        check(got_b, expected_b)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
