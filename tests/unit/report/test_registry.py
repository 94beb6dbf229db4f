"""The report's registry (gna.report.registry): figures and their caption files, input keys,
inputs expanded like Snakemake's expand, switched-off phases without inputs."""

from conftest import REPO
from smoke_values import SMOKE_VALUES

from gna.report.registry import FIGURES, SECTIONS, Input, report_inputs


def test_every_figure_has_its_caption_file_and_every_caption_a_figure():
    names = [figure.name for figure in FIGURES]
    assert len(names) == len(set(names))
    for figure in FIGURES:
        assert (REPO / figure.caption_file).is_file(), figure.caption_file
    assert {p.stem for p in (REPO / "rules" / "captions").glob("*.rst")} == set(names)


def test_input_keys_are_unique():
    keys = [put.key for section in SECTIONS for put in section.inputs]
    assert len(keys) == len(set(keys))


def test_inputs_expand_like_snakemake_expand():
    put = Input("x", "r/{model}/{student_variant}.parquet")
    assert put.wildcards() == ["model", "student_variant"]
    assert put.paths({"model": ["a", "b"], "student_variant": ["k0-n8", "k2-n8"]}, {}) == [
        "r/a/k0-n8.parquet",
        "r/a/k2-n8.parquet",
        "r/b/k0-n8.parquet",
        "r/b/k2-n8.parquet",
    ]
    assert Input("y", "r/baseline.parquet").paths({}, {}) == "r/baseline.parquet"
    assert Input("z", "r/{model}/swap.parquet", "hybrid_swap").paths({"model": ["a"]}, {"hybrid_swap": False}) == []


def test_switched_off_hybrid_has_no_hybrid_inputs():
    inputs = report_inputs(
        {**SMOKE_VALUES, "attribution_model": []}, {"hybrid": False, "hybrid_swap": False, "facts_choice": False}
    )
    assert all(inputs[key] == [] for key in inputs if key.startswith("hybrid_"))
    assert inputs["facts_formats"] == []  # no multiple-choice facts: no format comparison
    assert inputs["heads_attribution"] == []  # verified sweeps only: nothing exact to check attribution against
    assert inputs["gna_roles"] == [f"data/results/gna/{m}/roles.parquet" for m in SMOKE_VALUES["gna_model"]]
    assert inputs["baseline"] == "data/results/baseline.parquet"
