"""The chance policy (gna.core.chance): one decision, one reason text, one column, for every phase."""

import polars as pl
import pytest

from gna.core.chance import SKIPPED, ChancePolicy, at_chance, chance_accuracy, skipped
from gna.core.stats import wilson_interval

# four items of four choices: chance is 25%
TABLE = pl.DataFrame({"task": ["t"] * 4, "choices": [["a", "b", "c", "d"]] * 4})


def _items(correct: list[bool]) -> pl.DataFrame:
    return pl.DataFrame({"correct": correct})


def test_at_chance_follows_the_wilson_interval():
    assert chance_accuracy(TABLE) == 0.25
    reason = at_chance(_items([True, False, False, False]), TABLE, "removing heads")
    low, high = wilson_interval(1, 4)
    assert reason == (
        f"not distinguishable from chance at n=4: accuracy 25.0% [{low:.1%}, {high:.1%}] "
        "contains chance 25.0%, so removing heads has no shown ability to take away"
    )
    many = pl.concat([TABLE] * 10)
    assert at_chance(_items([True] * 40), many) is None  # 100% [91-100]: clear of 25%
    # below chance is not chance: 0% [0-9] of 40 avoids the answer item by item, so it reads the
    # items and a change can show (back up to chance); 5 of 40 (12.5% [5-26]) still contains 25%
    assert at_chance(_items([False] * 40), many) is None
    assert at_chance(_items([True] * 5 + [False] * 35), many).startswith("not distinguishable from chance at n=40")
    assert at_chance(_items([]), TABLE.clear()) is None


def test_the_policy_is_off_by_default_and_spares_the_tasks_it_is_told():
    at = _items([False] * 4)
    assert ChancePolicy().reason(at, TABLE, "x") is None
    on = ChancePolicy(skip=True)
    assert on.reason(at, TABLE, "x").endswith("so x has no shown ability to take away")
    assert on.sparing("t").reason(at, TABLE, "x") is None and on.sparing(None) == on
    assert on.sparing("t").applies("other") and not on.sparing("t").applies("t")
    with pytest.raises(ValueError, match="^chance.skip: "):
        ChancePolicy(skip="yes")


def _summary(task: str, acc: float, low: float, high: float, degenerate: bool) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "task": [task, task, task],
            "group": ["all", "all", "3"],
            "n": [50, 50, 20],
            "metric": ["acc", "degeneracy_agreement", "acc"],
            "value": [acc, 0.9, 0.0],
            "ci_low": [low, 0.8, 0.0],
            "ci_high": [high, 0.95, 0.1],
            "degenerate": [degenerate] * 3,
        }
    )


def test_teacher_reasons_name_degeneracy_first_then_chance():
    on = ChancePolicy(skip=True)
    tables = {"t": TABLE, "u": TABLE.with_columns(pl.lit("u").alias("task"))}
    summary = pl.concat([_summary("t", 0.3, 0.2, 0.4, True), _summary("u", 0.3, 0.2, 0.4, False)])
    reasons = on.teacher_reasons(summary, tables)
    assert list(reasons) == ["t", "u"]
    assert reasons["t"].startswith("the teacher keeps its answer on 90% of 50 items")
    assert reasons["u"].startswith("the teacher's accuracy is not distinguishable from chance at n=50")
    # above chance and reading the context: compared; the policy off or no summary: every task compared
    clear = _summary("u", 0.9, 0.8, 0.95, False)
    assert on.teacher_reasons(clear, tables) == {}
    assert ChancePolicy().teacher_reasons(summary, tables) == {} and on.teacher_reasons(None, tables) == {}
    # a task not among the tables is not named
    assert list(on.teacher_reasons(summary, {"u": tables["u"]})) == ["u"]


def test_the_reason_column_is_a_string_even_when_empty():
    frame = pl.DataFrame({"a": [1, 2]}).with_columns(skipped(None))
    assert frame.schema[SKIPPED] == pl.String and frame[SKIPPED].null_count() == 2
