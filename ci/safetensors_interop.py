#!/usr/bin/env python3
"""safetensors compatibility with the reference implementation (issue 14).

Run by ctest as cli.safetensors_interop with the torch environment's python
(it has the `safetensors` package, ci/bootstrap.sh installs it):

  safetensors_interop.py DFLASH TMPDIR

1. Files written by the `safetensors` package (every dtype dflash reads,
   special float values, metadata, zero-size and scalar tensors) and one file
   written by hand with unaligned data offsets (which the package also reads)
   are listed by `dflash inspect --json`: names, dtypes, shapes, FNV-1a 64 of
   the bytes and metadata must match what the package sees.
2. Files dflash writes (`dflash dump` in float32 and bfloat16) are read by the
   package and must match `dflash inspect` the same way.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
         torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
         torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def fnv1a64(t):
    h = 0xCBF29CE484222325  # FNV-1a 64 offset basis
    for b in t.contiguous().view(-1).view(torch.uint8).tolist() if t.numel() else []:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def described(path):
    """What the reference implementation reads from `path`."""
    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for name in f.keys():
            t = f.get_tensor(name)
            out[name] = (CODES[t.dtype], list(t.shape), fnv1a64(t))
    return out, meta


def inspect(dflash, path, tmp):
    js = tmp / (path.name + ".inspect.json")
    subprocess.run([dflash, "inspect", str(path), "--json", str(js)], check=True,
                   stdout=subprocess.DEVNULL)
    j = json.loads(js.read_text())
    return ({t["name"]: (t["dtype"], t["shape"], t["fnv1a64"]) for t in j["tensors"]},
            j["metadata"])


def compare(label, ours, theirs):
    if ours != theirs:
        for k in sorted(set(ours[0]) | set(theirs[0])):
            if ours[0].get(k) != theirs[0].get(k):
                print(f"{label}: {k}: dflash {ours[0].get(k)} vs safetensors {theirs[0].get(k)}")
        if ours[1] != theirs[1]:
            print(f"{label}: metadata: dflash {ours[1]} vs safetensors {theirs[1]}")
        sys.exit(f"{label}: dflash and the safetensors package disagree")
    print(f"{label}: {len(ours[0])} tensors and {len(ours[1])} metadata keys agree")


def package_files(tmp):
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1.5, float("inf"), -float("inf"), float("nan"),
                            1e-45, 3.4e38], dtype=torch.float32)
    every = {
        "f64": torch.randn(3, 5, dtype=torch.float64, generator=g),
        "f32.special": special,
        "f16": torch.randn(4, 2, generator=g).half(),
        "bf16": torch.randn(2, 3, 4, generator=g).bfloat16(),
        "i64": torch.tensor([-2**63, -1, 0, 2**63 - 1], dtype=torch.int64),
        "i32": torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4),
        "i16": torch.tensor([-32768, 7, 32767], dtype=torch.int16),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
    }
    save_file(every, str(tmp / "py-every-dtype.safetensors"),
              metadata={"format": "pt", "note": "written by the safetensors package, ünïcode"})
    save_file({"empty": torch.zeros(0), "empty.2d": torch.zeros(3, 0, dtype=torch.bfloat16),
               "scalar": torch.tensor(2.5, dtype=torch.float64), "u8.odd": torch.ones(3, dtype=torch.uint8)},
              str(tmp / "py-zero-size.safetensors"))
    # By hand: tensors in header order with unaligned data offsets (U8 of 3
    # bytes, then F32 at offset 3, then F64 at 11), header not padded to 8.
    a = bytes([1, 2, 3])
    b = struct.pack("<2f", 1.25, -2.5)
    c = struct.pack("<1d", 3.0)
    header = {"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
              "c": {"dtype": "F64", "shape": [1], "data_offsets": [11, 19]},
              "__metadata__": {"by": "hand"}}
    h = json.dumps(header).encode()
    (tmp / "hand-unaligned.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + a + b + c)
    return sorted(tmp.glob("py-*.safetensors")) + [tmp / "hand-unaligned.safetensors"]


def main():
    dflash, tmp = sys.argv[1], Path(sys.argv[2])
    tmp.mkdir(parents=True, exist_ok=True)
    for f in package_files(tmp):
        compare(f.name, inspect(dflash, f, tmp), described(f))
    tiny = Path("fixtures/configs/tiny.toml")
    bf16 = tmp / "tiny-bf16.toml"
    bf16.write_text(tiny.read_text().replace('dtype = "float32"', 'dtype = "bfloat16"'))
    for cfg in (tiny, bf16):
        out = tmp / f"dflash-dump-{cfg.stem}.safetensors"
        subprocess.run([dflash, "dump", "--config", str(cfg), "--out", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
        compare(out.name, inspect(dflash, out, tmp), described(out))
    print("safetensors interop: ok")


if __name__ == "__main__":
    main()
