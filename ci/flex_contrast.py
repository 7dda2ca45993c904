#!/usr/bin/env python3
"""What flex_attention does in the set-up of the compile + checkpoint test
(python/dflash/compile_checkpoint_test.py): the DFlash mask as a flex block
mask, a layer under torch.utils.checkpoint, torch.compile(fullgraph=True),
forward and backward. docs/PYTORCH.md records what it printed, per torch
and device; ci/gpu-check.sh runs it on CUDA.

usage: flex_contrast.py [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    dev = ap.parse_args().device
    torch.manual_seed(0)
    B, nh, hd, S, bs, N = 1, 2, 16, 64, 4, 4
    Q = N * bs
    anchors = torch.tensor([[3, 10, 20, 40]], device=dev)
    keep = torch.ones(1, N, dtype=torch.bool, device=dev)

    def mask_mod(b, h, q, kv):  # SPEC.md step 7
        n = q // bs
        ctx = (kv < S) & (kv < anchors[b, n])
        own = (kv >= S) & ((kv - S) // bs == n)
        return (ctx | own) & keep[b, n]

    block_mask = create_block_mask(mask_mod, B, None, Q, S + Q, device=dev)
    lin = torch.nn.Linear(hd, hd, device=dev)

    def layer(q, k, v):
        return lin(flex_attention(q, k, v, block_mask=block_mask))

    q = torch.randn(B, nh, Q, hd, device=dev, requires_grad=True)
    k = torch.randn(B, nh, S + Q, hd, device=dev, requires_grad=True)
    v = torch.randn(B, nh, S + Q, hd, device=dev, requires_grad=True)
    cases = {
        "eager, no checkpoint": lambda: layer(q, k, v).sum(),
        "eager, checkpoint(use_reentrant=False)":
            lambda: checkpoint(layer, q, k, v, use_reentrant=False).sum(),
        "compile(fullgraph=True), checkpoint(use_reentrant=False)": torch.compile(
            lambda: checkpoint(layer, q, k, v, use_reentrant=False).sum(), fullgraph=True),
        "compile(fullgraph=True), checkpoint(use_reentrant=True)": torch.compile(
            lambda: checkpoint(layer, q, k, v, use_reentrant=True).sum(), fullgraph=True),
    }
    print(f"flex_attention, torch {torch.__version__}, device {dev}")
    for name, fn in cases.items():
        t = time.time()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn().backward()
            notes = sorted({str(w.message).splitlines()[0][:160] for w in caught})
            print(f"  {name}: forward + backward ran ({time.time() - t:.1f} s)"
                  + (f"; warnings: {notes}" if notes else ""))
        except Exception as e:  # the point is to record what happens
            cause = e.__cause__ or e.__context__
            detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
            more = f" <- {type(cause).__name__}: {str(cause).splitlines()[0]}" if cause else ""
            print(f"  {name}: {type(e).__name__}: {detail[:300]}{more[:300]}")
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
