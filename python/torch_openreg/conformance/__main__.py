"""python -m torch_openreg.conformance --device NAME [--import MODULE] [--quick | --full]
[--only AREA_OR_CHECK,...] [--timeout S] [--json FILE] [--markdown FILE] [--list]"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch_openreg.conformance",
        description="Checks which of PyTorch's PrivateUse1 integration contracts a backend keeps, "
        "and where it computes differently from CPU. Exit status 0 only when no check failed.",
    )
    parser.add_argument("--device", required=True, help="the backend's device type, e.g. openreg")
    parser.add_argument("--import", dest="module", metavar="MODULE",
                        help="module that registers the backend (backend autoload is then off)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a sample of ops (the default)")
    mode.add_argument("--full", action="store_true", help="every op and module, every check")
    parser.add_argument("--only", help="comma-separated areas or check ids")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds every check may take (default: the check's own limit, else 60)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--markdown", metavar="FILE")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    caller_autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    # The runner reads the checks' metadata; it never loads a backend (Note
    # [Conformance processes]).
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch

    from torch_openreg.conformance import _report, _runner

    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
    try:
        checks = _runner.select_checks(only, args.full)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.list:
        for c in checks:
            flags = "".join([" (isolated)" if c.isolated else "", " (full only)" if c.full_only else ""])
            print(f"{c.id}{flags}: {c.expected}")
        return 0
    options = _runner.Options(device=args.device, module=args.module, full=args.full,
                              timeout_s=args.timeout,
                              progress=not args.no_progress, autoload=caller_autoload)
    runner = _runner.Runner(options)
    started = time.monotonic()
    results = runner.run(checks)
    header = {"device": args.device, "import": args.module, "mode": "full" if args.full else "quick",
              "torch": torch.__version__, "device_count": runner.device_count or 0,
              "seconds": time.monotonic() - started}
    print(_report.terminal(results, header))
    if args.json:
        with open(args.json, "w") as f:
            f.write(_report.as_json(results, header))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(_report.markdown(results, header))
    return 0 if _report.passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
