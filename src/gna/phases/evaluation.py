"""Evaluation: baseline scoring of one model on one task (our engine) or one lm-eval task, and
scoring a model on several tasks plus held-out perplexity (students and their teacher)."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from gna.core.chance import chance_accuracy
from gna.core.io import collect_tables, read_parquet, write_parquet
from gna.core.runtime import peak_rss_mb
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.engine.scoring import Scorer, score_table, summarize_task
from gna.models.prepare import load_model
from gna.tasks.lmeval_bridge import (
    ASSUMED_TOKENS,
    CROSSCHECK_TASK,
    LmEvalOptions,
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


@dataclass(frozen=True)
class Baseline(RuleSettings):
    """Rule baseline: the model's name (wildcard model) and how it is loaded and scored."""

    model: str
    evaluation: Evaluation = Evaluation()


def run_baseline(inputs: Files, outputs: Files, settings: Baseline) -> pl.DataFrame:
    """Rule baseline: score the prepared model of the inputs' `model` on the task table of the
    inputs' `task` with our engine; write its per-item scores to the outputs' `per_item` and its
    baseline_summary to the outputs' `summary`."""
    model_name, evaluation = settings.model, settings.evaluation
    table = read_parquet(inputs.task)
    if table.is_empty():
        raise ValueError(f"task file has no items: {inputs.task}")
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    start = time.perf_counter()
    items = score_table(
        Scorer(model, tok, batch_size=evaluation.batch_size), table, desc=f"{model_name} {table['task'][0]}"
    )
    seconds = time.perf_counter() - start
    summary = baseline_summary(model_name, table, items)
    write_parquet(items.with_columns(pl.lit(model_name).alias("model")), outputs.per_item)
    write_parquet(summary, outputs.summary)
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


@dataclass(frozen=True)
class LmEval(RuleSettings):
    """Rule lm_eval: the model's name (wildcard model), the lm-eval task (wildcard lmtask), how
    lm-eval runs (config section lm_eval without its task list), how the model is loaded and
    scored, and the job's memory `memory_mb` (its mem_mb resource), which lm-eval's logits must
    fit in (None: no limit)."""

    model: str
    task: str
    options: LmEvalOptions = LmEvalOptions()
    evaluation: Evaluation = Evaluation()
    memory_mb: int | None = None


def lm_eval_frame(settings: LmEval, model_dir: str | Path, items_file: str | Path | None = None) -> pl.DataFrame:
    """The metrics of the lm-eval task `settings.task` on the prepared model `model_dir`:
    results_to_frame plus format/group 'lm-eval'/'all' and engine 'lm-eval'. lm-eval's batch is
    made to fit in `settings.memory_mb` (request lengths measured on `items_file` where the
    items are ours, else assumed)."""
    evaluation = settings.evaluation
    model, tok = load_model(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    start = time.perf_counter()
    longest = longest_request(tok, items_file) if items_file is not None else ASSUMED_TOKENS
    batch_size = fitting_batch_size(model, evaluation.batch_size, settings.memory_mb, longest)
    results = evaluate_tasks(Scorer(model, tok, batch_size), [settings.task], settings.options)
    seconds = time.perf_counter() - start
    frame = results_to_frame(results, settings.model)
    frame = frame.with_columns(
        pl.lit("lm-eval").alias("format"),
        pl.lit("all").alias("group"),
        pl.lit("lm-eval").alias("engine"),
    )
    log.info(
        "%s on lm-eval task %s: %d metrics in %.1fs (peak RSS %.0f MB)",
        settings.model,
        settings.task,
        len(frame),
        seconds,
        peak_rss_mb(),
    )
    return frame


def run_lm_eval(inputs: Files, outputs: Files, settings: LmEval) -> pl.DataFrame:
    """Rule lm_eval: run the lm-eval task `settings.task` on the prepared model of the inputs'
    `model` and write its metrics (lm_eval_frame) to the outputs' `metrics`."""
    frame = lm_eval_frame(settings, inputs.model)
    write_parquet(frame, outputs.metrics)
    return frame


@dataclass(frozen=True)
class LmEvalCrosscheck(RuleSettings):
    """Rule lm_eval_crosscheck: the model's name (wildcard model), how it is loaded and scored,
    and the job's memory `memory_mb` (its mem_mb resource; None: no limit)."""

    model: str
    evaluation: Evaluation = Evaluation()
    memory_mb: int | None = None


def run_lm_eval_crosscheck(inputs: Files, outputs: Files, settings: LmEvalCrosscheck) -> pl.DataFrame:
    """Rule lm_eval_crosscheck: lm-eval on our own MMLU letter items, the task CROSSCHECK_TASK
    that lmeval_bridge.write_crosscheck_task wrote to the inputs' `task_dir`, with lm-eval's
    built-in tasks off, on the prepared model of the inputs' `model`; its metrics written to the
    outputs' `metrics`. The task's YAML is written again here (crosscheck_task_yaml), next to
    the output and removed after, so it names the items where they are now."""
    out_path, task_dir = outputs.metrics, inputs.task_dir
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(out_path).parent, prefix=".lmeval-task-") as yaml_dir:
        crosscheck_task_yaml(task_dir, yaml_dir)
        lm_eval = LmEval(
            model=settings.model,
            task=CROSSCHECK_TASK,
            options=LmEvalOptions(include_path=yaml_dir, include_defaults=False),
            evaluation=settings.evaluation,
            memory_mb=settings.memory_mb,
        )
        frame = lm_eval_frame(lm_eval, inputs.model, items_file=Path(task_dir) / f"{CROSSCHECK_TASK}.jsonl")
    write_parquet(frame, out_path)
    return frame


@dataclass(frozen=True)
class CollectBaseline(RuleSettings):
    """Rule collect_baseline reads no settings: what it collects is its inputs."""


def run_collect_baseline(inputs: Files, outputs: Files, settings: CollectBaseline) -> pl.DataFrame:
    """Rule collect_baseline: every per-(model, task) baseline summary and lm-eval table of the
    inputs' `tables` as one tidy table, written to the outputs' `table`."""
    paths = inputs.get("tables", [])
    table = collect_tables([paths] if isinstance(paths, str) else paths)
    write_parquet(table, outputs.table)
    return table
