"""Conversations answered by the shipped byte target (docs/TRAINING.md,
"Conversations answered by the target"), end to end through the binary:
fixtures/configs/chat-regen.toml's data, written by `dflash features`, keep
every prompt token of fixtures/chat/conversations-bytes.jsonl up to the
first answer, replace the dataset's answers with the target's (the loss on
those only), and train."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "fixtures/configs/chat-regen.toml"


def dflash(*args: str) -> str:
    binary = os.environ.get("DFLASH_BINARY", str(ROOT / "build/dflash"))
    r = subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"dflash {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_the_target_answers_the_fixture_conversations(tmp_path: Path) -> None:
    out = dflash("features", "--config", str(CONFIG), "--out", str(tmp_path / "f"))
    assert "26 training and 4 held-out samples" in out, out
    index = json.loads((tmp_path / "f/features.json").read_text())
    got = load_file(str(tmp_path / "f" / index["train"][0]["file"]))
    rows = [json.loads(x) for x in
            (ROOT / "fixtures/chat/conversations-bytes.jsonl").read_text().splitlines()]
    replaced = 0
    for r, row in enumerate(rows[:26]):
        ids, mask = got["input_ids"][r].tolist(), got["loss_mask"][r].tolist()
        first = row["loss_mask"].index(1)  # the prompt before the first answer is kept
        assert ids[:first] == row["input_ids"][:first], r
        assert mask[:first] == [0] * first and mask[first] == 1, r
        n = sum(row["loss_mask"])
        replaced += ids[first:first + n] != row["input_ids"][first:first + n]
    assert replaced == 26  # the target's answers, not the dataset's
    run = tmp_path / "run"
    dflash("train", "--config", str(CONFIG), "--out-dir", str(run), "--skip-preflight",
           "--steps", "2", "--set", "train.served_eval_prompts=1",
           "--set", "train.served_eval_tokens=16")
    kinds = [json.loads(x).get("kind") for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("train") == 2 and "served" in kinds, kinds
