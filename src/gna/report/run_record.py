"""The run record: when, where and from which commit the latest run ran, and how long each step took.

Wall times and machines differ between two runs of the same code and config, so they are kept out
of the results and the report (which DVC hashes): Snakemake's benchmark records (one TSV per step)
and the timing logs of steps that time their parts (`<step>.timings.json` under the logs folder)
are gathered into `data/run/index.html` after every successful run (the Snakefile's onsuccess).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl

from gna.core.io import write_text
from gna.core.provenance import config_hash, git_commit, machine
from gna.report.htmlkit import CSS, table

RUN_RECORD = "data/run/index.html"
RUN_RECORD_JSON = "data/run/record.json"  # the same record for gna.report.timing_table (README's time table)

# the study's phases, by the rules that make them (a rule's benchmark records are under its name)
PHASE_OF_RULE_PREFIX = {
    "fetch_": "models and tasks",
    "prepare_model": "models and tasks",
    "kv_task": "models and tasks",
    "mmlu_task": "models and tasks",
    "lmeval_crosscheck_task": "models and tasks",
    "facts_task": "models and tasks",
    "facts_known": "models and tasks",
    "facts_formats": "baseline",
    "baseline": "baseline",
    "collect_baseline": "baseline",
    "lm_eval": "baseline",
    "prune_": "pruning",
    "minimal_model": "pruning",
    "case_": "MMLU case study",
    "heads_": "heads",
    "gna_": "gather & aggregate",
    "distill_": "students",
    "hybrid_": "students",
}
STEP_SCHEMA = {"step": pl.String, "seconds": pl.Float64, "peak RSS (MB)": pl.Float64}


def timings(benchmark_dir: str | Path) -> pl.DataFrame:
    """Wall time and peak memory of each step, from Snakemake's benchmark records."""
    rows = []
    for tsv in sorted(Path(benchmark_dir).rglob("*.tsv")):
        frame = pl.read_csv(tsv, separator="\t")
        rows.append(
            {
                "step": str(tsv.relative_to(benchmark_dir).with_suffix("")),
                "seconds": float(frame["s"][0]),
                "peak RSS (MB)": float(frame["max_rss"][0]),
            }
        )
    return pl.DataFrame(rows, schema=STEP_SCHEMA)


def part_timings(logs_dir: str | Path) -> pl.DataFrame:
    """Wall time of the timed parts of steps: one row per (step, part) of every
    `<step>.timings.json` ({part: seconds}) under `logs_dir`."""
    rows = []
    for path in sorted(Path(logs_dir).rglob("*.timings.json")):
        step = str(path.relative_to(logs_dir)).removesuffix(".timings.json")
        rows += [
            {"step": step, "part": part, "seconds": float(seconds)}
            for part, seconds in json.loads(path.read_text()).items()
        ]
    return pl.DataFrame(rows, schema={"step": pl.String, "part": pl.String, "seconds": pl.Float64})


WORK_SCHEMA = {"step": pl.String, "layer-tokens (M)": pl.Float64, "GFLOP": pl.Float64}


def work_counts(logs_dir: str | Path) -> pl.DataFrame:
    """Layer-tokens and useful GFLOP each step ran (gna.core.work), from the `<step>.work.json` files
    under `logs_dir` (GFLOP null in a count written before FLOPs were counted)."""
    rows = []
    for path in sorted(Path(logs_dir).rglob("*.work.json")):
        counts = json.loads(path.read_text())
        flops = counts.get("flops")
        rows.append(
            {
                "step": str(path.relative_to(logs_dir)).removesuffix(".work.json"),
                "layer-tokens (M)": counts["layer_tokens"] / 1e6,
                "GFLOP": None if flops is None else flops / 1e9,
            }
        )
    return pl.DataFrame(rows, schema=WORK_SCHEMA)


def with_work(steps: pl.DataFrame, logs_dir: str | Path, peak: dict | None = None) -> pl.DataFrame:
    """`steps` (timings) with each step's layer-tokens and seconds per million of them, its useful
    GFLOP/s and, given the `peak` measured at the run's start (gna.engine.peak), their fraction of
    it (null for a step that counts none: downloads, tables, the lm-eval cross-check, the report)."""
    peak_rate = (peak or {}).get("GFLOP/s")
    return (
        steps.join(work_counts(logs_dir), on="step", how="left", maintain_order="left")
        .with_columns(
            (pl.col("seconds") / pl.col("layer-tokens (M)")).alias("s per M layer-tokens"),
            (pl.col("GFLOP") / pl.col("seconds")).alias("GFLOP/s"),
        )
        .with_columns((pl.col("GFLOP/s") / peak_rate if peak_rate else pl.lit(None, pl.Float64)).alias("of peak"))
        .drop("GFLOP")
    )


def phase_of(step: str) -> str:
    """The study phase of a benchmark record's step name '<rule>/<wildcards>' ('other' if none)."""
    rule = step.split("/", 1)[0]
    return next((phase for prefix, phase in PHASE_OF_RULE_PREFIX.items() if rule.startswith(prefix)), "other")


def phase_timings(steps: pl.DataFrame) -> pl.DataFrame:
    """Per phase (phase_of): steps, summed wall time and the largest peak RSS, plus a total row;
    with summed layer-tokens, and the useful GFLOP/s and fraction of the peak of the steps that
    count FLOPs (weighted by their time), where `steps` has them (with_work)."""
    aggs = [pl.len().alias("steps"), pl.col("seconds").sum(), pl.col("peak RSS (MB)").max()]
    if "layer-tokens (M)" in steps.columns:
        aggs.append(pl.col("layer-tokens (M)").sum())
    for rate in ("GFLOP/s", "of peak"):  # over the steps that count FLOPs, weighted by their time
        if rate in steps.columns:
            counted = pl.col(rate).is_not_null()
            aggs.append(
                ((pl.col(rate) * pl.col("seconds")).sum() / pl.col("seconds").filter(counted).sum())
                .fill_nan(None)  # a phase without such steps
                .alias(rate)
            )
    by_phase = (
        steps.with_columns(pl.col("step").map_elements(phase_of, return_dtype=pl.String).alias("phase"))
        .group_by("phase", maintain_order=True)
        .agg(*aggs)
    )
    total = steps.select(pl.lit("all").alias("phase"), *aggs)
    return pl.concat([by_phase, total])


def write_run_record(
    out_path: str | Path, benchmark_dir: str | Path, logs_dir: str | Path, config: dict, workflow_dir: str | Path
) -> None:
    """Write the run record page `out_path`: time, commit, config hash and machine, then the
    per-phase and per-step timings (timings, phase_timings) and the timed parts (part_timings);
    beside it, record.json: the same machine and steps for gna.report.timing_table."""
    from gna.engine.peak import PEAK_FILE, read_peak  # here: the report reads RUN_RECORD without torch

    mach = machine()
    peak = read_peak(Path(out_path).with_name(Path(PEAK_FILE).name))
    about = {
        "written": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git commit": git_commit(workflow_dir),
        "config hash": config_hash(config),
        "python / torch": f"{mach['python']} / {mach['torch']}",
        "machine": f"{mach['platform']}, {mach['cpu']} ({mach['kernels']}), {mach['cpu_count']} CPUs, "
        f"CUDA {'yes' if mach['cuda'] else 'no'}",
        "matmul peak at the run's start": "not measured (make reproduce measures it)"
        if peak is None
        else f"{peak['GFLOP/s']:.0f} GFLOP/s {peak['dtype']} ({peak['kernel']}, {peak['threads']} threads, "
        f"{'×'.join(map(str, peak['shape']))})",
    }
    fmt = {
        "seconds": lambda v: f"{v:.1f}",
        "peak RSS (MB)": lambda v: f"{v:.0f}",
        "layer-tokens (M)": lambda v: "" if v is None else f"{v:.2f}",
        "s per M layer-tokens": lambda v: "" if v is None else f"{v:.1f}",
        "GFLOP/s": lambda v: "" if v is None else f"{v:.0f}",
        "of peak": lambda v: "" if v is None else f"{v:.0%}",
    }
    body = [
        "<h1>Run record</h1>",
        "<p>How the latest run of this folder went: wall time and peak memory per study phase and of "
        "each step, from Snakemake's benchmark records, beside the work each step did (layer-tokens: tokens "
        "through decoder layers, forward; a count that does not depend on the machine), its useful GFLOP/s "
        "(linear layers, causal attention and the output head at the rows read out; a training step counts 3× "
        "its forward) and their fraction of the matmul peak measured at the run's start (the sum of wall times "
        "is the run's length on one job at a time). A step run in an earlier invocation keeps its record. "
        "These numbers describe the machine, not the results, so they are kept out of the results and the "
        "report.</p>",
        table(pl.DataFrame({"item": list(about), "value": list(about.values())}), left=("item", "value")),
    ]
    steps, parts = with_work(timings(benchmark_dir), logs_dir, peak), part_timings(logs_dir)
    record = {
        "written": about["written"],
        "git commit": about["git commit"],
        "cpu": mach["cpu"],
        "kernels": mach["kernels"],
        "cpu_count": mach["cpu_count"],
        "cuda": mach["cuda"],
        "models": sorted(config.get("models", {})),
        "peak": peak,
        "steps": steps.select("step", "seconds", "peak RSS (MB)", "layer-tokens (M)", "GFLOP/s", "of peak").to_dicts(),
    }
    write_text(json.dumps(record, indent=1) + "\n", Path(out_path).with_name(Path(RUN_RECORD_JSON).name))
    if steps.is_empty():
        body.append(
            "<p>No benchmark records: no step has run in this folder (results restored with "
            "<code>make pull</code> carry no timings).</p>"
        )
    else:
        body += [
            "<h2>Per phase</h2>",
            table(phase_timings(steps), left=("phase",), fmt=fmt),
            "<h2>Per step</h2>",
            table(steps, left=("step",), fmt=fmt),
        ]
    if not parts.is_empty():
        body += [
            "<h2>Parts of steps</h2><p>Steps that time their parts separately (e.g. the attribution "
            "pre-ranking of the attribution check).</p>",
            table(parts, left=("step", "part"), fmt=fmt),
        ]
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Run record</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    write_text(page, out_path)
