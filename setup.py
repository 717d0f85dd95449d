"""Builds the Rust library with cargo, ships it inside the package, and
compiles the small `torch_openreg._C` extension against its C ABI.

Build with `python3 -m pip install --no-build-isolation .` so that cargo's
build script finds the torch that is installed (see build.rs).
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libtorch_openreg.so"
CARGO_OUT = os.path.join(ROOT, "target", "release")


class BuildWithCargo(build_ext):
    def run(self):
        env = dict(os.environ, PYTHON=sys.executable)
        subprocess.run(["cargo", "build", "--release", "--lib"], cwd=ROOT, env=env, check=True)
        package_dir = os.path.dirname(self.get_ext_fullpath("torch_openreg._C"))
        lib_dir = os.path.join(package_dir, "lib")
        os.makedirs(lib_dir, exist_ok=True)
        shutil.copy2(os.path.join(CARGO_OUT, LIBRARY), os.path.join(lib_dir, LIBRARY))
        super().run()


def _cmake() -> str:
    """The cmake program: the PyPI wheel's (requirements.txt), else PATH's."""
    try:
        import cmake

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        found = shutil.which("cmake")
        if found is None:
            sys.exit("building torch_openreg needs CMake 3.24 or newer: python3 -m pip install cmake")
        return found


class BuildPyWithHeaders(build_py):
    """Ships the public headers (include/) as torch_openreg/include, where
    torch_openreg.include_dir() finds them, and the CMake package
    (share/cmake/torch_openreg, for find_package from C++: see
    torch_openreg.cmake_prefix_path); an editable install uses the
    repository's include/ instead, and has no CMake package."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            package = os.path.join(self.build_lib, "torch_openreg")
            target = os.path.join(package, "include")
            shutil.rmtree(target, ignore_errors=True)  # no stale headers from an earlier build
            shutil.copytree(os.path.join(ROOT, "include"), target, dirs_exist_ok=True)
            shutil.rmtree(os.path.join(package, "share"), ignore_errors=True)
            subprocess.run(
                [
                    _cmake(),
                    f"-DPACKAGE_DIR={os.path.abspath(package)}",
                    f"-DTORCH_ROOT={TORCH_DIR}",
                    f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                    "-P",
                    os.path.join(ROOT, "cmake", "PythonPackageConfig.cmake"),
                ],
                check=True,
            )


import torch  # noqa: E402  (installed first: see the module docstring)
from torch.utils.cpp_extension import include_paths  # noqa: E402

TORCH_DIR = os.path.dirname(torch.__file__)

extension = Extension(
    "torch_openreg._C",
    # generator.cpp binds torch.Generator and ipc.cpp makes storages: they
    # need torch's Python headers and libtorch_python; module.cpp needs only
    # the C ABI.
    sources=["cpp/python/module.cpp", "cpp/python/generator.cpp", "cpp/python/ipc.cpp"],
    language="c++",
    include_dirs=[os.path.join(ROOT, "include"), *include_paths()],
    define_macros=[("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))],
    extra_compile_args=["-std=c++20"],
    library_dirs=[CARGO_OUT, os.path.join(TORCH_DIR, "lib")],
    libraries=["torch_openreg", "torch_python", "torch_cpu", "c10"],
    runtime_library_dirs=["$ORIGIN/lib", os.path.join(TORCH_DIR, "lib")],
)

setup(ext_modules=[extension], cmdclass={"build_ext": BuildWithCargo, "build_py": BuildPyWithHeaders})
