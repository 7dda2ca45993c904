#!/usr/bin/env python3
"""Every #include points down: no folder includes one above it.

The layers, bottom to top (each a CMake library; README "What is here"):

  core -> reference -> fixtures -> optimized -> harness -> models -> data
       -> decode -> dist -> train -> cli, fuzz, ops

A source or header of a folder may include its own folder and any folder
below it. Tests (`*_test.cpp`, `*_nightly_test.cpp`) may also include the
test support above them, `fixtures/` and `harness/` (the fixtures and the
comparisons they check with), and nothing else above; benches are sources
like any other (they live in harness/). A folder this script does not know
is an error, so a new folder must be placed in the order first.

usage: layers_check.py REPO_ROOT
"""
import os
import re
import subprocess
import sys

LAYERS = {"core": 0, "reference": 1, "fixtures": 2, "optimized": 3, "harness": 4,
          "models": 5, "data": 6, "decode": 7, "dist": 8, "train": 9, "cli": 10, "fuzz": 10,
          "ops": 10}
TEST_SUPPORT = {"fixtures", "harness"}
SOURCE = (".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"')


def is_test(path: str) -> bool:
    return path.endswith("_test.cpp")


def check(root: str) -> tuple[int, list[str]]:
    files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.split()
    errors: list[str] = []
    checked = 0
    for rel in files:
        folder = rel.split("/", 1)[0]
        if "/" not in rel or not rel.endswith(SOURCE) or folder not in LAYERS:
            if "/" in rel and rel.endswith(SOURCE) and folder not in ("ci", "cmake", "build"):
                errors.append(f"{rel}: folder '{folder}' has no place in the layer order "
                              f"(ci/layers_check.py)")
            continue
        if not os.path.isfile(os.path.join(root, rel)):
            continue  # deleted in the working tree, not yet in the index
        checked += 1
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for no, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in LAYERS:
                    continue
                inc = m.group(1)
                if inc == folder or LAYERS[inc] < LAYERS[folder]:
                    continue
                if is_test(rel) and inc in TEST_SUPPORT:
                    continue
                errors.append(f"{rel}:{no}: includes {inc}/ (layer {LAYERS[inc]}) from {folder}/ "
                              f"(layer {LAYERS[folder]}): an include that points up")
    return checked, errors


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    checked, errors = check(root)
    for e in errors:
        print(e)
    print(f"layers_check: {checked} files, {len(errors)} includes pointing up")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
