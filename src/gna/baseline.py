"""Baseline scoring of one model on one task (our engine) or one lm-eval task."""

from __future__ import annotations

import logging
import time

import polars as pl

from gna.io import read_parquet, write_parquet
from gna.models import load_model
from gna.runtime import peak_rss_mb
from gna.scoring import chance_accuracy, score_table, summarize

log = logging.getLogger("gna.baseline")

# lm-eval task name of our own MMLU letter items (see lmeval_bridge.write_local_mmlu_task)
CROSSCHECK_TASK = "gna_mmlu_letter"


def task_format(table: pl.DataFrame) -> str:
    task = table["task"][0]
    if task == "kv_retrieval":
        return str(table["template"][0])
    return task.removeprefix("mmlu_")


def run_baseline(model_name: str, model_dir: str, task_path: str, summary_path: str, items_path: str,
                 batch_size: int = 8, dtype: str = "float32") -> pl.DataFrame:
    table = read_parquet(task_path)
    if table.is_empty():
        raise ValueError(f"task file has no items: {task_path}")
    model, tok = load_model(model_dir, dtype)
    start = time.perf_counter()
    items = score_table(model, tok, table, batch_size=batch_size, desc=f"{model_name} {table['task'][0]}")
    seconds = time.perf_counter() - start
    by_group = table["task"][0] == "kv_retrieval"  # accuracy per dictionary size
    summary = summarize(items, by_group=by_group)
    if by_group:
        summary = pl.concat([summary, summarize(items, by_group=False)])
    chance = {g: chance_accuracy(table.filter(pl.col("group") == g)) for g in table["group"].unique()}
    chance["all"] = chance_accuracy(table)
    summary = summary.with_columns(
        pl.lit(model_name).alias("model"),
        pl.lit(task_format(table)).alias("format"),
        pl.col("group").replace_strict(chance, return_dtype=pl.Float64).alias("chance"),
        pl.lit(round(seconds, 2)).alias("seconds"),
        pl.lit("gna").alias("engine"),
    ).select("model", "task", "format", "group", "n", "metric", "value", "chance", "seconds", "engine")
    write_parquet(items.with_columns(pl.lit(model_name).alias("model")), items_path)
    write_parquet(summary, summary_path)
    acc = summary.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    log.info("%s on %s: acc=%.3f over %d items in %.1fs (peak RSS %.0f MB)", model_name,
             table["task"][0], acc, len(table), seconds, peak_rss_mb())
    return summary


def run_lm_eval_task(model_name: str, model_dir: str, task: str, out_path: str, options: dict,
                     include_path: str | None, batch_size: int = 8, dtype: str = "float32") -> pl.DataFrame:
    from gna.lmeval_bridge import results_to_frame, run_tasks

    model, tok = load_model(model_dir, dtype)
    start = time.perf_counter()
    results = run_tasks(model, tok, [task], include_path=include_path,
                        include_defaults=options.get("include_defaults", True), limit=options.get("limit"),
                        num_fewshot=options.get("num_fewshot"), batch_size=batch_size)
    seconds = time.perf_counter() - start
    frame = results_to_frame(results, model_name)
    frame = frame.with_columns(
        pl.lit("lm-eval").alias("format"), pl.lit("all").alias("group"),
        pl.lit(round(seconds, 2)).alias("seconds"), pl.lit("lm-eval").alias("engine"),
    )
    write_parquet(frame, out_path)
    log.info("%s on lm-eval task %s: %d metrics in %.1fs", model_name, task, len(frame), seconds)
    return frame
