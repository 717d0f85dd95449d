"""A conformance child process: imports the backend under test, runs the
checks it is given in order, and writes one JSON line per event to the file
descriptor the runner passed it (`--result-fd`):

  {"event": "ready", "device_count": N}         the backend imported
  {"event": "import_failed", "detail": "..."}   it did not; nothing runs
  {"event": "start", "id": "area.name"}         a check begins
  {"event": "result", "id": ..., "verdict": ..., "detail": ..., "seconds": ...}

The runner learns which check was running when the process dies or hangs
from the last "start" without its "result" (Note [Conformance processes] in
_runner.py). Launched as `python -m torch_openreg.conformance._child`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
import traceback

from torch_openreg.conformance import _api


def _emit(fd: int, **event) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def _import_backend(device: str, module: str | None) -> str | None:
    """Imports torch and the backend; returns why it is unusable, or None."""
    try:
        import torch

        if module is not None:
            importlib.import_module(module)
        loaded = torch._C._get_privateuse1_backend_name()
    except BaseException as error:  # noqa: B902 - any import failure is reported
        return "importing the backend raised " + _api.first_line(error)
    if loaded != device:
        how = f"importing {module}" if module else "torch's backend autoload"
        return f"after {how} the PrivateUse1 backend is named {loaded!r}, not {device!r} (pass --import MODULE)"
    return None


def _run(check, backend) -> tuple[str, str]:
    try:
        happened = check.function(backend)
        return _api.PASS, happened or ""
    except _api.NotSupported as reason:
        return _api.NOT_SUPPORTED, str(reason)
    except _api.Failed as failure:
        return _api.FAIL, str(failure)
    except BaseException as error:  # noqa: B902 - the check met the unexpected
        where = traceback.extract_tb(error.__traceback__)[-1]
        return _api.ERROR, f"raised {_api.first_line(error)} (at {os.path.basename(where.filename)}:{where.lineno})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", required=True)
    parser.add_argument("--import", dest="module")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--checks", required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args()
    fd = args.result_fd

    problem = _import_backend(args.device, args.module)
    if problem is not None:
        _emit(fd, event="import_failed", detail=problem)
        return
    checks = _api.registered()
    backend = _api.Backend(args.device, args.full, args.module)
    _emit(fd, event="ready", device_count=backend.device_count)
    for check_id in args.checks.split(","):
        _emit(fd, event="start", id=check_id)
        started = time.monotonic()
        verdict, detail = _run(checks[check_id], backend)
        _emit(fd, event="result", id=check_id, verdict=verdict, detail=detail, seconds=time.monotonic() - started)

if __name__ == "__main__":
    main()
