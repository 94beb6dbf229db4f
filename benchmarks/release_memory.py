"""Memory of an evaluated model held in its bf16 copies alone (gna.engine.precision.release_full_precision)
against the reference, the float32 weights kept beside their copies, on the same items.

    .venv/bin/python benchmarks/release_memory.py [--model-dir data/models/qwen2.5-coder-1.5b]
        [--task data/tasks/mmlu_letter.parquet] [--items 40] [--attribution-prompts 8]

Each side runs in its own process (peak RSS is per process): load the prepared model at
eval.compute_dtype bfloat16 as load_model does (released) or with the float32 weights kept
(reference), score `--items` items of the task table, then run the head sweep's attribution pass
(forward and backward) on `--attribution-prompts` of them. Prints each side's peak RSS after
loading, scoring and attribution, the ratio released / reference, and whether the scores are the
same bit for bit (they must be: the released weights are the copies the matmuls read).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from gna.core.provenance import cpu_kernels, cpu_name

SIDE = r"""
import json, sys, torch
import polars as pl
from gna.core.io import read_parquet
from gna.core.runtime import peak_rss_mb
from gna.engine.precision import linears_computed_in
from gna.engine.scoring import Scorer, score_table
from gna.models import prepare
from gna.phases.head_ablation import attribution_scores

model_dir, task = sys.argv[1], sys.argv[2]
items, prompts, release = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
torch.set_num_threads(2)
if not release:
    prepare.release_full_precision = lambda model: 0  # the reference: float32 weights kept beside the copies
model, tok = prepare.load_model(model_dir, "float32", compute_dtype="bfloat16")
loaded = peak_rss_mb()
table = read_parquet(task).head(items)
scored = score_table(Scorer(model, tok, batch_size=8, progress=False), table)
after_scoring = peak_rss_mb()
attribution_scores(Scorer(model, tok, batch_size=8, progress=False), table.head(prompts))
print(json.dumps({"loaded": loaded, "scoring": after_scoring, "attribution": peak_rss_mb(),
                  "logp": scored["logp_target"].to_list()}))
"""


def side(args, release: bool) -> dict:
    cmd = [sys.executable, "-c", SIDE, args.model_dir, args.task, str(args.items), str(args.attribution_prompts)]
    out = subprocess.run([*cmd, "1" if release else "0"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/qwen2.5-coder-1.5b")
    parser.add_argument("--task", default="data/tasks/mmlu_letter.parquet")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--attribution-prompts", type=int, default=8)
    args = parser.parse_args()
    print(f"{cpu_name()} ({cpu_kernels()})")
    reference, released = side(args, release=False), side(args, release=True)
    for stage in ("loaded", "scoring", "attribution"):
        print(
            f"peak RSS after {stage:12s} reference {reference[stage] / 1024:5.2f} GB, released "
            f"{released[stage] / 1024:5.2f} GB, ratio {released[stage] / reference[stage]:.2f}"
        )
    same = reference["logp"] == released["logp"]
    print(f"scores of {args.items} items the same bit for bit: {same}")
    if not same:
        raise SystemExit("the released model's scores differ from the reference's")


if __name__ == "__main__":
    main()
