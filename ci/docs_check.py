#!/usr/bin/env python3
"""The docs stand alone: every SPEC citation resolves inside the clone.

docs/SPEC.md is the definition that code, tests and docs cite as "SPEC",
"SPEC.md" or "SPEC step N". This check fails, naming file:line, when
  - docs/SPEC.md lacks a section that others cite, or its numbered steps
    under "## One step" are not 1, 2, ... in order;
  - a "SPEC step N" / "SPEC steps N-M" / "SPEC.md step N" cites a step
    docs/SPEC.md does not have;
  - a tracked text file points outside the clone (`../shared`, the place
    the spec lived before it was written into the repository);
  - a relative Markdown link in README.md or docs/*.md names a file that
    does not exist.

usage: docs_check.py REPO_ROOT
"""
import os
import re
import subprocess
import sys

TEXT_SUFFIXES = (".md", ".cpp", ".h", ".py", ".sh", ".toml", ".txt", ".cmake", ".yml")
SECTIONS = ("## Models", "## Numerical conventions", "## One step",
            "## The full-scale configuration", "## Failure modes")
CITATION = re.compile(r"SPEC(?:\.md)?,? steps? (\d+)(?:\s*(?:-|to|and)\s*(\d+))?")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def spec_steps(path: str, errors: list[str]) -> set[int]:
    """The step numbers of docs/SPEC.md, checked to run 1, 2, ... in order."""
    if not os.path.isfile(path):
        errors.append(f"{path}: missing (code and docs cite it as SPEC)")
        return set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for s in SECTIONS:
        if not re.search("^" + re.escape(s), text, re.M):
            errors.append(f"{path}: no section '{s}'")
    body = text.split("## One step", 1)[-1].split("\n## ", 1)[0]
    steps = [int(n) for n in re.findall(r"^(\d+)\. \*\*", body, re.M)]
    if steps != list(range(1, len(steps) + 1)) or not steps:
        errors.append(f"{path}: steps under '## One step' are {steps}, not 1..n in order")
    return set(steps)


def tracked_text_files(root: str) -> list[str]:
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [p for p in out if p.endswith(TEXT_SUFFIXES) and p != "ci/docs_check.py"
            and os.path.isfile(os.path.join(root, p))]  # a deletion not yet committed


def check_file(root: str, rel: str, steps: set[int], errors: list[str]) -> None:
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for no, line in enumerate(lines, 1):
        where = f"{rel}:{no}"
        if "../shared" in line:
            errors.append(f"{where}: points outside the clone (../shared); cite docs/SPEC.md")
        for m in CITATION.finditer(line):
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) else lo
            for n in range(lo, hi + 1):
                if n not in steps:
                    errors.append(f"{where}: cites SPEC step {n}, which docs/SPEC.md lacks")
        if rel.endswith(".md") and (rel == "README.md" or rel.startswith("docs/")):
            for target in MD_LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # a URL
                path = os.path.normpath(os.path.join(root, os.path.dirname(rel), target))
                if not os.path.exists(path):
                    errors.append(f"{where}: link to {target}, which does not exist")


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    errors: list[str] = []
    steps = spec_steps(os.path.join(root, "docs", "SPEC.md"), errors)
    files = tracked_text_files(root)
    for rel in files:
        check_file(root, rel, steps, errors)
    for e in errors:
        print(e)
    print(f"docs_check: {len(files)} files, SPEC steps {min(steps, default=0)}-"
          f"{max(steps, default=0)}, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
