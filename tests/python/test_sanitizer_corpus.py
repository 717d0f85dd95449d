"""The stream sanitizer against a corpus of buggy programs and their
corrected twins (tests/python/sanitizer_corpus/, one bug per module; its
_corpus.py says what a module holds): in "warn" mode every buggy program
is reported, with its expected kind, in each of 20 runs, and no twin is
ever reported, in the same process after the buggy runs. Also: "raise"
mode (OPENREG_SANITIZER=raise or 1) raises ``RuntimeError("openreg
sanitizer: ...")`` at the offending op, "warn" mode prints the reports at
exit and exits cleanly, OPENREG_SANITIZER=0 reports nothing, and the
``torch.openreg.sanitizer`` API (``enable`` as a context manager, ``mode``,
``counts``, ``clear``)."""

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from _openreg_util import clean_env, script

CORPUS = Path(__file__).resolve().parent / "sanitizer_corpus"
PROGRAMS = sorted(p.stem for p in CORPUS.glob("*.py") if not p.name.startswith("_"))
KINDS = {"race", "write_after_read", "freed_in_use", "pinned_host_access", "query_misuse"}
RUNS = 20
# A program used where any "race" program would do.
RACE_PROGRAM = "missing_wait_stream"

# Prepended to the scripts below: the corpus on the path, and a synchronize
# of every device (some programs use both).
_SETUP = f"""
import sys
sys.path.insert(0, {str(CORPUS)!r})
import torch, torch_openreg
san = torch.openreg.sanitizer

def synchronize_all():
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
"""

# One program, RUNS times buggy then RUNS times fixed, each run from a
# clean slate: no work pending, no reports.
_RUN_PROGRAM = (
    _SETUP
    + """
import importlib
program = importlib.import_module(NAME)

def runs(fn):
    out = []
    for _ in range(RUNS):
        synchronize_all()
        san.clear()
        fn()
        synchronize_all()
        out.append({"counts": san.counts(), "reports": [r[:1500] for r in san.reports()[:4]]})
    return out

RESULT["mode"] = san.mode()
RESULT["expected"] = program.EXPECTED
RESULT["buggy"] = runs(program.buggy)
RESULT["fixed"] = runs(program.fixed)
done(RESULT)
"""
)

CORPUS_RUNS = {
    name: script(
        f"sanitizer_corpus_{name}",
        f"NAME = {name!r}\nRUNS = {RUNS}\n" + _RUN_PROGRAM,
        env=clean_env(OPENREG_SANITIZER="warn"),
        timeout=120,
    )
    for name in PROGRAMS
}


def _readme_sanitizer_example() -> str:
    """The Python block of "Stream sanitizer" (docs/sanitizer-and-diagnostics.md), verbatim."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "sanitizer-and-diagnostics.md").read_text()
    section = page[page.index("## Stream sanitizer") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# The documented example (docs/sanitizer-and-diagnostics.md), as written, in fresh processes.
README_EXAMPLE_RUNS = [
    script(f"sanitizer_readme_example_{i}", _readme_sanitizer_example(), env=clean_env()) for i in range(3)
]


def _describe(runs) -> str:
    """The counts and first reports of the runs, for assertion messages."""
    lines = []
    for i, run in enumerate(runs):
        lines.append(f"run {i}: counts {run['counts']}")
        lines.extend("    " + report.replace("\n", "\n    ") for report in run["reports"])
    return "\n".join(lines)


def test_corpus_is_well_formed():
    assert len(PROGRAMS) >= 14, PROGRAMS
    sys.path.insert(0, str(CORPUS))
    try:
        for name in PROGRAMS:
            module = importlib.import_module(name)
            assert module.__doc__ and "Fix" in module.__doc__, f"{name}: the docstring names the bug and the fix"
            assert module.EXPECTED in KINDS, (name, module.EXPECTED)
            assert callable(module.buggy) and callable(module.fixed), name
    finally:
        sys.path.remove(str(CORPUS))


@pytest.mark.subprocess
@pytest.mark.parametrize("name", PROGRAMS)
def test_buggy_program_is_reported_every_run(name):
    data = CORPUS_RUNS[name].result().check_ok()
    assert data["mode"] == "warn"
    expected, runs = data["expected"], data["buggy"]
    assert len(runs) == RUNS
    missed = [i for i, run in enumerate(runs) if run["counts"][expected] == 0]
    assert not missed, (
        f"{name}: {len(missed)} of {RUNS} buggy runs made no {expected!r} report (runs {missed})\n" + _describe(runs)
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("name", PROGRAMS)
def test_fixed_program_is_never_reported(name):
    data = CORPUS_RUNS[name].result().check_ok()
    runs = data["fixed"]
    assert len(runs) == RUNS
    reported = [run for run in runs if any(run["counts"].values())]
    assert not reported, f"{name}: {len(reported)} of {RUNS} runs of the corrected twin were reported\n" + _describe(reported)


# ------------------------------------------------- modes from the environment

# A buggy "race" program, then its twin (the runtime stays usable after a
# raise, and the twin raises nothing).
_MODE_FROM_ENV = (
    _SETUP
    + f"""
import {RACE_PROGRAM} as program
RESULT["mode"] = san.mode()
RESULT["buggy_error"] = error_of(program.buggy)
synchronize_all()
RESULT["buggy_reports"] = san.report_count()
RESULT["fixed_error"] = error_of(program.fixed)
synchronize_all()
# enable() as a context manager restores the mode set by the environment.
with san.enable("warn"):
    RESULT["inside"] = san.mode()
RESULT["after"] = san.mode()
done(RESULT)
"""
)

MODE_FROM_ENV = {value: script(f"sanitizer_env_{value}", _MODE_FROM_ENV, env=clean_env(OPENREG_SANITIZER=value)) for value in ("raise", "1", "0")}


@pytest.mark.subprocess
@pytest.mark.parametrize("value", ["raise", "1"])
def test_raise_mode_raises_at_the_offending_op(value):
    data = MODE_FROM_ENV[value].result().check_ok()
    assert data["mode"] == "raise"
    error = data["buggy_error"]
    assert error is not None and error.startswith("RuntimeError: openreg sanitizer:"), error
    assert data["fixed_error"] is None, data["fixed_error"]
    assert (data["inside"], data["after"]) == ("warn", "raise")


@pytest.mark.subprocess
def test_zero_turns_the_sanitizer_off():
    data = MODE_FROM_ENV["0"].result().check_ok()
    assert data["mode"] == "off"
    assert data["buggy_error"] is None and data["buggy_reports"] == 0
    assert (data["inside"], data["after"]) == ("warn", "off")


WARN_AT_EXIT = script(
    "sanitizer_warn_at_exit",
    _SETUP
    + f"""
import {RACE_PROGRAM} as program
program.buggy()
synchronize_all()
RESULT["reports"] = san.reports()
done(RESULT)
""",
    env=clean_env(OPENREG_SANITIZER="warn"),
)


@pytest.mark.subprocess
def test_warn_mode_exits_cleanly_and_prints_the_reports_at_exit():
    result = WARN_AT_EXIT.result()
    data = result.check_ok()  # exit status 0: nothing was raised
    assert data["reports"], f"no report\n{result.describe()}"
    for report in data["reports"]:
        first_line = report.splitlines()[0]
        assert first_line in result.stderr, f"report not printed at exit: {first_line!r}\n{result.describe()}"


# ------------------------------------------------------------------ the API


@pytest.fixture
def sanitizer():
    """``torch.openreg.sanitizer``, put back in its mode afterwards."""
    san = torch.openreg.sanitizer
    before = san.mode()
    yield san
    if before == "off":
        san.disable()
    else:
        san.enable(before)


def test_enable_as_a_context_manager_restores_the_previous_mode(sanitizer):
    sanitizer.disable()
    assert sanitizer.mode() == "off" and not sanitizer.is_enabled()
    with sanitizer.enable("warn"):
        assert sanitizer.mode() == "warn" and sanitizer.is_enabled()
        with sanitizer.enable("raise"):
            assert sanitizer.mode() == "raise"
        assert sanitizer.mode() == "warn"
    assert sanitizer.mode() == "off" and not sanitizer.is_enabled()


def test_enable_without_with_stays_on_and_defaults_to_raise(sanitizer):
    sanitizer.disable()
    sanitizer.enable()
    assert sanitizer.mode() == "raise" and sanitizer.is_enabled()
    sanitizer.enable("warn")
    assert sanitizer.mode() == "warn"
    sanitizer.disable()
    assert sanitizer.mode() == "off" and not sanitizer.is_enabled()


def test_enable_rejects_an_unknown_mode(sanitizer):
    sanitizer.disable()
    with pytest.raises((ValueError, RuntimeError)):
        sanitizer.enable("loud")
    assert sanitizer.mode() == "off"


def test_counts_has_exactly_the_report_kinds():
    san = torch.openreg.sanitizer
    counts = san.counts()
    assert set(counts) == KINDS
    assert all(isinstance(n, int) and n >= 0 for n in counts.values()), counts
    assert san.report_count() == sum(counts.values())


# Reports, counts and clear(), with the sanitizer turned on by enable() in a
# process that started with it off.
API = script(
    "sanitizer_api",
    _SETUP
    + f"""
import {RACE_PROGRAM} as program
RESULT["initial"] = san.mode()
with san.enable("warn"):
    program.buggy()
    synchronize_all()
    RESULT["counts"] = san.counts()
    RESULT["report_count"] = san.report_count()
    RESULT["reports"] = san.reports()
    san.clear()
    RESULT["cleared"] = [san.counts(), san.report_count(), san.reports()]
    program.buggy()  # reports again after clear()
    synchronize_all()
    RESULT["again"] = san.counts()
RESULT["after"] = san.mode()
san.clear()
program.buggy()  # off: nothing is reported
synchronize_all()
RESULT["off"] = san.report_count()
done(RESULT)
""",
)


@pytest.mark.subprocess
def test_reports_counts_and_clear():
    data = API.result().check_ok()
    assert data["initial"] == "off" and data["after"] == "off"
    counts, reports = data["counts"], data["reports"]
    assert counts["race"] >= 1, counts
    assert data["report_count"] == sum(counts.values()) == len(reports), data
    assert all(isinstance(r, str) and r for r in reports), reports
    assert data["cleared"] == [dict.fromkeys(KINDS, 0), 0, []]
    assert data["again"]["race"] >= 1, data["again"]
    assert data["off"] == 0


@pytest.mark.subprocess
def test_readme_example_reports_its_race_in_fresh_processes():
    """The documented example (a side-stream Linear + relu consumed by argmax
    on the default stream without a wait) reports exactly that one race,
    naming both ops, in each of three fresh processes, and exits with 0."""
    for run in README_EXAMPLE_RUNS:
        result = run.result()
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert "'race': 1, 'write_after_read': 0" in result.stdout, result.stdout
        assert 'kernel "aten::argmax"' in result.stdout and 'kernel "aten::relu"' in result.stdout, result.stdout
        assert "stream-ordering reports" in result.stderr, result.stderr  # printed at exit ("warn")
