"""The SSM scan: chunked fast path vs the recurrent reference, and inference memory.

    .venv/bin/python benchmarks/ssm_scan_speed.py [--length 2048] [--heads 9] [--state 16] [--threads 2]
                                                  [--device cuda --batch 4]

Prints, measured in this run on the same random inputs (a SmolLM2-sized layer of SSM heads):
the recurrent reference time, the chunked scan time and their ratio, the masked quadratic path
used for packed scoring, the tree fast path against it on a scoring batch (right-padded prompts,
each with ten two-token choices packed after its context, as KV retrieval's two-digit values are),
layout detection included, the largest output difference between paths, and the bytes of state a
recurrent step carries vs a KV cache of the same length (the reason hybrids exist). Where
mamba-ssm's Triton kernel runs (a CUDA device with `make gpu`; gna.engine.ssm_kernel), also its
time against the chunked scan on the same device and their largest difference.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gna.engine.packing import collate, pack
from gna.engine.ssm import ScanInputs, ssd_chunked, ssd_masked, ssd_recurrent, ssd_tree, tree_layout
from gna.engine.ssm_kernel import kernel_runs, ssd_chunked_kernel


def timed(fn, repeats: int = 1):
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return out, best


def kernel_vs_chunked(batch: int, L: int, H: int, P: int, N: int, chunk: int, device: str) -> dict:
    """mamba-ssm's kernel against the chunked scan on `device` (first call, which compiles, timed
    apart), float32 inputs of `batch` sequences."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, L, H, P, generator=g).to(device)
    if not kernel_runs(x):
        return {"kernel": f"not run on {device} (needs a CUDA device and mamba-ssm: make gpu)"}
    log_a = (-torch.rand(batch, L, H, generator=g) * 0.1).to(device)
    Bm, Cm = (torch.randn(batch, L, H, N, generator=g).to(device) / N**0.5 for _ in range(2))
    D = torch.randn(H, generator=g).to(device)
    inputs = ScanInputs(x, log_a, Bm, Cm, D)
    _, t_first = timed(lambda: ssd_chunked_kernel(inputs, chunk))
    (ours, _), t_chunk = timed(lambda: ssd_chunked(inputs, chunk), repeats=5)
    (theirs, _), t_kernel = timed(lambda: ssd_chunked_kernel(inputs, chunk), repeats=5)
    return {
        "device": str(device),
        "batch": batch,
        "kernel_first_call_s": round(t_first, 2),
        "chunked_s": round(t_chunk, 5),
        "kernel_s": round(t_kernel, 5),
        "kernel_speedup": round(t_chunk / t_kernel, 1),
        "max_abs_diff_kernel": float((theirs - ours).abs().max()),
        "max_abs_output": float(ours.abs().max()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the kernel comparison runs (cuda on a GPU node)")
    ap.add_argument("--batch", type=int, default=4, help="sequences in the kernel comparison")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    L, H, P, N = args.length, args.heads, args.head_dim, args.state
    x = torch.randn(1, L, H, P, generator=g)
    log_a = -torch.rand(1, L, H, generator=g) * 0.1
    Bm, Cm = torch.randn(1, L, H, N, generator=g) / N**0.5, torch.randn(1, L, H, N, generator=g) / N**0.5
    D = torch.randn(H, generator=g)
    with torch.inference_mode():
        (ref, _), t_rec = timed(lambda: ssd_recurrent(x, log_a, Bm, Cm, D))
        (fast, _), t_chunk = timed(lambda: ssd_chunked(ScanInputs(x, log_a, Bm, Cm, D), args.chunk), repeats=3)
        short = min(L, 512)  # the quadratic path is for packed scoring of short prompts
        causal = torch.ones(1, short, short, dtype=torch.bool).tril()
        masked, t_masked = timed(
            lambda: ssd_masked(x[:, :short], log_a[:, :short], Bm[:, :short], Cm[:, :short], D, causal), repeats=3
        )
        # a scoring batch of 8 right-padded items, ten two-token choices each: the tree fast path
        # against the masked reference it replaces, layout detection included
        lengths = [short - 10 - 37 * i for i in range(8)]
        allowed = collate([pack(list(range(n)), [[j, 1] for j in range(10)]) for n in lengths]).mask[:, 0] == 0
        xb, lab, Bb, Cb = (t[:, :short].repeat(8, *[1] * (t.dim() - 1)) for t in (x, log_a, Bm, Cm))
        batch_ref, t_batch_masked = timed(lambda: ssd_masked(xb, lab, Bb, Cb, D, allowed), repeats=3)
        batch_fast, t_batch_tree = timed(
            lambda: ssd_tree(ScanInputs(xb, lab, Bb, Cb, D), tree_layout(allowed), args.chunk), repeats=3
        )
    result = {
        "length": L,
        "heads": H,
        "head_dim": P,
        "state": N,
        "recurrent_s": round(t_rec, 4),
        "chunked_s": round(t_chunk, 4),
        "speedup": round(t_rec / t_chunk, 1),
        "max_abs_diff_chunked": float((fast - ref).abs().max()),
        f"masked_quadratic_s_at_{short}": round(t_masked, 4),
        "max_abs_diff_masked": float((masked - ref[:, :short]).abs().max()),
        "scoring_batch_masked_reference_s": round(t_batch_masked, 4),
        "scoring_batch_tree_s": round(t_batch_tree, 4),
        "scoring_batch_speedup": round(t_batch_masked / t_batch_tree, 1),
        "max_abs_diff_tree": float((batch_fast - batch_ref).abs().max()),
        "state_bytes_fp16": H * N * P * 2,
        "kv_cache_bytes_fp16_same_heads": 2 * H * P * L * 2,
        **kernel_vs_chunked(args.batch, L, H, P, N, args.chunk, args.device),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
