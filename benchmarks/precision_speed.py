"""Evaluation with the linear layers' matmuls in bf16 (eval.compute_dtype: bfloat16) against
the float32 reference, on the same items in one run.

    .venv/bin/python benchmarks/precision_speed.py [--model-dir data/models/smollm2-135m]
        [--student-dir data/models/smollm2-135m-hybrid-k10-n16] [--sizes 10,40] [--n 24] [--threads 2]

For the model (and the student, where its folder exists): KV-retrieval scoring of `--n` seeded
prompts per dictionary size, with PyTorch's default float32 matmul (F.linear, the reference), then
as the pipeline evaluates at eval.compute_dtype float32 (oneDNN's float32 kernel on a CPU) and
bfloat16 (bf16 linears), each timed after one warm-up batch. Printed: the times, their ratios to
the reference, the largest |Δ log-prob of the target|, and on how many items the prediction is
the same.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from _common import model_or_tiny

from gna.engine.precision import linears_computed_in
from gna.engine.scoring import Scorer, score_table
from gna.students.spec import load_any
from gna.tasks.tables import build_kv_retrieval


def timed_scores(model, tok, table, batch_size: int):
    score_table(Scorer(model, tok, batch_size=batch_size, progress=False), table.head(batch_size))  # warm-up
    start = time.perf_counter()
    scores = score_table(Scorer(model, tok, batch_size=batch_size, progress=False), table)
    return scores, time.perf_counter() - start


def compare(name: str, model, tok, table, batch_size: int) -> dict:
    reference, t_ref = timed_scores(model, tok, table, batch_size)
    result = {"float32_s": t_ref, "items": len(table), "acc_float32": float(reference["correct"].mean())}
    line = f"{name}: float32 (F.linear) {t_ref:6.1f} s"
    for label, compute_dtype in (("float32_kernel", "float32"), ("bf16", "bfloat16")):
        fast, t_fast = timed_scores(linears_computed_in(copy.deepcopy(model), compute_dtype), tok, table, batch_size)
        worst = float((reference["logp_target"] - fast["logp_target"]).abs().max())
        same = int((reference["pred"] == fast["pred"]).sum())
        result[label] = {
            "s": t_fast,
            "ratio": t_ref / t_fast,
            "max_abs_logp_diff": worst,
            "same_prediction": same,
            "acc": float(fast["correct"].mean()),
        }
        line += (
            f"; eval.compute_dtype {compute_dtype} {t_fast:6.1f} s = {t_ref / t_fast:4.2f}x, max|Δ logp target| "
            f"{worst:.1e}, same prediction on {same} of {len(table)}"
        )
    result["bf16_vs_float32_kernel"] = result["float32_kernel"]["s"] / result["bf16"]["s"]
    print(line + f"; bf16 vs the float32 kernel {result['bf16_vs_float32_kernel']:4.2f}x")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--student-dir", default="data/models/smollm2-135m-hybrid-k10-n16")
    parser.add_argument("--sizes", default="10,40")
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/precision.json")
    args = parser.parse_args()
    model, tok, name = model_or_tiny(args.model_dir, args.threads)
    table = build_kv_retrieval([int(s) for s in args.sizes.split(",")], args.n, seed=4321, template="lookup")
    print(f"{len(table)} KV prompts (sizes {args.sizes}), {torch.get_num_threads()} threads")
    result = {
        "model": name,
        "items": len(table),
        "threads": args.threads,
        name: compare(name, model, tok, table, args.batch_size),
    }
    if Path(args.student_dir, "config.json").exists():
        student, student_tok = load_any(args.student_dir)
        student_name = Path(args.student_dir).name
        result[student_name] = compare(student_name, student, student_tok, table, args.batch_size)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
