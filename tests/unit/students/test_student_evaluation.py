"""The students' scoring (gna.students.student_evaluation): variant labels, the scoring and
layer-swap rules on the distilled tiny students, the teacher read from its baseline, students not
scored where their teacher cannot compare, and the KD budget curve."""

import logging

import polars as pl
import pytest
import torch
from conftest import MINI_MMLU

from gna.core.chance import ChancePolicy, chance_accuracy
from gna.core.io import write_parquet
from gna.core.settings import Evaluation
from gna.core.tensor_files import read_tensors
from gna.engine.device import device_of
from gna.engine.scoring import Scorer, score_table
from gna.models.prepare import load_model
from gna.students.alignment import Realign, load_aligned, realign_in_context
from gna.students.mixer import mixers, snapshot
from gna.students.spec import load_any, make_hybrid, read_spec
from gna.students.student_evaluation import (
    KD_VS_REALIGNED,
    budget_point_from_scores,
    checkpoint_states,
    label_variant,
    swap_label,
)
from gna.tasks.tables import load_task_tables
from unit.students.rules import ON, answer_rows, budget, score, swap_layer

# the scoring settings of the budget-curve test: two degeneracy checks, batches of two
SCORING = dict(degeneracy_items=2, evaluation=Evaluation(batch_size=2))


def test_variant_labels():
    frame = pl.DataFrame({"task": ["kv"], "value": [1.0]})
    student = label_variant(frame, "k2-n8").row(0, named=True)
    assert (student["variant"], student["heads_kept"], student["state_size"]) == ("k2-n8", 2, 8)
    teacher = label_variant(frame, "teacher")
    assert teacher["heads_kept"].to_list() == [None] and teacher["heads_kept"].dtype == pl.Int64
    assert swap_label("k0-n8", 3) == "k0-n8 + attention layer 3"


def test_scoring_rules_on_the_distilled_students(phase):
    root, p = phase
    tasks = [p["kv_retrieval.parquet"]]
    args = dict(max_items=4, evaluation=Evaluation(batch_size=2))
    scores = score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "score.parquet"),
        str(root / "answers.parquet"),
        degeneracy_items=None,
        **args,
    )
    assert "perplexity" in scores["metric"].to_list() and set(scores["heads_kept"]) == {2}
    assert "degeneracy_agreement" in scores["metric"].to_list() and "degenerate" in scores.columns
    answers = pl.read_parquet(root / "answers.parquet")
    assert (
        len(answers) == 4 and set(answers["variant"]) == {"k2-n4"} and answers["pred_other_context"].null_count() == 0
    )
    # the summary is computed from exactly these answers
    acc = scores.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))["value"][0]
    assert acc == answers["correct"].mean()
    # a student saved and reloaded scores identically
    again = score(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "score2.parquet"),
        str(root / "answers2.parquet"),
        degeneracy_items=None,
        **args,
    )
    assert again.equals(scores)
    swap = swap_layer(
        "tiny",
        "k0-n4",
        str(root / "k0"),
        p["ranking.parquet"],
        str(root / "teacher.safetensors"),
        tasks,
        str(root / "swap.parquet"),
        str(root / "swap-answers.parquet"),
        degeneracy_items=0,
        **args,
    )
    assert set(swap["variant"]) == {"k0-n4 + attention layer 2"} and set(swap["swapped_layer"]) == {2}
    assert "degeneracy_agreement" not in swap["metric"].to_list()
    assert set(pl.read_parquet(root / "swap-answers.parquet")["swapped_layer"]) == {2}
    every = ChancePolicy(skip=False)  # the tiny student is at chance: run the masked condition anyway
    rows = answer_rows("tiny", "k2-n4", str(root / "k2"), tasks, str(root / "rows.parquet"), chance=every, **args)
    assert rows["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert pl.read_parquet(root / "rows.parquet").equals(rows)
    student, _ = load_any(root / "k2")
    assert len(mixers(student)) == 3


def test_the_teacher_is_read_from_its_baseline_not_scored_again(phase):
    root, p = phase
    from gna.core.settings import Files
    from gna.phases.evaluation import Baseline, run_baseline

    run_baseline(
        Files(model=p["teacher"], task=p["kv_retrieval.parquet"]),
        Files(summary=str(root / "base.parquet"), per_item=str(root / "base.items.parquet")),
        Baseline(model="tiny", evaluation=Evaluation(batch_size=2)),
    )
    args = dict(max_items=3, degeneracy_items=2, evaluation=Evaluation(batch_size=2))
    scored = score(
        "tiny",
        "teacher",
        p["teacher"],
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "t1.parquet"),
        str(root / "t1a.parquet"),
        **args,
    )
    read = score(
        "tiny",
        "teacher",
        p["teacher"],
        str(root / "teacher.safetensors"),
        [p["kv_retrieval.parquet"]],
        str(root / "t2.parquet"),
        str(root / "t2a.parquet"),
        baseline_paths=[str(root / "base.items.parquet")],
        **args,
    )
    assert read.equals(scored)
    assert pl.read_parquet(root / "t2a.parquet").equals(pl.read_parquet(root / "t1a.parquet"))
    # scores of other items are refused, not silently mixed in
    write_parquet(pl.read_parquet(root / "base.items.parquet").head(1), root / "short.items.parquet")
    with pytest.raises(ValueError, match="items have no earlier scores"):
        score(
            "tiny",
            "teacher",
            p["teacher"],
            str(root / "teacher.safetensors"),
            [p["kv_retrieval.parquet"]],
            str(root / "t3.parquet"),
            str(root / "t3a.parquet"),
            baseline_paths=[str(root / "short.items.parquet")],
            **args,
        )


def _four_items(phase):
    """(root, files, the KV table, scoring keywords: 4 items, no degeneracy check, (k2 student, teacher file))."""
    root, p = phase
    args = dict(max_items=4, degeneracy_items=None, evaluation=Evaluation(batch_size=2))
    return root, p, [p["kv_retrieval.parquet"]], args, (str(root / "k2"), str(root / "teacher.safetensors"))


def _doctored(teacher: pl.DataFrame, interval: tuple[float, float], degenerate: bool) -> pl.DataFrame:
    """The teacher's summary with its overall accuracy's interval set to `interval` and its flag to `degenerate`."""
    overall = (pl.col("metric") == "acc") & (pl.col("group") == "all")
    return teacher.with_columns(
        pl.when(overall).then(interval[0]).otherwise(pl.col("ci_low")).alias("ci_low"),
        pl.when(overall).then(interval[1]).otherwise(pl.col("ci_high")).alias("ci_high"),
        pl.lit(degenerate).alias("degenerate"),
    )


def _rows_of(root, student, tasks, teacher_summary, **scoring):
    """The k2 student's answer-row masking on 4 items, judged against the teacher summary file named."""
    summary = str(root / f"{teacher_summary}.parquet")
    options = dict(max_items=4, evaluation=Evaluation(batch_size=2), teacher_summary_path=summary)
    return answer_rows("tiny", "k2-n4", student[0], tasks, str(root / "rows.parquet"), **options, **scoring)


def test_a_student_is_not_scored_where_its_teacher_is_degenerate(phase):
    root, p, tasks, args, student = _four_items(phase)
    # the tiny teacher is at chance too: its summaries below are made clear of chance, so that only the flag decides
    # 2 of 4 items, of 3 and 5 keys: no item has a partner to swap contexts with, so no check (not a crash)
    unchecked = score(
        "tiny",
        "teacher",
        p["teacher"],
        student[1],
        tasks,
        str(root / "u.parquet"),
        str(root / "ua.parquet"),
        **(args | {"degeneracy_items": 2}),
    )
    assert "degeneracy_agreement" not in unchecked["metric"].to_list() and "degenerate" not in unchecked.columns
    teacher = score(
        "tiny", "teacher", p["teacher"], student[1], tasks, str(root / "t.parquet"), str(root / "ta.parquet"), **args
    )
    for flag in (True, False):
        write_parquet(_doctored(teacher, (0.95, 1.0), flag), root / f"teacher-{flag}.parquet")
    skipped = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "s1.parquet"),
        str(root / "a1.parquet"),
        teacher_summary_path=str(root / "teacher-True.parquet"),
        **args,
    )
    assert set(skipped["metric"]) == {"perplexity", "acc"}
    row = skipped.filter(pl.col("skipped_reason").is_not_null()).row(0, named=True)
    assert row["task"] == "kv_retrieval" and row["metric"] == "acc" and row["value"] is None
    assert row["skipped_reason"].startswith("the teacher keeps its answer on") and row["heads_kept"] == 2
    assert pl.read_parquet(root / "a1.parquet").is_empty()
    # a teacher that reads the context leaves the student's scoring as it is without the check
    kept = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "s2.parquet"),
        str(root / "a2.parquet"),
        teacher_summary_path=str(root / "teacher-False.parquet"),
        **args,
    )
    plain = score("tiny", "k2-n4", *student, tasks, str(root / "s3.parquet"), str(root / "a3.parquet"), **args)
    assert kept.equals(plain) and plain["skipped_reason"].is_null().all()
    assert skipped.filter(pl.col("metric") == "perplexity")["value"][0] == pytest.approx(
        plain.filter(pl.col("metric") == "perplexity")["value"][0]
    )
    swap = swap_layer(
        "tiny",
        "k0-n4",
        str(root / "k0"),
        p["ranking.parquet"],
        student[1],
        tasks,
        str(root / "sw.parquet"),
        str(root / "swa.parquet"),
        teacher_summary_path=str(root / "teacher-True.parquet"),
        **args,
    )
    assert swap["skipped_reason"].drop_nulls().to_list() == [row["skipped_reason"]]
    assert set(swap["swapped_layer"]) == {2}
    rows = _rows_of(root, student, tasks, "teacher-True")
    assert rows["task"].to_list() == ["kv_retrieval"] and rows["condition"].null_count() == 1
    assert rows["skipped_reason"][0].startswith("the teacher keeps its answer on")
    ran = _rows_of(root, student, tasks, "teacher-False")
    # the teacher passes; the tiny student is at chance itself, so only its unmodified row is scored
    assert ran["condition"].to_list() == ["unmodified"]
    assert (
        "masking answer rows has no shown ability to take away: the masked condition not run"
        in ran["skipped_reason"][0]
    )
    every = _rows_of(root, student, tasks, "teacher-True", chance=ChancePolicy(skip=False))
    assert every["condition"].to_list() == ["unmodified", "attention answer rows masked"]


def test_a_student_is_not_scored_where_its_teacher_is_at_chance(phase):
    root, p, tasks, args, student = _four_items(phase)
    teacher = score(
        "tiny", "teacher", p["teacher"], student[1], tasks, str(root / "t.parquet"), str(root / "ta.parquet"), **args
    )
    chance = chance_accuracy(load_task_tables(tasks, 4)["kv_retrieval"])
    for name, (low, high) in {"at": (chance - 0.1, chance + 0.1), "above": (chance + 0.05, 1.0)}.items():
        write_parquet(_doctored(teacher, (low, high), False), root / f"teacher-{name}.parquet")
    skipped = score(
        "tiny",
        "k2-n4",
        *student,
        tasks,
        str(root / "c1.parquet"),
        str(root / "c1a.parquet"),
        teacher_summary_path=str(root / "teacher-at.parquet"),
        **args,
    )
    row = skipped.filter(pl.col("skipped_reason").is_not_null()).row(0, named=True)
    assert row["task"] == "kv_retrieval" and row["value"] is None
    assert f"contains chance {chance:.1%}" in row["skipped_reason"]
    assert row["skipped_reason"].startswith("the teacher's accuracy is not distinguishable from chance at n=4")
    # with the policy off, or a teacher above chance, the scoring is as it is without a teacher
    plain = score("tiny", "k2-n4", *student, tasks, str(root / "c2.parquet"), str(root / "c2a.parquet"), **args)
    for summary, policy in (("at", ChancePolicy(skip=False)), ("above", ON)):
        kept = score(
            "tiny",
            "k2-n4",
            *student,
            tasks,
            str(root / "c3.parquet"),
            str(root / "c3a.parquet"),
            teacher_summary_path=str(root / f"teacher-{summary}.parquet"),
            chance=policy,
            **args,
        )
        assert kept.equals(plain)
    # degenerate and at chance: one row, the degeneracy's reason
    write_parquet(
        pl.read_parquet(root / "teacher-at.parquet").with_columns(pl.lit(True).alias("degenerate")),
        root / "teacher-both.parquet",
    )
    both = _rows_of(root, student, tasks, "teacher-both")
    assert len(both) == 1 and both["skipped_reason"][0].startswith("the teacher keeps its answer on")


def test_budget_curve_scores_each_checkpoint_and_ends_at_the_student(phase, caplog):
    root, p = phase
    student = ("tiny", "k2-n4", str(root / "k2"))

    def curve_of(out, **read):
        checkpoints, teacher = str(root / "kd2-checkpoints.safetensors"), str(root / "teacher.safetensors")
        kv = p["kv_retrieval.parquet"]
        return budget(*student, checkpoints, teacher, kv, str(root / out), dict_size=5, **SCORING, **read)

    def scores_of(name, **options):
        files = (str(root / "teacher.safetensors"), [p["kv_retrieval.parquet"]])
        return score(*student, *files, str(root / f"s{name}.parquet"), str(root / f"a{name}.parquet"), **options)

    curve = curve_of("budget.parquet")
    assert sorted(set(curve["kd_steps"])) == [0, 1, 2] and sorted(set(curve["kd_tokens"])) == [0, 64, 128]
    assert pl.read_parquet(root / "budget.parquet").equals(curve)
    # every KD checkpoint against the realigned student (step 0), item by item on the curve's items
    steps = pl.read_parquet(root / "budget.comparisons.parquet").filter(pl.col("group") == "all")
    acc = curve.filter((pl.col("metric") == "acc") & (pl.col("group") == "all")).sort("kd_steps")["value"].to_list()
    assert steps["condition"].to_list() == ["KD 1", "KD 2"] and set(steps["reference"]) == {"realigned"}
    assert steps["acc_reference"].to_list() == pytest.approx([acc[0]] * 2)
    assert steps["acc_condition"].to_list() == pytest.approx(acc[1:])
    assert set(steps["family"]) == {KD_VS_REALIGNED} and set(steps["variant"]) == {"k2-n4"}
    assert (
        steps["n"].to_list() == [len(pl.read_parquet(p["kv_retrieval.parquet"]).filter(pl.col("dict_size") == 5))] * 2
    )
    # hybrid_score at the one dictionary size (the state-size sweep's scoring) is the last point
    full = scores_of("", max_items=None, **SCORING, kv_dict_size=5)
    assert set(pl.read_parquet(root / "a.parquet")["group"]) == {"5"}
    with pytest.raises(ValueError, match="no KV-retrieval items of dictionary size 4"):
        scores_of("", max_items=None, **SCORING, kv_dict_size=4)
    chosen = read_spec(root / "k2")["chosen_step"]  # the student is the step selection chose
    assert curve.filter(pl.col("chosen"))["kd_steps"].unique().to_list() == [chosen]
    last = curve.filter(pl.col("kd_steps") == chosen).drop("kd_steps", "kd_tokens", "model", "chosen")
    assert last.sort("task", "group", "metric").equals(full.select(last.columns).sort("task", "group", "metric"))
    # scored on every size with its degeneracy check at the curve's size, the student's own
    # results give the last point: read, not scored again, and equal to scoring it
    scores_of("5", max_items=None, **SCORING, degeneracy_dict_size=5)
    answers = pl.read_parquet(root / "a5.parquet")
    assert answers.filter(pl.col("pred_other_context").is_not_null())["group"].to_list() == ["5", "5"]
    with caplog.at_level(logging.INFO, logger="gna.students.student_evaluation"):
        read = curve_of(
            "budget-read.parquet", summary_path=str(root / "s5.parquet"), answers_path=str(root / "a5.parquet")
        )
    assert f"after {chosen} KD steps: read from its scores" in caplog.text
    order = ["kd_steps", "task", "group", "metric"]
    assert read.select(sorted(curve.columns)).sort(order).equals(curve.select(sorted(curve.columns)).sort(order))
    # the chosen step's answers read from its scores compare as scoring it does
    assert pl.read_parquet(root / "budget-read.comparisons.parquet").equals(
        pl.read_parquet(root / "budget.comparisons.parquet")
    )
    # answers without the check on every item of that size are not read: the point is scored
    scores_of("0", max_items=None, degeneracy_items=0, evaluation=Evaluation(batch_size=2))
    kv = pl.read_parquet(p["kv_retrieval.parquet"])
    at = {size: kv.filter(pl.col("dict_size") == size) for size in (3, 5)}
    assert budget_point_from_scores(str(root / "s0.parquet"), str(root / "a0.parquet"), at[5]) is None
    assert budget_point_from_scores(str(root / "s5.parquet"), str(root / "a5.parquet"), at[3]) is None
    # nor answers on fewer items than the curve's (hybrid.eval_items cuts the tables)
    scores_of("1", max_items=3, **SCORING, degeneracy_dict_size=5)
    assert len(pl.read_parquet(root / "a1.parquet").filter(pl.col("group") == "5")) == 1
    assert budget_point_from_scores(str(root / "s1.parquet"), str(root / "a1.parquet"), at[5]) is None
    assert budget_point_from_scores(str(root / "s5.parquet"), str(root / "a5.parquet"), at[5]) is not None
    # step 0 is the aligned student, realigned as the phase's k = 2 student is (conftest)
    teacher = load_model(p["teacher"])[0]
    aligned = load_aligned(
        make_hybrid(teacher, [(2, 1), (0, 3)], 4),
        read_tensors(str(root / "align.safetensors"), None, device_of(teacher)),
    )
    hidden = read_tensors(str(root / "teacher.safetensors"), ["hidden"], device_of(teacher))["hidden"]
    realign_in_context(aligned, hidden, Realign(steps=2, batch=2, lr=1e-2), seed=1, progress=False)
    first = checkpoint_states(read_tensors(str(root / "kd2-checkpoints.safetensors")))[0]  # on the CPU
    for key, value in snapshot(aligned).items():
        assert torch.equal(first[key], value.cpu())


def test_facts_are_compared_with_the_teacher_at_every_stage_of_training(phase, tiny_llama):
    """The budget curve's knowledge table: the facts scored after alignment (the aligned heads
    loaded into the student), after realignment (KD step 0) and at each checkpoint, each stage
    compared item by item with the teacher's answers and with the stage before; the aligned stage
    scores as a student built from the aligned file alone does, and without facts the table is
    empty."""
    from gna.students.spec import ALIGNED_STAGE, STAGE_BY_STAGE, THROUGH_TRAINING
    from gna.tasks.facts import FactSelection, build_facts, read_local_facts

    root, p = phase
    model, tok = tiny_llama
    cloze = build_facts(
        read_local_facts(MINI_MMLU.parent / "mini_facts.csv"), FactSelection(("capital", "symbol"), 6, seed=1), "cloze"
    )
    write_parquet(cloze, root / "facts_cloze.parquet")
    teacher_items = score_table(Scorer(model, tok, progress=False), cloze).with_columns(
        pl.lit("teacher").alias("variant")
    )
    write_parquet(teacher_items, root / "teacher-answers.parquet")
    files = (str(root / "kd2-checkpoints.safetensors"), str(root / "teacher.safetensors"), p["kv_retrieval.parquet"])
    budget(
        "tiny",
        "k2-n4",
        str(root / "k2"),
        *files,
        str(root / "kb.parquet"),
        dict_size=5,
        **SCORING,
        aligned=str(root / "align.safetensors"),
        facts=[str(root / "facts_cloze.parquet")],
        teacher_answers=[str(root / "teacher-answers.parquet")],
    )
    knowledge = pl.read_parquet(root / "kb-training-facts.comparisons.parquet").filter(pl.col("group") == "all")
    stages = [ALIGNED_STAGE, "realigned", "KD 1", "KD 2"]
    vs_teacher = knowledge.filter(pl.col("family") == THROUGH_TRAINING)
    assert vs_teacher["condition"].to_list() == stages and set(vs_teacher["reference"]) == {"teacher"}
    assert vs_teacher["n"].to_list() == [len(cloze)] * 4 and set(knowledge["variant"]) == {"k2-n4"}
    steps = knowledge.filter(pl.col("family") == STAGE_BY_STAGE)
    assert list(zip(steps["reference"], steps["condition"])) == list(zip(stages, stages[1:]))
    # the aligned stage is the student built from the aligned heads, before realignment and KD
    aligned_model, _ = load_any(str(root / "k2"))
    load_aligned(aligned_model, read_tensors(str(root / "align.safetensors"), None, "cpu"))
    direct = score_table(Scorer(aligned_model, tok, progress=False), cloze)
    assert vs_teacher["acc_condition"][0] == pytest.approx(float(direct["correct"].mean()))
    assert vs_teacher["acc_reference"][0] == pytest.approx(float(teacher_items["correct"].mean()))
    budget("tiny", "k2-n4", str(root / "k2"), *files, str(root / "kc.parquet"), dict_size=5, **SCORING)
    assert pl.read_parquet(root / "kc-training-facts.comparisons.parquet").is_empty()
