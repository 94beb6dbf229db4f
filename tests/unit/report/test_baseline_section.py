"""The baseline's letter-vs-cloze finding: read from the paired test on the same questions."""

import polars as pl

from gna.core.stats import wilson_interval
from gna.report.baseline_section import format_finding, letter_vs_cloze, pypi_source


def _acc(correct: int, n: int) -> dict:
    low, high = wilson_interval(correct, n)
    return {"value": correct / n, "ci_low": low, "ci_high": high, "n": n, "chance": 0.25}


def _items(letter: list[bool], cloze: list[bool]) -> pl.DataFrame:
    frame = lambda task, c: pl.DataFrame(  # noqa: E731
        {"model": "m", "task": task, "item_id": range(len(c)), "group": "g", "correct": c}
    )
    return pl.concat([frame("mmlu_letter", letter), frame("mmlu_cloze", cloze)])


def test_the_study_reading_needs_the_paired_test_not_apart_intervals():
    # 60 questions: letter 18 right (30%, its interval holds chance), cloze 27 (45%): the two
    # Wilson intervals overlap, but cloze gains 11 questions and loses 2 on the same items
    letter = [True] * 16 + [True] * 2 + [False] * 11 + [False] * 31
    cloze = [True] * 16 + [False] * 2 + [True] * 11 + [False] * 31
    by_format = {"letter": _acc(18, 60), "cloze": _acc(27, 60)}
    assert by_format["cloze"]["ci_low"] < by_format["letter"]["ci_high"]  # overlapping intervals
    row = letter_vs_cloze(_items(letter, cloze))["m"]
    assert (row["reference_only"], row["condition_only"]) == (2, 11)
    text = format_finding("m", by_format, row, 0.05)
    assert "<b>rises</b>" in text and "cannot retrieve the option letter in context" in text
    # the same accuracies with the items changing both ways: no paired finding, no study reading
    mixed = [True] * 9 + [False] * 9 + [True] * 18 + [False] * 24
    row = letter_vs_cloze(_items(letter, mixed))["m"]
    assert "do not separate the two formats" in format_finding("m", by_format, row, 0.05)
    assert "do not separate the two formats" in format_finding("m", by_format, None, 0.05)


def test_a_model_in_many_wheels_is_named_by_its_first_and_last():
    parts = [{"package": f"m-part{i}", "version": "0.2.0", "member": f"m/p{i}.bin"} for i in range(1, 23)]
    assert pypi_source({"parts": parts}) == "PyPI m-part1==0.2.0 … m-part22==0.2.0 (22 parts joined in order)"
    assert pypi_source({"parts": parts[:2]}) == "PyPI m-part1==0.2.0 + m-part2==0.2.0"
    assert pypi_source({"package": "w", "version": "1", "member": "w/f.gguf"}) == "PyPI w==1 : w/f.gguf"
