"""docs/findings.md is written by code from docs/headline.json: the committed page and its figures'
data are what the code writes from the committed headline, and a claim's cell is never stronger
than its premise."""

import json
from pathlib import Path

import polars as pl
import pytest

from gna.report.findings import FIGURES, NOT_IN_HEADLINE, figure_data, findings_markdown, letter_not_knowledge
from gna.report.headline import compare, provenance_entry

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_committed_findings_are_what_the_headline_writes():
    entries = json.loads((DOCS / "headline.json").read_text())
    assert (DOCS / "findings.md").read_text() == findings_markdown(entries), "run `make findings`"
    for name, rows in figure_data(entries).items():  # the figures: the data they are drawn from
        committed = pl.read_csv(DOCS / FIGURES / f"{name}.csv")
        assert committed.equals(pl.DataFrame(rows).cast(committed.schema)), name
        assert (DOCS / FIGURES / f"{name}.png").stat().st_size > 1000


def _entry(name, value, n=60, lost=0, gained=0):
    return {"name": name, "kind": "verdict", "value": value, "n": n, "lost": lost, "gained": gained, "p_holm": 0.01}


@pytest.mark.parametrize(
    "answered, kv, fall, says",
    [
        ("no", "falls", "excluded", "not tested: the model answers no letter form above chance"),
        ("yes", "undecided", "excluded", "not tested: the units removed are not shown to carry retrieval"),
        ("yes", "falls", "excluded", "a fall to chance excluded"),
        ("yes", "falls", "not excluded", "a fall to chance not excluded"),
    ],
)
def test_the_contrast_is_tested_only_where_its_premise_holds(answered, kv, fall, says):
    entries = {
        "m a letter form answered": {"name": "m a letter form answered", "kind": "label", "value": answered},
        "m: top 4 vs unmodified, kv_retrieval": _entry("m: top 4 vs unmodified, kv_retrieval", kv, lost=40),
        "m: top 4 vs unmodified, mmlu_letter": _entry("m: top 4 vs unmodified, mmlu_letter", "undecided", 200, 5, 4),
        "m: top 4 vs unmodified, mmlu_letter: a fall to chance": _entry(
            "m: top 4 vs unmodified, mmlu_letter: a fall to chance", fall, 200, 5, 4
        ),
    }
    cell = letter_not_knowledge(entries, "m")
    assert cell.startswith(f"**{says}") and "contradict" not in cell
    assert letter_not_knowledge({}, "m") is None


def test_a_claim_the_headline_lacks_says_so_and_provenance_is_not_compared():
    entries = [
        {"name": "m baseline kv_retrieval", "kind": "accuracy", "value": 0.9, "n": 50, "ci": [0.8, 0.95]},
        provenance_entry(
            {"git commit": "abcdef0123-dirty", "cpu": "Some CPU, family 6", "kernels": "AMX", "cpu_count": 2,
             "written": "2026-12-03 10:00 UTC"}
        ),
    ]  # fmt: skip
    page = findings_markdown(entries)
    assert "commit abcdef0-dirty on Some CPU, family 6 (AMX) (2 cores), 2026-12-03 10:00 UTC" in page
    assert page.count(NOT_IN_HEADLINE) >= 8
    lines, ok = compare(entries, [entries[0]])
    assert ok and not any("provenance" in line for line in lines)


def test_a_model_with_a_case_study_is_judged_by_it_not_by_its_top_k_table():
    case = "m case study heads kept: kept − L23H6 vs kept"
    entries = {
        "m: the study's contrast (case study)": {"name": "x", "kind": "label", "value": "not reproduced",
                                                  "reason": "a fall to chance is excluded"},
        "m case study: heads found": {"name": "x", "kind": "label", "value": "L23H6"},
        f"{case}, mmlu_letter": _entry(f"{case}, mmlu_letter", "holds", 200, 2, 0),
        f"{case}, facts_cloze": _entry(f"{case}, facts_cloze", "holds", 240, 1, 0),
        "m: top 4 vs unmodified, mmlu_letter": _entry("m: top 4 vs unmodified, mmlu_letter", "undecided", 200, 5, 4),
    }  # fmt: skip
    cell = letter_not_knowledge(entries, "m")
    assert cell.startswith("**not reproduced: a fall to chance is excluded**; head found L23H6")
    assert "mmlu letter: holds: 2 lost / 0 gained of 200" in cell and "facts cloze: holds" in cell
    assert "top 4" not in cell
