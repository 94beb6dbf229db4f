"""Search for a KV-retrieval setting where a model's retrieval has a head bottleneck, on prompts
that are never reported (string seeds, apart from every integer-seeded prompt set of the study).

    .venv/bin/python benchmarks/kv_bottleneck.py --model-dir data/models/qwen2.5-coder-1.5b \
        [--sizes 40,60,80,90] [--template lookup] [--probe-n 16] [--search-n 24] [--heldout-n 48] \
        [--budget 0.08] [--k 5,10] [--unit head|group] [--threads 2] [--out data/benchmarks/kv_bottleneck/<model>.json]

1. probe: accuracy at each dictionary size of `--sizes` (`--probe-n` prompts each); the search
   size is the largest whose accuracy is at least 80% (a bottleneck needs items to lose), else the
   smallest size;
2. search: the verified sweep (attribution, then the exact ablation of the top heads within
   `--budget` of the full sweep's cost) on `--search-n` prompts of that size, ranked as the
   pipeline ranks (accuracy drop, then log-prob drop); with `--unit group`, every KV group (the
   query heads that share one key/value head, ablated together) is swept exactly instead: in a
   grouped-query model the heads of a group read the same keys and values, so one of them can
   stand in for another;
3. held out: `--heldout-n` new prompts of that size scored unmodified, with the top k units
   removed for each k of `--k`, and with k random units (one seeded draw), each as a paired table
   against the unmodified model (lost, gained, exact McNemar p).

The heads count as a bottleneck where the top-k removal loses items with McNemar p < 0.05 and the
random-k removal does not. Prints one JSON object (also written to `--out`)."""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from pathlib import Path

import polars as pl
import torch

from gna.core.paired import mcnemar_p
from gna.engine.ablation import ablation_units, score_ablations, unit_name
from gna.engine.anatomy import all_heads, head_sites
from gna.engine.hooks import ablate_heads
from gna.engine.scoring import Scorer, score_table
from gna.models.prepare import load_model
from gna.phases.head_ablation import rank_heads, sweep_heads_verified
from gna.tasks.tables import build_kv_retrieval

SEARCHABLE = 0.8  # the largest size still answered this often is searched


def paired(base, other) -> dict:
    a, b = base["correct"].to_list(), other["correct"].to_list()
    lost = sum(x and not y for x, y in zip(a, b))
    gained = sum(y and not x for x, y in zip(a, b))
    return {"acc": sum(b) / len(b), "lost": lost, "gained": gained, "p_mcnemar": mcnemar_p(lost, gained)}


def kv_groups(model) -> dict[str, list[tuple[int, int]]]:
    """{"L<layer>G<group>": its query heads} of every layer (the pipeline's units, heads.sweep_unit: group)."""
    return {unit_name(layer, g, "group"): heads for (layer, g), heads in ablation_units(model, "group").items()}


def unit_heads(unit: str, model) -> list[tuple[int, int]]:
    """The heads of a unit name: "L<l>H<h>" one head, "L<l>G<g>" a KV group (kv_groups)."""
    if "G" in unit:
        return kv_groups(model)[unit]
    layer, head = unit[1:].split("H")
    return [(int(layer), int(head))]


def rank_units(frames: dict) -> pl.DataFrame:
    """score_ablations' frames {"base": …, unit: …} ranked as rank_heads ranks heads."""
    base = frames["base"]
    rows = [
        {
            "unit": unit,
            "acc_drop": float(base["correct"].mean() - f["correct"].mean()),
            "logp_drop": float(base["logp_target"].mean() - f["logp_target"].mean()),
        }
        for unit, f in frames.items()
        if unit != "base"
    ]
    return pl.DataFrame(rows).sort(["acc_drop", "logp_drop"], descending=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sizes", default="40,60,80,90")
    ap.add_argument("--template", default="lookup")
    ap.add_argument("--probe-n", type=int, default=16)
    ap.add_argument("--search-n", type=int, default=24)
    ap.add_argument("--heldout-n", type=int, default=48)
    ap.add_argument("--budget", type=float, default=0.08)
    ap.add_argument("--k", default="5,10")
    ap.add_argument("--unit", choices=("head", "group"), default="head")
    ap.add_argument(
        "--ranked",
        default=None,
        help="skip the search: these units, best first (e.g. L13G0,L14G0), at the first size of --sizes",
    )
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tok = load_model(args.model_dir, compute_dtype="bfloat16")
    scorer = Scorer(model, tok, args.batch)
    out = {"model_dir": args.model_dir, "template": args.template, "probe": {}}

    for size in map(int, args.sizes.split(",")) if not args.ranked else []:
        t = time.perf_counter()
        frame = score_table(scorer, build_kv_retrieval([size], args.probe_n, "bottleneck-probe", args.template))
        out["probe"][size] = {
            "acc": float(frame["correct"].mean()),
            "n": len(frame),
            "s": round(time.perf_counter() - t, 1),
        }
        print(json.dumps({"probe": size, **out["probe"][size]}), flush=True)
    answered = [s for s, r in out["probe"].items() if r["acc"] >= SEARCHABLE]
    size = (max(answered) if answered else min(out["probe"])) if not args.ranked else int(args.sizes.split(",")[0])
    out["size"] = size

    t = time.perf_counter()
    search = build_kv_retrieval([size], args.search_n, "bottleneck-search", args.template)
    if args.ranked:
        units = {u: unit_heads(u, model) for u in args.ranked.split(",")}
        ranking = pl.DataFrame({"unit": list(units), "acc_drop": 0.0, "logp_drop": 0.0})
    elif args.unit == "group":
        units = kv_groups(model)
        frames = score_ablations(scorer, search, {"base": [], **units}, desc="group sweep")
        ranking = rank_units(frames)
    else:
        ranking = rank_heads(sweep_heads_verified(scorer, search, args.budget))
        units = {f"L{r['layer']}H{r['head']}": [(r["layer"], r["head"])] for r in ranking.iter_rows(named=True)}
        ranking = ranking.with_columns(pl.format("L{}H{}", "layer", "head").alias("unit"))
    out["search"] = {
        "unit": args.unit,
        "n": args.search_n,
        "measured": len(ranking),
        "s": round(time.perf_counter() - t, 1),
        "top": [
            {"unit": r["unit"], "acc_drop": r["acc_drop"], "logp_drop": round(r["logp_drop"], 4)}
            for r in ranking.head(10).iter_rows(named=True)
        ],
    }
    print(json.dumps({"search": out["search"]}), flush=True)

    heldout = build_kv_retrieval([size], args.heldout_n, "bottleneck-heldout", args.template)
    sites = head_sites(model)
    base = score_table(scorer, heldout)
    out["heldout"] = {"n": len(heldout), "acc": float(base["correct"].mean())}
    draw = random.Random("bottleneck-random")
    every = list(kv_groups(model)) if args.unit == "group" else [f"L{a}H{b}" for a, b in all_heads(model)]
    for k in map(int, args.k.split(",")):
        for kind, chosen in (("top", ranking["unit"].head(k).to_list()), ("random", draw.sample(every, k))):
            heads = [h for unit in chosen for h in (units.get(unit) or unit_heads(unit, model))]
            with ablate_heads(model, heads, sites):
                result = paired(base, score_table(scorer, heldout))
            out["heldout"][f"{kind}{k}"] = {"units": chosen, **result}
            print(json.dumps({f"{kind}{k}": out["heldout"][f"{kind}{k}"]}), flush=True)
    out["s"] = round(time.perf_counter() - start, 1)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
