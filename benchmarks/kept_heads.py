"""Which kept heads cost retrieval before KD, and what realignment does: validation prompts only.

    python benchmarks/kept_heads.py --data DATA --model gemma3-270m --state-size 16 \
        --sets 0,2,5,10,20,10+11,10+12 [--realign 0,40] [--out benchmarks/out/kept_heads.parquet]

Reads a finished run's model, aligned heads (align-n<N>), teacher file and head ranking under DATA.
A set is k (the k best-ranked heads kept) or k+r (those and the head ranked r). Each student is
built as distill_kd builds it, realigned on its own stream with hybrid.realign's steps replaced by
each value of --realign (0 = as aligned on the teacher's stream), and scored before any KD on the
checkpoint selection's validation KV prompts (hybrid.validation: their own seed, never evaluation
items). Prints one row per set and realignment: accuracy (n, Wilson 95%), the target's mean
log-prob and seconds; writes them all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import polars as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from gna.core.io import read_parquet, write_parquet  # noqa: E402
from gna.core.stats import wilson_interval  # noqa: E402
from gna.core.tensor_files import read_tensors  # noqa: E402
from gna.students.alignment import Realign, load_aligned, realign_in_context
from gna.students.kd import validation_scorer  # noqa: E402
from gna.students.spec import make_hybrid, ranked_heads  # noqa: E402
from gna.tasks.tables import KD_VALIDATION, PROMPT_SETS_DIR, build_kv_retrieval, kv_prompt_sets  # noqa: E402
from gna.workflow.config import load_schema, validate_config  # noqa: E402


def kept_set(name: str, ranked: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """'k' -> the k best-ranked heads; 'k+r' -> those and the head ranked r (1-based)."""
    k, _, extra = name.partition("+")
    return ranked[: int(k)] + ([ranked[int(extra) - 1]] if extra else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--model", required=True)
    ap.add_argument("--state-size", type=int, default=16)
    ap.add_argument("--sets", default="0,2,5,10,20")
    ap.add_argument("--realign", default="0,40", help="realignment steps per layer to compare (0 = none)")
    ap.add_argument("--windows", type=int, default=None, help="hybrid.realign.windows (default: the config's)")
    ap.add_argument("--out", default="benchmarks/out/kept_heads.parquet")
    args = ap.parse_args()
    from gna.models.prepare import load_model

    config = validate_config(
        yaml.safe_load(Path(args.config).read_text()), load_schema(REPO / "config" / "schema.yaml")
    )
    hy = config["hybrid"]
    torch.set_num_threads(2)
    keys = kv_prompt_sets(config)[f"{PROMPT_SETS_DIR}/{KD_VALIDATION}"]  # the workflow's validation prompts
    table = build_kv_retrieval(keys["sizes"], keys["n_per_size"], keys["seed"], keys["template"])
    data, n = Path(args.data), args.state_size
    ranking = read_parquet(data / "results" / "heads" / args.model / "ranking.parquet")
    ranked = ranked_heads(ranking, len(ranking), args.model)
    aligned = read_tensors(data / "distill" / args.model / f"align-n{n}.safetensors", None, "cpu")
    hidden = read_tensors(data / "distill" / args.model / "teacher.safetensors", ["hidden"], "cpu")["hidden"]
    rows = []
    for name in args.sets.split(","):
        for steps in (int(s) for s in args.realign.split(",")):
            start = time.perf_counter()
            model, tok = load_model(data / "models" / args.model, config["dtype"])
            student = load_aligned(make_hybrid(model, kept_set(name, ranked), n), aligned)
            realign = {**hy["realign"], "steps": steps, **({"windows": args.windows} if args.windows else {})}
            realign_in_context(student, hidden, Realign(**realign), hy["seed"], progress=False)
            with torch.no_grad():
                correct, logp = validation_scorer(tok, table, config["eval"]["batch_size"])(student.eval())
            low, high = wilson_interval(sum(correct), len(correct))
            rows.append(
                {
                    "set": name,
                    "heads_kept": len(kept_set(name, ranked)),
                    "realign_steps": steps,
                    "realign_windows": args.windows or hy["realign"]["windows"] or len(hidden[0]),
                    "n": len(correct),
                    "accuracy": sum(correct) / len(correct),
                    "ci_low": low,
                    "ci_high": high,
                    "mean_logp": logp,
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            print(rows[-1], flush=True)
    frame = pl.DataFrame(rows).with_columns(pl.lit(args.model).alias("model"), pl.lit(n).alias("state_size"))
    write_parquet(frame, args.out)
    with pl.Config(tbl_rows=100, tbl_width_chars=200):
        print(frame)


if __name__ == "__main__":
    main()
