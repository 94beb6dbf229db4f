"""The distillation recipe and its ablations: what each ingredient (gna.students.alignment, gna.students.kd) buys.

The pipeline's recipe for a student: SSM heads initialised from their attention heads, layer
alignment (stage 1) with the first-token share, realignment on the student's own stream, then
end-to-end distillation (stage 2) on all training windows with the answer positions weighted.
An ablation trains one student with one ingredient removed and scores it like the budget curve
(one task and held-out perplexity); the full recipe and "aligned, no KD" come from the student
itself and its budget curve.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, RuleSettings, StudentScoring
from gna.core.tensor_files import read_tensors
from gna.engine.device import device_of
from gna.engine.precision import linears_computed_in
from gna.engine.scoring import Scorer
from gna.models.prepare import load_model
from gna.students.alignment import Align, Realign, align_layers, load_aligned, realign_in_context
from gna.students.kd import KD, Select, Watch, answer_weights, distill_logits
from gna.students.mixer import mixers
from gna.students.spec import ABLATIONS, make_hybrid, parse_variant, ranked_heads
from gna.students.student_evaluation import kv_items, score_model

log = logging.getLogger("gna.students.recipe")


@dataclass(frozen=True)
class Recipe:
    """The distillation recipe the ablations remove one ingredient of: `align` (hybrid.align),
    `realign` (hybrid.realign; None: no realignment), `kd` (hybrid.kd, for the ablations' steps:
    gna.students.spec.ablation_kd), `align_windows` (hybrid.corpus.align_windows: the small
    corpus's windows) and `seed` (hybrid.seed)."""

    align: Align = Align()
    realign: Realign | None = None
    kd: KD = KD()
    align_windows: int = 32
    seed: int = 99


def realigns(ablation: str, recipe: Recipe) -> bool:
    """Whether the student without `ablation` is realigned on its own stream (and so needs the
    teacher file's hidden states)."""
    return ablation not in ("init_only", "no_align", "no_realign") and bool(recipe.realign and recipe.realign.steps)


def ablated_student(teacher, kept: list[tuple[int, int]], state_size: int, ablation: str, data: dict, recipe: Recipe):
    """A student trained by the recipe with `ablation` (a key of ABLATIONS) removed, made from
    `teacher` in place (the teacher's forward is in the teacher file; no copy is held beside the
    student). data: the teacher file's tensors, under "aligned" the recipe's aligned SSM heads
    at `state_size` ({"<layer>.<param>": tensor}) and, optionally, under "selection" the
    checkpoint selection (Selection) that picks the KD step as the full recipe's student's is
    picked (without it: the last step); recipe: Recipe."""
    align, kd, seed, aligned = recipe.align, recipe.kd, recipe.seed, data["aligned"]
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown distillation ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
    if ablation == "no_first_token":  # aligned again, from the teacher before it becomes the student
        aligned, _ = align_layers(
            teacher, data["hidden"], state_size, dataclasses.replace(align, first_token=False), seed
        )
    student = make_hybrid(teacher, kept, state_size)
    if ablation == "init_only":
        return student
    if ablation == "no_first_token":
        for m in mixers(student):
            m.first_token_share = False
    if ablation != "no_align":
        load_aligned(student, aligned)
        if realigns(ablation, recipe):
            realign_in_context(student, data["hidden"], recipe.realign, seed, progress=False)
    ids, top_logp, top_idx = data["train_ids"], data["top_logp"], data["top_idx"]
    weights = answer_weights(data["train_answers"], 1 if ablation == "no_answer_weight" else kd.answer_weight)
    if ablation == "small_corpus":
        ids, top_logp, top_idx, weights = (t[: recipe.align_windows] for t in (ids, top_logp, top_idx, weights))
    targets = {"ids": ids, "top_logp": top_logp, "top_idx": top_idx, "weights": weights}
    distill_logits(student, targets, kd, seed, Watch(select=data.get("selection"), desc=f"kd, {ablation}"))
    return student


@dataclass(frozen=True)
class HybridAblation(RuleSettings):
    """Rule hybrid_ablation's settings: student `variant` (hybrid.ablation.variant) of `model`
    (wildcard model) trained by `recipe` without `ablation` (wildcard ablation), its KD checkpoint
    chosen by `select` as the full recipe's student's is (None: the last step; the rule passes
    None where the ablations train for a budget of the curve, hybrid.ablation.kd_steps), scored by
    `scoring` (its dict_size, degeneracy_items and evaluation)."""

    model: str
    ablation: str
    variant: str
    recipe: Recipe = Recipe()
    scoring: StudentScoring = StudentScoring()
    select: Select | None = None


def run_hybrid_ablation(inputs: Files, outputs: Files, settings: HybridAblation) -> pl.DataFrame:
    """Train student settings.variant by settings.recipe without settings.ablation
    (ablated_student), score it on the KV items of `scoring.dict_size` keys
    (`scoring.degeneracy_items` degeneracy checks; linear layers in
    `scoring.evaluation.compute_dtype`) and on the teacher file's held-out windows; tidy rows with
    ablation and description columns to outputs.ablation. inputs: model (the teacher's folder),
    teacher (its distillation file), aligned (the recipe's aligned SSM heads), ranking, task (the
    KV table), validation (the KV prompts of checkpoint selection, where settings.select is by
    validation)."""
    model_name, ablation, variant, recipe, scoring = (
        settings.model,
        settings.ablation,
        settings.variant,
        settings.recipe,
        settings.scoring,
    )
    evaluation = scoring.evaluation
    teacher, tok = load_model(inputs.model, evaluation.dtype)
    heads_kept, state_size = parse_variant(variant)
    kept = ranked_heads(read_parquet(inputs.ranking), heads_kept, model_name)
    needed = ["train_ids", "train_answers", "top_logp", "top_idx", "heldout_ids"]
    on = device_of(teacher)
    hidden = ablation == "no_first_token" or realigns(ablation, recipe)
    data = read_tensors(inputs.teacher, needed + (["hidden"] if hidden else []), on)
    data["aligned"] = read_tensors(inputs.aligned, None, on)
    if settings.select is not None:
        data["selection"] = settings.select.selection(tok, inputs.validation)
    student = ablated_student(teacher, kept, state_size, ablation, data, recipe)
    if data.get("selection") is not None and data["selection"].rows:  # init_only trains nothing
        log.info(
            "%s %s: validation accuracy %s by step; chosen: after %d KD steps",
            variant,
            ablation,
            data["selection"].points(),
            data["selection"].chosen,
        )
    linears_computed_in(student.eval(), evaluation.compute_dtype)
    frame, _ = score_model(
        Scorer(student, tok, evaluation.batch_size),
        kv_items(inputs.task, scoring.dict_size),
        data["heldout_ids"],
        scoring.degeneracy_items,
    )
    frame = frame.with_columns(
        pl.lit(model_name).alias("model"),
        pl.lit(variant).alias("variant"),
        pl.lit(heads_kept).alias("heads_kept"),
        pl.lit(state_size).alias("state_size"),
        pl.lit(ablation).alias("ablation"),
        pl.lit(ABLATIONS[ablation]).alias("description"),
    )
    write_parquet(frame, outputs.ablation)
    acc = frame.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"]
    log.info("%s %s: acc %.3f", variant, ablation, acc[0] if len(acc) else float("nan"))
    return frame
