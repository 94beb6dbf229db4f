"""Answer-row masking on hybrid students: every attention head kept from the teacher is denied
the answer rows (answer_rows_experiment), the SSM heads are left as they are."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl
import torch

from gna.core.chance import SKIPPED, ChancePolicy
from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, RuleSettings, StudentScoring
from gna.engine.packing import PackedBatch
from gna.engine.scoring import Scorer, accuracy_of, known_or_scored, score_table
from gna.students.mixer import mixers
from gna.students.spec import load_any
from gna.students.student_evaluation import skip_where_teacher_cannot_compare
from gna.tasks.tables import load_task_tables

log = logging.getLogger("gna.students.student_masking")


def answer_rows_mask(batch: PackedBatch, n_heads: int, heads: list[int]) -> torch.Tensor:
    """[B, n_heads, T, T]: the ordinary packed mask, except that the answer rows of `heads` (the
    last context token and every choice token) see only themselves — nothing is aggregated there."""
    mask = batch.mask.expand(-1, n_heads, -1, -1).clone()
    blocked = torch.finfo(mask.dtype).min
    T = mask.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=mask.device)
    for b, item in enumerate(batch.items):
        rows = [item.score_at[0][0]] + [p for p, s in enumerate(item.segment) if s >= 0]
        for h in heads:
            mask[b, h, rows] = torch.where(eye[rows], 0.0, blocked).to(mask.dtype)
    return mask


def answer_rows_experiment(
    model,
    tables: dict[str, pl.DataFrame],
    tok,
    batch_size: int = 8,
    scored: dict[str, pl.DataFrame] | None = None,
    chance: ChancePolicy = ChancePolicy(),
) -> pl.DataFrame:
    """Hybrid students: every attention head's answer rows masked (SSM heads untouched), against
    the unmodified student, on each task (the study's Zamba2 table). `scored`: {task: per-item
    scores of the unmodified student on its items (its hybrid_score answers)}, read for the
    unmodified condition where they hold every item of the task's table, instead of scoring
    those items again. `chance`: where the unmodified student cannot be told from chance it has no
    shown ability for masking to take away, so the masked condition is not run; the unmodified row's skipped_reason
    says why (null elsewhere)."""
    n_heads = model.config.num_attention_heads
    attention = {m.layer_idx: m.attention_heads for m in mixers(model) if m.attention_heads}
    if not attention:
        raise ValueError("the model has no attention heads to mask (a pure SSM)")
    n_attention = sum(len(h) for h in attention.values())

    def layer_masks(batch, rows):
        return {layer: answer_rows_mask(batch, n_heads, heads) for layer, heads in attention.items()}

    rows = []
    for task, table in tables.items():
        plain = known_or_scored(Scorer(model, tok, batch_size=batch_size), table, (scored or {}).get(task))
        reason = chance.reason(plain, table, "masking answer rows")
        if reason is not None:
            log.info("%s: the masked condition not run, the unmodified student is %s", task, reason)
            rows.append(
                {
                    "task": task,
                    "condition": "unmodified",
                    **accuracy_of(plain),
                    "attention_heads": n_attention,
                    SKIPPED: f"{reason}: the masked condition not run",
                }
            )
            continue
        for condition, frame in (
            ("unmodified", plain),
            (
                "attention answer rows masked",
                score_table(Scorer(model, tok, batch_size=batch_size, progress=False), table, layer_masks=layer_masks),
            ),
        ):
            rows.append(
                {
                    "task": task,
                    "condition": condition,
                    **accuracy_of(frame),
                    "attention_heads": n_attention,
                    SKIPPED: None,
                }
            )
    return pl.DataFrame(rows, schema_overrides={SKIPPED: pl.String})


@dataclass(frozen=True)
class HybridAnswerRows(RuleSettings):
    """Rule hybrid_answer_rows's settings: student `variant` (wildcard variant) of `model` (wildcard
    model), scored by `scoring` (its items: hybrid.answer_rows_items, chance and evaluation)."""

    model: str
    variant: str
    scoring: StudentScoring = StudentScoring()


def run_hybrid_answer_rows(inputs: Files, outputs: Files, settings: HybridAnswerRows) -> pl.DataFrame:
    """answer_rows_experiment on student settings.variant over the task tables (each cut to
    `scoring.items`, scoring = settings.scoring), with model and variant columns, written to
    outputs.answer_rows. inputs: model,
    tasks; optional teacher_summary (by `scoring.chance`, a task on which the teacher is degenerate
    or at chance, skip_where_teacher_cannot_compare, is not run: its row carries the reason,
    skipped_reason, instead of accuracies) and answers (the student's per-item answers, its
    hybrid_score, read for the unmodified condition instead of scoring those items again). The
    masked condition is not run where the unmodified student is at chance (answer_rows_experiment)."""
    model_name, variant, scoring = settings.model, settings.variant, settings.scoring
    evaluation = scoring.evaluation
    model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    tables, reasons = skip_where_teacher_cannot_compare(
        load_task_tables(inputs.tasks, scoring.items), inputs.get("teacher_summary"), scoring.chance
    )
    answers_path = inputs.get("answers")
    scored = None
    if answers_path is not None:
        answers = read_parquet(answers_path)
        scored = {task: answers.filter(pl.col("task") == task) for task in tables}
    frame = (
        answer_rows_experiment(model, tables, tok, evaluation.batch_size, scored, scoring.chance)
        if tables
        else pl.DataFrame()
    )
    for row in frame.iter_rows(named=True):
        log.info("%s %s: acc %.3f", row["task"], row["condition"], row["acc"])
    if reasons is not None:
        frame = pl.concat(
            [frame, reasons.select("task", pl.lit(None, pl.String).alias("condition"), SKIPPED)],
            how="diagonal_relaxed",
        )
    frame = frame.with_columns(pl.lit(model_name).alias("model"), pl.lit(variant).alias("variant"))
    write_parquet(frame, outputs.answer_rows)
    return frame
