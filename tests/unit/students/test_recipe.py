"""The distillation ablations (gna.students.recipe): each ablated student is the recipe with its
ingredient removed, and the ablation rule's scored rows."""

import copy
import dataclasses

import polars as pl
import pytest
import torch

from gna.core.settings import Evaluation
from gna.core.tensor_files import read_tensors
from gna.engine.device import device_of
from gna.models.prepare import load_model
from gna.students.alignment import Align, Realign, align_layers, load_aligned, realign_in_context
from gna.students.kd import KD as KDSettings
from gna.students.kd import Selection, Watch, answer_weights, distill_logits
from gna.students.mixer import mixers, snapshot
from gna.students.recipe import Recipe, ablated_student
from gna.students.spec import make_hybrid
from unit.students.rules import KD, ablation


def _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, weights, kd, seed, first_token=True, realign=None) -> dict:
    """The SSM parameters of a student made by make_hybrid, its SSM heads loaded from `aligned`
    (None: left as initialised) and realigned by `realign` = (hidden, settings) where given, after
    distill_logits on exactly these windows and weights (without the first-token share where not
    `first_token`)."""
    student = make_hybrid(copy.deepcopy(teacher), kept, 4)
    for m in mixers(student):
        m.first_token_share = first_token
    if aligned is not None:
        load_aligned(student, aligned)
    if realign is not None:
        realign_in_context(student, *realign, seed, progress=False)
    distill_logits(
        student,
        {"ids": ids, "top_logp": top_logp, "top_idx": top_idx, "weights": weights},
        KDSettings(**kd),
        seed,
        Watch(progress=False),
    )
    return snapshot(student)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], v) for k, v in b.items())


@pytest.mark.parametrize(
    "ablation", ["init_only", "no_align", "no_realign", "no_answer_weight", "small_corpus", "no_first_token"]
)
def test_each_ablation_removes_its_ingredient(phase, ablation):
    """Each ablated student is, bit for bit, the recipe's KD run with exactly its ingredient
    removed (built here from make_hybrid, load_aligned and distill_logits), and differs from the
    full recipe's student: an ignored switch trains the full recipe and fails."""
    root, p = phase
    teacher, _ = load_model(p["teacher"])
    # read onto the teacher's device, as run_hybrid_ablation reads them
    data = read_tensors(str(root / "teacher.safetensors"), None, device_of(teacher))
    aligned = read_tensors(str(root / "align.safetensors"), None, device_of(teacher))
    kept = [(2, 1), (0, 3)]
    # two steps over every window: the answer positions and the windows beyond align_windows are
    # in every batch, and Adam's second step follows the gradients' size, not only their signs
    kd, seed, align_windows = {**KD, "steps": 2, "batch": 6}, 1, 4
    realign = {"steps": 2, "batch": 2, "lr": 1e-2}
    align = {"steps": 2, "batch": 2, "lr": 1e-3}
    args = Recipe(Align(**align), Realign(**realign), KDSettings(**kd), align_windows, seed)
    mine = (data["hidden"], Realign(**realign))  # the recipe's realignment
    tensors = {**data, "aligned": aligned}
    student = ablated_student(copy.deepcopy(teacher), kept, 4, ablation, tensors, args)
    state = snapshot(student)
    init = snapshot(make_hybrid(copy.deepcopy(teacher), kept, 4))
    from_aligned = snapshot(load_aligned(make_hybrid(copy.deepcopy(teacher), kept, 4), aligned))
    assert not _same(init, from_aligned)  # alignment moved the SSM heads: the two starts differ
    if ablation == "init_only":
        assert _same(init, state)
    else:
        assert not _same(init, state) and not _same(from_aligned, state)
    ids, top_logp, top_idx, answers = data["train_ids"], data["top_logp"], data["top_idx"], data["train_answers"]
    weighted = answer_weights(answers, kd["answer_weight"])
    if ablation != "init_only":
        recipe = _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, weighted, kd, seed, realign=mine)
        if ablation == "no_first_token":  # aligned again without the share, then realigned and KD without it
            again, _ = align_layers(copy.deepcopy(teacher), data["hidden"], 4, Align(**align, first_token=False), seed)
            expected = _kd_from(
                teacher, kept, again, ids, top_logp, top_idx, weighted, kd, seed, first_token=False, realign=mine
            )
        elif ablation == "no_align":  # KD starts from the initialised SSM heads, not the aligned ones
            expected = _kd_from(teacher, kept, None, ids, top_logp, top_idx, weighted, kd, seed)
        elif ablation == "no_realign":  # KD starts from the heads as aligned on the teacher's stream
            expected = _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, weighted, kd, seed)
        elif ablation == "no_answer_weight":  # every position weighs the same: the plain loss
            assert answers.any() and weighted.max() == kd["answer_weight"] > 1
            expected = _kd_from(teacher, kept, aligned, ids, top_logp, top_idx, None, kd, seed, realign=mine)
        else:  # only the first align_windows windows (those alignment saw), not all train windows
            assert len(ids) > align_windows
            expected = _kd_from(
                teacher,
                kept,
                aligned,
                *(t[:align_windows] for t in (ids, top_logp, top_idx, weighted)),
                kd,
                seed,
                realign=mine,
            )
        assert _same(expected, state), f"{ablation}: not the recipe with its ingredient removed"
        assert not _same(recipe, state), f"{ablation}: the full recipe's student (the switch did nothing)"
    shares = [m.first_token_share for m in mixers(student)]
    assert all(shares) == (ablation != "no_first_token") and any(shares) == all(shares)
    if ablation == "no_first_token":  # the share's parameters are not trained
        assert all(torch.equal(init[k], state[k]) for k in state if ".sink_proj." in k)
    with pytest.raises(ValueError, match="unknown distillation ablation 'nope'"):
        ablated_student(copy.deepcopy(teacher), kept, 4, "nope", tensors, args)


def test_ablation_rule_writes_scored_rows(phase):
    root, p = phase
    files = (p["teacher"], str(root / "teacher.safetensors"), str(root / "align.safetensors"), p["ranking.parquet"])
    recipe = dict(align={"steps": 1, "batch": 2, "lr": 1e-3}, align_windows=4, seed=1)

    def run(which, out, **settings):
        kv = p["kv_retrieval.parquet"]
        scoring = dict(degeneracy_items=2, evaluation=Evaluation(batch_size=2))
        return ablation("tiny", which, "k2-n4", *files, kv, str(root / out), **recipe, **scoring, **settings)

    frame = run("no_align", "ablation.parquet", kd={**KD, "steps": 1}, dict_size=3)
    assert set(frame["ablation"]) == {"no_align"} and {"acc", "perplexity"} <= set(frame["metric"])
    assert set(frame.filter(pl.col("metric") == "acc")["group"]) == {"3", "all"}
    with pytest.raises(ValueError, match="no KV-retrieval items of dictionary size 7"):
        run("init_only", "x.parquet", kd=KD, dict_size=7)
    assert pl.read_parquet(root / "ablation.parquet").equals(frame)
    # the rule's selection path: validation prompts read, points scored after 0, 1 and 2 KD steps
    select = {"by": "validation", "every": 1, "batch_size": 2}
    kv = p["kv_retrieval.parquet"]
    chosen = run("no_align", "chosen.parquet", kd={**KD, "steps": 2}, dict_size=3, select=select, validation=kv)
    assert set(chosen["ablation"]) == {"no_align"} and (root / "chosen.parquet").exists()


def test_an_ablation_chooses_its_kd_checkpoint_as_the_full_recipe_does(phase):
    """With a selection (built so that the point before KD answers every validation item and
    every later one none), the ablated student is its realigned, un-distilled checkpoint, bit for
    bit, and the selection records step 0; without one, it is KD's last step."""
    root, p = phase
    teacher, _ = load_model(p["teacher"])
    data = read_tensors(str(root / "teacher.safetensors"), None, device_of(teacher))
    tensors = {**data, "aligned": read_tensors(str(root / "align.safetensors"), None, device_of(teacher))}
    kept = [(2, 1), (0, 3)]
    realign = Realign(steps=2, batch=2, lr=1e-2)
    recipe = Recipe(Align(steps=2, batch=2, lr=1e-3), realign, KDSettings(**{**KD, "steps": 4, "batch": 6}), 4, 1)
    before_kd = dataclasses.replace(recipe, kd=dataclasses.replace(recipe.kd, steps=0))
    untrained = snapshot(ablated_student(copy.deepcopy(teacher), kept, 4, "no_answer_weight", tensors, before_kd))
    calls = []

    def first_point_best(student):
        calls.append(1)
        return [len(calls) == 1] * 20, 0.0

    selection = Selection(first_point_best, every=2)
    chosen = ablated_student(
        copy.deepcopy(teacher), kept, 4, "no_answer_weight", {**tensors, "selection": selection}, recipe
    )
    assert selection.chosen == 0 and [r["after_steps"] for r in selection.rows] == [0, 2, 4]
    assert _same(untrained, snapshot(chosen))
    last = ablated_student(copy.deepcopy(teacher), kept, 4, "no_answer_weight", tensors, recipe)
    assert not _same(untrained, snapshot(last))
