"""Evaluating students and their teacher: task scores and held-out perplexity per variant, and
the layer swap of the pure-SSM student (answer-row masking on hybrids: gna.students.student_masking)."""

from __future__ import annotations

import logging

import polars as pl

from gna.phases.evaluation import score_model
from gna.students.mixer import swapped_to_attention
from gna.core.io import read_parquet, write_parquet
from gna.models.prepare import load_model
from gna.students.spec import TEACHER_VARIANT, parse_variant, ranked_heads
from gna.tasks.tables import load_task_tables
from gna.core.tensor_files import read_tensors

log = logging.getLogger("gna.students.student_evaluation")


def label_variant(frame: pl.DataFrame, variant: str) -> pl.DataFrame:
    """`frame` with the variant's columns: variant, heads_kept and state_size (null for the
    teacher)."""
    heads_kept, state_size = (None, None) if variant == TEACHER_VARIANT else parse_variant(variant)
    return frame.with_columns(pl.lit(variant).alias("variant"), pl.lit(heads_kept, pl.Int64).alias("heads_kept"),
                              pl.lit(state_size, pl.Int64).alias("state_size"))


def swap_label(variant: str, layer: int) -> str:
    """The variant name of a student with every head of `layer` run as attention."""
    return f"{variant} + attention layer {layer}"


def log_scores(frame: pl.DataFrame) -> None:
    """Log each task's overall accuracy and perplexity."""
    for row in frame.filter(pl.col("group") == "all").filter(pl.col("metric").is_in(["acc", "perplexity"])).iter_rows(
            named=True):
        log.info("%s %s %s: %.3f", row["variant"], row["task"], row["metric"], row["value"])


def write_scores(frame: pl.DataFrame, items: pl.DataFrame, model_name: str, summary_path: str,
                 answers_path: str) -> None:
    """Write a scored variant's summary and its per-item answers (variant columns copied), each
    with a model column, and log the summary."""
    labels = frame.select("variant", *[c for c in ("heads_kept", "state_size", "swapped_layer") if c in frame.columns])
    answers = items.drop("logprobs").join(labels.head(1), how="cross")
    write_parquet(answers.with_columns(pl.lit(model_name).alias("model")), answers_path)
    write_parquet(frame.with_columns(pl.lit(model_name).alias("model")), summary_path)
    log_scores(frame)


def run_hybrid_score(model_name: str, variant: str, model_dir: str, teacher_path: str, task_paths: list[str],
                     summary_path: str, answers_path: str, max_items: int | None, swap_items: int | None,
                     batch_size: int, dtype: str = "float32") -> pl.DataFrame:
    """score_model of the teacher or one student (`variant`) on the task tables (each cut to
    `max_items`; None: all, the teacher's baseline items) with `swap_items` per task checked
    for degeneracy, and on the teacher file's held-out windows. The label_variant'ed summary
    goes to `summary_path`, the per-item answers to `answers_path`."""
    model, tok = load_model(model_dir, dtype)
    tables = load_task_tables(task_paths, max_items)
    heldout = read_tensors(teacher_path, ["heldout_ids"])["heldout_ids"]
    frame, items = score_model(model, tok, tables, heldout, batch_size, swap_items)
    frame = label_variant(frame, variant)
    write_scores(frame, items, model_name, summary_path, answers_path)
    return frame


def run_hybrid_swap(model_name: str, variant: str, model_dir: str, ranking_path: str, teacher_path: str,
                    task_paths: list[str], summary_path: str, answers_path: str, max_items: int | None,
                    swap_items: int | None, batch_size: int, dtype: str = "float32") -> pl.DataFrame:
    """The layer swap: score_model of student `variant` with every head of the top-ranked
    head's layer run as the teacher's attention; variant swap_label and swapped_layer columns;
    summary and answers written as by run_hybrid_score."""
    model, tok = load_model(model_dir, dtype)
    tables = load_task_tables(task_paths, max_items)
    heldout = read_tensors(teacher_path, ["heldout_ids"])["heldout_ids"]
    critical = ranked_heads(read_parquet(ranking_path), 1, model_name)[0][0]
    with swapped_to_attention(model, [critical]):
        frame, items = score_model(model, tok, tables, heldout, batch_size, swap_items)
    frame = frame.with_columns(pl.lit(swap_label(variant, critical)).alias("variant"),
                               pl.lit(critical).alias("swapped_layer"))
    write_scores(frame, items, model_name, summary_path, answers_path)
    return frame
