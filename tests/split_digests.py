"""The bits of every float32 op_db op's results on openreg, run inline and
queued, as one digest per op (Note [Split kernels] in cpp/ops/kernel_split.h).

tests/python/test_split_kernels.py runs this at 1, 2 and 4 kernel threads
(OPENREG_KERNEL_THREADS) with chunks of a few elements
(OPENREG_SPLIT_ELEMENTS), so that op_db's small samples split too: the
digests must be the same at every thread count, and each op's inline run
must give the bits of its queued run.

  OPENREG_SPLIT_ELEMENTS=16 OPENREG_KERNEL_THREADS=2 python3 tests/split_digests.py out.json

Writes {"digests": {op: digest}, "inline_differs": [op, ...]}. A sample that
raises contributes its error's type to the digest. Ops drawing random
numbers are skipped (their values are compared by shape elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import sys

from opinfo_parity import VALUE_AGNOSTIC_OPS, meta_samples, moved_sample, op_db, values_compared

import torch

SAMPLES_PER_OP = 4


def feed(digest, value) -> None:
    """Adds the bits (and dtype and shape) of every tensor in `value`."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
        if value.is_complex():
            value = torch.view_as_real(value.resolve_conj())
        if value.dtype != torch.bool and value.numel() > 0:
            digest.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        elif value.numel() > 0:
            digest.update(value.contiguous().numpy().tobytes())
    elif isinstance(value, (list, tuple)):
        for v in value:
            feed(digest, v)
    else:
        digest.update(repr(value).encode())


def op_digest(op, queued: bool) -> str:
    digest = hashlib.sha256()
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    for i, (sample, placement) in enumerate(zip(samples, meta_samples(op, torch.float32, False))):
        if i >= SAMPLES_PER_OP:
            break
        if not values_compared(op.name, sample.kwargs):
            continue
        try:
            dev_input, dev_args, dev_kwargs = moved_sample(sample, placement)
            if queued:
                torch.openreg._sleep(1)
            feed(digest, op(dev_input, *dev_args, **dev_kwargs))
            torch.openreg.synchronize()
        except Exception as e:  # noqa: BLE001 - an error is part of the outcome
            digest.update(type(e).__name__.encode())
            try:
                torch.openreg.synchronize()  # a failure the error left parked
            except RuntimeError:
                pass
    return digest.hexdigest()


def main() -> int:
    ops = [
        op for op in op_db
        if op.supports_dtype(torch.float32, "cpu") and not any(r in op.name for r in VALUE_AGNOSTIC_OPS)
    ]
    digests, inline_differs = {}, []
    for op in ops:
        name = f"{op.name}.{op.variant_test_name}"
        queued = op_digest(op, queued=True)
        if op_digest(op, queued=False) != queued:
            inline_differs.append(name)
        digests[name] = queued
    with open(sys.argv[1], "w") as out:
        json.dump({"digests": digests, "inline_differs": inline_differs}, out)
    print(f"{len(digests)} ops, {len(inline_differs)} differ inline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
