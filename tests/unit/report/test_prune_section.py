"""The layer-pruning section (gna.report.prune_section): gradual pruning drawn for the tasks scored
at every depth."""

import polars as pl


def test_gradual_pruning_draws_only_the_tasks_scored_at_every_depth_and_names_the_others(tmp_path):
    from gna.report.htmlkit import ReportOptions, SectionContext
    from gna.report.prune_section import gradual_part, plot_gradual

    kv = [
        {
            "model": "m",
            "task": "kv_retrieval",
            "group": "all",
            "metric": "acc",
            "n": 80,
            "layers_kept": k,
            "value": k / 3,
            "skipped_reason": None,
        }
        for k in (1, 2, 3)
    ]
    cloze = [
        {
            "model": "m",
            "task": "mmlu_cloze",
            "group": "all",
            "metric": "acc",
            "n": 80,
            "layers_kept": 3,
            "value": 0.26,
            "skipped_reason": "not distinguishable from chance at n=80: accuracy 26.0%",
        }
    ]
    plot_gradual(pl.DataFrame(kv + cloze), {}, tmp_path / "g.png")
    ctx = SectionContext(
        inputs={},
        figures={"prune_gradual": str(tmp_path / "g.png")},
        captions={"prune_gradual": "caption"},
        options=ReportOptions(),
        config={},
    )
    part = gradual_part(pl.DataFrame(kv + cloze), ctx)
    assert "Scored on the full model only" in part and "<b>m</b>, mmlu_cloze: not distinguishable" in part
    assert (
        "kv_retrieval</th>" in part and "mmlu_cloze</th>" not in part
    )  # no column of the depth table: it was not scored per depth


def test_the_shallowest_prefix_shown_to_hold_is_read_as_a_fixed_sequence_from_the_deepest_down():
    """Prefixes 30, 28, 26 hold, 24 is not decided, 22 holds again: the sequence stops at 24, so the
    answer is 26 (22 would be the minimum over uncorrected tests). A fall within the margin holds."""
    from gna.core.paired import Decision, shallowest_holding

    holds, open_, falls = Decision("holds", 0.05), Decision("undecided", 0.05, 300), Decision("falls", 0.05)
    decisions = {30: holds, 28: holds, 26: Decision("falls", 0.05, within=True), 24: open_, 22: holds}
    assert shallowest_holding(decisions) == 26
    assert shallowest_holding({30: falls, 28: holds}) is None and shallowest_holding({}) is None
