"""Builds the op library for the package (pyproject.toml holds the rest).

The library (ops/, CMake target dflash_torch_ops) must be compiled against
the torch of the python that installs the package. Where it comes from:
$DFLASH_OPS_LIBRARY (a library built elsewhere), else the CMake build
directory $DFLASH_BUILD_DIR or `build/` when it is configured for this
python's torch (what ci/bootstrap.sh made: nothing is rebuilt), else
`build-py-<torch version>/` (a build directory counts when it is a Release
build for this torch without sanitizers),
configured and built here for this torch (tests and benches off).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIBRARY = "libdflash_ops.so"


def torch_cmake_dir() -> tuple[Path, str]:
    import torch  # the torch this package is installed into
    return Path(torch.utils.cmake_prefix_path).resolve() / "Torch", torch.__version__


def configured_for(build: Path, torch_dir: Path) -> bool:
    cache = build / "CMakeCache.txt"
    if not cache.is_file() or not (build / "build.ninja").is_file():
        return False
    text = cache.read_text(errors="replace")
    m = re.search(r"^Torch_DIR:PATH=(.*)$", text, re.M)
    release = re.search(r"^CMAKE_BUILD_TYPE:STRING=Release$", text, re.M)
    sanitized = re.search(r"^DFLASH_SANITIZE:STRING=.+$", text, re.M)  # its .so cannot load
    return bool(m) and Path(m.group(1)).resolve() == torch_dir and bool(release) and not sanitized


def build_library() -> Path:
    env = os.environ.get("DFLASH_OPS_LIBRARY")
    if env:
        return Path(env)
    torch_dir, version = torch_cmake_dir()
    candidates = dict.fromkeys([os.environ.get("DFLASH_BUILD_DIR", "build"), "build"])
    found = [ROOT / c for c in candidates if configured_for(ROOT / c, torch_dir)]
    build = found[0] if found else ROOT / f"build-py-{version.split('+')[0]}"
    if not found:
        if not configured_for(build, torch_dir):
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
                            "-DCMAKE_BUILD_TYPE=Release", f"-DDFLASH_TORCH_PYTHON={sys.executable}",
                            "-DDFLASH_BUILD_TESTS=OFF", "-DDFLASH_BUILD_BENCH=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "dflash_torch_ops"], check=True)
    return build / "python" / "dflash" / LIBRARY


class BuildPyWithOps(build_py):
    def find_package_modules(self, package, package_dir):
        """The package without its tests (`*_test.py` stay in the checkout)."""
        return [m for m in super().find_package_modules(package, package_dir)
                if not m[1].endswith("_test")]

    def run(self) -> None:
        shutil.rmtree(Path(self.build_lib) / "dflash", ignore_errors=True)  # no stale modules
        super().run()
        lib = build_library()
        if not lib.is_file():
            raise RuntimeError(f"dflash: the op library {lib} was not built")
        dest = Path(self.build_lib) / "dflash" / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)


class BinaryDistribution(Distribution):
    """A platform wheel: the package carries a compiled library."""

    def has_ext_modules(self) -> bool:
        return True


# setuptools' own files go under the CMake build directory (one per torch).
PACKAGE_BUILD = f"{os.environ.get('DFLASH_BUILD_DIR', 'build')}/python-package"
(ROOT / PACKAGE_BUILD).mkdir(parents=True, exist_ok=True)
setup(cmdclass={"build_py": BuildPyWithOps}, distclass=BinaryDistribution,
      options={"build": {"build_base": PACKAGE_BUILD}, "egg_info": {"egg_base": PACKAGE_BUILD}})
