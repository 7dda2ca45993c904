#!/usr/bin/env python3
"""The GitHub Actions workflows parse and run what the README documents.

.github/workflows/quick.yml runs the README's command 2 on push, and
nightly.yml runs ci/nightly.sh on a schedule and uploads the JUnit files
that ci/nightly.sh writes. They cannot run here, so this checks them with a
YAML parser: every job has steps, every `uses:` is pinned to a version, the
cron is five fields, and each command is the one the README states.

usage: workflows_check.py REPO_ROOT
"""
import os
import re
import sys

import yaml


def fail(path: str, msg: str) -> None:
    print(f"{path}: {msg}")
    sys.exit(1)


def load(root: str, name: str) -> tuple[str, dict]:
    path = os.path.join(root, ".github", "workflows", name)
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict):
        fail(path, "not a YAML mapping")
    # YAML 1.1 reads the bare key `on` as the boolean true.
    doc["on"] = doc.pop(True, doc.get("on"))
    if not doc.get("on") or not isinstance(doc.get("jobs"), dict) or not doc["jobs"]:
        fail(path, "needs `on:` triggers and at least one job")
    for job_name, job in doc["jobs"].items():
        steps = job.get("steps")
        if not isinstance(steps, list) or not steps:
            fail(path, f"job {job_name}: no steps")
        for i, step in enumerate(steps):
            if not ("run" in step) ^ ("uses" in step):
                fail(path, f"job {job_name} step {i}: exactly one of run/uses")
            if "uses" in step and not re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]):
                fail(path, f"job {job_name} step {i}: `uses: {step['uses']}` is not owner/action@vN")
    return path, doc


def runs(doc: dict) -> str:
    return "\n".join(s.get("run", "") for j in doc["jobs"].values() for s in j["steps"])


def uploads(doc: dict) -> list[str]:
    paths = []
    for j in doc["jobs"].values():
        for s in j["steps"]:
            if s.get("uses", "").startswith("actions/upload-artifact@"):
                paths += [p.strip() for p in s["with"]["path"].splitlines() if p.strip()]
    return paths


def main() -> int:
    root = sys.argv[1]
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    m = re.search(r"^# 2\..*\n(ci/bootstrap\.sh && ctest .*)$", readme, re.M)
    if not m:
        fail("README.md", "command 2 (ci/bootstrap.sh && ctest ...) not found")
    command2 = m.group(1).strip()

    qpath, quick = load(root, "quick.yml")
    if "push" not in quick["on"]:
        fail(qpath, "the quick suite must run on push")
    if command2 not in runs(quick):
        fail(qpath, f"does not run the README's command 2: {command2}")

    npath, nightly = load(root, "nightly.yml")
    crons = [c.get("cron", "") for c in nightly["on"].get("schedule", [])]
    if not crons or not all(len(c.split()) == 5 for c in crons):
        fail(npath, f"needs a schedule with five-field cron lines, got {crons}")
    if not re.search(r"^ci/nightly\.sh\b", runs(nightly), re.M):
        fail(npath, "does not run ci/nightly.sh")
    script = open(os.path.join(root, "ci", "nightly.sh"), encoding="utf-8").read()
    junit = [p for p in uploads(nightly) if p.endswith(".xml")]
    if not junit:
        fail(npath, "uploads no JUnit file")
    for p in uploads(nightly):
        if os.path.basename(p) not in script:
            fail(npath, f"uploads {p}, which ci/nightly.sh does not write")
    print(f"workflows ok: quick runs `{command2}` on push; nightly runs ci/nightly.sh at "
          f"{crons} and uploads {len(junit)} JUnit file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
