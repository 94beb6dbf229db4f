"""Layer-pruning sweeps: one-pass fast paths vs evaluating every pruned model from scratch.

    .venv/bin/python benchmarks/pruning_speed.py [--model-dir data/models/smollm2-135m] [--items 24]

Prints, measured in this run on the same items: the naive time (one evaluation per pruned
model, each running only its own layers), the fast time (gradual: one pass read out at every
depth; individual removal: the state entering the removed layer reused), their ratio, and the
largest difference between the two paths' per-choice log-probabilities (should be ~1e-6).
A tiny random model is used when the model folder does not exist (e.g. before `make reproduce`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import polars as pl
from _common import model_or_tiny

from gna.engine.scoring import Scorer, score_removals, score_table
from gna.tasks.tables import build_kv_retrieval


def _flat(frame: pl.DataFrame) -> np.ndarray:
    return np.concatenate(frame["logprobs"].to_list())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--items", type=int, default=24, help="KV-retrieval items (sizes 10 and 20)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--removals", type=int, default=8, help="layers removed one at a time (the last N of the minimal model)"
    )
    parser.add_argument("--out", default="benchmarks/out/prune.json")
    args = parser.parse_args()
    model, tok, name = model_or_tiny(args.model_dir, args.threads)
    n = model.config.num_hidden_layers
    table = build_kv_retrieval([10, 20], args.items // 2, seed=99, template="lookup")
    results = {"model": name, "n_layers": n, "items": len(table), "threads": args.threads}

    start = time.perf_counter()
    naive = {k: score_table(Scorer(model, tok, progress=False), table, layers=list(range(k))) for k in range(1, n + 1)}
    t_naive = time.perf_counter() - start
    start = time.perf_counter()
    fast = score_table(Scorer(model, tok, progress=False), table, depths=list(range(1, n + 1)))
    t_fast = time.perf_counter() - start
    diff = max(float(np.abs(_flat(naive[k]) - _flat(fast.filter(pl.col("depth") == k))).max()) for k in naive)
    same_acc = all(
        naive[k]["correct"].to_list() == fast.filter(pl.col("depth") == k)["correct"].to_list() for k in naive
    )
    results["gradual"] = {
        "naive_s": t_naive,
        "fast_s": t_fast,
        "ratio": t_naive / t_fast,
        "max_abs_logprob_diff": diff,
        "same_predictions": same_acc,
    }

    keep = list(range(n))
    removals = keep[-args.removals :] if args.removals < n else keep
    start = time.perf_counter()
    naive_r = {
        r: score_table(Scorer(model, tok, progress=False), table, layers=[l for l in keep if l != r]) for r in removals
    }
    t_naive_r = time.perf_counter() - start
    start = time.perf_counter()
    fast_r = score_removals(Scorer(model, tok, progress=False), table, keep, removals)
    t_fast_r = time.perf_counter() - start
    diff_r = max(
        float(np.abs(_flat(naive_r[r]) - _flat(fast_r.filter(pl.col("removed_layer") == r))).max()) for r in removals
    )
    results["individual"] = {
        "removals": removals,
        "naive_s": t_naive_r,
        "fast_s": t_fast_r,
        "ratio": t_naive_r / t_fast_r,
        "max_abs_logprob_diff": diff_r,
    }

    print(f"model {name}: {n} layers, {len(table)} KV items, {args.threads} threads")
    print(
        f"gradual   : naive {t_naive:7.1f} s (each of {n} prefixes from scratch)  fast {t_fast:6.1f} s  "
        f"ratio {t_naive / t_fast:5.1f}x  max|Δlogp| {diff:.1e}  same predictions: {same_acc}"
    )
    print(
        f"individual: naive {t_naive_r:7.1f} s ({len(removals)} removals from scratch)  fast {t_fast_r:6.1f} s  "
        f"ratio {t_naive_r / t_fast_r:5.1f}x  max|Δlogp| {diff_r:.1e}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
