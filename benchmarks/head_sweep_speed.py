"""Per-head ablation sweep: exact fast sweep vs the naive full forward per head, same prompts.

    .venv/bin/python benchmarks/head_sweep_speed.py [--model-dir data/models/smollm2-135m] [--prompts 32] [--layer-stride 3]

Naive: for every head, a full forward of the whole model with that head zeroed (the same
packed engine, logits only at scored positions). Fast: per batch the hidden state entering
layer L is computed once and only layers L..end rerun for that layer's heads. Also times the
attribution pre-ranking (one forward + backward) and prints its agreement with the exact sweep.
`--layer-stride 3` sweeps every third layer (all of its heads) to keep the naive side short;
the full-sweep times are extrapolated from the per-layer averages and printed as such.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polars as pl

from gna.phases.head_ablation import (attribution_scores, compare_attribution, rank_attribution, rank_heads, sweep_heads,
                               sweep_heads_naive)
from gna.engine.hooks import all_heads, head_sites, heads_per_layer
from gna.tasks.tables import build_kv_retrieval

from _common import model_or_tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--dict-size", type=int, default=10)
    parser.add_argument("--layer-stride", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/heads.json")
    args = parser.parse_args()
    model, tok, name = model_or_tiny(args.model_dir, args.threads)
    table = build_kv_retrieval([args.dict_size], args.prompts, seed=4321, template="lookup")
    per_layer = heads_per_layer(head_sites(model))
    n_layers = len(per_layer)
    layers = list(range(0, n_layers, args.layer_stride))
    heads = [(layer, h) for layer, h in all_heads(model) if layer in layers]

    start = time.perf_counter()
    naive = sweep_heads_naive(model, tok, table, heads, progress=False)
    t_naive = time.perf_counter() - start
    start = time.perf_counter()
    fast = sweep_heads(model, tok, table, heads=heads, progress=False)
    t_fast = time.perf_counter() - start
    worst = 0.0
    for layer, head in heads:
        row = fast.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
        worst = max(worst, abs(row["mean_logp"] - float(naive[(layer, head)]["logp_target"].mean())))
    start = time.perf_counter()
    est = attribution_scores(model, tok, table, progress=False)
    t_attr = time.perf_counter() - start
    swept = est.join(pl.DataFrame(heads, schema=["layer", "head"], orient="row"), on=["layer", "head"])
    rho = compare_attribution(rank_attribution(swept), rank_heads(fast), top_n=10)["spearman_logp"][0]

    n_all = sum(per_layer.values())
    # naive cost is the same for every head; the fast cost of a head grows with the layers after it
    per_head_naive = t_naive / len(heads)
    frac_swept = sum(n_layers - l for l, _ in heads) / len(heads)
    frac_all = sum((n_layers - layer) * n for layer, n in per_layer.items()) / n_all
    est_fast_all = t_fast / len(heads) * n_all * frac_all / frac_swept
    result = {"model": name, "prompts": len(table), "threads": args.threads, "heads_swept": len(heads),
              "naive_s": t_naive, "fast_s": t_fast, "ratio": t_naive / t_fast,
              "max_abs_mean_logp_diff": worst, "attribution_s": t_attr, "attribution_spearman_swept": rho,
              "extrapolated_all_heads": {"heads": n_all, "naive_s": per_head_naive * n_all, "fast_s": est_fast_all,
                                         "ratio": per_head_naive * n_all / est_fast_all},
              "prefix_cache_bound": n_layers / frac_all}
    print(f"model {name}: {n_layers} layers, {n_all} heads; {len(table)} KV prompts (size {args.dict_size}), "
          f"{args.threads} threads; swept {len(heads)} heads in layers {layers}")
    print(f"naive (full forward per head): {t_naive:8.1f} s")
    print(f"fast  (prefix-cached, exact) : {t_fast:8.1f} s   ratio {t_naive / t_fast:4.2f}x   "
          f"max|Δ mean logp| {worst:.1e}")
    print(f"all {n_all} heads, extrapolated : naive {per_head_naive * n_all:7.0f} s, fast {est_fast_all:7.0f} s, "
          f"ratio {result['extrapolated_all_heads']['ratio']:.2f}x (prefix-skipping alone bounds it at "
          f"{result['prefix_cache_bound']:.2f}x)")
    print(f"attribution pre-ranking: {t_attr:.1f} s for every head at once; Spearman vs exact on the swept heads {rho:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
