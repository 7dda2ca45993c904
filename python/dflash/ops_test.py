"""The registered ops: opcheck (schema, fake tensor, autograd registration,
AOT dispatch) on CPU in float32 and float64, parity against plain PyTorch,
and the errors a user sees for wrong inputs."""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F

import dflash
from dflash import ops

TOL64 = dict(rtol=0, atol=1e-10)  # float64 against float64 PyTorch: rounding only
# ci/gpu-check.sh runs this file with DFLASH_TEST_DEVICE=cuda (the CUDA kernels).
DEVICE = os.environ.get("DFLASH_TEST_DEVICE", "cpu")


def loss_case(dtype, *, teacher=True, N=13, H=8, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g, dtype=dtype).to(DEVICE).requires_grad_(True)
    W = torch.randn(V, H, generator=g, dtype=dtype).to(DEVICE)
    t = torch.randn(N, H, generator=g, dtype=dtype).to(DEVICE) if teacher else None
    y = torch.randint(0, V, (N,), generator=g)
    y[3] = -100
    w = torch.rand(N, generator=g, dtype=torch.float64)
    return x, W, y.to(DEVICE), t, w.to(DEVICE)


def plain_loss(x, W, y, t, w, *, ce_weight=1.0, kl_weight=0.0, temperature=1.0, reduction="mean"):
    """The objective of docs/LOSSES.md with full logits (plain autograd)."""
    keep = y != -100
    z = (x @ W.t()).double()
    ce = F.cross_entropy(z[keep], y[keep], reduction="none")
    wk = w[keep]
    num = (wk * ce).sum() * ce_weight
    if kl_weight:
        lps = torch.log_softmax(z[keep] / temperature, -1)
        lpt = torch.log_softmax((t @ W.t()).double()[keep] / temperature, -1)
        num = num + kl_weight * (wk * (lpt.exp() * (lpt - lps)).sum(-1)).sum()
    return num / wk.sum() if reduction == "mean" else num


OPCHECK_LOSS = [  # (name, kwargs): every objective and both reductions
    ("ce", dict(teacher=False, kw=dict())),
    ("ce_kl_T2", dict(teacher=True, kw=dict(kl_weight=0.5, temperature=2.0))),
    ("rkl_jsd_tv_sum", dict(teacher=True, kw=dict(ce_weight=0.0, reverse_kl_weight=0.3,
                                                   jsd_weight=0.2, jsd_beta=0.3, tv_weight=0.1,
                                                   reduction="sum"))),
]


def op_args(x, W, y, t, w, *, ignore_index=-100, reduction="mean", ce_weight=1.0, kl_weight=0.0,
            reverse_kl_weight=0.0, jsd_weight=0.0, jsd_beta=0.5, tv_weight=0.0, temperature=1.0,
            chunk_size=5):
    return (x, W, y, t, w, ignore_index, reduction, ce_weight, kl_weight, reverse_kl_weight,
            jsd_weight, jsd_beta, tv_weight, temperature, chunk_size, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,case", OPCHECK_LOSS)
def test_fused_loss_opcheck(dtype, name, case):
    x, W, y, t, w = loss_case(dtype, teacher=case["teacher"])
    torch.library.opcheck(torch.ops.dflash.fused_loss.default, op_args(x, W, y, t, w, **case["kw"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_attention_opcheck(dtype):
    q, k, v, anchors, keep, S, bs = attention_case(dtype)
    torch.library.opcheck(torch.ops.dflash.sparse_attention.default,
                          (q, k, v, anchors, keep, S, bs, 3))


@pytest.mark.parametrize("kl", [0.0, 0.7])
def test_fused_loss_matches_plain_pytorch_float64(kl):
    x, W, y, t, w = loss_case(torch.float64)
    out = dflash.fused_loss(x, W, y, t if kl else None, w, kl_weight=kl, temperature=1.5,
                            chunk_size=4)
    out.loss.backward()
    x2 = x.detach().clone().requires_grad_(True)
    ref = plain_loss(x2, W, y, t, w, kl_weight=kl, temperature=1.5)
    ref.backward()
    torch.testing.assert_close(out.loss, ref, **TOL64)
    torch.testing.assert_close(x.grad, x2.grad, **TOL64)
    keep = y != -100
    z = x.detach() @ W.t()
    assert out.accuracy.item() == pytest.approx((z.argmax(-1) == y)[keep].double().mean().item())
    assert out.weight_sum.item() == pytest.approx(w[keep].sum().item())


def test_fused_loss_backward_scales_by_the_upstream_gradient():
    x, W, y, t, w = loss_case(torch.float64)
    (3.0 * dflash.fused_loss(x, W, y, None, w, reduction="sum").loss).backward()
    x2 = x.detach().clone().requires_grad_(True)
    (3.0 * plain_loss(x2, W, y, None, w, reduction="sum")).backward()
    torch.testing.assert_close(x.grad, x2.grad, **TOL64)


def test_fused_loss_without_grad_computes_no_gradient():
    x, W, y, t, w = loss_case(torch.float32)
    with torch.no_grad():
        _, _, grad = torch.ops.dflash.fused_loss(*op_args(x, W, y, t, w)[:-1], False)
    assert grad.numel() == 0
    with torch.no_grad():
        assert not dflash.fused_loss(x, W, y).loss.requires_grad


def attention_case(dtype, *, B=2, nh=4, nkv=2, hd=8, S=11, bs=3, N=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    Q = N * bs
    q = torch.randn(B, nh, Q, hd, generator=g, dtype=dtype).to(DEVICE).requires_grad_(True)
    k = torch.randn(B, nkv, S + Q, hd, generator=g, dtype=dtype).to(DEVICE).requires_grad_(True)
    v = torch.randn(B, nkv, S + Q, hd, generator=g, dtype=dtype).to(DEVICE).requires_grad_(True)
    anchors = torch.tensor([[0, 4, 9], [2, 5, 0]], device=DEVICE)
    keep = torch.tensor([[True, True, True], [True, True, False]], device=DEVICE)
    return q, k, v, anchors, keep, S, bs


def dense_attention(q, k, v, anchors, keep, S, bs):
    """SPEC.md step 7 with an explicit mask."""
    B, nh, Q, hd = q.shape
    G = nh // k.size(1)
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    j = torch.arange(S + Q, device=q.device)
    a = anchors.repeat_interleave(bs, 1)  # (B, Q)
    blk = torch.arange(Q, device=q.device) // bs
    vis = ((j < S) & (j < a.unsqueeze(-1))) | ((j >= S) & ((j - S).clamp(min=0) // bs == blk.view(-1, 1)))
    vis = vis & keep.repeat_interleave(bs, 1).unsqueeze(-1)
    s = (q @ k.transpose(-1, -2)) * hd ** -0.5
    p = torch.softmax(s.masked_fill(~vis.unsqueeze(1), float("-inf")), -1)
    p = torch.where(vis.unsqueeze(1).any(-1, keepdim=True), p, torch.zeros_like(p))
    return p @ v


def test_sparse_attention_matches_dense_float64():
    q, k, v, anchors, keep, S, bs = attention_case(torch.float64)
    out = dflash.sparse_attention(q, k, v, anchors, keep, S, bs, tile=4)
    go = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), go)
    ref = dense_attention(q, k, v, anchors, keep, S, bs)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), go)
    for a, b in ((out, ref), (dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(a, b, **TOL64)
    assert out[1, :, 6:].abs().max() == 0  # the keep = false block outputs exactly 0


def test_package_metadata():
    assert dflash.__version__ == ops.BUILD_INFO["dflash"]
    assert ops.BUILD_INFO["torch"].split("+")[0] == torch.__version__.split("+")[0]


@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.update(x=a["x"].half()), "must be float32, float64 or bfloat16"),
    (lambda a: a.update(W=a["W"].float()), "but weight is"),
    (lambda a: a.update(y=a["y"].int()), "target must be (N) int64"),
    (lambda a: a.update(W=a["W"][:, :5]), "weight must be (V, H)"),
    (lambda a: a.update(t=None, kl=0.5), "teacher_input is None"),
    (lambda a: a.update(reduction="none"), "reduction must be 'mean' or 'sum'"),
    (lambda a: a.update(y=a["y"].clamp(min=-1)), "target values must lie in [0, V = 37) or equal "
     "ignore_index = -100; found [-1, "),
])
def test_fused_loss_errors(mutate, message):
    x, W, y, t, w = loss_case(torch.float64)
    a = dict(x=x, W=W, y=y, t=None, w=w, kl=0.0, reduction="mean")
    mutate(a)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        dflash.fused_loss(a["x"], a["W"], a["y"], a["t"], a["w"], kl_weight=a["kl"],
                          reduction=a["reduction"])


def test_inputs_the_op_gives_no_gradient_must_not_require_one():
    x, W, y, t, w = loss_case(torch.float32)
    with pytest.raises(ValueError, match="weight requires grad, but this op gives it none"):
        dflash.fused_loss(x, W.clone().requires_grad_(True), y)
    with pytest.raises(ValueError, match="row_weight requires grad"):
        dflash.fused_loss(x, W, y, None, w.clone().requires_grad_(True))


@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.update(q=a["q"].half()), "q must be float32, float64 or bfloat16"),
    (lambda a: a.update(anchors=a["anchors"].int()), "anchors must be (B, Q / block_size)"),
    (lambda a: a.update(keep=a["keep"].long()), "keep must be (B, N) bool"),
    (lambda a: a.update(k=a["k"][:, :, :-1], v=a["v"][:, :, :-1]), "k must have S + Q"),
    (lambda a: a.update(bs=4), "is not a multiple of block_size"),
    (lambda a: a.update(anchors=a["anchors"] + 20), "anchors must lie in [0, S"),
])
def test_sparse_attention_errors(mutate, message):
    q, k, v, anchors, keep, S, bs = attention_case(torch.float32)
    a = dict(q=q, k=k, v=v, anchors=anchors, keep=keep, S=S, bs=bs)
    mutate(a)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        dflash.sparse_attention(a["q"], a["k"], a["v"], a["anchors"], a["keep"], a["S"], a["bs"])
