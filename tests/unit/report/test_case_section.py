"""The report's case-study section from scripted result files: a model the case study does not apply to
says why and gives 'not tested'; one that ran shows its minimal model, critical layers, heads found, the
heads-kept table beside the study's rows, KV by size, and the verdict its tables decide."""

import json

import polars as pl
from test_case_verdict import REMOVED, _kept

from gna.core.io import write_parquet
from gna.core.stats import wilson_interval
from gna.phases.case_study import ALL_HEADS, KEPT
from gna.report.case_section import render_case
from gna.report.htmlkit import ReportOptions, SectionContext
from gna.report.registry import SECTIONS

FIGURES = ("case_gradual", "case_layers", "case_sweep", "case_maps")


def _acc(value: float, n: int, **columns) -> dict:
    low, high = wilson_interval(value * n, n)
    return {"group": "all", "metric": "acc", "value": value, "ci_low": low, "ci_high": high, "n": n, **columns}


def _context(tmp_path, files: dict) -> SectionContext:
    inputs = {}
    for key, value in files.items():
        path = tmp_path / f"{key}.{'json' if isinstance(value, dict) else 'parquet'}"
        if isinstance(value, dict):
            path.write_text(json.dumps({"model": "m", **value}))
        else:
            write_parquet(value.with_columns(pl.lit("m").alias("model")), path)
        inputs[key] = [str(path)]
    keys = {put.key for section in SECTIONS if section.name == "case" for put in section.inputs}
    assert set(inputs) == keys  # every input the registry names, scripted
    return SectionContext(
        inputs=inputs,
        figures={name: str(tmp_path / f"{name}.png") for name in FIGURES},
        captions={name: name for name in FIGURES},
        options=ReportOptions(),
        config={"case_study": {"control": {"seed": 4321, "draws": 1}}},
    )


GRADUAL = pl.DataFrame(
    [_acc(v, 200, task="mmlu_letter", split="evaluation", layers_kept=k) for k, v in [(1, 0.25), (2, 0.5), (3, 0.6)]]
    + [_acc(v, 200, task="mmlu_letter", split="development", layers_kept=k) for k, v in [(1, 0.2), (2, 0.5), (3, 0.6)]]
)
FOUND = {"acc_drop": 0.2, "logp_drop": 0.5, "stable": True, "top_half1": 0, "top_half2": 3}
EMPTY = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64})


def test_a_model_the_case_study_does_not_apply_to_says_why(tmp_path):
    reason = "no prefix short of the full 3 layers is shown to hold within ±5 points"
    files = {
        "case_gradual": GRADUAL,
        "case_minimal": {"applies": False, "reason": reason, "layers_kept": None},
        "case_layers_comparisons": pl.DataFrame(schema={"task": pl.String, "group": pl.String}),
        "case_critical": {"layers": [], "removed": [], "reason": reason},
        "case_sweep": EMPTY,
        "case_found": {"heads": [], "reason": reason},
        "case_kept": pl.DataFrame(schema={"variant": pl.String, "task": pl.String}),
        "case_kept_comparisons": _kept(letter_lost=0).clear(),
        "case_roles": EMPTY,
        "case_maps": EMPTY.with_columns(pl.lit("mmlu_letter").alias("task")),
        "case_masking": pl.DataFrame(schema={"condition": pl.String}),
        "case_masking_comparisons": _kept(letter_lost=0).clear(),
    }
    html = render_case(_context(tmp_path, files))
    assert "The case study does not apply to this model" in html and reason in html
    assert "case study): not tested</b>" in html and "contradict" not in html
    assert all((tmp_path / f"{name}.png").is_file() for name in FIGURES)


def test_a_case_study_that_ran_shows_its_steps_and_the_verdict_its_tables_decide(tmp_path):
    kept = pl.DataFrame(
        [_acc(0.6, 200, variant=v, task="mmlu_letter") for v in (ALL_HEADS, KEPT)]
        + [_acc(0.1, 200, variant=REMOVED, task="mmlu_letter"), _acc(0.9, 20, variant=KEPT, task="kv_retrieval@10")]
    )
    files = {
        "case_gradual": GRADUAL,
        "case_minimal": {
            "applies": True,
            "reason": None,
            "layers_kept": 3,
            "n_layers": 4,
            "margin": 0.05,
            "development_items": 200,
            "letter": {"value": 0.6, "ci_low": 0.53, "ci_high": 0.67, "n": 200},
            "holding": 3,
            "two_sided": None,
            "shallower": {"layers_kept": 2, "verdict": "falls", "diff": -0.1, "ci_low": -0.15, "ci_high": -0.05},
        },
        "case_layers_comparisons": pl.DataFrame(schema={"task": pl.String, "group": pl.String}),
        "case_critical": {"layers": [5, 7], "removed": [], "reason": None},
        "case_sweep": EMPTY,
        "case_found": {
            "heads": [FOUND | {"layer": 5, "head": 2}, FOUND | {"layer": 7, "head": 0, "stable": False}],
            "n": 200,
            "reason": None,
        },  # fmt: skip
        "case_kept": kept,
        "case_kept_comparisons": _kept(letter_lost=100),
        "case_roles": EMPTY,
        "case_maps": EMPTY.with_columns(pl.lit("mmlu_letter").alias("task")),
        "case_masking": pl.DataFrame(schema={"condition": pl.String}),
        "case_masking_comparisons": _kept(letter_lost=0).clear(),
    }
    html = render_case(_context(tmp_path, files))
    assert "Minimal model: layers 0–2 (3 of 4)</b>." in html and "One layer fewer (2 layers): -10.0 points" in html
    assert "A departure from the report's two-sided reading, labelled" in html and "no prefix holds" in html
    assert "case study): reproduced</b>" in html and "L5H2 removed from the kept configuration" in html
    assert "Reference, not produced by this pipeline" in html and "66.32%" in html  # the study's rows, labelled
    assert "10 keys (n=20)" in html and "falls (-50.0)" in html
    assert "on top in both halves" in html and "not stable: the top head is H0 on the first half and H3" in html
