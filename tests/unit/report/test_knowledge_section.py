"""The knowledge-vs-retrieval view: its sentences follow the 95% intervals, its table the results."""

import polars as pl

from gna.core.stats import wilson_interval
from gna.report.knowledge_section import change_sentence, findings, view_table


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


def test_a_change_is_a_finding_only_where_the_intervals_separate():
    before = {"value": 0.98, "ci_low": 0.95, "ci_high": 0.99}
    assert "falls" in change_sentence("KV", before, {"value": 0.2, "ci_low": 0.15, "ci_high": 0.27}, "x")
    assert "a finding" in change_sentence("KV", before, {"value": 0.2, "ci_low": 0.15, "ci_high": 0.27}, "x")
    overlap = change_sentence("KV", before, {"value": 0.93, "ci_low": 0.89, "ci_high": 0.96}, "x")
    assert "no change the intervals can show" in overlap and "-5 points" in overlap
    assert "rises" in change_sentence("KV", {"value": 0.1, "ci_low": 0.05, "ci_high": 0.2}, before, "x")
    assert change_sentence("KV", None, before, "x") is None


def test_view_and_findings_compare_each_condition_with_its_reference():
    conds = [
        ("unmodified", condition(198, 200, 83, 73)),
        ("top 5 heads removed", condition(50, 202, 40, 35)),
        ("student k0-n16 (pure SSM)", condition(12, 110, 66, 60)),
        ("student k10-n16", condition(196, 105, 70, 61)),
    ]
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
    sentences = findings(conds)
    kv_top = next(s for s in sentences if s.startswith("KV retrieval") and "top 5" in s)
    assert "falls" in kv_top and "a finding" in kv_top
    cloze_top = next(s for s in sentences if s.startswith("facts cloze") and "top 5" in s)
    assert "no change" in cloze_top
    choice_top = next(s for s in sentences if s.startswith("facts choice:") and "top 5" in s)
    assert "falls" in choice_top  # 34.6% [29–41] -> 16.7% [13–22]
    overlapping = findings([conds[0], ("top 5 heads removed", condition(50, 202, 62, 55))])
    assert "no change" in next(
        s for s in overlapping if s.startswith("facts choice:")
    )  # 34.6% [29–41] -> 25.8% [21–32]
    kv_students = next(s for s in sentences if s.startswith("KV retrieval") and "k10-n16" in s)
    assert "rises" in kv_students


def test_the_pure_ssm_is_compared_with_its_teacher():
    conds = [("unmodified", condition(198, 200, 83, 73)), ("student k0-n16 (pure SSM)", condition(12, 110, 66, 60))]
    sentences = [s for s in findings(conds) if "pure SSM student" in s]
    assert len(sentences) == 4
    assert "falls" in next(s for s in sentences if s.startswith("facts cloze"))  # 83% -> 46%: knowledge lost


def test_each_sentence_says_how_it_stands_to_the_study():
    conds = [("unmodified", condition(198, 200, 83, 73)), ("top 5 heads removed", condition(50, 150, 80, 70))]
    sentences = findings(conds)
    assert "as the study reports" in next(s for s in sentences if s.startswith("KV retrieval"))
    # cloze 83% -> 62%: the study reports that knowledge stays
    assert "contradicts the study</b>, which reports that it stays" in next(
        s for s in sentences if s.startswith("facts cloze")
    )
    assert "the study reports that it falls; not shown at this n" in next(
        s for s in sentences if s.startswith("facts choice:")
    )


def test_the_format_comparison_says_whether_the_chosen_format_trails_the_best():
    from gna.report.knowledge_section import formats_part

    def formats(chosen_correct: int) -> pl.DataFrame:
        rows = []
        for shots, correct, chosen in ((0, 66, False), (1, chosen_correct, True), (3, 85, False)):
            low, high = wilson_interval(correct, 240)
            rows.append(
                {
                    "model": "m",
                    "format": "choice (text)",
                    "answer": "text",
                    "shots": shots,
                    "n": 240,
                    "acc": correct / 240,
                    "ci_low": low,
                    "ci_high": high,
                    "chance": 0.25,
                    "distinct_predictions": 4,
                    "prompt_tokens": 30.0 + shots,
                    "chosen": chosen,
                }
            )
        return pl.DataFrame(rows)

    assert "cannot be told apart at this n" in formats_part(formats(81))  # 33.8% vs 35.4%
    assert "less accurate by the intervals" in formats_part(formats(50))  # 20.8% vs 35.4%


def test_a_config_without_facts_still_writes_the_figure(tmp_path):
    """The figure is an output of the report rule whatever the config (a run without the facts
    failed on it as a missing output)."""
    from gna.report.htmlkit import SectionContext
    from gna.report.knowledge_section import render_knowledge

    figure = tmp_path / "knowledge_view.png"
    ctx = SectionContext(
        inputs={},
        figures={"knowledge_view": str(figure)},
        captions={"knowledge_view": ""},
        options={},
        config={"tasks": {"facts": {"formats": []}}},
    )
    assert render_knowledge(ctx) == ""
    assert figure.read_bytes().startswith(b"\x89PNG")
