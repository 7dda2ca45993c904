"""The installed package (what `pip install --no-build-isolation .` and
ci/bootstrap.sh put into the torch environment) is this checkout's: it
imports without PYTHONPATH, carries its op library, and its ops compute
what this checkout's do. The torch range is declared once per language and
the two declarations agree."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import dflash

SOURCE = Path(__file__).resolve().parent
ROOT = SOURCE.parents[1]
PROBE = """
import hashlib, json, pathlib, torch, dflash
g = torch.Generator().manual_seed(0)
x = torch.randn(9, 4, generator=g, dtype=torch.float64)
W = torch.randn(11, 4, generator=g, dtype=torch.float64)
y = torch.randint(0, 11, (9,), generator=g)
here = pathlib.Path(dflash.__file__).parent
print(json.dumps({"file": dflash.__file__, "version": dflash.__version__,
                  "library": str(dflash.library_path()),
                  "sources": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                              for p in sorted(here.glob("*.py"))},
                  "loss": dflash.fused_loss(x, W, y).loss.item()}))
"""
HINT = "run ci/bootstrap.sh (it installs this checkout's package into the torch environment)"


def installed(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DFLASH_OPS_LIBRARY")}
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, f"the installed package does not import: {p.stderr[-2000:]}\n{HINT}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_installed_package_is_this_checkout(tmp_path):
    got = installed(tmp_path)
    assert "site-packages" in got["file"], got["file"]
    assert got["version"] == dflash.__version__
    assert Path(got["library"]).parent == Path(got["file"]).parent  # shipped inside the package
    mine = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(SOURCE.glob("*.py"))
            if not p.name.endswith("_test.py")}
    stale = sorted(n for n in mine if got["sources"].get(n) != mine[n])
    assert not stale, f"installed modules differ from this checkout's: {stale}; {HINT}"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64)
    W = torch.randn(11, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 11, (9,), generator=g)
    assert got["loss"] == dflash.fused_loss(x, W, y).loss.item()


def test_importing_dflash_does_not_import_torch():
    p = subprocess.run([sys.executable, "-c", "import sys, dflash, dflash.chat_records; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(SOURCE.parent)})
    assert p.stdout.strip() == "False", p.stdout + p.stderr


def test_torch_range_declared_once_per_language():
    lo, hi = (ROOT / "cmake" / "TORCH_RANGE").read_text().split()
    spec = re.search(r'"torch([^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1)
    hi_major, hi_minor = map(int, hi.split("."))
    assert spec == f">={lo},<{hi_major}.{hi_minor + 1}", (spec, lo, hi)
    default = (ROOT / "cmake" / "TORCH_VERSION").read_text().split()[0]
    assert default.startswith(lo), (default, lo)
