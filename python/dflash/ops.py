"""dflash's two kernels as PyTorch ops: `fused_loss` and `sparse_attention`.

The kernels are the C++ ones of dflash's optimized build (the fused chunked
LM-head loss and the tiled block-sparse draft attention), registered as
`torch.ops.dflash.*` by the op library `libdflash_ops.so` (ops/ in the
repository). This module loads that library, registers what PyTorch needs
beside the kernels (fake kernels, for torch.compile and FakeTensor; the
autograd formulas, whose backwards are dflash's own) and wraps the ops in
functions with PyTorch's usual conventions (docs/PYTORCH.md).

Importing it needs no GPU: the library carries a CPU kernel (the host row
kernels) and a CUDA kernel (the same algorithm in ATen ops) for each op.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from torch import Tensor

LIBRARY_NAME = "libdflash_ops.so"


def library_path() -> Path:
    """Where the op library is: $DFLASH_OPS_LIBRARY (a build tree's copy, as
    the test suite sets it), else the one installed inside this package."""
    env = os.environ.get("DFLASH_OPS_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ImportError(f"dflash: DFLASH_OPS_LIBRARY={env} is not a file")
        return path
    path = Path(__file__).with_name(LIBRARY_NAME)
    if not path.is_file():
        raise ImportError(
            f"dflash: the op library {path} is missing: this is a source checkout, not an "
            "installed package. Install the package (ci/bootstrap.sh does, or `pip install "
            "--no-build-isolation .` in the repository) or point DFLASH_OPS_LIBRARY at a built "
            "libdflash_ops.so")
    return path


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def _load() -> dict:
    path = library_path()
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        raise ImportError(
            f"dflash: cannot load {path} into torch {torch.__version__}: {e}. The library is "
            "built against one torch; rebuild it against this one (ci/bootstrap.sh, or "
            "`pip install --no-build-isolation .` with this python)") from e
    info = json.loads(torch.ops.dflash.build_info())
    if _base(info["torch"]) != _base(torch.__version__):
        raise ImportError(
            f"dflash: {path} was built against torch {info['torch']} but this python runs torch "
            f"{torch.__version__}; rebuild it against this torch (`pip install "
            "--no-build-isolation .` with this python)")
    return info


BUILD_INFO = _load()


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- fake (shape-only) kernels -------------------------------------------


@torch.library.register_fake("dflash::fused_loss")
def _fused_loss_fake(input, weight, target, teacher_input, row_weight, ignore_index, reduction,
                     ce_weight, kl_weight, reverse_kl_weight, jsd_weight, jsd_beta, tv_weight,
                     temperature, chunk_size, compute_grad):
    loss = input.new_empty((), dtype=_acc(input.dtype))
    metrics = input.new_empty((7,), dtype=torch.float64)
    grad = input.new_empty(input.shape) if compute_grad else input.new_empty((0,))
    return loss, metrics, grad


@torch.library.register_fake("dflash::fused_loss_backward")
def _fused_loss_backward_fake(grad_input, grad_loss):
    return grad_input.new_empty(grad_input.shape)


@torch.library.register_fake("dflash::sparse_attention")
def _sparse_attention_fake(q, k, v, anchors, keep, seq_len, block_size, tile):
    acc = _acc(q.dtype)
    out = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:3], dtype=acc)
    out_acc = q.new_empty(q.shape if q.dtype != acc else (0,), dtype=acc)
    return out, lse, out_acc


@torch.library.register_fake("dflash::sparse_attention_backward")
def _sparse_attention_backward_fake(grad_out, q, k, v, out, lse, out_acc, anchors, keep, seq_len,
                                    block_size, tile):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- autograd: dflash's backwards -----------------------------------------


def _fused_loss_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output[2])


def _fused_loss_backward(ctx, grad_loss, grad_metrics, grad_saved):
    (saved,) = ctx.saved_tensors
    grad_input = None
    if ctx.needs_input_grad[0] and grad_loss is not None:
        grad_input = torch.ops.dflash.fused_loss_backward(saved, grad_loss)
    return (grad_input,) + (None,) * 15


torch.library.register_autograd("dflash::fused_loss", _fused_loss_backward,
                                setup_context=_fused_loss_setup)


def _sparse_attention_setup(ctx, inputs, output) -> None:
    q, k, v, anchors, keep, seq_len, block_size, tile = inputs
    out, lse, out_acc = output
    # Backward reads the output in the accumulation dtype when there is one
    # (bf16 inputs: out_acc), else out: only that one is kept.
    saved_out = out_acc if out_acc.numel() > 0 else out
    ctx.save_for_backward(q, k, v, saved_out, lse, anchors, keep)
    ctx.geometry = (seq_len, block_size, tile)


def _sparse_attention_backward(ctx, grad_out, grad_lse, grad_out_acc):
    q, k, v, saved_out, lse, anchors, keep = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    dq, dk, dv = torch.ops.dflash.sparse_attention_backward(
        grad_out, q, k, v, saved_out, lse, lse.new_empty((0,)), anchors, keep, *ctx.geometry)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("dflash::sparse_attention", _sparse_attention_backward,
                                setup_context=_sparse_attention_setup)


# ---- the functions users call ----------------------------------------------


class FusedLossOutput(NamedTuple):
    """The loss and the metrics a trainer logs; every metric is a float64
    scalar tensor, detached. ce ... tv are sum(w * term) / sum(w) ('mean')
    or sum(w * term) ('sum'); accuracy is over the rows whose target is not
    ignore_index."""
    loss: Tensor
    ce: Tensor
    kl: Tensor
    reverse_kl: Tensor
    jsd: Tensor
    tv: Tensor
    weight_sum: Tensor
    accuracy: Tensor


def fused_loss(input: Tensor, weight: Tensor, target: Tensor,
               teacher_input: Optional[Tensor] = None, row_weight: Optional[Tensor] = None, *,
               ignore_index: int = -100, reduction: str = "mean", ce_weight: float = 1.0,
               kl_weight: float = 0.0, reverse_kl_weight: float = 0.0, jsd_weight: float = 0.0,
               jsd_beta: float = 0.5, tv_weight: float = 0.0, temperature: float = 1.0,
               chunk_size: int = 2048) -> FusedLossOutput:
    """The fused LM-head loss: no (N, V) logits tensor ever exists.

    input (N, H): the student's final hidden states (the drafter's D, rows
    flattened); weight (V, H): the frozen LM head; target (N) int64 labels,
    ignore_index where a row does not count; teacher_input (N, H): the
    target's final hidden state for each row (the teacher's logits are
    teacher_input @ weight.T), needed when a distillation weight is set;
    row_weight (N): each row's weight w (default 1).

    loss = sum_r w_r (ce_weight CE_r + kl_weight KL_r + reverse_kl_weight
    RKL_r + jsd_weight JSD_r + tv_weight TV_r) / sum_r w_r  ('mean'; 'sum'
    drops the division); the temperature T divides the student's and the
    teacher's logits in the distillation terms (CE is at T = 1), with no T^2
    factor (docs/LOSSES.md). Rows are processed chunk_size at a time;
    the input gradient is computed in forward (three GEMMs per chunk) and
    backward only scales it. The LM head and the teacher are frozen: they
    must not require grad. Float32, float64 or bfloat16; CPU or CUDA.
    """
    if torch.is_grad_enabled():
        for name, t in (("weight", weight), ("teacher_input", teacher_input),
                        ("row_weight", row_weight)):
            if t is not None and t.requires_grad:
                raise ValueError(
                    f"dflash.fused_loss: {name} requires grad, but this op gives it none (the "
                    "LM head and the teacher are frozen; row weights are constants); pass "
                    f"{name}.detach() or set requires_grad_(False)")
    compute_grad = torch.is_grad_enabled() and input.requires_grad
    loss, metrics, _ = torch.ops.dflash.fused_loss(
        input, weight, target, teacher_input, row_weight, ignore_index, reduction,
        float(ce_weight), float(kl_weight), float(reverse_kl_weight), float(jsd_weight),
        float(jsd_beta), float(tv_weight), float(temperature), int(chunk_size), compute_grad)
    m = metrics.detach()
    return FusedLossOutput(loss, m[0], m[1], m[2], m[3], m[4], m[5], m[6])


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, anchors: Tensor, keep: Tensor,
                     seq_len: int, block_size: int, *, tile: int = 256) -> Tensor:
    """DFlash's block-sparse draft attention, without a mask or score tensor.

    q (B, nh, Q, hd) for the Q = N * block_size draft slots; k and v
    (B, nkv, S + Q, hd): the S = seq_len context keys, then the draft slots'
    own keys; anchors (B, N) int64 and keep (B, N) bool (SPEC.md step 2).
    Slot (n, j) sees context keys [0, anchors[n]) and the block_size keys of
    its own block, when keep[n]; a block with keep false outputs exactly 0.
    Scale hd^-0.5; GQA when nh is a multiple of nkv (no repeated K/V).
    Keys are visited `tile` at a time with an online softmax; backward
    recomputes each tile from the saved log-sum-exp. Returns (B, nh, Q, hd).
    """
    out, _, _ = torch.ops.dflash.sparse_attention(q, k, v, anchors, keep, int(seq_len),
                                                   int(block_size), int(tile))
    return out
