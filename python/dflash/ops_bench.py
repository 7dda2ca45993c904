"""The fused-loss op against what a PyTorch trainer would otherwise run, at
the shapes of `dflash bench --case loss` (Q=8192 H=1024 V=32768, fp32,
CE + KL, forward + backward), time and peak memory in one run:

  op          dflash.fused_loss (the registered op; chunk 1024, as the C++ case)
  eager       full (Q, V) logits in plain PyTorch (docs/LOSSES.md's CE + KL)
  compiled    torch.compile of the same function
  checkpoint  the same loss in chunks of 1024 rows, each under
              torch.utils.checkpoint(use_reentrant=False)
  c++         dflash's own C++ path (`dflash bench --case loss`, optimized
              side), run by this bench in the same invocation

Each variant runs in a fresh process (peak RSS is per process: the peak is
VmHWM after the inputs exist minus the RSS then); times are the best of
--repeats after one warm-up. Prints a table and the ratios the issue asks
for (op / c++ time: within 5%; c++ / compiled time and memory); --json
writes them. docs/PERFORMANCE.md holds the figures.

usage: python -m dflash.ops_bench [--repeats N] [--json FILE] [--binary build/dflash]
       [--Q 8192 --H 1024 --V 32768]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

VARIANTS = ("op", "eager", "compiled", "checkpoint")
CHUNK = 1024
KL_WEIGHT = 1.0


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _loss_fn(variant: str) -> Callable:
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def plain(x, W, t, y):
        z = x @ W.t()
        zt = t @ W.t()
        ce = F.cross_entropy(z, y, reduction="sum")
        lps, lpt = torch.log_softmax(z, -1), torch.log_softmax(zt, -1)
        kl = (lpt.exp() * (lpt - lps)).sum()
        return (ce + KL_WEIGHT * kl) / x.size(0)

    if variant == "eager":
        return plain
    if variant == "compiled":
        return torch.compile(plain)
    if variant == "checkpoint":
        def chunked(x, W, t, y):
            total = x.new_zeros(())
            for c0 in range(0, x.size(0), CHUNK):
                sl = slice(c0, c0 + CHUNK)
                total = total + checkpoint(plain, x[sl], W, t[sl], y[sl], use_reentrant=False) \
                    * min(CHUNK, x.size(0) - c0)
            return total / x.size(0)
        return chunked
    import dflash

    def op(x, W, t, y):
        return dflash.fused_loss(x, W, y, t, kl_weight=KL_WEIGHT, chunk_size=CHUNK).loss
    return op


def run_variant(variant: str, Q: int, H: int, V: int, repeats: int) -> dict:
    """In this process: inputs, one warm-up, `repeats` timed runs."""
    import torch
    g = torch.Generator().manual_seed(0)
    # The C++ case's inputs (harness/bench.cpp LossCase): logits of unit scale.
    x = torch.randn(Q, H, generator=g).requires_grad_(True)
    W = torch.randn(V, H, generator=g) / H ** 0.5
    t = torch.randn(Q, H, generator=g)
    y = torch.randint(0, V, (Q,), generator=g)
    fn = _loss_fn(variant)
    fn(x, W, t, y).backward()  # warm-up (compiles the compiled variant)
    x.grad = None
    base = _rss_kib("VmRSS")
    _reset_peak()
    best = float("inf")
    loss = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = fn(x, W, t, y)
        loss.backward()
        best = min(best, time.perf_counter() - t0)
        x.grad = None
    peak = (_rss_kib("VmHWM") - base) / 1024
    return {"variant": variant, "seconds": best, "peak_mib": peak, "loss": float(loss)}


def run_cpp(binary: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bench.json")
        subprocess.run([binary, "bench", "--case", "loss", "--repeats", str(repeats), "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            data = json.load(f)
    case = data["cases"]["loss"]
    # Its peak is the C++ bench's own probe (bytes live in the CPU allocator),
    # not an RSS: comparable in size, not to the byte.
    return {"variant": "c++", "seconds": case["optimized_s"],
            "peak_mib": case["optimized_peak_bytes"] / 2**20, "loss": float("nan")}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--binary", default=os.environ.get("DFLASH_BINARY", "build/dflash"))
    ap.add_argument("--Q", type=int, default=8192)
    ap.add_argument("--H", type=int, default=1024)
    ap.add_argument("--V", type=int, default=32768)
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child process
    a = ap.parse_args(argv)
    if a.variant:
        print(json.dumps(run_variant(a.variant, a.Q, a.H, a.V, a.repeats)))
        return 0
    rows = []
    for v in VARIANTS:
        p = subprocess.run([sys.executable, "-m", "dflash.ops_bench", "--variant", v,
                            "--repeats", str(a.repeats), "--Q", str(a.Q), "--H", str(a.H),
                            "--V", str(a.V)], capture_output=True, text=True, check=True)
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(f"{v:>10}: {rows[-1]['seconds']:7.2f} s  peak {rows[-1]['peak_mib']:8.1f} MiB  "
              f"loss {rows[-1]['loss']:.6f}", flush=True)
    if (a.Q, a.H, a.V) == (8192, 1024, 32768):
        rows.append(run_cpp(a.binary, a.repeats))
        print(f"{'c++':>10}: {rows[-1]['seconds']:7.2f} s  peak {rows[-1]['peak_mib']:8.1f} MiB")
    by = {r["variant"]: r for r in rows}
    ratios = {f"{n}/compiled time": by[n]["seconds"] / by["compiled"]["seconds"]
              for n in ("op", "c++") if n in by}
    ratios.update({f"{n}/compiled peak": by[n]["peak_mib"] / by["compiled"]["peak_mib"]
                   for n in ("op", "c++") if n in by})
    if "c++" in by:
        ratios["op/c++ time"] = by["op"]["seconds"] / by["c++"]["seconds"]
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": {"Q": a.Q, "H": a.H, "V": a.V, "chunk": CHUNK}, "rows": rows,
                       "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
