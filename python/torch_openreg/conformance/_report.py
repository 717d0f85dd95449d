"""The run's report: a terminal table, JSON (schema in
docs/conformance.md) and Markdown."""

from __future__ import annotations

import json
from dataclasses import asdict

from torch_openreg.conformance._api import ERROR, FAIL, NOT_SUPPORTED, PASS, VERDICTS
from torch_openreg.conformance._runner import Result

SCHEMA_VERSION = 1


def counts_by_area(results: list[Result]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for r in results:
        table.setdefault(r.area, dict.fromkeys(VERDICTS, 0))[r.verdict] += 1
    return table


def totals(results: list[Result]) -> dict[str, int]:
    summary = dict.fromkeys(VERDICTS, 0)
    for r in results:
        summary[r.verdict] += 1
    return summary


def passed(results: list[Result]) -> bool:
    """Nothing failed and nothing met the unexpected."""
    return all(r.verdict in (PASS, NOT_SUPPORTED) for r in results)


def _rows(results: list[Result]) -> list[list[str]]:
    rows = [[area, *(str(n[v]) for v in VERDICTS)] for area, n in counts_by_area(results).items()]
    return rows + [["all", *(str(n) for n in totals(results).values())]]


def terminal(results: list[Result], header: dict) -> str:
    heading = ["area", *VERDICTS]
    rows = _rows(results)
    widths = [max(len(row[i]) for row in [heading, *rows]) for i in range(len(heading))]
    lines = [f"conformance of {header['device']} ({header['mode']}, torch {header['torch']}, "
             f"{header['device_count']} devices, {header['seconds']:.0f} s)", ""]
    for row in [heading, *rows]:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    for title, verdicts in (("failures", (FAIL, ERROR)), ("not supported", (NOT_SUPPORTED,))):
        chosen = [r for r in results if r.verdict in verdicts]
        if chosen:
            lines += ["", f"{title}:"]
            for r in chosen:
                lines.append(f"  {r.verdict.upper() if r.verdict != NOT_SUPPORTED else '-'} {r.id}: "
                             f"expected {r.expected}; {r.detail}")
    lines += ["", "PASSED" if passed(results) else "FAILED"]
    return "\n".join(lines)


def as_json(results: list[Result], header: dict) -> str:
    document = {"schema": SCHEMA_VERSION, **header, "passed": passed(results), "summary": totals(results),
                "areas": counts_by_area(results), "checks": [asdict(r) for r in results]}
    return json.dumps(document, indent=2)


def markdown(results: list[Result], header: dict) -> str:
    lines = [f"# Conformance of `{header['device']}`", "",
             f"{header['mode']} run, torch {header['torch']}, {header['device_count']} devices, "
             f"{header['seconds']:.0f} s: **{'passed' if passed(results) else 'failed'}**", "",
             "| area | " + " | ".join(VERDICTS) + " |", "|---" * (len(VERDICTS) + 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    lines += ["", "| check | verdict | expected | what happened |", "|---|---|---|---|"]
    for r in results:
        detail = r.detail.replace("|", "\\|")
        lines.append(f"| `{r.id}` | {r.verdict} | {r.expected.replace('|', chr(92) + '|')} | {detail} |")
    return "\n".join(lines) + "\n"
