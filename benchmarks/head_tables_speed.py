"""The head tables' conditions (remove-top-k with random-k controls, as heads_topk runs them) scored
in one pass with exact prefix reuse (gna.phases.head_ablation.score_ablations, the pipeline's path)
against the reference, a full forward per condition (ablate_heads + score_table), on the same items.

    .venv/bin/python benchmarks/head_tables_speed.py [--model-dir data/models/smollm2-135m]
        [--ranking data/results/heads/smollm2-135m/ranking.parquet] [--ks 1,2,5,10,20] [--draws 3]
        [--n 60] [--compute-dtype bfloat16] [--threads 2]

Uses the model's ranking where the heads phase made it (else the first heads of each layer) on
`--n` seeded KV-retrieval prompts of 10 keys. Printed: both times, their ratio, the largest
|Δ log-prob| between the paths and whether every prediction is the same.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import polars as pl
from _common import model_or_tiny

from gna.engine.anatomy import all_heads
from gna.engine.hooks import ablate_heads
from gna.engine.precision import linears_computed_in
from gna.engine.scoring import Scorer, score_table
from gna.phases.head_ablation import score_ablations
from gna.tasks.tables import build_kv_retrieval


def conditions(model, ranking_path: str, ks: list[int], draws: int) -> dict:
    """{name: heads}: the top-k of the ranking and seeded random-k draws (as remove_top_k)."""
    population = all_heads(model)
    if Path(ranking_path).exists():
        ranked = pl.read_parquet(ranking_path).sort("rank")
        order = list(zip(ranked["layer"].to_list(), ranked["head"].to_list()))
    else:
        order = population
    out = {f"top-{k}": sorted(order[:k]) for k in ks}
    for k in ks:
        for draw in range(draws):
            out[f"random-{k}#{draw}"] = sorted(random.Random(f"random-heads-0-{k}-{draw}").sample(population, k))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--ranking", default="data/results/heads/smollm2-135m/ranking.parquet")
    parser.add_argument("--ks", default="1,2,5,10,20")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--compute-dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/head_tables.json")
    args = parser.parse_args()
    model, tok, name = model_or_tiny(args.model_dir, args.threads)
    linears_computed_in(model, args.compute_dtype)
    table = build_kv_retrieval([10], args.n, 0, "lookup")
    chosen = conditions(model, args.ranking, [int(k) for k in args.ks.split(",")], args.draws)
    score_table(Scorer(model, tok, batch_size=args.batch_size, progress=False), table.head(args.batch_size))  # warm-up

    start = time.perf_counter()
    reference = {}
    for key, heads in chosen.items():
        with ablate_heads(model, heads):
            reference[key] = score_table(Scorer(model, tok, batch_size=args.batch_size, progress=False), table)
    t_ref = time.perf_counter() - start
    start = time.perf_counter()
    fast = score_ablations(Scorer(model, tok, batch_size=args.batch_size, progress=False), table, chosen)
    t_fast = time.perf_counter() - start

    worst = max(
        float(
            np.abs(
                np.concatenate(fast[k]["logprobs"].to_list()) - np.concatenate(reference[k]["logprobs"].to_list())
            ).max()
        )
        for k in chosen
    )
    same = all(fast[k]["pred"].to_list() == reference[k]["pred"].to_list() for k in chosen)
    summary = {
        "model": name,
        "conditions": len(chosen),
        "items": len(table),
        "reference_s": t_ref,
        "fast_s": t_fast,
        "ratio": t_ref / t_fast,
        "max_abs_logprob_diff": worst,
        "same_predictions": same,
    }
    print(
        f"{name}: {len(chosen)} ablation conditions on {len(table)} KV prompts ({args.compute_dtype} linears): "
        f"a forward each {t_ref:.1f} s, one pass with prefix reuse {t_fast:.1f} s -> {t_ref / t_fast:.2f}x; "
        f"max |Δ log-prob| {worst:.1e}, same predictions: {same}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
