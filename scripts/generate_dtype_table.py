"""Derives openreg's dtype table (cpp/generated/dtype_table.h) from
PyTorch's op_db.

Note [Dtype policy] in cpp/ops/dtype_policy.h says what the table does. It is
derived here, never written by hand: every sample of every OpInfo runs on
openreg at every dtype PyTorch declares for it on CPU or CUDA (CUDA as on a
current GPU: torch_openreg/_op_db.py), forward and, at floating and complex
dtypes, backward too, and every sparse sample of every layout it declares
(forward only; Note [Sparse dtype rules] in cpp/ops/dtype_policy.h: a sparse
kernel's rules are named "<op>/Sparse" or "<op>/SparseCsr"), under
OPENREG_DTYPES=record, which
notes the (aten op, dtype) of each kernel call the sample reaches and
computes a dtype the CPU kernel refuses in the first wider dtype it accepts.
Then, per (aten op, dtype):
  - computed wider while running an OpInfo at a dtype CUDA supports: the
    table computes it in that dtype;
  - reached while running an OpInfo at a dtype CPU supports and CUDA does
    not, and by no sample of a dtype CUDA supports: the table refuses it.
A structured op's functional and out= forms share their rules (CUDA computes
both with one kernel, while op_db's samples mostly reach the functional one).

  python3 scripts/generate_dtype_table.py            # rewrite the table
  python3 scripts/generate_dtype_table.py --check    # exit 1 if it is stale
  python3 scripts/generate_dtype_table.py --report   # also print every pair's outcome

It runs in a few minutes (samples run on openreg in this process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from collections import defaultdict

from generated_files import write_or_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "cpp", "generated", "dtype_table.h")
ENV = {"OPENREG_DTYPES": "record", "OPENREG_LAUNCH_BLOCKING": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}


def in_recording_process(argv: list[str]) -> int:
    """Runs this script again with the recording options set."""
    env = dict(os.environ, **ENV)
    return subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=env).returncode


def derive():
    """(rules, outcomes): rules maps (aten op, dtype name) to the dtype name
    it computes in, or None when refused, each with the OpInfos that led to
    it; outcomes says for each CUDA-only and CPU-only (OpInfo, dtype) what
    the table does for it."""
    warnings.simplefilter("ignore")  # the samples' own deprecation warnings
    import torch
    import torch_openreg
    from torch_openreg._op_db import c10_name, cpu_dtypes, cuda_dtypes, load_op_db, sparse_layout_samples

    record = torch_openreg._C._recorded_kernel_dtypes
    op_db = load_op_db()
    allowed = set()  # (op, dtype) reached at a dtype CUDA supports
    widened = defaultdict(set)  # (op, dtype, wide) -> OpInfo names
    refusable = defaultdict(set)  # (op, dtype) -> OpInfo names of CPU-only pairs
    cpu_only_reached = {}  # (OpInfo, dtype) -> ops reached at that dtype
    cuda_only_widened = {}  # (OpInfo, dtype) -> ops widened
    for op in op_db:
        cuda, cpu = cuda_dtypes(op), cpu_dtypes(op)
        label = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        for dtype in sorted(cuda | cpu, key=str):
            dtype_name = c10_name(dtype)
            calls = set()
            backward = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
            for requires_grad in (False, True) if backward else (False,):
                for sample in _samples(op, dtype, requires_grad):
                    record()  # the sample's own making is not the op's
                    _run(op, sample, requires_grad)
                    calls |= {tuple(line.split("\t")) for line in record().splitlines()}
            for layout in _SPARSE_LAYOUTS:
                if not op.supports_sparse_layout(getattr(torch, layout)):
                    continue
                for _, _, sample in _drawn(sparse_layout_samples, op, getattr(torch, layout), dtype, "openreg"):
                    record()
                    _run(op, sample, False)
                    calls |= {tuple(line.split("\t")) for line in record().splitlines()}
            if dtype in cuda:
                allowed |= {(name, dt) for name, dt, _ in calls}
                for name, dt, wide in calls:
                    if wide != dt:
                        widened[(name, dt, wide)].add(label)
                if dtype not in cpu:
                    cuda_only_widened[(label, dtype_name)] = sorted({n for n, dt, w in calls if w != dt})
            else:
                reached = {name for name, dt, _ in calls if dt == dtype_name}
                cpu_only_reached[(label, dtype_name)] = reached
                for name in reached:
                    refusable[(name, dtype_name)].add(label)
    # An op that an OpInfo of its own name declares for CUDA at a dtype is
    # never refused there, even where no sample reaches it (add.out).
    declared = {(name, c10_name(dtype)) for op in op_db for name in _aten_names(op) for dtype in cuda_dtypes(op)}
    rules = {}
    for (name, dtype, wide), labels in widened.items():
        rules[(name, dtype)] = (wide, labels)
    for (name, dtype), labels in refusable.items():
        if (name, dtype) not in allowed and (_base_name(name), dtype) not in declared:
            rules[(name, dtype)] = (None, labels)
    for forms in _structured_forms(torch):
        for (name, dtype), rule in list(rules.items()):
            if name in forms:
                for other in forms:
                    if (other, dtype) not in rules and (other, dtype) not in allowed:
                        rules[(other, dtype)] = rule
    outcomes = {
        "cuda_only": cuda_only_widened,
        "cpu_only": {
            pair: sorted(n for n in reached if rules.get((n, pair[1]), ("x",))[0] is None)
            for pair, reached in cpu_only_reached.items()
        },
    }
    return rules, outcomes


def _structured_forms(torch) -> list:
    """(functional, out=) name pairs of the structured ops, e.g.
    ("aten::exp", "aten::exp.out"): openreg sends the functional form to its
    fallback or its own kernel (Note [Composites that differ from CPU] in
    cpp/ops/fallback.cpp), so each form is recorded under its own name. CUDA
    computes both forms (and the in-place one, which reaches the out= form)
    with one kernel, so a rule recorded on one holds for the other: op_db's
    samples call the functional form, while `out=` and in-place calls reach
    the out= form."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    pairs = []
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.partition(".")
        if not base.startswith("aten::") or not has_kernel(name, "CPU"):
            continue
        if not has_kernel(name, "CompositeExplicitAutogradNonFunctional"):
            continue
        packet = getattr(torch.ops.aten, base[len("aten::"):])
        schema = getattr(packet, overload or "default")._schema
        if schema.is_mutable:
            continue
        for candidate in packet.overloads():
            out = getattr(packet, candidate)._schema
            if _is_out_form(schema, out):
                pairs.append((name, f"{base}.{candidate}"))
                break
    return pairs


def _is_out_form(functional, out) -> bool:
    """Whether `out` takes `functional`'s arguments, then one out= tensor per
    result (as Note [Out variants] in cpp/ops/fallback.cpp matches them)."""
    arguments, out_arguments = functional.arguments, out.arguments
    if len(out_arguments) != len(arguments) + len(functional.returns):
        return False
    for i, a in enumerate(out_arguments):
        if i < len(arguments):
            if a.is_out or a.name != arguments[i].name or str(a.type) != str(arguments[i].type):
                return False
        elif not a.is_out:
            return False
    return True


def _aten_names(op) -> set:
    """The aten op names an OpInfo stands for: its aten_name, its name's last
    part (nn.functional.avg_pool2d: avg_pool2d) and its aliases'."""
    names = {op.aten_name, op.name.split(".")[-1]}
    names |= {alias.name.split(".")[-1] for alias in getattr(op, "aliases", ())}
    return names


def _base_name(aten_op: str) -> str:
    """'add' for 'aten::add.out' (and for a sparse kernel's 'aten::add.out/Sparse')."""
    return aten_op.split("::")[-1].split("/")[0].split(".")[0]


_SPARSE_LAYOUTS = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")


def _drawn(samples, *args):
    """`samples(*args)`, ending quietly where drawing them fails (a sample
    function refusing the dtype)."""
    try:
        yield from samples(*args)
    except Exception:
        return


def _samples(op, dtype, requires_grad: bool):
    try:
        yield from op.sample_inputs("openreg", dtype, requires_grad=requires_grad)
    except Exception:
        return


def _run(op, sample, requires_grad: bool) -> None:
    """The sample's forward, and with `requires_grad` its backward too (the
    kernels training reaches)."""
    import torch

    try:
        out = op(sample.input, *sample.args, **sample.kwargs)
        if requires_grad:
            outs = [t for t in _tensors(sample.output_process_fn_grad(out)) if t.requires_grad]
            leaves = [t for t in _tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
            if outs and leaves:
                torch.autograd.grad(outs, leaves, [torch.ones_like(t) for t in outs], allow_unused=True)
        torch.openreg.synchronize()
    except Exception:
        pass


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def render(rules) -> str:
    import torch

    lines = [
        "// Generated by scripts/generate_dtype_table.py from op_db of torch "
        f"{torch.__version__.split('+')[0]}: do not edit.",
        "// Each rule names the OpInfos it was derived from (Note [Dtype policy] in",
        "// cpp/ops/dtype_policy.h).",
        "#pragma once",
        "",
        "#include <array>",
        "",
        "#include <c10/core/ScalarType.h>",
        "",
        "namespace openreg {",
        "",
        "// A kernel call of `op` whose dtype is `dtype` computes in `compute`, or is",
        "// refused when `compute` is Undefined.",
        "struct DtypeRule {",
        "  const char* op;",
        "  c10::ScalarType dtype;",
        "  c10::ScalarType compute;",
        "};",
        "",
        f"inline constexpr std::array<DtypeRule, {len(rules)}> kDtypeRules{{{{",
    ]
    for (name, dtype), (wide, labels) in sorted(rules.items()):
        what = f"CUDA computes {dtype}" if wide else f"CUDA refuses {dtype}"
        shown = ", ".join(sorted(labels)[:4]) + (", ..." if len(labels) > 4 else "")
        lines.append(f"    // {what}: {shown}")
        lines.append(f'    {{"{name}", c10::ScalarType::{dtype}, c10::ScalarType::{wide or "Undefined"}}},')
    lines += ["}};", "", "} // namespace openreg", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with cpp/generated/dtype_table.h instead of writing it")
    parser.add_argument("--report", action="store_true", help="print what the table does for each differing pair")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in ENV.items()):
        return in_recording_process(sys.argv[1:])
    rules, outcomes = derive()
    text = render(rules)
    if args.report:
        for (label, dtype), ops in sorted(outcomes["cuda_only"].items()):
            print(f"CUDA-only {dtype:14} {label}: " + (f"computed wider in {', '.join(ops)}" if ops else "runs as it is"))
        for (label, dtype), ops in sorted(outcomes["cpu_only"].items()):
            print(f"CPU-only  {dtype:14} {label}: " + (f"refused at {', '.join(ops)}" if ops else "NOT REFUSED"))
    refused = sum(1 for ops in outcomes["cpu_only"].values() if ops)
    print(f"{len(rules)} rules; CPU-only pairs refused: {refused} of {len(outcomes['cpu_only'])}")
    return write_or_check(TABLE, text, args.check, __file__)


if __name__ == "__main__":
    sys.exit(main())
