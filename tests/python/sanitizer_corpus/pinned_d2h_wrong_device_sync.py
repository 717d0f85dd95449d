"""Host synchronizes the wrong device before reading a pinned copy: a
model runs on openreg:1 and its embeddings are copied into a pinned host
buffer with ``non_blocking=True`` (on openreg:1's current stream); the
program then calls ``torch.openreg.synchronize()``, which waits for the
current device, openreg:0, only, and reads the buffer on the host (the
copy may still be writing it). Reported when the host touches the pinned
memory.

Fix: synchronize the device that runs the copy:
``torch.openreg.synchronize(emb.device)``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV1, check, prepare, reference

EXPECTED = "pinned_host_access"


def _program(fixed: bool) -> None:
    torch.manual_seed(12)
    encoder = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 16))
    x_cpu = torch.randn(24, 32)
    with torch.no_grad():
        expected = F.normalize(encoder(reference(x_cpu)), dim=1)
        encoder.to(DEV1)
        emb = F.normalize(encoder(prepare(x_cpu, DEV1)), dim=1)
        host_emb = torch.empty(24, 16, pin_memory=True)
        host_emb.copy_(emb, non_blocking=True)
        torch.openreg.synchronize(emb.device if fixed else None)
        similarity = host_emb @ host_emb.T  # on the host
    if fixed:
        check(host_emb, expected)
        check(similarity, expected @ expected.T)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
