"""dflash.audit_leakage on a PyTorch drafter (dflash/example_drafter.py):
clean with dflash's sparse-attention op and with a correct dense mask,
failing with the first (block, position) on a mask seeded to let a block
see the positions it must predict. ci/mutants.toml's
`sparse_context_includes_anchor` shows it failing on dflash's own kernel
(the op) when that kernel's mask is mutated."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import dflash
from dflash.example_drafter import Batch, Drafter, DrafterShape, StepSettings, draft_layout
from dflash.dump_test import SeesLaterPositions

SHAPE = DrafterShape(hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
                     intermediate_size=24, num_taps=2)
V = 29
SETTINGS = StepSettings(block_size=3, mask_token_id=V - 1)


def setup(cls=Drafter, **kw):
    torch.manual_seed(0)
    model = cls(SHAPE, SETTINGS, **kw).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1 if p.dim() == 1 else 0))
    g = torch.Generator().manual_seed(2)
    B, S, H = 2, 14, SHAPE.hidden_size
    batch = Batch(input_ids=torch.randint(0, V - 1, (B, S), generator=g),
                  loss_mask=torch.ones(B, S, dtype=torch.bool),
                  features=torch.randn(B, S, 2 * H, generator=g, dtype=torch.float64),
                  target_hidden=torch.randn(B, S, H, generator=g, dtype=torch.float64),
                  anchors=torch.tensor([[0, 4, 9], [2, 6, 0]]),
                  keep=torch.tensor([[True, True, True], [True, True, False]]))
    embed = torch.randn(V, H, generator=g, dtype=torch.float64)
    lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    return model, batch, embed, lm_head


def audit(model, batch, embed, lm_head):
    lay = draft_layout(batch, SETTINGS)
    B, Q = lay.noise_ids.shape

    def slot_losses(features, noise_embeds):
        D = model.hidden(dataclasses.replace(batch, features=features), lay, noise_embeds)
        ce = F.cross_entropy((D @ lm_head.t()).flatten(0, 1), lay.labels.flatten(),
                             reduction="none")
        return (ce * lay.weights.flatten()).view(B, Q)

    return dflash.audit_leakage(slot_losses, batch.features, F.embedding(lay.noise_ids, embed),
                                batch.anchors, batch.keep, SETTINGS.block_size)


@pytest.mark.parametrize("attention", ["dflash", "dense"])
def test_clean_drafter_passes(attention):
    report = audit(*setup(attention=attention))
    assert report.ok, str(report)
    assert report.blocks_checked == 5  # the kept blocks
    assert report.blocks_reading_context == 4  # every kept block with an anchor > 0


def test_mask_seeing_later_positions_is_named():
    report = audit(*setup(SeesLaterPositions, attention="dense"))
    assert not report.ok
    assert report.first == ("block (row 0, block 0, anchor 0) reads target features at "
                            "position 0 >= its anchor 0"), report.first


def test_context_up_to_and_including_the_anchor_is_named():
    """SPEC.md's `<=` for `<`: the block reads exactly its anchor's position."""
    class SeesItsAnchor(Drafter):
        def build_mask(self, anchors, keep, S):
            m = super().build_mask(anchors, keep, S)
            j = torch.arange(m.size(-1))
            a = anchors.repeat_interleave(self.st.block_size, 1).unsqueeze(-1)
            return m | ((j == a) & keep.repeat_interleave(self.st.block_size, 1).unsqueeze(-1))

    report = audit(*setup(SeesItsAnchor, attention="dense"))
    assert report.first == ("block (row 0, block 0, anchor 0) reads target features at "
                            "position 0 >= its anchor 0"), report.first
    assert len(report.violations) == 5  # every kept block


def test_a_block_reading_another_block_is_named():
    class SeesNextBlock(Drafter):
        def build_mask(self, anchors, keep, S):
            m = super().build_mask(anchors, keep, S)
            bs = self.st.block_size
            return m | torch.roll(m, shifts=bs, dims=-1) & (torch.arange(m.size(-1)) >= S)

    report = audit(*setup(SeesNextBlock, attention="dense"))
    assert not report.ok
    # Row 1's block 1 reads block 2 (keep false: its slots hold only noise):
    # the first thing it reads that it must not is that block's noise.
    assert ("block (row 1, block 1, anchor 6) reads the noise embedding of row 1 slot 6 "
            "(block 2)") in report.violations, report.violations


def test_a_block_reading_another_row_is_named():
    class MixesRows(Drafter):
        def context(self, features):  # seeded: the context centred over the batch
            c = super().context(features)
            return c - c.mean(0, keepdim=True)

    report = audit(*setup(MixesRows))
    assert report.first == ("block (row 0, block 1, anchor 4) reads target features of row 1 "
                            "at position 0"), report.first


def test_an_audit_that_checks_nothing_is_refused():
    model, batch, embed, lm_head = setup()
    with pytest.raises(ValueError, match="no kept block's loss depends on"):
        dflash.audit_leakage(lambda f, e: torch.zeros(2, 9, dtype=torch.float64), batch.features,
                             torch.zeros(2, 9, 16, dtype=torch.float64), batch.anchors,
                             batch.keep, 3)


def test_losses_must_be_float64():
    with pytest.raises(ValueError, match="must be float64"):
        dflash.audit_leakage(lambda f, e: (f.sum(-1)[:, :6] * 1).float(), torch.zeros(1, 8, 2),
                             torch.zeros(1, 6, 2), torch.zeros(1, 2, dtype=torch.long),
                             torch.ones(1, 2, dtype=torch.bool), 3)
