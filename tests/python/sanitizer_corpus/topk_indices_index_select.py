"""Indices produced on a side stream, used on the default stream: a
retrieval step scores queries against keys on a side stream and takes the
top 3 keys per query (``torch.topk``, into preallocated index buffers);
the default stream gathers the matching values with ``index_select``
without waiting for the side stream, so it reads the indices unordered: a
race. (The index buffer is preallocated with zeros so that indices read
too early are still in range: the buggy run must not fail in the kernel.)

Fix: ``main.wait_stream(side)`` before ``index_select``.
"""

import torch

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _program(fixed: bool) -> None:
    torch.manual_seed(7)
    queries_cpu, keys_cpu, values_cpu = torch.randn(8, 16), torch.randn(50, 16), torch.randn(50, 4)
    top_cpu = torch.topk(reference(queries_cpu) @ keys_cpu.T, 3, dim=1).indices
    expected = values_cpu.index_select(0, top_cpu.flatten()).view(8, 3, 4).mean(1)
    main = torch.openreg.current_stream()
    side = torch.Stream(device=DEV)
    keys, values = keys_cpu.to(DEV), values_cpu.to(DEV)
    queries = prepare(queries_cpu)
    top_scores = torch.empty(8, 3, device=DEV)
    top = torch.zeros(8, 3, dtype=torch.long, device=DEV)
    side.wait_stream(main)
    with torch.openreg.stream(side):
        torch.topk(queries @ keys.T, 3, dim=1, out=(top_scores, top))
    if fixed:
        main.wait_stream(side)
    gathered = values.index_select(0, top.flatten()).view(8, 3, 4).mean(1)
    out = gathered.cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
