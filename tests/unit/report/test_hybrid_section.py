"""The students' summary sentences: what they claim follows the intervals."""

import polars as pl

from gna.core.paired import comparisons
from gna.report.hybrid_section import answer_rows_part, heads_kept_summary, state_size_part
from gna.report.student_budget import budget_goal, knowledge_part
from gna.report.student_recipe import ablation_part
from gna.report.student_swap import swap_verdict


def kv10(value, low, high, n=50, **extra) -> dict:
    return {
        "task": "kv_retrieval",
        "group": "10",
        "metric": "acc",
        "n": n,
        "value": value,
        "ci_low": low,
        "ci_high": high,
        **extra,
    }


def ppl(value, **extra) -> dict:
    return {"task": "heldout", "group": "all", "metric": "perplexity", "value": value, **extra}


TEACHER = pl.DataFrame([kv10(1.0, 0.93, 1.0), ppl(16.0)])


def students(k10: tuple, k20: tuple) -> pl.DataFrame:
    return pl.DataFrame(
        [
            kv10(0.04, 0.01, 0.13, heads_kept=0, variant="k0-n16"),
            kv10(*k10, heads_kept=10, variant="k10-n16"),
            kv10(*k20, heads_kept=20, variant="k20-n16"),
            ppl(32.0, heads_kept=0),
            ppl(24.0, heads_kept=10),
            ppl(20.0, heads_kept=20),
        ]
    )


def compared(family: str, reference: str, condition: str, lost: int, gained: int, both: int, neither: int):
    """A comparisons table of one pair on KV retrieval with these counts."""
    ref = [True] * lost + [False] * gained + [True] * both + [False] * neither
    cond = [False] * lost + [True] * gained + [True] * both + [False] * neither
    frame = lambda outcomes: pl.DataFrame(  # noqa: E731
        {"task": "kv_retrieval", "item_id": range(len(outcomes)), "group": "all", "correct": outcomes}
    )
    return comparisons({reference: frame(ref), condition: frame(cond)}, [(family, reference, condition)])


def test_summary_names_the_goal_student_and_what_the_paired_test_shows():
    rises = compared("hybrids vs pure SSM", "k0-n16", "k10-n16", 1, 180, 8, 11)
    text = heads_kept_summary(TEACHER, students((0.96, 0.87, 0.99), (0.5, 0.36, 0.64)), rises, 0.05)
    assert "k = 10 96.0% [87–99] (96% of the teacher's)" in text
    assert "k = 10 against the pure SSM, item by item over all sizes: <b>rises</b>: +89.5 points" in text
    assert "k = 0 32.0 (2.00×), k = 10 24.0 (1.50×)" in text
    few = compared("hybrids vs pure SSM", "k0-n16", "k10-n16", 1, 3, 2, 4)
    assert "not decided at n = 10" in heads_kept_summary(
        TEACHER, students((0.1, 0.04, 0.21), (0.5, 0.36, 0.64)), few, 0.05
    )


def test_budget_goal_is_shown_by_the_interval_read_from_the_largest_budget_down():
    rows = [
        kv10(v, lo, hi, variant="k10-n16", heads_kept=10, kd_tokens=t, degenerate=False)
        for v, lo, hi, t in ((0.5, 0.36, 0.64, 0), (0.85, 0.73, 0.93, 1000), (0.95, 0.87, 0.99, 2000))
    ]
    budget = pl.DataFrame(rows)
    # 85% [73-93] at 1,000 tokens passes 80% on its point only; 95% [87-99] at 2,000 shows it
    assert "k10-n16 is shown to reach 80% of the teacher's KV accuracy at 10 keys (80%) from 2,000" in budget_goal(
        budget, TEACHER, 10
    )
    point = budget.filter(pl.col("kd_tokens") <= 1000)
    text = budget_goal(point, TEACHER, 10)
    assert "k10-n16's point estimate passes 80% of the teacher's KV accuracy at 10 keys (80%) after 1,000" in text
    assert "no budget's interval shows it" in text
    # a fixed sequence: an early budget that shows it does not count past a later one that does not
    dip = pl.DataFrame([rows[0], {**rows[2], "kd_tokens": 1000}, {**rows[1], "kd_tokens": 2000}])
    assert "is shown to reach" not in budget_goal(dip, TEACHER, 10)
    short = budget.filter(pl.col("kd_tokens") == 0)
    assert "k10-n16 does not reach 80%" in budget_goal(short, TEACHER, 10)
    degenerate = budget.with_columns(pl.lit(True).alias("degenerate"))
    assert "every point of its curve is degenerate" in budget_goal(degenerate, TEACHER, 10)


def test_ablations_at_a_budget_are_compared_with_the_recipe_at_that_budget():
    """With ablation.kd_steps the 'full recipe' row is the budget curve's checkpoint at those
    steps (not the fully trained student), and the title says the budget."""
    hy = {"ablation": {"variant": "k10-n16", "kd_steps": 14}, "dict_size": 10}
    common = {"model": "m", "variant": "k10-n16", "degenerate": False}
    scores = pl.DataFrame([kv10(0.96, 0.87, 0.99, **common)])
    budget = pl.DataFrame(
        [
            kv10(v, v - 0.1, v + 0.05, kd_steps=s, kd_tokens=s * 1000, **common)
            for v, s in ((0.46, 0), (0.88, 14), (0.96, 42))
        ]
    )
    ablation = pl.DataFrame([kv10(0.6, 0.45, 0.73, description="without layer alignment", **common)])
    page = ablation_part("m", scores, budget, ablation, hy, pl.DataFrame())
    assert "14 distillation steps, 14,000 tokens" in page
    assert "88.0%" in page and "96.0%" not in page and "60.0%" in page and "46.0%" in page
    untrained_budget = ablation_part(
        "m", scores, budget, ablation, {**hy, "ablation": {"variant": "k10-n16", "kd_steps": None}}, pl.DataFrame()
    )
    assert "96.0%" in untrained_budget and "all distillation steps" in untrained_budget


def test_a_full_recipe_chosen_before_kds_last_step_is_noted_beside_the_ablations():
    """Checkpoint selection can make the student its realigned, un-distilled checkpoint: the
    table says so (only then), and that the ablations choose theirs by the same rule."""
    hy = {"ablation": {"variant": "k10-n16", "kd_steps": None}, "dict_size": 10}
    common = {"model": "m", "variant": "k10-n16", "degenerate": False}
    scores = pl.DataFrame([kv10(0.92, 0.81, 0.97, **common)])
    ablation = pl.DataFrame([kv10(0.6, 0.45, 0.73, description="without answer weighting", **common)])

    def points(chosen: int) -> pl.DataFrame:
        return pl.DataFrame(
            {"after_steps": [0, 7, 14], "accuracy": [0.92, 0.64, 0.54], "chosen": [s == chosen for s in (0, 7, 14)]}
        ).with_columns(pl.lit("m").alias("model"), pl.lit(10).alias("heads_kept"), pl.lit(16).alias("state_size"))

    early = ablation_part("m", scores, pl.DataFrame(), ablation, hy, points(0))
    assert "checkpoint after 0 of 14 distillation steps" in early
    assert "by the same rule" in early
    assert "by the same rule" not in ablation_part("m", scores, pl.DataFrame(), ablation, hy, points(14))
    other = points(0).with_columns(pl.lit(20).alias("heads_kept"))  # another student's selection
    assert "checkpoint after" not in ablation_part("m", scores, pl.DataFrame(), ablation, hy, other)


def kv_all(value, low, high, n=200) -> dict:
    return {
        "task": "kv_retrieval",
        "group": "all",
        "metric": "acc",
        "n": n,
        "value": value,
        "ci_low": low,
        "ci_high": high,
    }


def test_swap_verdict_says_plainly_whether_it_contradicts_the_study():
    family = "layer swap vs pure SSM"
    same = swap_verdict(compared(family, "k0-n16", "swap", 1, 0, 15, 184).row(0, named=True), 0.05)
    assert "<b>holds within ±5 points</b>" in same and "no recovery, which <b>contradicts the study</b>" in same
    better = swap_verdict(compared(family, "k0-n16", "swap", 2, 80, 14, 104).row(0, named=True), 0.05)
    assert "<b>rises</b>" in better and "as in the study" in better
    unsure = swap_verdict(compared(family, "k0-n16", "swap", 3, 7, 5, 5).row(0, named=True), 0.05)
    assert "this n cannot say whether it recovers here" in unsure
    assert swap_verdict(None, 0.05) == ""


def test_state_size_table_shows_the_one_dictionary_size_every_student_is_scored_at():
    kv = {"task": "kv_retrieval", "metric": "acc", "n": 50, "ci_low": 0.0, "ci_high": 0.2}
    rows = [kv | {"group": "10", "value": 0.1, "state_size": n} for n in (4, 16, 64)]
    rows += [
        kv | {"group": "40", "value": 0.05, "state_size": 16},
        kv | {"group": "all", "value": 0.08, "state_size": 16},
    ]
    rows += [ppl(30.0 - n / 8, state_size=n) for n in (4, 16, 64)]
    scores = pl.DataFrame([r | {"heads_kept": 0} for r in rows])
    html_text = state_size_part("m", scores, {"state_sweep_heads_kept": [0], "dict_size": 10})
    assert "KV-retrieval at 10 keys" in html_text and "KV 10" in html_text
    assert "KV 40" not in html_text and "KV all" not in html_text


def test_answer_rows_lists_tasks_not_run_with_their_reason():
    ran = [
        {
            "model": "m",
            "variant": "k10-n16",
            "attention_heads": 10,
            "task": "kv_retrieval",
            "condition": c,
            "acc": a,
            "n": 100,
            "ci_low": a - 0.05,
            "ci_high": a + 0.05,
        }
        for c, a in (("unmodified", 0.98), ("attention answer rows masked", 0.07))
    ]
    skipped = {
        "model": "m",
        "variant": "k10-n16",
        "task": "mmlu_cloze",
        "condition": None,
        "skipped_reason": "the teacher keeps its answer on 80% of 50 items",
    }
    text = answer_rows_part(pl.DataFrame(ran + [skipped], infer_schema_length=None))
    assert "attention answer rows masked" in text and "Not run" in text
    assert "the teacher keeps its answer on 80% of 50 items" in text


def test_tasks_the_students_were_not_scored_on_are_named_with_the_reason():
    from gna.report.knowledge_section import _acc
    from gna.report.student_tables import accuracy_rows, kv_at, not_scored_note

    # a student's table: KV scored, MMLU letter kept off by the teacher (one row, no value, the reason)
    reason = "the teacher keeps its answer on 100% of 50 items"
    rows = pl.DataFrame(
        {
            "task": ["kv_retrieval", "mmlu_letter", "heldout"],
            "group": ["all", "all", "all"],
            "n": [50, None, 100],
            "metric": ["acc", "acc", "perplexity"],
            "value": [0.9, None, 12.0],
            "ci_low": [0.8, None, None],
            "ci_high": [0.95, None, None],
            "skipped_reason": [None, reason, None],
        }
    )
    note = not_scored_note(rows)
    assert note.count("<li>") == 1 and f"MMLU letter (retrieval-heavy): {reason}" in note
    assert not_scored_note(rows.filter(pl.col("skipped_reason").is_null())) == ""
    assert not_scored_note(rows.drop("skipped_reason")) == ""
    # tables, figures and the knowledge view read only what was scored
    assert accuracy_rows(rows)["task"].to_list() == ["kv_retrieval"]
    assert _acc(rows, "mmlu_letter", "all") is None and _acc(rows, "kv_retrieval", "all")["value"] == 0.9
    assert len(kv_at(rows, None)) == 1 and kv_at(rows.filter(pl.col("task") != "kv_retrieval"), None).is_empty()


def test_the_selection_note_prints_the_holm_corrected_p_the_selection_decided_on():
    """The best point's p against the last in the students' table is the selection's own Holm-corrected
    one (not its raw one-sided p): points after 0, 7 and 14 steps on 40 prompts."""
    from gna.report.student_training import _p_best
    from gna.students.kd import Selection

    selection = Selection(score=lambda student: ([], 0.0), every=7)
    answers = {0: [True] * 30 + [False] * 10, 7: [True] * 27 + [False] * 13, 14: [True] * 22 + [False] * 18}
    for step, correct in answers.items():
        selection.rows.append({"after_steps": step, "accuracy": sum(correct) / 40, "mean_logp": -1.0})
        selection.correct[step] = correct
    selection.finish(14)
    points = pl.DataFrame(selection.rows)
    best = points.filter(pl.col("after_steps") == 0).row(0, named=True)
    assert best["p_holm_vs_last"] > best["p_vs_last"]  # two candidates: the correction matters
    assert _p_best(points) == f"{best['p_holm_vs_last']:.2g}" != f"{best['p_vs_last']:.2g}"


def _facts(correct: list[bool]) -> pl.DataFrame:
    return pl.DataFrame(
        {"task": "facts_cloze", "item_id": list(range(len(correct))), "group": "capital", "correct": correct}
    )


def test_facts_through_training_names_the_stage_that_loses_them():
    """knowledge_part: the stage-by-stage comparison that falls is named with its counts, and the
    first stage below the teacher; a student whose stages never differ reads 'not shown'."""
    from gna.students.spec import STAGE_BY_STAGE, THROUGH_TRAINING

    n = 200
    teacher = _facts([True] * 180 + [False] * 20)
    aligned = teacher  # alignment keeps every fact
    realigned = teacher
    kd = _facts([True] * 150 + [False] * 50)  # KD loses 30 facts, gains none
    per_item = {"teacher": teacher, "aligned": aligned, "realigned": realigned, "KD 7": kd}
    stages = ["aligned", "realigned", "KD 7"]
    pairs = [(THROUGH_TRAINING, "teacher", s) for s in stages]
    pairs += [(STAGE_BY_STAGE, a, b) for a, b in zip(stages, stages[1:])]
    frame = comparisons(per_item, pairs).with_columns(pl.lit("k10-n16").alias("variant"), pl.lit("m").alias("model"))
    page = knowledge_part("m", frame, 0.05)
    assert "realigned → KD 7 (30 lost / 0 gained" in page.replace("&gt;", ">").replace("→", "→")
    assert "below the teacher's from <i>KD 7</i> on (75.0% against 90.0%, n = 200)" in page
    assert "the teacher: 90.0%" in page and page.count("<tr>") >= 4
    steady = comparisons({"teacher": teacher, **{s: teacher for s in stages}}, pairs).with_columns(
        pl.lit("k0-n16").alias("variant"), pl.lit("m").alias("model")
    )
    assert "not shown to fall between any two stages" in knowledge_part("m", steady, 0.05)
    assert n == len(teacher) and knowledge_part("other", frame, 0.05) == ""


def test_kd_effect_reads_the_chosen_checkpoint_against_the_realigned_student():
    """kd_effect: the sentence is the chosen step's paired row (its counts, Holm p and verb); a
    student that kept step 0 gets the checkpoints' verbs against it instead."""
    from gna.report.student_budget import kd_effect
    from gna.students.spec import KD_VS_REALIGNED

    def kv(correct):
        return pl.DataFrame({"task": "kv_retrieval", "item_id": list(range(50)), "group": "10", "correct": correct})

    realigned = kv([True] * 30 + [False] * 20)
    per_item = {"realigned": realigned, "KD 7": kv([True] * 45 + [False] * 5), "KD 14": kv([True] * 30 + [False] * 20)}
    pairs = [(KD_VS_REALIGNED, "realigned", s) for s in ("KD 7", "KD 14")]
    steps = comparisons(per_item, pairs).with_columns(pl.lit("k10-n16").alias("variant"), pl.lit("m").alias("model"))
    budget = pl.DataFrame(
        {"variant": ["k10-n16"] * 3, "model": "m", "kd_steps": [0, 7, 14], "chosen": [False, True, False]}
    )
    page = kd_effect("m", steps, budget, 10, 0.05)
    assert "the chosen checkpoint (KD step 7) against the realigned student, 60.0% → 90.0%: <b>rises</b>" in page
    assert "+30.0 points" in page and "0 lost and 15 gained of 50 items" in page
    kept = budget.with_columns((pl.col("kd_steps") == 0).alias("chosen"))
    page = kd_effect("m", steps, kept, 10, 0.05)
    assert "kept the realigned student (KD step 0)" in page and "KD 7 rises" in page and "KD 14 " in page
    assert kd_effect("m", steps.clear(), budget, 10, 0.05) == "" and kd_effect("other", steps, budget, 10, 0.05) == ""
