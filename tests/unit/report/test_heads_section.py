"""The heads section names what its curves remove: a head, or a key/value group where the ranking ranks groups."""

import polars as pl

from gna.report.heads_section import curve_unit, dictsize_part, plot_dictsize
from gna.report.htmlkit import ReportOptions, SectionContext


def _curves(labels: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "model": "m",
            "dict_size": [5] * len(labels),
            "condition": labels,
            "metric": "acc",
            "value": 1.0,
            "ci_low": 0.9,
            "ci_high": 1.0,
            "n": 24,
        }
    )


def test_the_dictionary_size_curves_name_the_unit_they_remove(tmp_path):
    groups = _curves(["none removed", "#1 L7G0 removed", "#2 L14G0 removed"])
    heads = _curves(["none removed", "#1 L16H0 removed", "#2 L3H1 removed"])
    assert (curve_unit(groups), curve_unit(heads), curve_unit(groups.clear())) == ("key/value group", "head", "head")
    ctx = SectionContext(
        inputs={},
        figures={"heads_dictsize": str(tmp_path / "d.png")},
        captions={"heads_dictsize": "caption"},
        options=ReportOptions(),
        config={},
    )
    plot_dictsize(groups, tmp_path / "d.png")
    assert "with the #1 or #2 key/value group removed</h3>" in dictsize_part(groups, ctx)
    assert "with the #1 or #2 head removed</h3>" in dictsize_part(heads, ctx)
