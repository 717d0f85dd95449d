#!/usr/bin/env bash
# Runs the whole test suite: Rust (cargo test), C++ (CTest over a libtorch
# program and contract tests), Python (pytest). Installs first, so it works
# on a fresh machine. Every runner runs even if an earlier one fails; the
# exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# build.rs, setup.py and CMake all hand cargo the same interpreter, so the
# shim is compiled once, not once per builder.
export PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)')

bash scripts/install.sh --no-demo || exit 1
# The training libraries (the package's `training` extra): their
# integration tests skip without them.
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements-training.txt || exit 1

# The PyPI cmake and ninja wheels install their programs beside the package.
CMAKE_BIN=$("$PYTHON" -c 'import cmake; print(cmake.CMAKE_BIN_DIR)')
NINJA=$("$PYTHON" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')
# torch.utils.cpp_extension (the custom-kernel test) looks for `ninja` on PATH:
# put the interpreter's scripts directory first, where pip put it (a pyenv
# shim for it may not exist yet on a fresh machine).
export PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"

failed=()
run() {
  echo "==> $*"
  "$@" || failed+=("$1")
}

run cargo test --release
run "$CMAKE_BIN/cmake" -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_MAKE_PROGRAM="$NINJA" -DPython3_EXECUTABLE="$(command -v "$PYTHON")"
run "$CMAKE_BIN/cmake" --build build/cpp -j2
run "$CMAKE_BIN/ctest" --test-dir build/cpp --output-on-failure
run "$PYTHON" -m pytest tests/python -q --durations=20

if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all test runners passed"
