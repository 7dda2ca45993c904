"""A PyTorch trainer's step as a dflash step dump (docs/HARNESS.md section 7).

`dump_step` writes the safetensors file that `dflash step --from FILE
--check` recomputes with dflash's float64 reference and compares tensor by
tensor (`check_step` runs it), and whose recorded gradients `dflash audit
--from FILE` audits (`audit_dump`). Names (SPEC.md):

  input.{input_ids, loss_mask, features, target_hidden, anchors, keep}
  every drafter parameter by its Hugging Face DFlash name, plus the frozen
  embed_tokens.weight and lm_head.weight
  output.{loss, student_hidden, ce, kl, ...}
  grad.<name> for every parameter that has a gradient (a frozen tensor's
  gradient is written too, so that the check reports it)
  metadata: config (the resolved config JSON), format, producer
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Mapping, Optional, Union

from torch import Tensor, nn

INPUTS = ("input_ids", "loss_mask", "features", "target_hidden", "anchors", "keep")
FROZEN = ("embed_tokens.weight", "lm_head.weight")


def _config_json(config: Union[Mapping, str, os.PathLike]) -> str:
    if isinstance(config, Mapping):
        return json.dumps(config)
    path = Path(config)
    try:
        with open(path, "rb") as f:
            return json.dumps(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"dflash.dump_step: config {path}: {e}") from e


def _tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"dflash.dump_step: '{name}' must be a tensor, found {type(t).__name__}")
    # A copy: tied weights (embed_tokens = lm_head) must not share memory in
    # the file (safetensors refuses that).
    return t.detach().to("cpu", copy=True).contiguous()


def dump_step(path: Union[str, os.PathLike], *, config: Union[Mapping, str, os.PathLike],
              inputs: Mapping[str, Tensor], drafter: Union[nn.Module, Mapping[str, Tensor]],
              embed_tokens: Tensor, lm_head: Tensor, outputs: Mapping[str, Tensor],
              grads: Optional[Mapping[str, Tensor]] = None,
              producer: str = "dflash.dump_step") -> Path:
    """Writes one step of a PyTorch trainer in dflash's dump format.

    config: the run's dflash config, as a dict (the JSON form of the TOML)
    or a TOML path. inputs: the six input.* tensors. drafter: the module
    (its named_parameters must be the Hugging Face DFlash names) or a
    mapping of name -> tensor. outputs: at least loss and student_hidden
    (B, Q, H). grads: name -> gradient; by default every drafter
    parameter's .grad, and embed_tokens' / lm_head's .grad when they have
    one (a frozen weight with a gradient is a finding). The write is atomic.
    """
    missing = [k for k in INPUTS if k not in inputs]
    if missing:
        raise ValueError(f"dflash.dump_step: inputs lack {missing} (need {list(INPUTS)})")
    extra = sorted(set(inputs) - set(INPUTS))
    if extra:
        raise ValueError(f"dflash.dump_step: unknown inputs {extra} (known: {list(INPUTS)})")
    for need in ("loss", "student_hidden"):
        if need not in outputs:
            raise ValueError(f"dflash.dump_step: outputs lack '{need}'")
    params = dict(drafter.named_parameters()) if isinstance(drafter, nn.Module) else dict(drafter)
    tensors = {f"input.{k}": _tensor(k, inputs[k]) for k in INPUTS}
    tensors.update({name: _tensor(name, p) for name, p in params.items()})
    tensors["embed_tokens.weight"] = _tensor("embed_tokens", embed_tokens)
    tensors["lm_head.weight"] = _tensor("lm_head", lm_head)
    tensors.update({f"output.{k}": _tensor(k, v) for k, v in outputs.items()})
    if grads is None:
        grads = {name: p.grad for name, p in params.items() if p.grad is not None}
        for name, t in zip(FROZEN, (embed_tokens, lm_head)):
            if t.grad is not None:
                grads[name] = t.grad
    tensors.update({f"grad.{k}": _tensor(f"grad.{k}", g) for k, g in grads.items()})
    meta = {"config": _config_json(config), "format": "dflash-step-v1", "producer": producer}
    return _write_atomic(Path(path), tensors, meta)


def _write_atomic(path: Path, tensors: dict, meta: dict) -> Path:
    from safetensors.torch import save_file
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _binary(binary: Optional[str]) -> str:
    return binary or os.environ.get("DFLASH_BINARY") or "dflash"


def audit_dump(path: Union[str, os.PathLike], *,
               binary: Optional[str] = None) -> subprocess.CompletedProcess:
    """Runs `dflash audit --from PATH`: the requires_grad audit's rules on
    the recorded gradients (every trainable parameter has a finite gradient,
    nonzero where it must be; no frozen tensor has one). Returns the
    finished process (returncode 0: no finding; stdout: the table)."""
    return subprocess.run([_binary(binary), "audit", "--from", str(path)], capture_output=True,
                          text=True)


def check_step(path: Union[str, os.PathLike], *, binary: Optional[str] = None,
               compare: str = "tolerance") -> subprocess.CompletedProcess:
    """Runs `dflash step --from PATH --check --compare COMPARE` and returns
    the finished process (returncode 0: every recorded tensor agrees; its
    stdout holds the table, one line per failing tensor). The binary is
    `binary`, else $DFLASH_BINARY, else `dflash` on PATH."""
    return subprocess.run([_binary(binary), "step", "--from", str(path), "--check", "--compare", compare],
                          capture_output=True, text=True)
