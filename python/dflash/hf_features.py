"""The transformers engine of `dflash features` (docs/TRAINING.md): a
Hugging Face target run by its own transformers model class, for targets
dflash's forward does not run (any architecture transformers loads: a
hybrid Qwen3.5, a Mistral, ...) or to check dflash's forward against it.

`dflash features` (data/features.cpp) reads the data, splits it, writes
the shards and the index; this module only runs the target. It reads the
token ids the binary wrote (safetensors, "<split>.input_ids" (n, S) int64)
and writes, per split:

  <split>.features       (n, S, L*H)  the outputs of the tapped decoder
                                      layers, concatenated in layer order
  <split>.target_hidden  (n, S, H)    the final normed hidden state (the
                                      LM head's input)

plus embed_tokens.weight and lm_head.weight (V, H), in the run's dtype.
A tapped layer's state is the output of decoder layer i (a forward hook on
the decoder's layers[i]), as dflash's forward taps it: not
output_hidden_states' last entry, which some classes return normed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class EngineError(Exception):
    """A refusal naming the file or argument at fault."""


def load_model(target: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The target's causal-LM class from its directory, offline, in `dtype`."""
    from transformers import AutoModelForCausalLM

    if not (target / "config.json").is_file():
        raise EngineError(f"{target}/config.json: not found (--target must be a model directory)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise EngineError(f"{target}: transformers cannot load it: {e}") from e
    return model.eval()


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (embedding, layers, final norm) of a causal LM."""
    decoder = model.get_decoder()
    if not hasattr(decoder, "layers"):
        raise EngineError(f"{type(model).__name__}: its decoder has no `layers` to tap")
    return decoder


@torch.no_grad()
def run_split(decoder: torch.nn.Module, ids: torch.Tensor, layers: list[int],
              batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """features (n, S, L*H) and target_hidden (n, S, H) of ids (n, S)."""
    taps: dict[int, torch.Tensor] = {}

    def hook(i: int):
        def keep(_module, _inputs, output) -> None:
            taps[i] = output[0] if isinstance(output, tuple) else output
        return keep

    handles = [decoder.layers[i].register_forward_hook(hook(i)) for i in layers]
    feats, finals = [], []
    try:
        for s0 in range(0, ids.shape[0], batch):
            taps.clear()
            out = decoder(input_ids=ids[s0:s0 + batch], use_cache=False)
            feats.append(torch.cat([taps[i] for i in layers], dim=-1))
            finals.append(out.last_hidden_state)
    finally:
        for h in handles:
            h.remove()
    return torch.cat(feats), torch.cat(finals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash.hf_features", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, required=True, help="Hugging Face model directory")
    p.add_argument("--input", type=Path, required=True, help="safetensors of <split>.input_ids")
    p.add_argument("--output", type=Path, required=True, help="safetensors to write")
    p.add_argument("--layers", required=True, help="tapped layer ids, comma-separated, ascending")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--batch", type=int, default=8, help="sequences per forward")
    a = p.parse_args(argv)
    from safetensors.torch import load_file, save_file
    import transformers

    try:
        layers = [int(x) for x in a.layers.split(",")]
        model = load_model(a.target, DTYPES[a.dtype])
        decoder = decoder_of(model)
        n_layers = len(decoder.layers)
        if any(i < 0 or i >= n_layers for i in layers):
            raise EngineError(f"--layers {a.layers}: expected ids in [0, {n_layers}) "
                              f"({a.target} has {n_layers} decoder layers)")
        inputs = load_file(str(a.input))
        out: dict[str, torch.Tensor] = {}
        for key in sorted(inputs):
            split = key.removesuffix(".input_ids")
            f, h = run_split(decoder, inputs[key].to(torch.long), layers, max(1, a.batch))
            out[f"{split}.features"], out[f"{split}.target_hidden"] = f, h
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        out["embed_tokens.weight"] = embed
        out["lm_head.weight"] = head if head.data_ptr() != embed.data_ptr() else head.clone()
        out = {k: v.detach().to(DTYPES[a.dtype]).contiguous() for k, v in out.items()}
        save_file(out, str(a.output), metadata={
            "engine": f"transformers {transformers.__version__}",
            "class": type(model).__name__})
    except EngineError as e:
        print(f"dflash features (transformers): {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
