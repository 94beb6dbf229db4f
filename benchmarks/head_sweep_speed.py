"""Per-head ablation sweep: how fast, against what reference, and what the fast modes find.

    .venv/bin/python benchmarks/head_sweep_speed.py [--parts naive,verified] [--model-dir data/models/smollm2-135m]
        [--prompts 32] [--layer-stride 3] [--budget 0.2]

Part `naive`: the exact fast sweep vs the naive full forward per head, same prompts. Naive: for
every head, a full forward of the whole model with that head zeroed (the same packed engine,
logits only at scored positions), PyTorch's default float32 matmul (F.linear). Exact fast, as the
pipeline sweeps at eval.compute_dtype: float32: per batch the hidden state entering layer L is
computed once and only layers L..end rerun for that layer's heads, the linear layers through
oneDNN's float32 kernel (gna.engine.precision.float32_linear). Printed apart: prefix reuse alone
(F.linear), the kernel alone (the naive loop through it), and the fast sweep with the linear
layers' matmuls in bf16 (eval.compute_dtype: bfloat16), its error against the float32 naive loop
and on how many heads its accuracy equals the exact sweep's. `--layer-stride 3` sweeps every third
layer (all of its heads) to keep the naive side short; the full-sweep times are extrapolated
from the per-layer averages and printed as such.

Part `verified`: the exact sweep of every head (the reference, timed) vs the verified mode
(attribution ranks every head, then the heads that fit in `--budget` of the sweep's cost are swept
exactly) for each pre-ranking order: its time as a share of the full sweep's and the recall of
the full sweep's top 10. The default prompts are the default config's sweep (32 prompts, size 10).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import polars as pl
from _common import extrapolated_fast_sweep_s, model_or_tiny

from gna.engine.ablation import score_ablations
from gna.engine.anatomy import all_heads, decoder_layers, head_sites, heads_per_layer
from gna.engine.precision import linears_computed_in, linears_in_full_precision
from gna.engine.scoring import Scorer
from gna.phases.head_ablation import rank_heads, sweep_heads, sweep_heads_naive, sweep_heads_verified, top_heads
from gna.tasks.tables import build_kv_retrieval


def naive_part(model, tok, table, layer_stride: int) -> dict:
    per_layer = heads_per_layer(head_sites(model))
    n_layers = len(per_layer)
    layers = list(range(0, n_layers, layer_stride))
    heads = [(layer, h) for layer, h in all_heads(model) if layer in layers]

    def timed(sweep):
        start = time.perf_counter()
        out = sweep()
        return out, time.perf_counter() - start

    # `model` is set up as heads_sweep loads it at eval.compute_dtype: float32, its linear layers
    # through oneDNN's float32 kernel on a CPU; linears_in_full_precision gives PyTorch's default
    # float32 matmul (F.linear), the way a researcher's loop runs
    with linears_in_full_precision(model):
        naive, t_naive = timed(lambda: sweep_heads_naive(Scorer(model, tok, progress=False), table, heads))
        prefix, t_prefix = timed(lambda: sweep_heads(Scorer(model, tok, progress=False), table, heads=heads))
    fast, t_fast = timed(lambda: sweep_heads(Scorer(model, tok, progress=False), table, heads=heads))
    _, t_naive_kernel = timed(lambda: sweep_heads_naive(Scorer(model, tok, progress=False), table, heads))
    # the same fast sweep with the linear layers' matmuls in bf16 (eval.compute_dtype: bfloat16)
    with linears_in_full_precision(model):
        low = linears_computed_in(copy.deepcopy(model), "bfloat16")
    fast_low, t_low = timed(lambda: sweep_heads(Scorer(low, tok, progress=False), table, heads=heads))

    def worst(frame: pl.DataFrame) -> float:
        return max(
            abs(
                frame.filter((pl.col("layer") == layer) & (pl.col("head") == head))["mean_logp"][0]
                - float(naive[(layer, head)]["logp_target"].mean())
            )
            for layer, head in heads
        )

    def accs(frame: pl.DataFrame) -> list[float]:
        return frame.filter(pl.col("layer") >= 0).sort("layer", "head")["acc"].to_list()

    same_acc = sum(a == b for a, b in zip(accs(fast_low), accs(fast)))
    naive_acc = [float(naive[h]["correct"].mean()) for h in sorted(heads)]
    exact_same_acc = sum(a == b for a, b in zip(accs(fast), naive_acc))
    # the sweep's score is a head's mean log-prob; per item (untimed, the same exact fast path):
    per_item = score_ablations(Scorer(model, tok, progress=False), table, {head: [head] for head in heads})
    worst_item = max(float((per_item[h]["logp_target"] - naive[h]["logp_target"]).abs().max()) for h in heads)
    n_all = sum(per_layer.values())
    # naive cost is the same for every head; the fast cost of a head grows with the layers after it
    per_head_naive = t_naive / len(heads)
    frac_all = sum((n_layers - layer) * n for layer, n in per_layer.items()) / n_all
    est_fast_all = extrapolated_fast_sweep_s(t_fast, heads, per_layer)
    est_prefix_all = extrapolated_fast_sweep_s(t_prefix, heads, per_layer)
    result = {
        "heads_swept": len(heads),
        "layers": layers,
        "naive_s": t_naive,
        "fast_s": t_fast,
        "ratio": t_naive / t_fast,
        "max_abs_mean_logp_diff": worst(fast),
        "max_abs_item_logp_diff": worst_item,
        "heads_with_equal_acc": exact_same_acc,
        "prefix_reuse_only": {"fast_s": t_prefix, "ratio": t_naive / t_prefix, "max_abs_mean_logp_diff": worst(prefix)},
        "float32_kernel_alone": {"naive_s": t_naive_kernel, "ratio": t_naive / t_naive_kernel},
        "extrapolated_all_heads": {
            "heads": n_all,
            "naive_s": per_head_naive * n_all,
            "fast_s": est_fast_all,
            "ratio": per_head_naive * n_all / est_fast_all,
            "prefix_reuse_only_ratio": per_head_naive * n_all / est_prefix_all,
        },
        "prefix_cache_bound": n_layers / frac_all,
        "bf16_linears": {
            "fast_s": t_low,
            "ratio_vs_naive": t_naive / t_low,
            "ratio_vs_fast": t_fast / t_low,
            "max_abs_mean_logp_diff": worst(fast_low),
            "heads_with_equal_acc": same_acc,
        },
    }
    print(f"[naive] swept {len(heads)} heads in layers {layers}")
    print(f"naive (full forward per head, F.linear)     : {t_naive:7.1f} s")
    print(
        f"prefix reuse alone (F.linear)               : {t_prefix:7.1f} s   ratio {t_naive / t_prefix:4.2f}x   "
        f"max|Δ mean logp| {worst(prefix):.1e}"
    )
    print(
        f"exact fast (prefix reuse + oneDNN float32)  : {t_fast:7.1f} s   ratio {t_naive / t_fast:4.2f}x   "
        f"max|Δ mean logp| {worst(fast):.1e} (per item {worst_item:.1e}), equal accuracy on {exact_same_acc} of "
        f"{len(heads)} heads   (the pipeline's sweep at eval.compute_dtype: float32)"
    )
    print(
        f"naive with the oneDNN float32 kernel        : {t_naive_kernel:7.1f} s   ratio "
        f"{t_naive / t_naive_kernel:4.2f}x "
        f"(the kernel alone; prefix reuse on top: {t_naive_kernel / t_fast:4.2f}x)"
    )
    print(
        f"fast, bf16 linears                          : {t_low:7.1f} s   ratio {t_naive / t_low:4.2f}x vs naive, "
        f"{t_fast / t_low:4.2f}x vs exact fast   max|Δ mean logp| vs naive {worst(fast_low):.1e}, "
        f"equal accuracy on {same_acc} of {len(heads)} heads"
    )
    print(
        f"all {n_all} heads, extrapolated : naive {per_head_naive * n_all:7.0f} s, exact fast {est_fast_all:7.0f} s, "
        f"ratio {result['extrapolated_all_heads']['ratio']:.2f}x (prefix reuse alone "
        f"{result['extrapolated_all_heads']['prefix_reuse_only_ratio']:.2f}x, bounded by skipping the prefix at "
        f"{result['prefix_cache_bound']:.2f}x)"
    )
    return result


def verified_part(model, tok, table, budget: float, orders: list[str]) -> dict:
    start = time.perf_counter()
    full = sweep_heads(Scorer(model, tok, progress=False), table)
    t_full = time.perf_counter() - start
    exact = rank_heads(full)
    exact_top10 = set(top_heads(exact, 10))
    print(
        f"[verified] full exact sweep of {len(exact)} heads: {t_full:.1f} s; its top 10: "
        + ", ".join(f"L{l}H{h}" for l, h in top_heads(exact, 10))
    )
    result = {"full_s": t_full, "budget": budget, "exact_top10": [list(x) for x in top_heads(exact, 10)], "orders": {}}
    for order in orders:
        start = time.perf_counter()
        try:
            fast = sweep_heads_verified(Scorer(model, tok, progress=False), table, budget, order)
        except ValueError as err:  # the order's attribution alone does not leave room in the budget
            result["orders"][order] = {"refused": str(err)}
            print(f"verified ({order:9s}): refused: {err}")
            continue
        t_fast = time.perf_counter() - start
        found = rank_heads(fast)
        recall_any = len(exact_top10 & set(top_heads(found, len(found)))) / 10
        recall_top10 = len(exact_top10 & set(top_heads(found, 10))) / 10
        paired = found.join(exact.select("layer", "head", pl.col("mean_logp").alias("exact")), on=["layer", "head"])
        worst = float((paired["mean_logp"] - paired["exact"]).abs().max() or 0.0)
        result["orders"][order] = {
            "seconds": t_fast,
            "share_of_full": t_fast / t_full,
            "heads_verified": len(found),
            "recall_top10_verified": recall_any,
            "recall_top10_as_top10": recall_top10,
            "max_abs_mean_logp_diff": worst,
        }
        print(
            f"verified ({order:9s}): {t_fast:7.1f} s = {t_fast / t_full:5.1%} of the full sweep; "
            f"{len(found)} heads verified; exact top 10 found {recall_any:.0%} "
            f"(as its own top 10: {recall_top10:.0%}); max|Δ mean logp| vs full {worst:.1e}"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="naive,verified", help="comma-separated: naive, verified")
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--dict-size", type=int, default=10)
    parser.add_argument("--layer-stride", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--orders", default="magnitude,graddrop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/heads.json")
    args = parser.parse_args()
    model, tok, name = model_or_tiny(args.model_dir, args.threads)
    linears_computed_in(model, "float32")  # as heads_sweep loads it at eval.compute_dtype: float32
    table = build_kv_retrieval([args.dict_size], args.prompts, seed=4321, template="lookup")
    parts = args.parts.split(",")
    print(
        f"model {name}: {len(decoder_layers(model))} layers, {len(all_heads(model))} heads; {len(table)} KV "
        f"prompts (size {args.dict_size}), {args.threads} threads"
    )
    result = {"model": name, "prompts": len(table), "threads": args.threads}
    if "naive" in parts:
        result["naive"] = naive_part(model, tok, table, args.layer_stride)
    if "verified" in parts:
        result["verified"] = verified_part(model, tok, table, args.budget, args.orders.split(","))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
