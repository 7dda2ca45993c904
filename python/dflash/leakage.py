"""The information-flow (leakage) audit for a PyTorch trainer's drafter.

A mask that lets a block see what it must predict trains with good metrics
and accepts nothing when served. The audit finds it by autograd, not by
reading the mask (the same rule as dflash's C++ audit, harness/leakage.*,
docs/HARNESS.md): for every kept block (b, n) whose loss depends on the
inputs, in float64, the gradient of that block's loss must be exactly zero

  - with respect to the target features of every other row, and of its own
    row at every position >= its anchor;
  - with respect to the noise embedding of every slot outside the block.

Call it with a function of (features, noise_embeds) that runs your
drafter's forward on them and returns per-slot losses (B, Q) (or per-block
losses (B, N)); the features and noise embeddings become float64 leaves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor


@dataclass
class LeakageReport:
    blocks_checked: int = 0
    blocks_reading_context: int = 0  # blocks whose loss reads some position < anchor
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Optional[str]:
        return self.violations[0] if self.violations else None

    def __str__(self) -> str:
        head = (f"leakage audit: {self.blocks_checked} blocks checked, "
                f"{self.blocks_reading_context} read earlier context")
        if self.ok:
            return head + ": no block reads what it must predict"
        return head + f", {len(self.violations)} leaking; first: {self.first}"

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(str(self))


def _first_nonzero(g: Tensor) -> Optional[int]:
    nz = (g != 0).reshape(g.size(0), -1).any(-1).nonzero()
    return int(nz[0, 0]) if nz.numel() else None


def _check_block(report: LeakageReport, b: int, n: int, anchor: int, bs: int, gf: Tensor,
                 gn: Tensor) -> None:
    where = f"block (row {b}, block {n}, anchor {anchor})"
    for r in range(gf.size(0)):
        if r != b and (p := _first_nonzero(gf[r])) is not None:
            report.violations.append(f"{where} reads target features of row {r} at position {p}")
            return
    if (p := _first_nonzero(gf[b, anchor:])) is not None:
        report.violations.append(f"{where} reads target features at position {anchor + p} "
                                 f">= its anchor {anchor}")
        return
    outside = gn.clone()
    outside[b, n * bs:(n + 1) * bs] = 0
    for r in range(outside.size(0)):
        if (q := _first_nonzero(outside[r])) is not None:
            report.violations.append(f"{where} reads the noise embedding of row {r} slot {q} "
                                     f"(block {q // bs})")
            return
    if anchor > 0 and bool((gf[b, :anchor] != 0).any()):
        report.blocks_reading_context += 1


def audit_leakage(slot_losses: Callable[[Tensor, Tensor], Tensor], features: Tensor,
                  noise_embeds: Tensor, anchors: Tensor, keep: Tensor,
                  block_size: int) -> LeakageReport:
    """features (B, S, F), noise_embeds (B, Q, H), anchors (B, N) int64,
    keep (B, N) bool. Returns a LeakageReport; every violation names the
    (row, block, anchor) and the position or slot it reads."""
    f = features.detach().to(torch.float64).requires_grad_(True)
    e = noise_embeds.detach().to(torch.float64).requires_grad_(True)
    out = slot_losses(f, e)
    B, N = anchors.shape
    if out.dim() != 2 or out.size(0) != B or out.size(1) not in (N, N * block_size):
        raise ValueError(f"dflash.audit_leakage: slot_losses must return (B, Q) = ({B}, "
                         f"{N * block_size}) or (B, N) = ({B}, {N}), found {tuple(out.shape)}")
    if out.dtype != torch.float64:
        raise ValueError("dflash.audit_leakage: the losses must be float64 (run the drafter in "
                         f"float64: exact zeros need it), found {out.dtype}")
    per_block = out.reshape(B, N, -1).sum(-1)  # (B, N)
    report = LeakageReport()
    for b in range(B):
        for n in range(N):
            if not bool(keep[b, n]) or not per_block.requires_grad:
                continue
            gf, gn = torch.autograd.grad(per_block[b, n], (f, e), retain_graph=True,
                                         allow_unused=True)
            if gf is None and gn is None:
                continue  # this block's loss carries nothing
            gf = torch.zeros_like(f) if gf is None else gf
            gn = torch.zeros_like(e) if gn is None else gn
            report.blocks_checked += 1
            _check_block(report, b, n, int(anchors[b, n]), block_size, gf, gn)
    if report.blocks_checked == 0 and bool(keep.any()):
        raise ValueError(
            "dflash.audit_leakage: no kept block's loss depends on the features or noise "
            "embeddings it was given: slot_losses must run the drafter on those leaves, with "
            "grad enabled (an audit that checks nothing would pass)")
    return report
