"""C++ users of the installed package: torch_openreg ships its CMake package
(share/cmake/torch_openreg) and names it in ``torch_openreg.cmake_prefix_path``,
so examples/cpp, a project of its own, configures with find_package(torch_openreg)
exactly as its README says, builds, and its program runs on openreg devices.

Uses the cmake and ninja of the PyPI wheels (requirements.txt), else PATH's.
About 20-40 s on 2 cores, most of it compiling device_demo.cpp.
"""

import faulthandler
import os
import shutil
import subprocess
import sys

import pytest

import torch_openreg
from _openreg_util import clean_env

EXAMPLE = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "cpp"))
PACKAGE_DIR = os.path.join(torch_openreg.cmake_prefix_path, "torch_openreg")
# The README's command, verbatim.
PREFIX_COMMAND = "import torch, torch_openreg; print(torch.utils.cmake_prefix_path + ';' + torch_openreg.cmake_prefix_path)"


@pytest.fixture(autouse=True)
def _hang_guard():
    """A compile legitimately outlasts conftest's 120 s hang limit on a loaded
    machine; each step below has its own timeout."""
    faulthandler.dump_traceback_later(400, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


def _program(module_name: str, program: str) -> str:
    try:
        module = __import__(module_name)
        bin_dir = module.CMAKE_BIN_DIR if module_name == "cmake" else module.BIN_DIR
        return os.path.join(bin_dir, program)
    except ImportError:
        found = shutil.which(program)
        assert found, f"{program} is needed: python3 -m pip install {module_name}"
        return found


def _run(args, timeout, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


def test_the_package_ships_its_cmake_config():
    for name in ("torch_openregConfig.cmake", "torch_openregConfigVersion.cmake", "OpenRegTorch.cmake", "OpenRegLibrary.cmake"):
        assert os.path.isfile(os.path.join(PACKAGE_DIR, name)), name
    config = open(os.path.join(PACKAGE_DIR, "torch_openregConfig.cmake")).read()
    # Relative to itself, so the installed package may move.
    assert "${CMAKE_CURRENT_LIST_DIR}/../../../" in config
    assert "${PACKAGE_PREFIX_DIR}/lib/libtorch_openreg.so" in config
    assert os.path.isfile(os.path.join(torch_openreg.cmake_prefix_path, "..", "..", "lib", "libtorch_openreg.so"))


def test_examples_cpp_builds_against_the_installed_package(tmp_path):
    cmake, ninja = _program("cmake", "cmake"), _program("ninja", "ninja")
    # A user's shell: PYTHONPATH (if any) carries over, OPENREG_* knobs do not.
    env = clean_env()
    prefix_path = _run([sys.executable, "-c", PREFIX_COMMAND], 60, env=env).strip().splitlines()[-1]
    build = tmp_path / "build"
    _run(
        [cmake, "-S", EXAMPLE, "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix_path}"],
        180,
        env=env,
    )
    # Found through the prefix path: the installed package, not a build tree.
    cache = (build / "CMakeCache.txt").read_text()
    found = [line.split("=", 1)[1] for line in cache.splitlines() if line.startswith("torch_openreg_DIR:")]
    assert found and os.path.realpath(found[0]) == os.path.realpath(PACKAGE_DIR), found
    _run([cmake, "--build", str(build)], 240, env=env)
    output = _run([str(build / "device_demo")], 60, env=env)
    assert "everything as expected" in output, output
