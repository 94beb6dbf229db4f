"""The report's HTML pieces (gna.report.htmlkit): caption markup, the note of tasks scored on
the minimal model only."""

import polars as pl

from gna.report.htmlkit import rst_to_html


def test_rst_captions_become_html():
    assert rst_to_html("A *letter* and **bold**,\n``|T|`` & <x>.") == (
        "A <i>letter</i> and <b>bold</b>, <code>|T|</code> &amp; &lt;x&gt;."
    )
    assert rst_to_html("one\nline\n\nsecond") == "<p>one line</p><p>second</p>"


def test_tasks_scored_on_the_minimal_model_only_are_listed_with_their_reason():
    from gna.report.htmlkit import skipped_tasks_note

    rows = {
        "model": ["m", "m", "m"],
        "task": ["kv_retrieval", "mmlu_letter", "mmlu_letter"],
        "removed_layer": [-1, -1, -1],
        "metric": ["acc"] * 3,
        "skipped_reason": [None] + ["not distinguishable from chance at n=100: accuracy 26.0%"] * 2,
    }
    listed = skipped_tasks_note(pl.DataFrame(rows), "the minimal model", "no removals")
    assert listed.count("<li>") == 1 and "<b>m</b>, mmlu_letter: not distinguishable from chance at n=100" in listed
    assert "Scored on the minimal model only (no removals; <code>chance.skip</code>)" in listed
    assert skipped_tasks_note(pl.DataFrame(rows).drop("skipped_reason"), "the minimal model", "no removals") == ""
    none_skipped = pl.DataFrame(rows).with_columns(pl.lit(None, pl.String).alias("skipped_reason"))
    assert skipped_tasks_note(none_skipped, "the minimal model", "no removals") == ""


def test_a_comparisons_table_shows_each_verdict_and_folds_when_long():
    from gna.core.paired import comparisons
    from gna.report.htmlkit import FOLD_ROWS, comparisons_table

    def pair(lost: int, gained: int, same: int):
        ref = [True] * lost + [False] * gained + [True] * same
        cond = [False] * lost + [True] * gained + [True] * same
        frame = lambda c: pl.DataFrame(  # noqa: E731
            {"task": "kv_retrieval", "item_id": range(len(c)), "group": "all", "correct": c}
        )
        return frame(ref), frame(cond)

    per_item, pairs = {}, []
    for i, counts in enumerate([(40, 0, 160), (0, 0, 200), (3, 1, 6)] + [(1, 1, 8)] * FOLD_ROWS):
        per_item[f"r{i}"], per_item[f"c{i}"] = pair(*counts)
        pairs.append(("f", f"r{i}", f"c{i}"))
    short = comparisons_table(comparisons(per_item, pairs[:3]), 0.05)
    assert "<details>" not in short
    assert short.count(">falls<") == 1 and short.count(">holds<") == 1 and "not decided (about n = " in short
    long = comparisons_table(comparisons(per_item, pairs), 0.05)
    assert f"<summary>{FOLD_ROWS + 3} comparisons: 1 falls, 1 holds, {FOLD_ROWS + 1} not decided" in long
