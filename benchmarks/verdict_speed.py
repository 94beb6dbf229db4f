"""The report's comparisons tables (gna.report.htmlkit.comparisons_table: each row's verdict, its
planned n and its detectable difference) with the planning functions of gna.core.paired kept per
argument (the pipeline's path) against the reference, the same functions recomputed at every call,
on every comparisons table of a results folder.

    .venv/bin/python benchmarks/verdict_speed.py [--results tests/data/smoke_results/results]
        [--margin 0.05]

Printed: the tables and rows, both times, their ratio and whether the HTML is the same.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from gna.core import paired
from gna.report import htmlkit


@contextmanager
def uncached():
    """gna.core.paired's planning functions without their caches (paired.KEPT_PLANS: each call
    computes again, through what the cache wraps), also where the report's tables imported one by name."""
    kept = {name: getattr(paired, name) for name in paired.KEPT_PLANS}
    try:
        for name, fn in kept.items():
            for module in (paired, htmlkit):
                if getattr(module, name, None) is fn:
                    setattr(module, name, fn.__wrapped__)
        yield
    finally:
        for name, fn in kept.items():
            for module in (paired, htmlkit):
                if getattr(module, name, None) is fn.__wrapped__:
                    setattr(module, name, fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="tests/data/smoke_results/results")
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--out", default="benchmarks/out/verdict_speed.json")
    args = parser.parse_args()
    frames = [pl.read_parquet(p) for p in sorted(Path(args.results).rglob("*comparisons.parquet"))]
    frames = [f for f in frames if len(f)]
    if not frames:
        raise SystemExit(f"{args.results}: no comparisons tables (*comparisons.parquet) with rows")

    with uncached():
        start = time.perf_counter()
        reference = [htmlkit.comparisons_table(f, args.margin) for f in frames]
        t_ref = time.perf_counter() - start
    for name in paired.KEPT_PLANS:
        getattr(paired, name).cache_clear()  # the fast path starts cold, as a report job does
    start = time.perf_counter()
    fast = [htmlkit.comparisons_table(f, args.margin) for f in frames]
    t_fast = time.perf_counter() - start

    result = {
        "tables": len(frames),
        "rows": sum(len(f) for f in frames),
        "reference_s": round(t_ref, 2),
        "cached_s": round(t_fast, 2),
        "ratio": round(t_ref / t_fast, 1),
        "same_html": fast == reference,
    }
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if not result["same_html"]:
        raise SystemExit("the cached path's tables differ from the reference's")


if __name__ == "__main__":
    main()
