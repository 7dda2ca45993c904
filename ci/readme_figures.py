#!/usr/bin/env python3
"""README's figures of the default run against what the run prints.

README.md quotes command 1's run (`dflash train --config
fixtures/configs/tiny-train.toml`, then `dflash eval`): held-out tau, slot-1
accuracy, loss, served acceptance, the tree, the teacher-forced tau, and
the eval's block, trees and tau. Each row below names a figure, where README
states it, where the run prints it and how far they may differ (README
states the tolerance: float sums on another CPU move a 700-step run a
little, code that changes what the run learns moves it more). A failure
names the figure, both values and the README line to update.

usage: readme_figures.py README.md TRAIN_LOG EVAL_LOG
"""
import re
import sys
from dataclasses import dataclass

ABS_TOL = 0.01  # README: "held to it within 0.01"
NUM = r"([0-9]+\.[0-9]+)"


@dataclass
class Figure:
    name: str
    readme: str  # regex over README.md (whitespace-normalised)
    readme_group: int
    log: str  # "train" or "eval"
    printed: str  # regex over that log; the LAST match counts
    printed_group: int
    rel_tol: float = 0.0  # instead of ABS_TOL, for figures README rounds coarsely


TAU = rf"Held-out tau rises from \*\*{NUM} to {NUM}\*\*"
TREES = rf"block {NUM}, trees {NUM} / {NUM} / {NUM} at budgets 4 / 16 / 64, tau {NUM}"
FIGURES = [
    Figure("held-out tau at step 0", TAU, 1, "train", rf"held-out tau {NUM} -> {NUM}", 1),
    Figure("held-out tau at the end", TAU, 2, "train", rf"held-out tau {NUM} -> {NUM}", 2),
    Figure("slot-1 accuracy at the end", rf"slot-1 accuracy {NUM} to {NUM}", 2, "train",
           rf"eval @ \d+: loss {NUM}  tau {NUM}  accuracy of slots 1-\d+ \[{NUM}", 3),
    Figure("held-out loss at the end", rf"loss {NUM} to {NUM}:", 2, "train",
           rf"eval @ \d+: loss {NUM} ", 1, rel_tol=0.005),
    Figure("served acceptance at the end",
           rf"rises from \*\*{NUM} to {NUM}\*\* tokens per target forward", 2, "train",
           rf"served acceptance {NUM} -> {NUM}", 2),
    Figure("served tree (budget 16) at the end",
           rf"and to {NUM} with tree verification at node budget 16", 1, "train",
           rf"served @ \d+: acceptance {NUM}  tree 16 {NUM}", 2),
    Figure("teacher-forced tau on the served texts", rf"the teacher-forced tau is {NUM}", 1,
           "train", rf"\(tau on the same texts {NUM};", 1),
    Figure("eval: block", TREES, 1, "eval", rf"served acceptance \(block \d+\): {NUM}", 1),
    Figure("eval: tree budget 4", TREES, 2, "eval", rf"tree budget +4: acceptance {NUM}", 1),
    Figure("eval: tree budget 16", TREES, 3, "eval", rf"tree budget +16: acceptance {NUM}", 1),
    Figure("eval: tree budget 64", TREES, 4, "eval", rf"tree budget +64: acceptance {NUM}", 1),
    Figure("eval: teacher-forced tau", TREES, 5, "eval",
           rf"teacher-forced tau on the same texts: {NUM}", 1),
]


def readme_value(text: str, f: Figure) -> float:
    m = re.search(f.readme, text)
    if not m:
        raise SystemExit(f"README.md: no '{f.name}' (pattern {f.readme!r})")
    return float(m.group(f.readme_group))


def printed_value(text: str, f: Figure, path: str) -> float:
    found = list(re.finditer(f.printed, text))
    if not found:
        raise SystemExit(f"{path}: the run printed no '{f.name}' (pattern {f.printed!r})")
    return float(found[-1].group(f.printed_group))


def main() -> int:
    readme_path, train_path, eval_path = sys.argv[1:4]
    readme = " ".join(open(readme_path, encoding="utf-8").read().split())
    logs = {"train": (train_path, open(train_path, encoding="utf-8").read()),
            "eval": (eval_path, open(eval_path, encoding="utf-8").read())}
    bad = 0
    print(f"{'figure':<40} {'README':>9} {'run':>9} {'limit':>9}")
    for f in FIGURES:
        path, text = logs[f.log]
        want, got = readme_value(readme, f), printed_value(text, f, path)
        limit = f.rel_tol * abs(got) if f.rel_tol else ABS_TOL
        ok = abs(want - got) <= limit
        bad += not ok
        print(f"{f.name:<40} {want:>9.3f} {got:>9.3f} {limit:>9.3f}  {'ok' if ok else 'DIFFERS'}")
    if bad:
        print(f"{readme_path}: {bad} figures of the default run differ from what it prints; "
              "update README from this run (or find what changed the run)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
