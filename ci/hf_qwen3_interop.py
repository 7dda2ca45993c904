#!/usr/bin/env python3
"""The real-text target (fixtures/targets/qwen3-bytes) loads in Hugging Face
transformers' Qwen3ForCausalLM unchanged, and its held-out bits per byte
(the document named in result.json, windows of the recipe's seq_len) equal
the figure dflash recorded through its own loader and reference forward.

usage: hf_qwen3_interop.py MODEL_DIR   (run with the torch environment's python)
"""
import json
import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    d = sys.argv[1]
    res = json.load(open(os.path.join(d, "result.json")))
    held = os.path.join(res["recipe"]["corpus"], res["recipe"]["holdout"])
    if not os.path.exists(held):
        print("skip: %s is not on this machine (Debian's base-files)" % held)
        return 77  # CTest's SKIP_RETURN_CODE: reported as skipped, never as passed
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    ids = list(open(held, "rb").read()) + [json.load(open(os.path.join(d, "byte_tokenizer.json")))
                                           ["end_token_id"]]
    S, total, n = res["recipe"]["seq_len"], 0.0, 0
    with torch.no_grad():
        for o in range(0, len(ids) - 1, S):
            k = min(S, len(ids) - 1 - o)
            logits = m(torch.tensor([ids[o:o + k]])).logits[0].double()
            total += torch.nn.functional.cross_entropy(
                logits, torch.tensor(ids[o + 1:o + 1 + k]), reduction="sum").item()
            n += k
    bpb, want = total / n / math.log(2), res["heldout_bits_per_byte"]
    print("%s (transformers %s): held-out %s %.6f bits/byte; dflash recorded %.6f"
          % (type(m).__name__, __import__("transformers").__version__, res["recipe"]["holdout"],
             bpb, want))
    # float32 on both sides, different kernels: agreement to 1e-4 bits/byte.
    return 0 if type(m).__name__ == "Qwen3ForCausalLM" and abs(bpb - want) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
