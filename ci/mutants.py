#!/usr/bin/env python3
"""Mutation testing of the real sources (nightly; `ci/mutants.sh`).

Each mutant in ci/mutants.toml is a find/replace patch of one real source
file (a one-line mistake a careful engineer could make). The runner copies
the tree to a scratch directory once, builds it there, and for each mutant:
applies the patch, rebuilds incrementally, and runs the checks in order of
cost until one fails:

  1. parity  -- `dflash parity --cases N --no-zoo` (the step and component
                properties against the float64 reference);
  2. oracle  -- harness_spec_oracle_test (the reference against the SPEC
                oracle: catches mistakes in code both builds share);
  3. tests   -- the quick ctest tests of the touched area (core., optimized.,
                ...), for what is not in the step (optimizer, loop,
                checkpoint, split). The run's folders (models/, data/,
                decode/, dist/, train/) are one area: their tests drive each
                other end to end (a checkpoint mistake dies in train.Resume).

It prints a kill table (mutant, file:line, what it changes, killed by which
check, seconds) and writes a JSON summary. Exit 0 when every mutant is
killed or listed as equivalent in the TOML (`equivalent = "why"`), else 1.
Python 3.11+ standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd, cwd, timeout, log):
    """Runs cmd; returns (exit code, output). Exit code 124 on timeout."""
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        out = p.stdout
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = 124
    log.write(f"$ {' '.join(map(str, cmd))}  -> {rc}\n{out[-4000:]}\n")
    log.flush()
    return rc, out


def tracked_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    return [f for f in out.splitlines() if f and (ROOT / f).is_file()]


def torch_python():
    cache = ROOT / "build" / "CMakeCache.txt"
    if cache.exists():
        for line in cache.read_text().splitlines():
            if line.startswith("DFLASH_TORCH_PYTHON:FILEPATH=") and line.split("=", 1)[1]:
                return line.split("=", 1)[1]
    env = os.environ.get("DFLASH_TORCH_ENV")
    if env:
        return f"{env}/bin/python"
    cache_home = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    version = (ROOT / "cmake" / "TORCH_VERSION").read_text().split()[0]
    return f"{cache_home}/dflash/torch-{version}/bin/python"


def prepare(scratch, log, mutated_files=()):
    """A copy of the tree (tracked and untracked-not-ignored files) and a build."""
    src, build = scratch / "src", scratch / "build"
    # Only files whose content differs are written, with a fresh mtime: a
    # copy that kept the tree's older mtime over a file an interrupted run
    # left mutated would let ninja keep the mutant's object file.
    wanted = set(tracked_files())
    for f in wanted:
        dst = src / f
        if dst.is_file() and dst.read_bytes() == (ROOT / f).read_bytes():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, dst)
        dst.touch()
    for old in [p for p in src.rglob("*") if p.is_file()]:
        if str(old.relative_to(src)) not in wanted:
            old.unlink()
    # A run killed mid-mutant leaves that file's object built from the mutant:
    # every file a mutant touches is recompiled once (ccache makes it cheap).
    for f in mutated_files:
        if (src / f).is_file():
            (src / f).touch()
    if not (build / "build.ninja").exists():
        rc, out = run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                       f"-DDFLASH_TORCH_PYTHON={torch_python()}", "-DDFLASH_BUILD_BENCH=OFF"],
                      scratch, 600, log)
        if rc:
            sys.exit(f"mutants: configure failed (see {log.name}):\n{out[-3000:]}")
    rc, out = run(["ninja", "-C", build], scratch, 3600, log)
    if rc:
        sys.exit(f"mutants: the unmutated tree does not build (see {log.name}):\n{out[-3000:]}")
    return src, build


def first_failure(out, prefix):
    """The first FAIL row of a dflash table, or the first failed ctest name."""
    for line in out.splitlines():
        parts = line.split()
        if prefix == "parity" and len(parts) > 1 and parts[1] == "FAIL":
            return parts[0]
    if prefix == "tests":  # every failed test of ctest's closing list, up to three
        failed = [line.split(" - ", 1)[1].split(" (")[0].strip() for line in out.splitlines()
                  if " - " in line and any(w in line for w in
                                           ("(Failed)", "(SEGFAULT)", "(Timeout)", "(Subprocess aborted)"))]
        return ", ".join(failed[:3]) + (f" (+{len(failed) - 3} more)" if len(failed) > 3 else "")
    return ""


def compile_error(out):
    for line in out.splitlines():
        if "error:" in line:
            return line.strip()[:240]
    return out.strip().splitlines()[-1][:240] if out.strip() else "build failed"


# The run's folders: one test area (see the module docstring).
RUN_AREAS = ("models", "data", "decode", "dist", "train")


def test_area(m):
    """The ctest prefix regex of a mutant's tests stage: its `area`, else its folder."""
    if "area" in m:  # another test prefix (e.g. cli)
        return m["area"]
    folder = m["file"].split("/")[0]
    return "(" + "|".join(RUN_AREAS) + ")" if folder in RUN_AREAS else folder


def check_mutant(m, src, build, args, log):
    """Applies m, runs the checks; returns (killed_by, detail)."""
    ninja = ["ninja", "-C", build]
    if "test" in m:  # one named test must kill it (a test's own mutant)
        rc, out = run(ninja, src, 3600, log)
        if rc:
            return "", "does not compile: " + compile_error(out)
        rc, out = run(["ctest", "--test-dir", build, "-R", m["test"], "--output-on-failure",
                       "--timeout", "600"], src, 3600, log)
        if "No tests were found" in out:
            return "", f"no test matches {m['test']}"
        if rc != 0:
            return "test", first_failure(out, "tests") or "ctest failed"
        return "", f"survived its test {m['test']}"
    rc, out = run(ninja + ["dflash"], src, 1800, log)
    if rc:
        return "", "does not compile: " + compile_error(out)
    rc, out = run([build / "dflash", "parity", "--cases", str(args.cases), "--seed", str(args.seed),
                   "--no-zoo", "--out-dir", build / "mutant-cx"], src, 900, log)
    if rc != 0:
        what = first_failure(out, "parity") or f"exit {rc}"
        return "parity", what if rc == 1 else f"{what} (exit {rc}: crash or timeout)"
    rc, out = run(ninja + ["harness_spec_oracle_test"], src, 1800, log)
    if rc == 0:
        rc, out = run([build / "harness_spec_oracle_test"], src, 900, log)
        if rc != 0:
            return "oracle", "harness.SpecOracle"
    area = test_area(m)
    rc, out = run(ninja, src, 3600, log)
    if rc:
        return "", "test targets do not compile: " + compile_error(out)
    rc, out = run(["ctest", "--test-dir", build, "-L", "quick", "-R", f"^{area}\\.", "--output-on-failure", "-j",
                   str(os.cpu_count() or 2), "--timeout", "600"], src, 3600, log)
    if rc != 0:
        return "tests", first_failure(out, "tests") or "ctest failed"
    return "", "survived parity, the oracle and the quick tests of " + area + "."


def check_finds(mutants, list_path):
    """Each mutant applies to this tree: its file exists, its find occurs
    exactly once there and its replace changes the text. Returns the exit code."""
    stale = []
    for m in mutants:
        missing = [k for k in ("name", "file", "find", "replace", "what") if k not in m]
        if missing:
            stale.append(f"{m.get('name', '?')}: no {', '.join(missing)}")
            continue
        path = ROOT / m["file"]
        if not path.is_file():
            stale.append(f"{m['name']}: {m['file']} does not exist")
            continue
        n = path.read_text().count(m["find"])
        if n != 1:
            stale.append(f"{m['name']}: find occurs {n} times in {m['file']} (must be once): "
                         f"{m['find'][:100]!r}")
        elif m["find"] == m["replace"]:
            stale.append(f"{m['name']}: replace equals find")
    for line in stale:
        print("stale mutant " + line)
    print(f"{len(mutants) - len(stale)} passed, {len(stale)} failed: "
          f"mutant finds of {list_path} against this tree")
    return 1 if stale else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", default=str(ROOT / "ci" / "mutants.toml"))
    ap.add_argument("--scratch", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "dflash-mutants"))
    ap.add_argument("--json", default="")
    ap.add_argument("--cases", type=int, default=30, help="parity cases per property")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=[], help="names of the mutants to run")
    ap.add_argument("--check-finds", action="store_true",
                    help="build nothing: exit 1 unless every mutant's find occurs exactly once "
                         "in its file of this tree (a stale mutant checks nothing)")
    args = ap.parse_args()

    mutants = tomllib.loads(Path(args.list).read_text())["mutant"]
    names = [m["name"] for m in mutants]
    if len(set(names)) != len(names):
        sys.exit("mutants: duplicate names in " + args.list)
    if args.check_finds:
        return check_finds(mutants, args.list)
    every_file = {m["file"] for m in mutants}  # before --only: any may be left mutated
    if args.only:
        mutants = [m for m in mutants if m["name"] in args.only]
    # Cheapest checks first: parity, then the oracle, then area tests.
    order = {"parity": 0, "oracle": 1, "tests": 2}
    mutants.sort(key=lambda m: order.get(m.get("expect", "tests"), 3))
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    log = open(scratch / "mutants.log", "w")
    src, build = prepare(scratch, log, every_file)

    rows = []
    for i, m in enumerate(mutants):
        path = src / m["file"]
        text = path.read_text()
        t0 = time.monotonic()
        if text.count(m["find"]) != 1:
            rows.append({**m, "line": 0, "killed_by": "", "seconds": 0.0,
                         "detail": f"find text occurs {text.count(m['find'])} times: stale mutant"})
        else:
            line = text[: text.index(m["find"])].count("\n") + 1
            print(f"[mutants] {i + 1}/{len(mutants)} {m['name']} ({m['file']}:{line}) ...",
                  file=sys.stderr, flush=True)
            path.write_text(text.replace(m["find"], m["replace"], 1))
            try:
                killed_by, detail = check_mutant(m, src, build, args, log)
            finally:
                path.write_text(text)
            rows.append({**m, "line": line, "killed_by": killed_by, "detail": detail,
                         "seconds": round(time.monotonic() - t0, 1)})
        if args.json:  # partial results survive an interrupted run
            Path(args.json + ".partial").write_text(json.dumps(rows, indent=2) + "\n")
        r = rows[-1]
        print(f"[mutants]   -> {r['killed_by'] or 'SURVIVED'}: {r['detail']} ({r['seconds']} s)",
              file=sys.stderr, flush=True)
    # Leave the scratch tree built as the real code, for the next run.
    run(["ninja", "-C", build], src, 3600, log)

    print(f"\n{'mutant':<40} {'where':<36} {'expected':<8} {'killed by':<10} {'seconds':>7}  what [check]")
    survivors = 0
    for r in rows:
        equivalent = r.get("equivalent", "")
        status = r["killed_by"] or ("equivalent" if equivalent else "SURVIVED")
        survivors += status == "SURVIVED"
        print(f"{r['name']:<40} {r['file'] + ':' + str(r['line']):<36} {r.get('expect', ''):<8} {status:<10} "
              f"{r['seconds']:>7.1f}  {r['what']}" + (f" [{r['detail']}]" if r["killed_by"] else
                                                       f" [{equivalent or r['detail']}]"))
    killed = sum(1 for r in rows if r["killed_by"])
    print(f"\nmutants: {killed} killed, {survivors} survived, "
          f"{len(rows) - killed - survivors} equivalent, of {len(rows)}")
    summary = {"cases": args.cases, "seed": args.seed, "killed": killed, "survived": survivors,
               "total": len(rows), "mutants": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
