"""`dflash export` against the real client: speculators 0.9.0 (vLLM's library
for speculators), and the exported configs against the loading rules of
vLLM 0.34.0 and SGLang 0.5.23 (docs/SERVING.md).

A drafter for the shipped real-text target is trained for three steps
(fixtures/configs/export-check.toml), exported in both layouts (float32),
and a step of it is dumped (`dflash dump --init-from`). Then:
- the speculators export loads with `SpeculatorModel.from_pretrained`, its
  tensors exactly the checkpoint's;
- speculators' own z-lab converter, run on the zlab export, writes the same
  tensors and the same tap ids as our speculators export;
- speculators' drafter forward on the dump's inputs equals dflash's student
  hidden state on every kept block within 1e-5.

speculators lives beside the torch environment (its own dependency set
would replace our torch): `ci/bootstrap.sh` installs it with --no-deps into
$DFLASH_SPECULATORS_ENV (default ~/.cache/dflash/speculators-0.9.0) with the
light packages its DFlash model needs. Its package __init__ imports its
training data pipeline, which imports `datasets` and `openai` at import time
although loading, converting and the forward never call them: the test
registers empty stand-ins for those two modules before the import. Without
that directory the speculators tests skip, saying why.

The rule checks need no client; each rule cites where the engine reads it.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fixtures/targets/qwen3-bytes"
CONFIG = ROOT / "fixtures/configs/export-check.toml"
SPEC_ENV = Path(os.environ.get("DFLASH_SPECULATORS_ENV",
                               Path.home() / ".cache/dflash/speculators-0.9.0"))


def dflash(*args: str) -> str:
    binary = os.environ.get("DFLASH_BINARY", str(ROOT / "build/dflash"))
    r = subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"dflash {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("export")
    run = tmp / "run"
    dflash("train", "--config", str(CONFIG), "--out-dir", str(run), "--skip-preflight")
    ck = run / "checkpoints/step-000003"
    out = {"run": run, "checkpoint": ck}
    for fmt in ("zlab", "speculators"):
        out[fmt] = tmp / fmt
        dflash("export", str(run), "--format", fmt, "--dtype", "float32", "--out", str(out[fmt]))
    out["dump"] = tmp / "step.safetensors"
    dflash("dump", "--config", str(CONFIG), "--init-from", str(ck), "--out", str(out["dump"]))
    return out


def speculators_module() -> types.ModuleType:
    if not (SPEC_ENV / "speculators").is_dir():
        pytest.skip(f"speculators 0.9.0 is not installed in {SPEC_ENV} (ci/bootstrap.sh "
                    "installs it; set DFLASH_SPECULATORS_ENV for another place)")
    if str(SPEC_ENV) not in sys.path:
        sys.path.append(str(SPEC_ENV))  # after the torch environment: its torch wins
    stand_ins = import_only_stand_ins()
    try:
        import speculators
        import speculators.convert  # noqa: F401
        import speculators.models.dflash.core  # noqa: F401
    finally:  # gone again, so transformers never takes them for the real packages
        for name in stand_ins:
            sys.modules.pop(name, None)
    version = importlib.metadata.version("speculators")
    assert version == "0.9.0", f"speculators {version} in {SPEC_ENV}; the loader checked is 0.9.0"
    return speculators


def import_only_stand_ins() -> list[str]:
    """Modules with the names speculators imports from `datasets` and `openai`
    at import time; using any of them raises."""

    class Unused:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise ImportError("a stand-in: speculators' data pipeline is not under test")

    names = {
        "datasets": ["load_from_disk", "load_dataset", "concatenate_datasets", "Dataset"],
        "openai": ["OpenAI", "AsyncOpenAI", "Client", "AsyncClient"],
        "openai.types": [],
        "openai.types.chat": ["ChatCompletion", "ChatCompletionMessageParam"],
        "openai.types.completion": ["Completion"],
    }
    added = []
    for name, attrs in names.items():
        if name in sys.modules:
            continue
        m = types.ModuleType(name)
        for a in attrs:
            setattr(m, a, Unused)
        sys.modules[name] = m
        added.append(name)
    if "openai" in added:
        sys.modules["openai"].types = sys.modules["openai.types"]  # type: ignore[attr-defined]
        sys.modules["openai.types"].chat = sys.modules["openai.types.chat"]  # type: ignore
        sys.modules["openai.types"].completion = sys.modules["openai.types.completion"]  # type: ignore
    return added


def drafter_tensors(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def test_speculators_export_loads_unchanged(exported: dict[str, Path]) -> None:
    speculators_module()
    from speculators import SpeculatorModel

    m = SpeculatorModel.from_pretrained(str(exported["speculators"]))
    ours = load_file(str(exported["checkpoint"] / "model.safetensors"))
    theirs = m.state_dict()
    assert type(m).__name__ == "DFlashDraftModel"
    for name, t in ours.items():
        assert torch.equal(theirs[name].float(), t), name
    taps = json.loads((exported["zlab"] / "config.json").read_text())["dflash_config"]
    assert m.target_layer_ids == [i + 1 for i in taps["target_layer_ids"]]
    assert (m.block_size, m.mask_token_id) == (8, 258)


def test_speculators_converter_on_zlab_export_gives_the_same_drafter(
        exported: dict[str, Path], tmp_path: Path) -> None:
    speculators_module()
    from speculators.convert import convert_model

    convert_model(model=str(exported["zlab"]), verifier=str(TARGET), algorithm="dflash",
                  output_path=str(tmp_path / "converted"), validate_device=None)
    converted = drafter_tensors(tmp_path / "converted")
    ours = drafter_tensors(exported["speculators"])
    assert converted.keys() == ours.keys()
    for name in ours:
        assert torch.equal(converted[name], ours[name]), name
    theirs = json.loads((tmp_path / "converted/config.json").read_text())
    mine = json.loads((exported["speculators"] / "config.json").read_text())
    for key in ("aux_hidden_state_layer_ids", "block_size", "mask_token_id", "draft_vocab_size"):
        assert theirs[key] == mine[key], key
    assert (theirs["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
            == mine["speculators_config"]["proposal_methods"][0]["speculative_tokens"])


def test_speculators_forward_equals_dflash_student_hidden(exported: dict[str, Path]) -> None:
    speculators_module()
    import speculators.models.dflash.core as core
    from speculators import SpeculatorModel

    m = SpeculatorModel.from_pretrained(str(exported["speculators"])).float().eval()
    d = load_file(str(exported["dump"]))
    ids, feats, ht = d["input.input_ids"], d["input.features"], d["input.target_hidden"]
    anchors, keep, want = d["input.anchors"], d["input.keep"], d["output.student_hidden"]
    B, S = ids.shape
    bs = m.block_size
    worst, blocks = 0.0, 0
    for b in range(B):
        n_kept = int(keep[b].sum())
        assert bool(keep[b, :n_kept].all())  # kept blocks come first
        # speculators draws its own anchors at random: use dflash's instead.
        core.select_anchors = lambda lm, n, size, a=anchors[b, :n_kept]: (
            a.clone(), torch.ones(len(a), dtype=torch.bool))
        # Padding past S keeps every block inside speculators' index range;
        # no block sees it (context strictly before the anchor).
        pad = lambda t: torch.cat([t, torch.zeros_like(t[:bs])])  # noqa: E731
        with torch.no_grad():
            hidden = m._backbone_forward(
                pad(feats[b])[None], pad(ids[b])[None], torch.ones(1, S + bs, dtype=torch.long),
                pad(ht[b])[None], torch.zeros(1, S + bs, dtype=torch.long), None,
                max_anchors=n_kept)[0]
        got = hidden[0].reshape(n_kept, bs, -1)
        ref = want[b, :n_kept * bs].reshape(n_kept, bs, -1)
        worst = max(worst, float((got - ref).abs().max()))
        blocks += n_kept
    assert blocks > 0
    print(f"{blocks} kept blocks: max |speculators - dflash| = {worst:.2e}")
    assert worst <= 1e-5  # float32 on both sides, different kernels


# The loading rules read in vLLM 0.34.0 (V), SGLang 0.5.23 (S) and
# speculators 0.9.0 (P), written as checks on the exported config.json.
def zlab_rules(cfg: dict, target: dict) -> list[str]:
    L, df = target["num_hidden_layers"], cfg["dflash_config"]
    ids = df["target_layer_ids"]
    broken = []
    if cfg["architectures"] != ["DFlashDraftModel"]:
        broken.append("V registry.py / S models/dflash.py: architectures must be DFlashDraftModel")
    if ids != sorted(set(ids)):
        broken.append("V interfaces.py / S qwen3.py: taps are captured in layer order")
    if not all(0 <= i < L - 1 for i in ids):
        broken.append("S qwen3.py: a tap of the last layer is never captured")
    if not 0 <= df["mask_token_id"] < target["vocab_size"]:
        broken.append("S dflash_utils.py: mask_token_id below the target's vocab_size")
    if df.get("block_size", cfg.get("block_size")) != cfg["block_size"]:
        broken.append("S dflash_utils.py: dflash_config.block_size wins over block_size")
    if cfg.get("num_target_layers") != L:
        broken.append("S dflash_utils.py: num_target_layers bounds the tap ids")
    if cfg.get("is_causal") or df.get("causal"):
        broken.append("V qwen3_dflash.py / S dflash.py: is_causal makes every layer causal")
    if cfg.get("layer_types") != ["full_attention"] * cfg["num_hidden_layers"]:
        broken.append("V qwen3_dflash.py / S dflash.py: only full_attention stays bidirectional")
    if cfg["hidden_size"] != target["hidden_size"]:
        broken.append("S dflash.py: fc reads taps of the drafter's own width")
    return broken


def speculators_rules(cfg: dict, zlab: dict) -> list[str]:
    broken = []
    if "model_type" in cfg or cfg.get("speculators_model_type") != "dflash":
        broken.append("V config.py: no model_type, speculators_model_type dflash")
    if cfg["aux_hidden_state_layer_ids"] != [
            i + 1 for i in zlab["dflash_config"]["target_layer_ids"]]:
        broken.append("V algos.py: target_layer_ids = aux - 1")
    if cfg.get("sliding_window_non_causal") is False:
        broken.append("V algos.py: causal = not sliding_window_non_causal, on every layer")
    if cfg["mask_token_id"] != zlab["dflash_config"]["mask_token_id"]:
        broken.append("V algos.py: mask_token_id")
    spec = cfg["speculators_config"]
    if spec["proposal_methods"][0]["speculative_tokens"] != cfg["block_size"] - 1:
        broken.append("V speculator_config.py: num_speculative_tokens = block_size - 1")
    if not spec["verifier"]["name_or_path"] or not spec["verifier"]["architectures"]:
        broken.append("P core.py: the verifier gives the embedding and LM head")
    return broken


def test_exported_configs_follow_the_engines_loading_rules(exported: dict[str, Path]) -> None:
    target = json.loads((TARGET / "config.json").read_text())
    zlab = json.loads((exported["zlab"] / "config.json").read_text())
    spec = json.loads((exported["speculators"] / "config.json").read_text())
    assert zlab_rules(zlab, target) == []
    assert speculators_rules(spec, zlab) == []
    tensors = drafter_tensors(exported["zlab"])
    assert "embed_tokens.weight" not in tensors and "lm_head.weight" not in tensors
    H, n = target["hidden_size"], len(zlab["dflash_config"]["target_layer_ids"])
    assert list(tensors["fc.weight"].shape) == [H, n * H]  # V qwen3_dflash.py, S dflash.py
    # The rules catch what they are written for.
    bad = dict(zlab, dflash_config=dict(zlab["dflash_config"], target_layer_ids=[2, 0]))
    assert len(zlab_rules(bad, target)) == 1
    last = dict(zlab, dflash_config=dict(zlab["dflash_config"], target_layer_ids=[0, 3]))
    assert len(zlab_rules(last, target)) == 1
    assert len(speculators_rules(dict(spec, sliding_window_non_causal=False), zlab)) == 1


def test_init_from_an_export_is_the_checkpoint(exported: dict[str, Path], tmp_path: Path) -> None:
    """`--init-from` the zlab or speculators export (float32) or the checkpoint
    itself: the same dumped step, and the same parameters after a step."""
    dumps, params = [], []
    for src in (exported["checkpoint"], exported["zlab"], exported["speculators"]):
        dump, out = tmp_path / f"{src.name}.safetensors", tmp_path / f"{src.name}.params"
        dflash("dump", "--config", str(CONFIG), "--init-from", str(src), "--out", str(dump))
        dflash("train", "--config", str(CONFIG), "--init-from", str(src), "--skip-preflight",
               "--set", "train.steps=1", "--out-dir", str(tmp_path / f"run-{src.name}"),
               "--out-params", str(out))
        dumps.append(load_file(str(dump)))
        params.append(load_file(str(out)))
    for d in dumps[1:]:
        assert d.keys() == dumps[0].keys()
        assert all(torch.equal(d[k], dumps[0][k]) for k in d)
    for p in params[1:]:
        assert all(torch.equal(p[k], params[0][k]) for k in p)
    # Another run's drafter is refused, naming what differs.
    binary = os.environ.get("DFLASH_BINARY", str(ROOT / "build/dflash"))
    r = subprocess.run([binary, "train", "--config", str(CONFIG), "--init-from",
                        str(exported["zlab"]), "--set", "drafter.target_layer_ids=[1, 2]",
                        "--skip-preflight", "--out-dir", str(tmp_path / "refused")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0
    assert "target_layer_ids: [0, 2] there, [1, 2] in the config" in r.stdout + r.stderr
