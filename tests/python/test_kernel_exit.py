"""A custom kernel that captures a tensor never crashes the process at exit.

The documented example ("Custom kernels" in docs/custom-kernels-and-libtorch.md:
a kernel JIT-built with torch.utils.cpp_extension.load that captures the
tensor it scales) used to end with ``terminate called without an active
exception`` in about half of its runs: the stream's worker dropped the
kernel's captured tensor, whose Python object needs the GIL to be released,
while the interpreter was finalizing, and CPython ends a thread that takes the
GIL then (Note [Host exit] in src/runtime/lifecycle.rs). The example's own code is
taken from that page, built once, then run in many fresh processes (the
failure depends on timing), a few at a time.
"""

import glob
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from _openreg_util import clean_env

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "custom-kernels-and-libtorch.md")
RUNS = 20
# Fresh interpreters at once: each spends ~2 s of CPU importing torch.
PARALLEL = 2
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 120
# What an abort at exit prints (libstdc++, the shell, CPython).
CRASH_SIGNS = ("terminate called", "Aborted", "core dumped", "Fatal Python error", "Segmentation fault")

pytestmark = pytest.mark.subprocess


def readme_example() -> tuple[str, str]:
    """The C++ and Python code blocks of "Custom kernels" (docs/custom-kernels-and-libtorch.md)."""
    with open(DOC) as f:
        section = f.read().split("## Custom kernels", 1)[1].split("\n## ", 1)[0]
    cpp = re.search(r"```cpp\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return cpp, python


class Example:
    """The documented example in a directory of its own (its extension builds
    into ``ext/``), with variants of its Python script."""

    def __init__(self, root: str):
        self.root = root
        cpp, python = readme_example()
        with open(os.path.join(root, "my_ops.cpp"), "w") as f:
            f.write(cpp)
        lines = python.rstrip("\n").split("\n")
        self.setup, self.launch = "\n".join(lines[:-1]) + "\n", lines[-1] + "\n"
        assert self.launch.startswith("torch.ops.my_ops.scale_("), "the documented example no longer ends with its launch"
        self.python = python
        self.env = clean_env(TORCH_EXTENSIONS_DIR=os.path.join(root, "ext"))

    def run(self, name: str, code: str) -> subprocess.CompletedProcess:
        path = os.path.join(self.root, name + ".py")
        with open(path, "w") as f:
            f.write(code)
        return subprocess.run(
            [sys.executable, path], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )

    def run_many(self, scripts: dict[str, str]) -> dict[str, subprocess.CompletedProcess]:
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            futures = {name: pool.submit(self.run, name, code) for name, code in scripts.items()}
            return {name: future.result() for name, future in futures.items()}


def describe(name: str, proc: subprocess.CompletedProcess) -> str:
    return f"--- {name}: rc={proc.returncode}\n--- stdout:\n{proc.stdout[-2000:]}\n--- stderr:\n{proc.stderr[-3000:]}"


def crashes(results: dict[str, subprocess.CompletedProcess], expected_rc: int) -> list[str]:
    """The runs that did not end with ``expected_rc`` or that printed signs
    of an abort."""
    return [
        describe(name, proc)
        for name, proc in results.items()
        if proc.returncode != expected_rc or any(sign in proc.stderr for sign in CRASH_SIGNS)
    ]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Example:
    """The documented example, built by running it once as written."""
    ex = Example(str(tmp_path_factory.mktemp("readme_kernel")))
    # Compiles my_ops (~15 s here); how this run exits is checked with the others.
    ex.first_run = ex.run("readme_build", ex.python)
    built = glob.glob(os.path.join(ex.root, "ext", "my_ops*", "my_ops*.so"))
    assert built, "the documented example did not build\n" + describe("readme_build", ex.first_run)
    return ex


def test_readme_example_exits_cleanly(example):
    results = example.run_many({f"readme_{i}": example.python for i in range(1, RUNS)})
    results["readme_0"] = example.first_run
    failed = crashes(results, 0)
    assert not failed, f"{len(failed)} of {RUNS} runs crashed at exit\n" + "\n".join(failed[:2])


def sleep_then_launch(example: Example, i: int, tail: str = "") -> str:
    """The example with its kernel queued behind a sleep of 3*i ms: from
    still queued when the script ends to finishing during finalization."""
    return example.setup + f"torch.openreg._sleep({3 * i})\n" + example.launch + tail


def test_kernel_still_queued_at_exit_exits_cleanly(example):
    results = example.run_many({f"slow_{i}": sleep_then_launch(example, i) for i in range(RUNS)})
    failed = crashes(results, 0)
    assert not failed, f"{len(failed)} of {RUNS} runs crashed at exit\n" + "\n".join(failed[:2])


def test_uncaught_exception_and_sys_exit_exit_cleanly(example):
    raising = 'raise ValueError("the script ends with an uncaught exception")\n'
    results = example.run_many({f"raise_{i}": sleep_then_launch(example, i, raising) for i in range(RUNS // 2)})
    failed = crashes(results, 1)
    assert not failed, "\n".join(failed[:2])
    assert all("ValueError: the script ends with an uncaught exception" in p.stderr for p in results.values())
    exiting = "import sys\nsys.exit(3)\n"
    results = example.run_many({f"exit_{i}": sleep_then_launch(example, i, exiting) for i in range(RUNS // 4)})
    failed = crashes(results, 3)
    assert not failed, "\n".join(failed[:2])


def test_kernel_queued_after_the_exit_drain_leaks_its_captures(example):
    """An atexit handler registered before torch_openreg's runs after it: a
    kernel it queues runs, but what it captured is leaked, not released
    (releasing it could need the GIL during finalization). Before that, a
    kernel's captures are released as soon as it has run."""
    code = textwrap.dedent(
        """\
        import atexit, json
        def measure(tag):
            torch.openreg.synchronize()
            base = torch.openreg.memory_allocated(0)
            torch.ops.my_ops.scale_(torch.ones(1 << 20, device="openreg"), 2.0)
            torch.openreg.synchronize()
            print(tag, torch.openreg.memory_allocated(0) - base, flush=True)
        atexit.register(measure, "after_drain")
        """
    )
    code += example.setup + "measure('before_exit')\n"
    proc = example.run("late_atexit", code)
    assert proc.returncode == 0 and not any(sign in proc.stderr for sign in CRASH_SIGNS), describe("late_atexit", proc)
    held = dict(line.split() for line in proc.stdout.splitlines() if line.startswith(("before_exit", "after_drain")))
    assert int(held["before_exit"]) == 0, "a kernel's captured tensor outlived it"
    assert int(held["after_drain"]) >= 4 << 20, "a kernel run after the exit drain released its captures"
