"""Freed without ``record_stream``, then reused: a batch of features is
allocated on the default stream and projected by a Linear on a side stream;
the program drops the features (``del``) as soon as the projection is
launched, and allocates a same-size buffer on the default stream, which it
writes at once (``torch.zeros``). The caching allocator hands the freed
block straight back to the default stream, so the new buffer's write may
overwrite the features while the side stream still reads them: reported
at the reuse.

Fix: ``feats.record_stream(side)`` before ``del``: the allocator keeps the
block from reuse until the side stream's work at the time of the free is
done.
"""

import torch
import torch.nn as nn

from _corpus import DEV, check

EXPECTED = "freed_in_use"

ROWS, COLS = 256, 256  # 256 KiB


def _program(fixed: bool) -> None:
    torch.manual_seed(8)
    proj = nn.Linear(COLS, 32)
    with torch.no_grad():
        proj.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        # The features' block and the accumulator's: nothing else is allocated
        # or freed on the default stream in between, so the accumulator's best
        # fit is the block just freed.
        feats = torch.randn(ROWS, COLS, device=DEV)
        freed = feats.data_ptr()
        feats_cpu = feats.cpu()
        side.wait_stream(main)
        with torch.openreg.stream(side):
            projected = proj(feats)
        if fixed:
            feats.record_stream(side)
        del feats
        accumulator = torch.zeros(ROWS, COLS, device=DEV)  # written right away
        if not fixed:
            # Else this program would not exercise the bug.
            assert accumulator.data_ptr() == freed, "the allocator did not reuse the freed block"
        main.wait_stream(side)
        projected.record_stream(main)
        out = (projected.sum(0) + accumulator[0, :32]).cpu()
    if fixed:
        expected = proj.cpu()(feats_cpu).sum(0)
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
