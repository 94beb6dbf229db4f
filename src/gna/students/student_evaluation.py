"""Evaluating students and their teacher: task scores and held-out perplexity per variant, and
the layer swap of the pure-SSM student (answer-row masking on hybrids: gna.students.student_masking)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import polars as pl
import torch
import torch.nn.functional as F

from gna.core.chance import SKIPPED, ChancePolicy, skipped
from gna.core.io import read_parquet, write_parquet
from gna.core.paired import COLUMNS as COMPARISON_COLUMNS
from gna.core.paired import comparisons
from gna.core.settings import Files, RuleSettings, StudentScoring
from gna.core.tensor_files import read_tensors
from gna.engine.device import device_of
from gna.engine.scoring import Scorer, known_items, score_table, summarize_task
from gna.students.mixer import restore, snapshot, swapped_to_attention
from gna.students.spec import (
    ALIGNED_STAGE,
    KD_VS_REALIGNED,
    STAGE_BY_STAGE,
    TEACHER_VARIANT,
    THROUGH_TRAINING,
    load_any,
    parse_variant,
    ranked_heads,
    read_spec,
    stage_label,
)
from gna.tasks.tables import context_swapped, load_item_scores, load_task_tables

log = logging.getLogger("gna.students.student_evaluation")


def score_model(
    scorer: Scorer,
    tables: dict[str, pl.DataFrame],
    heldout: torch.Tensor | None,
    degeneracy_items: int | None = None,
    scored: dict[str, pl.DataFrame] | None = None,
    degeneracy_pool: dict[str, pl.DataFrame] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary, items) of the model of `scorer` (gna.engine.scoring.Scorer: model, tokenizer,
    items per forward, progress bars) on every task table, plus held-out perplexity: summary is
    tidy (task, group, n, metric, value, ci_low, ci_high, degenerate), items one row per scored
    item (gna.engine.scoring.per_item_frame). `degeneracy_items` items per task (None: all, 0: none) are
    scored again with another item's context (gna.tasks.tables.context_swapped): their
    predictions are the items' `pred_other_context`, and the summary says whether the model is
    degenerate (answers the same whatever the context). `scored`: {task: per-item scores of this
    model already computed on a superset of the table's items (the teacher's baseline)}, used
    instead of scoring those items again. `degeneracy_pool`: {task: the items of its table that the
    degeneracy check draws from (default: the whole table)}."""
    model, tok, batch_size, progress = scorer.model, scorer.tok, scorer.batch_size, scorer.progress
    summaries, items = [], []
    for name, table in tables.items():
        if scored and name in scored:
            per_item = known_items(table, scored[name])
        else:
            per_item = score_table(Scorer(model, tok, batch_size=batch_size, progress=progress), table, desc=name)
        pool = (degeneracy_pool or {}).get(name, table)
        check = context_swapped(pool, degeneracy_items) if degeneracy_items != 0 else table.clear()
        if degeneracy_items != 0 and check.is_empty():
            log.warning(
                "%s: no degeneracy check: none of the %s items chosen has a partner with as many "
                "choices to swap contexts with",
                name,
                degeneracy_items,
            )
        if not check.is_empty():
            swapped = score_table(
                Scorer(model, tok, batch_size=batch_size, progress=progress), check, desc=f"{name}, contexts swapped"
            )
            per_item = per_item.join(
                swapped.select("item_id", pl.col("pred").alias("pred_other_context")), on="item_id", how="left"
            )
        summaries.append(summarize_task(per_item))
        items.append(per_item)
    if heldout is not None:
        summaries.append(
            pl.DataFrame(
                {
                    "task": ["heldout"],
                    "group": ["all"],
                    "n": [heldout.numel()],
                    "metric": ["perplexity"],
                    "value": [perplexity(model, heldout)],
                }
            )
        )
    # no table (every task skipped): perplexity only, and no per-item answers
    return (
        pl.concat(summaries, how="diagonal_relaxed"),
        pl.concat(items, how="diagonal_relaxed") if items else pl.DataFrame(),
    )


@torch.inference_mode()
def perplexity(model, ids: torch.Tensor, batch: int = 4) -> float:
    """exp(mean next-token NLL) over windows ids [n, T]."""
    total, count = 0.0, 0
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        logits = model(input_ids=chunk, use_cache=False).logits[:, :-1].float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += chunk[:, 1:].numel()
    return math.exp(total / count)


def label_variant(frame: pl.DataFrame, variant: str) -> pl.DataFrame:
    """`frame` with the variant's columns: variant, heads_kept and state_size (null for the
    teacher)."""
    heads_kept, state_size = (None, None) if variant == TEACHER_VARIANT else parse_variant(variant)
    return frame.with_columns(
        pl.lit(variant).alias("variant"),
        pl.lit(heads_kept, pl.Int64).alias("heads_kept"),
        pl.lit(state_size, pl.Int64).alias("state_size"),
    )


def swap_label(variant: str, layer: int) -> str:
    """The variant name of a student with every head of `layer` run as attention."""
    return f"{variant} + attention layer {layer}"


def log_scores(frame: pl.DataFrame) -> None:
    """Log each task's overall accuracy and perplexity."""
    for row in (
        frame.filter(pl.col("group") == "all")
        .filter(pl.col("metric").is_in(["acc", "perplexity"]))
        .iter_rows(named=True)
    ):
        log.info("%s %s %s: %.3f", row["variant"], row["task"], row["metric"], row["value"])


def write_scores(
    frame: pl.DataFrame, items: pl.DataFrame, model_name: str, summary_path: str, answers_path: str
) -> None:
    """Write a scored variant's summary and its per-item answers (variant columns copied), each
    with a model column, and log the summary."""
    labels = frame.select("variant", *[c for c in ("heads_kept", "state_size", "swapped_layer") if c in frame.columns])
    answers = items.drop("logprobs", strict=False).join(labels.head(1), how="cross")
    write_parquet(answers.with_columns(pl.lit(model_name).alias("model")), answers_path)
    write_parquet(frame.with_columns(pl.lit(model_name).alias("model")), summary_path)
    log_scores(frame)


def skip_where_teacher_cannot_compare(
    tables: dict[str, pl.DataFrame], teacher_summary_path: str | None, chance: ChancePolicy
) -> tuple[dict[str, pl.DataFrame], pl.DataFrame | None]:
    """(the tables a student is scored on, rows recording the others): with the teacher's summary
    (`teacher_summary_path`, its hybrid_score), a task on which the teacher is degenerate or at
    chance (ChancePolicy.teacher_reasons) is not scored, since no student could be compared with
    it there; each such task gets one row (group all, metric acc, value null) whose
    skipped_reason says why. Without a summary (None) or with the policy off, every table is scored."""
    summary = None if teacher_summary_path is None else read_parquet(teacher_summary_path)
    reasons = chance.teacher_reasons(summary, tables)
    if not reasons:
        return tables, None
    for task, reason in reasons.items():
        log.info("%s not scored: %s", task, reason)
    rows = pl.DataFrame(
        {"task": list(reasons), "group": "all", "metric": "acc", "value": None, SKIPPED: list(reasons.values())},
        schema={"task": pl.String, "group": pl.String, "metric": pl.String, "value": pl.Float64, SKIPPED: pl.String},
    )
    return {t: table for t, table in tables.items() if t not in reasons}, rows


def _with_reasons(frame: pl.DataFrame, reasons: pl.DataFrame | None) -> pl.DataFrame:
    """`frame` with its skipped_reason column (null: scored), and the rows of `reasons` below."""
    frame = frame.with_columns(skipped(None))
    return frame if reasons is None else pl.concat([frame, reasons], how="diagonal_relaxed")


@dataclass(frozen=True)
class HybridScore(RuleSettings):
    """Rule hybrid_score's settings: the teacher or student `variant` (wildcard variant) of `model`
    (wildcard model), scored by `scoring` (StudentScoring); `kv_dict_size`: KV retrieval on its
    items of that dictionary size only (the state-size sweep's students; None: every item)."""

    model: str
    variant: str
    scoring: StudentScoring = StudentScoring()
    kv_dict_size: int | None = None


def run_hybrid_score(inputs: Files, outputs: Files, settings: HybridScore) -> pl.DataFrame:
    """score_model of the teacher or one student (settings.variant) on the task tables (each cut
    to `scoring.items`, scoring = settings.scoring) with `scoring.degeneracy_items` per task checked for degeneracy (KV
    retrieval's drawn from its items of `scoring.dict_size` keys: the budget curve then reads its
    last point from these results, budget_point_from_scores), and on the teacher file's held-out
    windows. settings.kv_dict_size: KV retrieval on the items of that dictionary size only (the
    state-size sweep's students).

    inputs: model (folder), teacher (distillation file), tasks (task tables); optional baseline
    (the teacher's per-item baseline scores, read instead of scoring its items again) and
    teacher_summary (a student's: tasks on which the teacher fails `scoring.chance` are not
    scored, skip_where_teacher_cannot_compare). outputs: summary (label_variant'ed), answers
    (per item)."""
    model_name, variant, scoring, kv_dict_size = (
        settings.model,
        settings.variant,
        settings.scoring,
        settings.kv_dict_size,
    )
    evaluation = scoring.evaluation
    model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    tables = load_task_tables(inputs.tasks, scoring.items)
    if kv_dict_size is not None and "kv_retrieval" in tables:
        tables["kv_retrieval"] = at_dict_size(tables["kv_retrieval"], kv_dict_size, "kv_retrieval")
    tables, reasons = skip_where_teacher_cannot_compare(tables, inputs.get("teacher_summary"), scoring.chance)
    heldout = read_tensors(inputs.teacher, ["heldout_ids"], device_of(model))["heldout_ids"]
    frame, items = score_model(
        Scorer(model, tok, evaluation.batch_size),
        tables,
        heldout,
        scoring.degeneracy_items,
        scored=load_item_scores(inputs.get("baseline", [])),
        degeneracy_pool=kv_degeneracy_pool(tables, scoring.dict_size),
    )
    frame = label_variant(_with_reasons(frame, reasons), variant)
    write_scores(frame, items, model_name, outputs.summary, outputs.answers)
    return frame


@dataclass(frozen=True)
class HybridSwap(RuleSettings):
    """Rule hybrid_swap's settings: the pure-SSM student `variant` of `model` (wildcard model),
    scored by `scoring` (StudentScoring)."""

    model: str
    variant: str
    scoring: StudentScoring = StudentScoring()


def run_hybrid_swap(inputs: Files, outputs: Files, settings: HybridSwap) -> pl.DataFrame:
    """The layer swap: score_model of student settings.variant with every head of the top-ranked
    head's layer run as the teacher's attention; variant swap_label and swapped_layer columns;
    summary and answers written as by run_hybrid_score (tasks skipped and KV's degeneracy check
    drawn as there). inputs: model, ranking (the head ranking), teacher, tasks, optional
    teacher_summary; outputs: summary, answers."""
    model_name, variant, scoring = settings.model, settings.variant, settings.scoring
    evaluation = scoring.evaluation
    model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    tables, reasons = skip_where_teacher_cannot_compare(
        load_task_tables(inputs.tasks, scoring.items), inputs.get("teacher_summary"), scoring.chance
    )
    heldout = read_tensors(inputs.teacher, ["heldout_ids"], device_of(model))["heldout_ids"]
    critical = ranked_heads(read_parquet(inputs.ranking), 1, model_name)[0][0]
    with swapped_to_attention(model, [critical]):
        frame, items = score_model(
            Scorer(model, tok, evaluation.batch_size),
            tables,
            heldout,
            scoring.degeneracy_items,
            degeneracy_pool=kv_degeneracy_pool(tables, scoring.dict_size),
        )
    frame = _with_reasons(frame, reasons).with_columns(
        pl.lit(swap_label(variant, critical)).alias("variant"), pl.lit(critical).alias("swapped_layer")
    )
    write_scores(frame, items, model_name, outputs.summary, outputs.answers)
    return frame


def checkpoint_states(tensors: dict) -> dict[int, dict]:
    """{step: {"<layer>.<param>": tensor}} from a distill_kd checkpoints file's tensors."""
    states: dict[int, dict] = {}
    for key, value in tensors.items():
        step, name = key.split("/", 1)
        states.setdefault(int(step), {})[name] = value
    return states


def at_dict_size(table: pl.DataFrame, dict_size: int, source: str) -> pl.DataFrame:
    """The KV-retrieval items of `table` with `dict_size` keys; a clear error naming `source`
    (the file) where there are none."""
    picked = table.filter(pl.col("dict_size") == dict_size)
    if picked.is_empty():
        raise ValueError(
            f"{source}: no KV-retrieval items of dictionary size {dict_size} "
            f"(hybrid.dict_size); the task has sizes {sorted(table['dict_size'].unique())}"
        )
    return picked


def kv_degeneracy_pool(tables: dict[str, pl.DataFrame], dict_size: int | None) -> dict[str, pl.DataFrame] | None:
    """score_model's degeneracy_pool: KV retrieval's degeneracy check drawn from its items of
    `dict_size` keys (None, or no KV table: from every item)."""
    if dict_size is None or "kv_retrieval" not in tables:
        return None
    return {"kv_retrieval": at_dict_size(tables["kv_retrieval"], dict_size, "kv_retrieval")}


def kv_items(kv_path: str, dict_size: int) -> dict[str, pl.DataFrame]:
    """{"kv_retrieval": the KV-retrieval items of one dictionary size} (the budget curve's, the
    ablations' and the state-size sweep's evaluation set)."""
    return {"kv_retrieval": at_dict_size(read_parquet(kv_path), dict_size, kv_path)}


def budget_point_from_scores(
    summary_path: str, answers_path: str, table: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The budget curve's point of the student itself from its hybrid_score results: (summary,
    items) of its KV answers on the items of `table` (the curve's, one dictionary size) with
    their context-swapped predictions, the summary with its held-out perplexity. None where they
    do not have it (KV not scored or cut to fewer items, or its degeneracy check drawn from other
    items): the point is then scored."""
    answers = read_parquet(answers_path)
    if "pred_other_context" not in answers.columns:
        return None
    items = answers.filter((pl.col("task") == "kv_retrieval") & pl.col("item_id").is_in(table["item_id"].implode()))
    if len(items) != len(table) or items["pred_other_context"].null_count():
        return None
    summary = read_parquet(summary_path)
    heldout = summary.filter(pl.col("task") == "heldout").select("task", "group", "n", "metric", "value")
    items = items.drop("variant", "heads_kept", "state_size", "model", strict=False)
    return pl.concat([summarize_task(items), heldout], how="diagonal_relaxed"), items


@dataclass(frozen=True)
class HybridBudget(RuleSettings):
    """Rule hybrid_budget's settings: student `variant` (wildcard variant) of `model` (wildcard
    model), scored by `scoring` (its dict_size, degeneracy_items and evaluation)."""

    model: str
    variant: str
    scoring: StudentScoring = StudentScoring()


def run_hybrid_budget(inputs: Files, outputs: Files, settings: HybridBudget) -> pl.DataFrame:
    """The distillation budget curve of student settings.variant (scoring = settings.scoring):
    score_model on the KV items of `scoring.dict_size` keys (kv_items; `scoring.degeneracy_items`
    degeneracy checks) and held-out perplexity after each KD step count saved in its checkpoints
    and at the step checkpoint selection chose (the student itself: read from its hybrid_score
    results where they hold it, budget_point_from_scores). Tidy rows with kd_steps, kd_tokens
    (tokens seen by distillation) and chosen (the student's own step) to outputs.budget. With
    inputs.facts (the facts cloze table, a list: empty where the config has none), also
    knowledge_through_training from the aligned heads inputs.aligned through every checkpoint,
    against the teacher's answers inputs.teacher_answers, to outputs.knowledge (a comparisons
    table; empty without facts). Every KD checkpoint against the realigned student (step 0) item by
    item on those KV items (does KD help, and does the chosen step?) to outputs.comparisons
    (family KD_VS_REALIGNED). inputs: model, checkpoints (its KD checkpoints), teacher, task (the
    KV table), aligned, facts, teacher_answers; optional summary and answers (its hybrid_score
    results)."""
    model_name, variant, scoring = settings.model, settings.variant, settings.scoring
    evaluation, model_dir = scoring.evaluation, inputs.model
    model, tok = load_any(model_dir, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    spec = read_spec(model_dir)
    tokens_per_step = spec["kd_tokens"] / max(1, spec["kd_steps"])
    states = checkpoint_states(read_tensors(inputs.checkpoints, None, device_of(model)))
    chosen = spec.get("chosen_step", spec["kd_steps"])  # the step checkpoint selection wrote
    states[chosen] = snapshot(model)
    tables = kv_items(inputs.task, scoring.dict_size)
    heldout = read_tensors(inputs.teacher, ["heldout_ids"], device_of(model))["heldout_ids"]
    summary_path, answers_path = inputs.get("summary"), inputs.get("answers")
    last = (
        budget_point_from_scores(summary_path, answers_path, tables["kv_retrieval"])
        if summary_path is not None and answers_path is not None
        else None
    )
    frames, answers = [], {}
    for step in sorted(states):
        if step == chosen and last is not None:
            frame, items = last
            log.info("%s after %d KD steps: read from its scores (%s)", variant, step, summary_path)
        else:
            restore(model, states[step])
            frame, items = score_model(
                Scorer(model, tok, evaluation.batch_size), tables, heldout, scoring.degeneracy_items
            )
        answers[stage_label(step)] = items
        frames.append(
            frame.with_columns(
                pl.lit(step).alias("kd_steps"),
                pl.lit(round(step * tokens_per_step)).alias("kd_tokens"),
                pl.lit(step == chosen).alias("chosen"),
            )
        )
        acc = frame.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"]
        log.info("%s after %d KD steps: acc %.3f", variant, step, acc[0] if len(acc) else float("nan"))
    out = label_variant(pl.concat(frames, how="diagonal_relaxed"), variant).with_columns(
        pl.lit(model_name).alias("model")
    )
    write_parquet(out, outputs.budget)
    realigned = stage_label(0)
    pairs = [(KD_VS_REALIGNED, realigned, label) for label in answers if label != realigned]
    steps = comparisons(answers, pairs).with_columns(
        pl.lit(variant).alias("variant"), pl.lit(model_name).alias("model")
    )
    write_parquet(steps, outputs.comparisons)
    if inputs.facts:  # facts cloze through training (a config without it: no table)
        aligned = read_tensors(inputs.aligned, None, device_of(model))
        stages = {ALIGNED_STAGE: aligned} | {stage_label(step): states[step] for step in sorted(states)}
        scorer = Scorer(model, tok, evaluation.batch_size)
        knowledge = knowledge_through_training(
            scorer, stages, read_parquet(inputs.facts[0]), read_parquet(inputs.teacher_answers[0])
        )
        labels = [pl.lit(variant).alias("variant"), pl.lit(model_name).alias("model")]
        write_parquet(knowledge.with_columns(*labels), outputs.knowledge)
    else:
        write_parquet(pl.DataFrame(schema=COMPARISON_COLUMNS), outputs.knowledge)
    return out


def knowledge_through_training(
    scorer: Scorer, stages: dict[str, dict], facts: pl.DataFrame, teacher: pl.DataFrame
) -> pl.DataFrame:
    """Where a student loses knowledge: the facts table `facts` scored at each stage of `stages`
    {label: SSM parameters, in training order; ALIGNED_STAGE's are loaded with load_aligned, the
    others restored as KD checkpoints} and compared item by item (gna.core.paired.comparisons)
    with the teacher's answers `teacher` (its per-item answers; the facts task's rows) and with
    the stage before. Leaves the model at the last stage."""
    from gna.students.alignment import load_aligned

    task = facts["task"][0]
    per_item = {TEACHER_VARIANT: teacher.filter(pl.col("task") == task)}
    for label, state in stages.items():
        if label == ALIGNED_STAGE:
            load_aligned(scorer.model, state)
        else:
            restore(scorer.model, state)
        per_item[label] = score_table(scorer, facts, desc=f"{task} {label}")
        log.info("%s at %s: acc %.3f", task, label, float(per_item[label]["correct"].mean()))
    labels = list(stages)
    pairs = [(THROUGH_TRAINING, TEACHER_VARIANT, label) for label in labels]
    pairs += [(STAGE_BY_STAGE, before, after) for before, after in zip(labels, labels[1:])]
    return comparisons(per_item, pairs)
