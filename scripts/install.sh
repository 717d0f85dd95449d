#!/usr/bin/env bash
# Installs torch_openreg for python3: pulls torch==2.15.* and the build tools
# from the package index, builds the Rust library (cargo) and the Python
# extension, installs the package, then runs the demo on the openreg device.
#   scripts/install.sh            install + demo
#   scripts/install.sh --no-demo  install only (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements.txt
# --no-build-isolation: the build must see the installed torch (build.rs asks it).
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation .

if [ "${1:-}" != "--no-demo" ]; then
  "$PYTHON" examples/demo.py
fi
