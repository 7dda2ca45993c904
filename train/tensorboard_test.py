"""The run's TensorBoard event files, read by the `tensorboard` package's own
reader (EventAccumulator): every number of every metrics.jsonl row is there,
at its step, under "<kind>/<key>" (list entries "<kind>/<key>/<index>"), as
`tensorboard --logdir runs/` would show it (train/tensorboard.h).

The run is the default run shortened (as cli.report_in_browser runs it), so
every kind of row appears: train steps, held-out evaluations and served
acceptance (block and tree).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
LICENSES = Path("/usr/share/common-licenses/Apache-2.0")
SHORT = ["data.num_samples=48", "data.eval_samples=8", "train.steps=20", "train.eval_every=10",
         "train.eval_batches=1", "train.log_every=10", "train.served_eval_every=10",
         "train.served_eval_prompts=2", "train.served_eval_tokens=16"]


def train(out: Path, *extra: str) -> None:
    binary = os.environ.get("DFLASH_BINARY", str(ROOT / "build/dflash"))
    sets = [a for s in SHORT for a in ("--set", s)]
    r = subprocess.run([binary, "train", "--config", "fixtures/configs/tiny-train.toml",
                        "--out-dir", str(out), "--skip-preflight", *sets, *extra],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def expected(row: dict) -> dict[str, float]:
    kind, out = row["kind"], {}
    for key, value in row.items():
        if key in ("kind", "step"):
            continue
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[f"{kind}/{key}"] = float(value)
        elif isinstance(value, list):
            first = 1 if key == "accuracy" else 0  # slot 0 is the given anchor: always 0
            for i in range(first, len(value)):
                out[f"{kind}/{key}/{i}"] = float(value[i])
    return out


@pytest.mark.skipif(not LICENSES.exists(), reason=f"{LICENSES} (Debian's base-files) is missing")
def test_every_metrics_value_is_in_tensorboard_at_its_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"train", "eval", "served"}
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    have = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    missing, wrong, n = [], [], 0
    for row in rows:
        for tag, value in expected(row).items():
            n += 1
            got = have.get(tag, {}).get(row["step"])
            if got is None:
                missing.append(f"{tag} @ {row['step']}")
            elif abs(got - value) > 1e-6 * max(1.0, abs(value)):  # stored as float32
                wrong.append(f"{tag} @ {row['step']}: {got} != {value}")
    print(f"{n} metrics.jsonl values, {len(have)} TensorBoard tags")
    assert not missing and not wrong, (missing[:10], wrong[:10])
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/tau",
                "eval/accuracy/1", "served/acceptance", "served/tree_acceptance"):
        assert tag in have, tag
    assert "eval/accuracy/0" not in have


@pytest.mark.skipif(not LICENSES.exists(), reason=f"{LICENSES} (Debian's base-files) is missing")
def test_report_to_none_writes_no_event_file(tmp_path: Path) -> None:
    train(tmp_path / "run", "--set", "train.report_to=none", "--set", "train.steps=2",
          "--set", "train.served_eval_prompts=0")
    assert not list((tmp_path / "run").glob("events.out.tfevents.*"))
