"""dflash.dump_step: a PyTorch drafter's step (dflash/example_drafter.py)
checked by `dflash step --from FILE --check` against dflash's float64
reference, and three bugs seeded into that module, each reported by name.

The inputs, weights and config are those of a reference dump of the
default config in float64 (`dflash dump`), with temperature 2 so that a KL
without its temperature differs."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import dflash
from dflash.example_drafter import Batch, Drafter, load_drafter, settings_from_config

ROOT = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("DFLASH_BINARY", str(ROOT / "build" / "dflash"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("dump") / "reference.safetensors"
    subprocess.run([BINARY, "dump", "--config", str(ROOT / "fixtures/configs/tiny.toml"),
                    "--set", "run.dtype=float64", "--set", "loss.temperature=2.0",
                    "--out", str(path)], check=True, capture_output=True)
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    return tensors, json.loads(meta["config"])


def run_step(reference, cls=Drafter, *, trainable_lm_head=False, **kw):
    tensors, config = reference
    shape, st = settings_from_config(config)
    model = cls(shape, st, **kw).double()
    load_drafter(model, tensors)
    embed = tensors["embed_tokens.weight"].clone()
    lm_head = tensors["lm_head.weight"].clone().requires_grad_(trainable_lm_head)
    batch = Batch(**{k: tensors[f"input.{k}"] for k in
                     ("input_ids", "loss_mask", "features", "target_hidden", "anchors", "keep")})
    out = model(batch, embed, lm_head)
    out["loss"].backward()
    return model, batch, embed, lm_head, out


def dump(tmp_path, reference, model, batch, embed, lm_head, out) -> Path:
    return dflash.dump_step(
        tmp_path / "mine.safetensors", config=reference[1], inputs=vars(batch), drafter=model,
        embed_tokens=embed, lm_head=lm_head,
        outputs={k: out[k] for k in ("loss", "ce", "kl", "student_hidden")})


def test_module_agrees_with_the_reference_float64(tmp_path, reference):
    model, batch, embed, lm_head, out = run_step(reference)
    tensors = reference[0]
    for name in ("loss", "ce", "kl", "student_hidden"):
        err = (out[name].detach() - tensors[f"output.{name}"]).abs().max().item()
        assert err <= 1e-10, f"output.{name}: {err:.3e}"
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert set(f"grad.{n}" for n in grads) == {k for k in tensors if k.startswith("grad.")}
    for n, g in grads.items():
        err = (g - tensors[f"grad.{n}"]).abs().max().item()
        assert err <= 1e-10, f"grad.{n}: {err:.3e}"
    path = dump(tmp_path, reference, model, batch, embed, lm_head, out)
    check = dflash.check_step(path, binary=BINARY)
    assert check.returncode == 0, check.stdout + check.stderr
    audit = dflash.audit_dump(path, binary=BINARY)
    assert audit.returncode == 0 and "audit: ok" in audit.stdout, audit.stdout + audit.stderr


class SeesLaterPositions(Drafter):
    """Seeded bug: the context is visible through anchor + block_size, so a
    block sees the positions it must predict."""

    def build_mask(self, anchors, keep, S):
        m = super().build_mask(anchors, keep, S)
        j = torch.arange(m.size(-1))
        a = anchors.repeat_interleave(self.st.block_size, 1).unsqueeze(-1)
        late = (j < S) & (j < a + self.st.block_size)
        return m | (late & keep.repeat_interleave(self.st.block_size, 1).unsqueeze(-1))


class KlWithoutTemperature(Drafter):
    """Seeded bug: the KL term on logits not divided by the temperature."""

    def kl_temperature(self) -> float:
        return 1.0


@pytest.mark.parametrize("bug,kw,named", [
    ("mask sees later positions", dict(cls=SeesLaterPositions, attention="dense"),
     "output.student_hidden"),
    ("KL without its temperature", dict(cls=KlWithoutTemperature, loss="torch"), "output.kl"),
    ("LM head left trainable", dict(loss="torch", trainable_lm_head=True), "grad.lm_head.weight"),
])
def test_seeded_bug_is_reported_by_name(tmp_path, reference, bug, kw, named):
    path = dump(tmp_path, reference, *run_step(reference, **kw))
    check = dflash.check_step(path, binary=BINARY)
    assert check.returncode == 1, f"{bug}: not reported\n{check.stdout}"
    assert f"tensor '{named}'" in check.stdout + check.stderr, check.stdout + check.stderr


def test_audit_names_a_trainable_lm_head(tmp_path, reference):
    path = dump(tmp_path, reference, *run_step(reference, loss="torch", trainable_lm_head=True))
    audit = dflash.audit_dump(path, binary=BINARY)
    assert audit.returncode == 1
    assert "finding (b) lm_head.weight: frozen tensor has a recorded gradient" in audit.stdout, \
        audit.stdout + audit.stderr


@pytest.mark.parametrize("kw", [dict(attention="dense"), dict(loss="torch")])
def test_plain_pytorch_paths_pass_unseeded(tmp_path, reference, kw):
    """The seeded bugs are the only difference: the plain paths pass."""
    path = dump(tmp_path, reference, *run_step(reference, **kw))
    check = dflash.check_step(path, binary=BINARY)
    assert check.returncode == 0, check.stdout + check.stderr


def test_tied_embedding_and_lm_head_are_written(tmp_path, reference):
    model, batch, embed, lm_head, out = run_step(reference)
    path = dflash.dump_step(tmp_path / "tied.safetensors", config=reference[1], inputs=vars(batch),
                            drafter=model, embed_tokens=embed, lm_head=embed, outputs=out)
    with safe_open(str(path), "pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), embed)


def test_example_refuses_a_config_it_does_not_implement(reference):
    config = json.loads(json.dumps(reference[1]))
    config["loss"]["jsd_weight"] = 0.5
    with pytest.raises(ValueError, match="also sets loss.jsd_weight = 0.5"):
        settings_from_config(config)


def test_dump_step_refuses_incomplete_inputs(tmp_path, reference):
    model, batch, embed, lm_head, out = run_step(reference)
    inputs = dict(vars(batch))
    del inputs["keep"]
    with pytest.raises(ValueError, match=r"inputs lack \['keep'\]"):
        dflash.dump_step(tmp_path / "x.safetensors", config=reference[1], inputs=inputs,
                         drafter=model, embed_tokens=embed, lm_head=lm_head, outputs=out)
    assert not (tmp_path / "x.safetensors").exists()
