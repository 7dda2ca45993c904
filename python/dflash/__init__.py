"""dflash for PyTorch trainers (docs/PYTORCH.md), and dflash's own Python
side (chat data preparation, docs/CHAT_DATA.md; the transformers feature
engine, docs/TRAINING.md).

    import dflash
    out = dflash.fused_loss(hidden, lm_head, labels, teacher_hidden, kl_weight=1.0)
    o = dflash.sparse_attention(q, k, v, anchors, keep, seq_len, block_size)
    dflash.dump_step("step.safetensors", config=..., inputs=..., drafter=module, ...)
    report = dflash.audit_leakage(slot_losses, features, noise_embeds, anchors, keep, block_size)

The ops load the compiled library on first use (importing `dflash` alone
does not import torch), so `dflash.prepare` and friends stay light.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "fused_loss": "ops", "sparse_attention": "ops", "FusedLossOutput": "ops",
    "library_path": "ops", "BUILD_INFO": "ops",
    "dump_step": "dump", "check_step": "dump", "audit_dump": "dump",
    "audit_leakage": "leakage", "LeakageReport": "leakage",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dflash' has no attribute '{name}'")
    import importlib
    value = getattr(importlib.import_module(f"dflash.{module}"), name)
    globals()[name] = value
    return value
