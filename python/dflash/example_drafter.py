"""A DFlash drafter in plain PyTorch, written from docs/SPEC.md, using
dflash's two ops: what docs/PYTORCH.md shows and what the package's tests
train under torch.compile and checkpointing, dump and audit.

Parameter names are the Hugging Face DFlash layout (SPEC.md "Parameter
names"), so `dflash.dump_step` can write them unchanged. The embedding and
the LM head are the target's, frozen: plain tensors here, not parameters.

Two switches keep the plain-PyTorch paths that a trainer without dflash
would write, beside the ops: `attention="dense"` (an explicit (B, Q, S+Q)
mask, `build_mask`) and `loss="torch"` (full logits, `torch_loss`); tests
seed bugs into those by subclassing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dflash import ops


@dataclass(frozen=True)
class DrafterShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_taps: int
    rope_theta: float = 1e6
    eps: float = 1e-6


@dataclass(frozen=True)
class StepSettings:
    block_size: int
    mask_token_id: int
    ce_weight: float = 1.0
    kl_weight: float = 0.0
    temperature: float = 1.0
    gamma: float = 0.0
    chunk_size: int = 2048


def settings_from_config(config: Mapping) -> tuple[DrafterShape, StepSettings]:
    """The shape and step settings of a dflash config (the resolved config
    JSON that `dflash validate --print json` prints and dumps carry)."""
    t, d, data, loss = config["target"], config["drafter"], config["data"], config["loss"]
    taps = d.get("target_layer_ids") or []
    unsupported = [f"loss.{k} = {loss[k]}" for k in ("reverse_kl_weight", "jsd_weight", "tv_weight")
                   if loss.get(k, 0)]
    if loss.get("weighting", "decay") != "decay":
        unsupported.append(f"loss.weighting = {loss['weighting']}")
    if d.get("rope_type") or t.get("rope_type"):
        unsupported.append("RoPE scaling")
    if unsupported:
        raise ValueError(f"example_drafter implements CE + KL with decay weights and plain RoPE; "
                         f"this config also sets {', '.join(unsupported)}")

    def key(name: str, default=None):  # the drafter's shape, else the target's
        return d.get(name, t.get(name, default))

    shape = DrafterShape(
        hidden_size=key("hidden_size"), num_layers=d["num_hidden_layers"],
        num_heads=key("num_attention_heads"), num_kv_heads=key("num_key_value_heads"),
        head_dim=key("head_dim"), intermediate_size=key("intermediate_size"),
        num_taps=len(taps) if taps else d["num_hidden_layers"],
        rope_theta=key("rope_theta", 1e6), eps=key("rms_norm_eps", 1e-6))
    step = StepSettings(
        block_size=data["block_size"], mask_token_id=data["mask_token_id"],
        ce_weight=loss.get("ce_weight", 1.0), kl_weight=loss.get("kl_weight", 0.0),
        temperature=loss.get("temperature", 1.0), gamma=loss.get("gamma", 0.0),
        chunk_size=loss.get("chunk_size", 2048))
    return shape, step


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float() if x.dtype != torch.float64 else x
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """x (B, h, T, hd) rotated at positions (B, T)."""
    hd = x.size(-1)
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
    ang = positions.to(torch.float64).unsqueeze(-1) * inv  # (B, T, hd/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype).unsqueeze(1)  # (B, 1, T, hd)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype).unsqueeze(1)
    rotated = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        H, hd = s.hidden_size, s.head_dim
        self.q_proj = nn.Linear(H, s.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(H, s.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(H, s.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(s.num_heads * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, s.eps)
        self.k_norm = RMSNorm(hd, s.eps)


class MLP(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.eps)
        self.mlp = MLP(s)


@dataclass
class Batch:
    """One step's inputs (SPEC.md step 1-2), as a dump stores them."""
    input_ids: Tensor      # (B, S) int64
    loss_mask: Tensor      # (B, S) bool
    features: Tensor       # (B, S, L*H)
    target_hidden: Tensor  # (B, S, H)
    anchors: Tensor        # (B, N) int64
    keep: Tensor           # (B, N) bool


@dataclass
class Layout:
    """SPEC.md steps 3, 5 and 8: per draft slot (B, Q)."""
    noise_ids: Tensor
    positions: Tensor
    labels: Tensor
    teacher_index: Tensor
    counted: Tensor
    weights: Tensor


def draft_layout(b: Batch, st: StepSettings) -> Layout:
    B, S = b.input_ids.shape
    N, bs = b.anchors.size(1), st.block_size
    k = torch.arange(bs, device=b.anchors.device)
    pos = b.anchors.unsqueeze(-1) + k                                  # (B, N, bs)
    pos_c = pos.clamp(max=S - 1).reshape(B, N * bs)                    # (B, Q)
    mask_at = b.loss_mask.gather(1, pos_c).reshape(B, N, bs)
    counted = b.keep.unsqueeze(-1) & (pos < S) & (k > 0) & mask_at    # (B, N, bs)
    decay = torch.tensor([1.0 if st.gamma == 0 else math.exp(-max(i - 1, 0) / st.gamma)
                          for i in range(bs)], dtype=torch.float64, device=pos.device)
    noise = torch.full((B, N, bs), st.mask_token_id, dtype=torch.long, device=pos.device)
    first = torch.where(b.keep, b.input_ids.gather(1, b.anchors), st.mask_token_id)
    noise[:, :, 0] = first
    return Layout(noise.reshape(B, -1), pos.reshape(B, -1), b.input_ids.gather(1, pos_c),
                  (pos - 1).clamp(0, S - 1).reshape(B, -1), counted.reshape(B, -1),
                  (counted.to(torch.float64) * decay).reshape(B, -1))


class Drafter(nn.Module):
    """SPEC.md's drafter: fc, hidden_norm, decoder layers, norm."""

    def __init__(self, s: DrafterShape, st: StepSettings, *, attention: str = "dflash",
                 loss: str = "dflash", checkpoint_layers: Optional[bool] = None) -> None:
        super().__init__()
        self.fc = nn.Linear(s.num_taps * s.hidden_size, s.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(s.hidden_size, s.eps)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.eps)
        self.s, self.st = s, st
        self.attention, self.loss_kind = attention, loss
        self.checkpoint_layers = checkpoint_layers  # None: no checkpoint; else use_reentrant

    # -- SPEC.md step 7: the mask, for the dense path --------------------------
    def build_mask(self, anchors: Tensor, keep: Tensor, S: int) -> Tensor:
        """(B, Q, S+Q) bool: slot (n, k) sees context j < anchor_n and its own block."""
        bs = self.st.block_size
        B, N = anchors.shape
        j = torch.arange(S + N * bs, device=anchors.device)
        block_of_slot = torch.arange(N * bs, device=anchors.device) // bs  # (Q)
        anchor_q = anchors.repeat_interleave(bs, 1)                        # (B, Q)
        ctx = (j < S) & (j.view(1, 1, -1) < anchor_q.unsqueeze(-1))
        own = (j >= S) & ((j - S).clamp(min=0) // bs == block_of_slot.view(-1, 1))
        return (ctx | own) & keep.repeat_interleave(bs, 1).unsqueeze(-1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, anchors: Tensor, keep: Tensor,
               S: int) -> Tensor:
        if self.attention == "dflash":
            return ops.sparse_attention(q, k, v, anchors, keep, S, self.st.block_size)
        G = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        visible = self.build_mask(anchors, keep, S).unsqueeze(1)  # (B, 1, Q, S+Q)
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        scores = (q @ k.transpose(-1, -2)).to(acc) * q.size(-1) ** -0.5
        p = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        p = torch.where(visible.any(-1, keepdim=True), p, torch.zeros_like(p))
        return p.to(q.dtype) @ v

    def layer(self, i: int, x: Tensor, context: Tensor, positions: Tensor, anchors: Tensor,
              keep: Tensor) -> Tensor:
        """SPEC.md step 6; tensors only, so that checkpoint (both kinds) and
        torch.compile see every input."""
        s, L = self.s, self.layers[i]
        B, Q, _ = x.shape
        S = context.size(1)
        a = L.self_attn
        h = L.input_layernorm(x)
        kv_in = torch.cat([context, h], 1)                                    # (B, S+Q, H)
        key_pos = torch.cat([torch.arange(S, device=x.device).expand(B, S), positions], 1)
        q = a.q_norm(a.q_proj(h).view(B, Q, s.num_heads, s.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(kv_in).view(B, S + Q, s.num_kv_heads, s.head_dim)).transpose(1, 2)
        v = a.v_proj(kv_in).view(B, S + Q, s.num_kv_heads, s.head_dim).transpose(1, 2)
        q, k = rope(q, positions, s.rope_theta), rope(k, key_pos, s.rope_theta)
        o = self.attend(q, k, v, anchors, keep, S).transpose(1, 2).reshape(B, Q, -1)
        x = x + a.o_proj(o)
        return x + L.mlp(L.post_attention_layernorm(x))

    def context(self, features: Tensor) -> Tensor:
        """SPEC.md step 4: C = hidden_norm(F @ W_fc^T), (B, S, H)."""
        return self.hidden_norm(self.fc(features))

    def hidden(self, b: Batch, lay: Layout, noise_embeds: Tensor) -> Tensor:
        """SPEC.md steps 4-8: D = norm(x) (B, Q, H) from x = embed(noise_ids)."""
        context = self.context(b.features)  # (B, S, H)
        x = noise_embeds
        for i in range(len(self.layers)):
            args = (i, x, context, lay.positions, b.anchors, b.keep)
            if self.checkpoint_layers is None:
                x = self.layer(*args)
            else:
                x = checkpoint(self.layer, *args, use_reentrant=self.checkpoint_layers)
        return self.norm(x)

    # -- SPEC.md step 9 ----------------------------------------------------------
    def kl_temperature(self) -> float:
        """T of the distillation terms (both sides' logits / T, no T^2)."""
        return self.st.temperature

    def torch_loss(self, D: Tensor, teacher: Tensor, lm_head: Tensor, lay: Layout) -> dict:
        """Full (Q, V) logits in plain PyTorch: what a trainer without dflash writes."""
        st = self.st
        w = lay.weights.reshape(-1)
        logits = D.reshape(-1, D.size(-1)) @ lm_head.t()
        ce = F.cross_entropy(logits.to(w.dtype), lay.labels.reshape(-1), reduction="none")
        T = self.kl_temperature()
        log_ps = torch.log_softmax(logits.to(w.dtype) / T, -1)
        log_pt = torch.log_softmax((teacher.reshape(-1, D.size(-1)) @ lm_head.t()).to(w.dtype) / T, -1)
        kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
        wsum = w.sum()
        den = torch.where(wsum > 0, wsum, torch.ones_like(wsum))  # 0/0 := 0
        ce_m, kl_m = (w * ce).sum() / den, (w * kl).sum() / den
        loss = st.ce_weight * ce_m + st.kl_weight * kl_m
        return {"loss": loss.to(D.dtype if D.dtype == torch.float64 else torch.float32),
                "ce": ce_m, "kl": kl_m}

    def forward(self, b: Batch, embed_tokens: Tensor, lm_head: Tensor) -> dict:
        """One step: {"loss", "ce", "kl", "student_hidden"}."""
        lay = draft_layout(b, self.st)
        B, Q = lay.noise_ids.shape
        H = self.s.hidden_size
        D = self.hidden(b, lay, F.embedding(lay.noise_ids, embed_tokens))  # (B, Q, H)
        teacher = b.target_hidden.gather(1, lay.teacher_index.unsqueeze(-1).expand(B, Q, H))
        if self.loss_kind == "torch":
            out = self.torch_loss(D, teacher, lm_head, lay)
        else:
            st = self.st
            target = torch.where(lay.counted, lay.labels, -100).reshape(-1)
            r = ops.fused_loss(D.reshape(-1, H), lm_head, target,
                               teacher.reshape(-1, H) if st.kl_weight else None,
                               lay.weights.reshape(-1), ce_weight=st.ce_weight,
                               kl_weight=st.kl_weight, temperature=st.temperature,
                               chunk_size=st.chunk_size)
            out = {"loss": r.loss, "ce": r.ce, "kl": r.kl}
        out["student_hidden"] = D
        return out


def load_drafter(module: Drafter, tensors: Mapping[str, Tensor]) -> None:
    """Copies a dump's (or checkpoint's) tensors into the module by name."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name not in tensors:
                raise KeyError(f"dflash: no tensor '{name}' for the drafter parameter '{name}'")
            p.copy_(tensors[name].to(p.dtype))
