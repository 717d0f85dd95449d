"""``record_stream`` on the wrong stream: token embeddings are gathered on
the default stream and encoded on a side stream (Linear + tanh); before
dropping them the program calls ``emb.record_stream(main)``, the stream
that allocated them (a no-op), instead of the side stream that reads them.
The next same-size allocation on the default stream reuses the block and
writes it while the side stream's read is not ordered before: reported at
the reuse.

Fix: ``emb.record_stream(side)``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check

EXPECTED = "freed_in_use"


def _program(fixed: bool) -> None:
    torch.manual_seed(9)
    table_cpu, encoder = torch.randn(1000, 128), nn.Linear(128, 16)
    tokens_cpu = torch.randint(0, 1000, (384,))
    with torch.no_grad():
        expected = torch.tanh(encoder(F.embedding(tokens_cpu, table_cpu))).mean(0)
        encoder.to(DEV)
        table, tokens = table_cpu.to(DEV), tokens_cpu.to(DEV)
        main = torch.openreg.current_stream()
        side = torch.Stream(device=DEV)
        emb = F.embedding(tokens, table)  # 384 x 128 floats, on the default stream
        freed = emb.data_ptr()
        side.wait_stream(main)
        with torch.openreg.stream(side):
            encoded = torch.tanh(encoder(emb))
        emb.record_stream(side if fixed else main)
        del emb
        mask = torch.ones(384, 128, device=DEV)  # the same size: the freed block, written at once
        if not fixed:
            # Else this program would not exercise the bug.
            assert mask.data_ptr() == freed, "the allocator did not reuse the freed block"
        main.wait_stream(side)
        encoded.record_stream(main)
        out = (encoded * mask[:, :16]).mean(0).cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
