"""The distillation recipe and its ablations: what each ingredient (gna.students.alignment, gna.students.kd) buys.

The pipeline's recipe for a student: SSM heads initialised from their attention heads, layer
alignment (stage 1) with the first-token share, realignment on the student's own stream, then
end-to-end distillation (stage 2) on all training windows with the answer positions weighted.
An ablation trains one student with one ingredient removed and scores it like the budget curve
(one task and held-out perplexity); the full recipe and "aligned, no KD" come from the student
itself and its budget curve.
"""

from __future__ import annotations

import logging

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, StudentScoring
from gna.core.tensor_files import read_tensors
from gna.engine.device import device_of
from gna.engine.precision import linears_computed_in
from gna.models.prepare import load_model
from gna.students.alignment import align_layers, load_aligned, realign_in_context
from gna.students.kd import answer_weights, distill_logits
from gna.students.mixer import mixers
from gna.students.spec import ABLATIONS, make_hybrid, parse_variant, ranked_heads
from gna.students.student_evaluation import kv_items, score_model

log = logging.getLogger("gna.students.recipe")


def realigns(ablation: str, recipe: dict) -> bool:
    """Whether the student without `ablation` is realigned on its own stream (and so needs the
    teacher file's hidden states)."""
    return ablation not in ("init_only", "no_align", "no_realign") and bool((recipe.get("realign") or {}).get("steps"))


def ablated_student(
    teacher,
    kept: list[tuple[int, int]],
    state_size: int,
    ablation: str,
    aligned: dict,
    data: dict,
    recipe: dict,
):
    """A student trained by the recipe with `ablation` (a key of ABLATIONS) removed, made from
    `teacher` in place (the teacher's forward is in the teacher file; no copy is held beside the
    student). aligned: the recipe's aligned SSM heads at `state_size`; data: the teacher file's
    tensors; recipe: {align, realign, kd (hybrid.align, hybrid.realign, hybrid.kd), align_windows
    (hybrid.corpus.align_windows), seed (hybrid.seed)}."""
    align, kd, seed = recipe["align"], recipe["kd"], recipe["seed"]
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown distillation ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
    if ablation == "no_first_token":  # aligned again, from the teacher before it becomes the student
        aligned, _ = align_layers(teacher, data["hidden"], state_size, align, seed, first_token=False)
    student = make_hybrid(teacher, kept, state_size)
    if ablation == "init_only":
        return student
    if ablation == "no_first_token":
        for m in mixers(student):
            m.first_token_share = False
    if ablation != "no_align":
        load_aligned(student, aligned)
        if realigns(ablation, recipe):
            realign_in_context(student, data["hidden"], recipe["realign"], seed, progress=False)
    ids, top_logp, top_idx = data["train_ids"], data["top_logp"], data["top_idx"]
    weights = answer_weights(data["train_answers"], 1 if ablation == "no_answer_weight" else kd["answer_weight"])
    if ablation == "small_corpus":
        ids, top_logp, top_idx, weights = (t[: recipe["align_windows"]] for t in (ids, top_logp, top_idx, weights))
    targets = {"ids": ids, "top_logp": top_logp, "top_idx": top_idx, "weights": weights}
    distill_logits(student, targets, kd, seed, desc=f"kd, {ablation}")
    return student


def run_hybrid_ablation(
    model_name: str, ablation: str, variant: str, inputs: Files, out_path: str, recipe: dict, scoring: StudentScoring
) -> pl.DataFrame:
    """Train student `variant` by the recipe without `ablation` (ablated_student), score it on
    the KV items of `scoring.dict_size` keys (`scoring.degeneracy_items` degeneracy checks; linear
    layers in `scoring.evaluation.compute_dtype`) and on the teacher file's held-out windows; tidy
    rows with ablation and description columns to `out_path`. inputs: model (the teacher's
    folder), teacher (its distillation file), aligned (the recipe's aligned SSM heads), ranking,
    task (the KV table)."""
    evaluation = scoring.evaluation
    teacher, tok = load_model(inputs.model, evaluation.dtype)
    heads_kept, state_size = parse_variant(variant)
    kept = ranked_heads(read_parquet(inputs.ranking), heads_kept, model_name)
    needed = ["train_ids", "train_answers", "top_logp", "top_idx", "heldout_ids"]
    on = device_of(teacher)
    hidden = ablation == "no_first_token" or realigns(ablation, recipe)
    data = read_tensors(inputs.teacher, needed + (["hidden"] if hidden else []), on)
    student = ablated_student(teacher, kept, state_size, ablation, read_tensors(inputs.aligned, None, on), data, recipe)
    linears_computed_in(student.eval(), evaluation.compute_dtype)
    frame, _ = score_model(
        student,
        tok,
        kv_items(inputs.task, scoring.dict_size),
        data["heldout_ids"],
        evaluation.batch_size,
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
    write_parquet(frame, out_path)
    acc = frame.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"]
    log.info("%s %s: acc %.3f", variant, ablation, acc[0] if len(acc) else float("nan"))
    return frame
