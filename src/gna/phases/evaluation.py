"""Evaluation: baseline scoring of one model on one task (our engine) or one lm-eval task, and
scoring a model on several tasks plus held-out perplexity (students and their teacher)."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import polars as pl

from gna.core.chance import chance_accuracy
from gna.core.io import read_parquet, write_parquet
from gna.core.runtime import peak_rss_mb
from gna.core.settings import Evaluation
from gna.engine.scoring import Scorer, score_table, summarize_task
from gna.models.prepare import load_model
from gna.tasks.lmeval_bridge import (
    ASSUMED_TOKENS,
    CROSSCHECK_TASK,
    crosscheck_task_yaml,
    evaluate_tasks,
    fitting_batch_size,
    longest_request,
    results_to_frame,
)

log = logging.getLogger("gna.phases.evaluation")


def task_format(table: pl.DataFrame) -> str:
    """The prompt format of a task table: the KV template, 'letter' / 'cloze' for MMLU, the facts
    table's own format column ('cloze', 'choice (text)', …)."""
    task = table["task"][0]
    if task == "kv_retrieval":
        return str(table["template"][0])
    if "format" in table.columns:
        return str(table["format"][0])
    return task.removeprefix("mmlu_")


def baseline_summary(model_name: str, table: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """The baseline's tidy summary of one task: summarize_task's rows with the model, the task's
    format, the chance accuracy of each group and engine 'gna'. No timings: a result must hash
    the same whenever its numbers are the same (wall times live in the run record)."""
    chance = {g: chance_accuracy(table.filter(pl.col("group") == g)) for g in table["group"].unique()}
    chance["all"] = chance_accuracy(table)
    return (
        summarize_task(items)
        .with_columns(
            pl.lit(model_name).alias("model"),
            pl.lit(task_format(table)).alias("format"),
            pl.col("group").replace_strict(chance, return_dtype=pl.Float64).alias("chance"),
            pl.lit("gna").alias("engine"),
        )
        .select("model", "task", "format", "group", "n", "metric", "value", "ci_low", "ci_high", "chance", "engine")
    )


def run_baseline(
    model_name: str,
    model_dir: str,
    task_path: str,
    summary_path: str,
    items_path: str,
    evaluation: Evaluation = Evaluation(),
) -> pl.DataFrame:
    """Score the prepared model `model_dir` on the task table `task_path` with our engine; write
    its per-item scores to `items_path` and its baseline_summary to `summary_path`."""
    table = read_parquet(task_path)
    if table.is_empty():
        raise ValueError(f"task file has no items: {task_path}")
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    start = time.perf_counter()
    items = score_table(
        Scorer(model, tok, batch_size=evaluation.batch_size), table, desc=f"{model_name} {table['task'][0]}"
    )
    seconds = time.perf_counter() - start
    summary = baseline_summary(model_name, table, items)
    write_parquet(items.with_columns(pl.lit(model_name).alias("model")), items_path)
    write_parquet(summary, summary_path)
    acc = summary.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    log.info(
        "%s on %s: acc=%.3f over %d items in %.1fs (peak RSS %.0f MB)",
        model_name,
        table["task"][0],
        acc,
        len(table),
        seconds,
        peak_rss_mb(),
    )
    return summary


def run_lm_eval_task(
    model_name: str,
    model_dir: str,
    task: str,
    out_path: str,
    options: dict,
    include_path: str | None,
    evaluation: Evaluation = Evaluation(),
    memory_mb: int | None = None,
    items_file: str | Path | None = None,
) -> pl.DataFrame:
    """Run the lm-eval task `task` on the prepared model `model_dir` and write its metrics to
    `out_path` (results_to_frame plus format/group 'lm-eval'/'all' and engine 'lm-eval').
    `options`: the `lm_eval` config keys include_defaults, limit, num_fewshot (absent: lm-eval's).
    `memory_mb`: the job's memory, which lm-eval's logits must fit in (a smaller batch where not;
    request lengths measured on `items_file` where the items are ours, else assumed)."""
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    start = time.perf_counter()
    longest = longest_request(tok, items_file) if items_file is not None else ASSUMED_TOKENS
    results = evaluate_tasks(
        model,
        tok,
        [task],
        include_path=include_path,
        include_defaults=options.get("include_defaults", True),
        limit=options.get("limit"),
        num_fewshot=options.get("num_fewshot"),
        batch_size=fitting_batch_size(model, evaluation.batch_size, memory_mb, longest),
    )
    seconds = time.perf_counter() - start
    frame = results_to_frame(results, model_name)
    frame = frame.with_columns(
        pl.lit("lm-eval").alias("format"),
        pl.lit("all").alias("group"),
        pl.lit("lm-eval").alias("engine"),
    )
    write_parquet(frame, out_path)
    log.info(
        "%s on lm-eval task %s: %d metrics in %.1fs (peak RSS %.0f MB)",
        model_name,
        task,
        len(frame),
        seconds,
        peak_rss_mb(),
    )
    return frame


def run_crosscheck(
    model_name: str,
    model_dir: str,
    task_dir: str,
    out_path: str,
    evaluation: Evaluation = Evaluation(),
    memory_mb: int | None = None,
) -> pl.DataFrame:
    """run_lm_eval_task on our own MMLU letter items: the task CROSSCHECK_TASK that
    lmeval_bridge.write_crosscheck_task wrote to `task_dir`, with lm-eval's built-in tasks off;
    its YAML is written again here (crosscheck_task_yaml), next to `out_path` and removed after,
    so it names the items where they are now."""
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(out_path).parent, prefix=".lmeval-task-") as yaml_dir:
        crosscheck_task_yaml(task_dir, yaml_dir)
        return run_lm_eval_task(
            model_name,
            model_dir,
            CROSSCHECK_TASK,
            out_path,
            options={"include_defaults": False},
            include_path=yaml_dir,
            evaluation=evaluation,
            memory_mb=memory_mb,
            items_file=Path(task_dir) / f"{CROSSCHECK_TASK}.jsonl",
        )
