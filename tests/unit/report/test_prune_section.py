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
