"""The knowledge-vs-retrieval view: its sentences follow the paired tests of the comparisons
tables, its table the results."""

import re

import polars as pl
import pytest

from gna.core.paired import comparisons
from gna.core.stats import wilson_interval
from gna.report.htmlkit import ReportOptions, SectionContext
from gna.report.knowledge_section import findings, view_table


def acc_rows(task: str, values: dict[str, tuple[int, int]]) -> pl.DataFrame:
    """Tidy acc rows of `task`: {group: (correct, n)} with their Wilson intervals."""
    rows = []
    for group, (correct, n) in values.items():
        low, high = wilson_interval(correct, n)
        rows.append(
            {
                "task": task,
                "group": group,
                "metric": "acc",
                "n": n,
                "value": correct / n,
                "ci_low": low,
                "ci_high": high,
            }
        )
    return pl.DataFrame(rows)


def condition(kv: int, cloze: int, choice: int, known: int) -> pl.DataFrame:
    return pl.concat(
        [
            acc_rows("kv_retrieval", {"all": (kv, 200), "10": (kv // 4, 50)}),
            acc_rows("facts_cloze", {"all": (cloze, 240), "capital": (cloze // 4, 60)}),
            acc_rows("facts_choice", {"all": (choice, 240), "known": (known, 185), "unknown": (choice - known, 55)}),
        ]
    )


def items(task: str, outcomes: list[bool], groups: list[str] | None = None) -> pl.DataFrame:
    """A per-item frame of `task`: item i correct where outcomes[i]."""
    return pl.DataFrame(
        {"task": task, "item_id": range(len(outcomes)), "group": groups or ["all"] * len(outcomes), "correct": outcomes}
    )


def paired(task: str, lost: int, gained: int, both: int, neither: int, groups=None):
    """(reference, condition) per-item frames of `task` with these counts."""
    ref = [True] * lost + [False] * gained + [True] * both + [False] * neither
    cond = [False] * lost + [True] * gained + [True] * both + [False] * neither
    return items(task, ref, groups), items(task, cond, groups)


def context(tmp_path, topk: dict | None = None, students: dict | None = None) -> SectionContext:
    """A report context whose comparisons tables hold `topk` {task: (lost, gained, both, neither)}
    (top 5 against the unmodified model) and `students` {(family, reference, condition): same}."""
    inputs = {}
    for key, spec in (("heads_topk_comparisons", topk), ("hybrid_comparisons", students)):
        if not spec:
            continue
        frames = []
        for (family, ref_label, cond_label), counts in spec.items():
            per_task = {task: paired(task, *c) for task, c in counts.items()}
            ref = pl.concat([r for r, _ in per_task.values()])
            cond = pl.concat([c for _, c in per_task.values()])
            frames.append(comparisons({ref_label: ref, cond_label: cond}, [(family, ref_label, cond_label)]))
        path = tmp_path / f"{key}.parquet"
        pl.concat(frames).with_columns(pl.lit("m").alias("model")).write_parquet(path)
        inputs[key] = [str(path)]
    config = {"hybrid": {"enabled": True, "heads_kept": [0, 10], "state_size": 16}}
    return SectionContext(inputs=inputs, figures={}, captions={}, options=ReportOptions(), config=config)


TOP5 = ("top k vs unmodified", "unmodified", "top 5")


def test_a_fall_the_intervals_overlap_on_is_a_fall(tmp_path):
    # 81/240 -> 60/240 on the same items, 21 lost and none gained: the Wilson intervals overlap
    # ([28-40] and [20-31]); the paired test shows the fall
    ctx = context(tmp_path, topk={TOP5: {"facts_choice": (21, 0, 60, 159)}})
    (sentence,) = findings("m", ctx)
    assert sentence.startswith("facts choice: 33.8% → 25.0% on the same 240 items")
    assert "<b>falls</b>: -8.8 points" in sentence and "as the study reports" in sentence


def test_no_change_is_claimed_only_within_the_margin(tmp_path):
    ctx = context(
        tmp_path,
        topk={
            TOP5: {
                "kv_retrieval": (150, 0, 48, 2),  # 99% -> 24%
                "facts_cloze": (1, 1, 200, 38),  # the same items right but two: within +-5 points
                "facts_choice": (25, 15, 58, 142),  # four points down, 40 items changing: not decided
            }
        },
    )
    kv, cloze, choice = findings("m", ctx)
    assert "<b>falls</b>" in kv and "as the study reports" in kv
    assert "<b>holds within ±5 points</b>" in cloze and "as the study reports" in cloze
    assert "not decided at n = 240" in choice and "about n = " in choice
    assert "the study reports that it falls; this n cannot decide it" in choice


def test_a_loss_of_knowledge_contradicts_the_study(tmp_path):
    ctx = context(tmp_path, topk={TOP5: {"facts_cloze": (50, 0, 150, 40)}})  # 83% -> 62%
    (cloze,) = findings("m", ctx)
    assert "<b>falls</b>" in cloze and "<b>contradicts the study</b>, which reports that it stays" in cloze


def test_the_students_are_judged_on_their_own_comparisons(tmp_path):
    ctx = context(
        tmp_path,
        students={
            ("students vs teacher", "teacher", "k0-n16"): {"kv_retrieval": (180, 2, 15, 3)},
            ("hybrids vs pure SSM", "k0-n16", "k10-n16"): {"kv_retrieval": (1, 175, 16, 8)},
        },
    )
    ssm, hybrid = findings("m", ctx)
    assert "pure SSM student" in ssm and "<b>falls</b>" in ssm
    assert "replaced by k10-n16" in hybrid and "<b>rises</b>" in hybrid and "as the study reports" in hybrid


def test_the_view_table_shows_each_condition_with_its_interval():
    conds = [("unmodified", condition(198, 200, 83, 73)), ("top 5 heads removed", condition(50, 202, 40, 35))]
    table = view_table(conds)
    assert table.columns == [
        "condition",
        "KV retrieval",
        "facts cloze (knowledge)",
        "facts choice",
        "facts choice, known items",
    ]
    assert table.row(0) == (
        "unmodified",
        "99.0% [96–100] n=200",
        "83.3% [78–88] n=240",
        "34.6% [29–41] n=240",
        "39.5% [33–47] n=185",
    )


def formats_frame(rows: list[tuple]) -> pl.DataFrame:
    """A facts_formats table of (split, form, answer, draw, correct, circular correct, chosen[, (facts
    only the chosen form passes, facts only this form passes)]) rows, n = 80."""
    out = []
    for split, form, answer, draw, correct, circular, chosen, *paired in rows:
        chosen_only, form_only = paired[0] if paired else (None, None)
        low, high = wilson_interval(correct, 80)
        c_low, c_high = wilson_interval(circular, 80) if circular is not None else (None, None)
        out.append(
            {
                "model": "m",
                "split": split,
                "form": form,
                "answer": answer,
                "shots": 1,
                "draw": draw,
                "note": None,
                "n": 80,
                "acc": correct / 80,
                "ci_low": low,
                "ci_high": high,
                "chance": 0.25,
                "circular_acc": None if circular is None else circular / 80,
                "circular_ci_low": c_low,
                "circular_ci_high": c_high,
                "distinct_predictions": 1 if correct == 20 else 4,
                "largest_share": 1.0 if correct == 20 else 0.3,
                "repeats_example": None,
                "prompt_tokens": 40.0,
                "chosen": chosen,
                "circular_chosen_only": chosen_only,
                "circular_form_only": form_only,
            }
        )
    return pl.DataFrame(out)


def test_the_format_comparison_says_when_no_letter_form_is_above_chance_and_whether_the_chosen_form_trails():
    from gna.report.knowledge_section import formats_part

    def formats(letter: int, letter_circular: int, chosen_circular: int, paired=(0, 0)) -> pl.DataFrame:
        return formats_frame(
            [
                ("dev", "cloze", None, 0, 70, None, False),
                ("dev", "letter, 3 shots, A.", "letter", 0, letter, letter_circular, False, paired),
                ("dev", "letter, 0 shots, A.", "letter", 0, 20, None, False),
                ("dev", "text, 1 shot, A.", "text", 0, 40, chosen_circular, True),
                ("eval", "text, 1 shot, A.", "text", 0, 27, 10, True),
                ("eval", "text, 1 shot, A.", "text", 1, 23, None, True),
                ("eval", "text, 1 shot, A.", "text", 2, 25, None, True),
            ]
        )

    page = formats_part(formats(letter=22, letter_circular=0, chosen_circular=25))
    assert "No letter form is above chance on this model" in page and "one answer for every item" in page
    assert "33.8%, 28.7%, 31.2% over 3 draws" in page and "spread 5.0 points" in page
    assert "2 of 3 multiple-choice forms are above chance" not in page  # 20/80 and 22/80 are not
    assert "1 of 3 multiple-choice forms are above chance" in page and "1 of those also pass the circular check" in page
    answered = formats_part(formats(letter=60, letter_circular=45, chosen_circular=25, paired=(0, 20)))
    assert "The letter format (MMLU's answer, the study's form) is answered" in answered
    assert "<b>the configured form trails it</b>" in answered
    close = formats_part(formats(letter=60, letter_circular=28, chosen_circular=25, paired=(5, 8)))
    assert "cannot be told apart at this n" in close and "passes 8 the configured form fails and fails 5" in close


def test_the_format_check_pairs_the_forms_on_the_same_facts_not_by_overlapping_intervals():
    """40/80 against 25/80 under the circular check: the Wilson intervals overlap ([39–61] and
    [22–42]), yet on the same facts the best form passes 16 the chosen one fails and fails 1 it
    passes (exact McNemar p = 0.00027): the chosen form trails. Holm runs over the forms compared
    with it (the best is a maximum over them)."""
    from gna.report.knowledge_section import formats_part

    def page(others: int) -> str:
        rows = [
            ("dev", "letter, 3 shots, A.", "letter", 0, 60, 40, False, (1, 16)),
            ("dev", "text, 1 shot, A.", "text", 0, 40, 25, True),
        ] + [("dev", f"letter, {i} shots, (A)", "letter", 0, 45, 25, False, (3, 3)) for i in range(others)]
        return formats_part(formats_frame(rows))

    assert wilson_interval(40, 80)[0] < wilson_interval(25, 80)[1]  # the intervals overlap
    one = page(0)
    assert "<b>the configured form trails it</b>" in one and "exact McNemar p = 0.00027" in one
    assert "the best the paired test shows better is letter, 3 shots, A." in one
    # the same best among 61 compared forms: Holm multiplies its p by 61 (0.017), still below 5%
    assert "Holm over the 61 forms compared 0.017" in page(60) and "trails it" in page(60)
    # the form with the most circular passes is not shown better, another one is: the chosen trails that one
    rows = [
        ("dev", "letter, 5 shots, A.", "letter", 0, 60, 42, False, (10, 17)),
        ("dev", "letter, 3 shots, A.", "letter", 0, 60, 40, False, (1, 16)),
        ("dev", "text, 1 shot, A.", "text", 0, 40, 25, True),
    ]
    text = formats_part(formats_frame(rows))
    assert "the best the paired test shows better is letter, 3 shots, A." in text and "trails it" in text


def test_a_config_without_facts_still_writes_the_figure(tmp_path):
    """The figure is an output of the report rule whatever the config (a run without the facts
    failed on it as a missing output)."""
    from gna.report.htmlkit import ReportOptions, SectionContext
    from gna.report.knowledge_section import render_knowledge

    figure = tmp_path / "knowledge_view.png"
    ctx = SectionContext(
        inputs={},
        figures={"knowledge_view": str(figure)},
        captions={"knowledge_view": ""},
        options=ReportOptions(),
        config={"tasks": {"facts": {"formats": []}}},
    )
    assert render_knowledge(ctx) == ""
    assert figure.read_bytes().startswith(b"\x89PNG")


def test_the_power_table_says_what_each_comparisons_table_can_detect(tmp_path):
    from gna.report.knowledge_section import power_part

    ctx = context(
        tmp_path,
        topk={TOP5: {"facts_choice": (21, 0, 60, 159), "kv_retrieval": (3, 2, 5, 0)}},
        students={("students vs teacher", "teacher", "k0-n16"): {"kv_retrieval": (150, 2, 40, 8)}},
    )
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in power_part(ctx).split("<tr>")[2:]]
    # of the two top-k rows only the 240-item one can show a 10-point fall; the students' row
    # has 152 of 200 items changing, so even 200 items detect only about 18 points (exact power)
    assert cells[0][:3] == ["remove top-k / random-k", "2", "10–240"] and cells[0][4] == "50.0%"
    assert cells[1] == ["students", "1", "200", "±18 points", "0.0%"]
    assert power_part(SectionContext({}, {}, {}, ReportOptions(), {})) == ""  # no comparisons: no table


def test_answers_are_counted_by_position_and_by_the_solved_examples_answer():
    from gna.report.knowledge_section import ONE_POSITION, answer_rows

    tasks = pl.DataFrame(
        {
            "task": ["facts_choice"] * 4,
            "item_id": [0, 1, 2, 3],
            "relation": ["capital", "capital", "symbol", "symbol"],
            "copyable": [False, False, True, False],
            "choices": [[" x", " y", " z", " w"]] * 4,
            "solved_answers": [["x"], ["y"], ["y"], ["y"]],
        }
    )
    items = pl.DataFrame(
        {
            "model": "m",
            "task": "facts_choice",
            "item_id": [0, 1, 2, 3],
            "pred": [0, 0, 0, 1],
            "target": [0, 1, 2, 1],
            "correct": [True, False, False, True],
        }
    )
    rows = {r["relation"]: r for r in answer_rows(tasks, items).iter_rows(named=True)}
    assert rows["all"]["answer A"] == 0.75 and rows["all"]["largest share"] == 0.75 > ONE_POSITION
    assert rows["all"]["correct there"] == 0.25  # A holds the answer of one item in four
    assert rows["capital"]["repeats an example"] == 0.5  # item 0 answered x, its example's answer
    assert rows["symbol"]["repeats an example"] == 0.5 and rows["symbol"]["value"] == 0.5
    assert rows["not copyable"]["n"] == 3 and rows["not copyable"]["value"] == pytest.approx(2 / 3)


def test_a_model_without_students_beside_one_with_them_has_no_swap_row(tmp_path):
    """The default study: SmolLM2 with students and a layer swap, the knowledge model with none
    (skip: [hybrid]); the view of the latter read the other's empty swap rows and failed."""
    from gna.report.knowledge_section import conditions

    scores = condition(180, 200, 190, 170).with_columns(
        pl.lit("small").alias("model"), pl.lit("k0-n16").alias("variant")
    )
    swap = scores.with_columns(pl.lit("k0-n16 + attention layer 3").alias("variant"))
    inputs = {}
    for key, frame in (("hybrid_scores", scores), ("hybrid_swap", swap)):
        frame.write_parquet(tmp_path / f"{key}.parquet")
        inputs[key] = [str(tmp_path / f"{key}.parquet")]
    config = {"hybrid": {"enabled": True, "heads_kept": [0, 10], "state_size": 16}}
    ctx = SectionContext(inputs=inputs, figures={}, captions={}, options=ReportOptions(), config=config)
    assert [label for label, _ in conditions("small", ctx)] == [
        "student k0-n16 (pure SSM)",
        "k0-n16 + attention layer 3",
    ]
    assert conditions("big", ctx) == []
