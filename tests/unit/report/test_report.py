"""The report: its registry (inputs, figures, captions), the caption markup, and the whole HTML
report built from the golden smoke results (tests/data/smoke_results)."""

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import REPO

from gna.core.config import load_schema, validate_config
from gna.core.provenance import import_closure
from gna.report.htmlkit import read_caption, rst_to_html
from gna.report.page import build_report, render_function
from gna.report.registry import FIGURES, SECTIONS, Input, report_figures, report_inputs
from gna.report.run_record import part_timings, phase_timings, timings, with_work, write_run_record

GOLDEN = REPO / "tests" / "data" / "smoke_results"
# the smoke config's models, students and variants (config/smoke.yaml), as rules/report.smk passes them
SMOKE_VALUES = {
    "model": ["tiny-llama"],
    "hybrid_model": ["tiny-llama"],
    "gna_model": ["tiny-llama", "tiny-llama-hybrid-k0-n8", "tiny-llama-hybrid-k2-n8"],
    "scored_variant": ["teacher", "k0-n8", "k2-n8", "k0-n4"],
    "student_variant": ["k0-n8", "k2-n8", "k0-n4"],
    "answer_row_variant": ["k2-n8"],
    "budget_variant": ["k0-n8", "k2-n8"],
    "ablation": ["no_first_token", "small_corpus"],
    "state_size": [4, 8],
}
SECTION_TITLES = [
    "Models",
    "Baseline",
    "Layer pruning",
    "Per-head ablation",
    "Gather-and-Aggregate roles",
    "SSM and hybrid students",
    "Config",
]


def test_every_figure_has_its_caption_file_and_every_caption_a_figure():
    names = [figure.name for figure in FIGURES]
    assert len(names) == len(set(names))
    for figure in FIGURES:
        assert (REPO / figure.caption_file).is_file(), figure.caption_file
    assert {p.stem for p in (REPO / "rules" / "captions").glob("*.rst")} == set(names)


def test_every_section_renders_through_a_module_the_report_script_imports():
    closure = set(import_closure(REPO / "workflow_scripts" / "report.py"))
    for section in SECTIONS:
        render = render_function(section)
        assert callable(render)
        assert Path(render.__code__.co_filename).resolve() in {p.resolve() for p in closure}, section.name


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
        SMOKE_VALUES, {"hybrid": False, "hybrid_swap": False, "attribution": False, "facts_choice": False}
    )
    assert all(inputs[key] == [] for key in inputs if key.startswith("hybrid_"))
    assert inputs["facts_formats"] == []  # no multiple-choice facts: no format comparison
    assert inputs["heads_attribution"] == []  # a verified sweep: nothing exact to check attribution against
    assert inputs["gna_roles"] == [f"data/results/gna/{m}/roles.parquet" for m in SMOKE_VALUES["gna_model"]]
    assert inputs["baseline"] == "data/results/baseline.parquet"


def test_rst_captions_become_html():
    assert rst_to_html("A *letter* and **bold**,\n``|T|`` & <x>.") == (
        "A <i>letter</i> and <b>bold</b>, <code>|T|</code> &amp; &lt;x&gt;."
    )
    assert rst_to_html("one\nline\n\nsecond") == "<p>one line</p><p>second</p>"


def smoke_data(root: Path) -> Path:
    """A data folder like a finished smoke run's: the golden results plus the few inputs the golden
    set leaves out (the KV task, the model's provenance, the minimal model, a benchmark record)."""
    data = root / "data"
    for folder in ("results", "distill"):
        shutil.copytree(GOLDEN / folder, data / folder)
    (data / "tasks").mkdir()
    pl.DataFrame(
        {
            "task": ["kv_retrieval"] * 2,
            "item_id": [0, 1],
            "group": ["3", "6"],
            "context": ["k1:v1\nk2:v2\nk3:v3\n\nLookup:\nk1:v1\nk2:", "…"],
            "choices": [["v1", "v2", "v3"]] * 2,
            "target": [1, 0],
            "dict_size": [3, 6],
            "query_key": ["k2", "k1"],
            "template": ["lookup"] * 2,
        }
    ).write_parquet(data / "tasks/kv_retrieval.parquet")
    model = data / "models/tiny-llama"
    model.mkdir(parents=True)
    (model / "gna_source.json").write_text(
        json.dumps(
            {
                "name": "tiny-llama",
                "spec": {"source": "tiny-random", "arch": "llama", "seed": 0},
                "raw_file_sha256": None,
                "architecture": "LlamaForCausalLM",
                "n_layers": 4,
                "n_params": 180928,
            }
        )
    )
    (data / "results/prune/tiny-llama/minimal_model.json").write_text(
        json.dumps(
            {
                "fraction": 0.9,
                "full_value": 1 / 6,
                "kept_layers": [0],
                "layers_kept": 1,
                "metric": "acc",
                "model": "tiny-llama",
                "n_layers": 4,
                "task": "kv_retrieval",
                "threshold": 0.15,
                "value": 1 / 6,
            }
        )
    )
    bench = data / "benchmarks/heads_sweep"
    bench.mkdir(parents=True)
    (bench / "tiny-llama.tsv").write_text("s\th:m:s\tmax_rss\n12.5\t0:00:12\t800.0\n")
    return data


def render(root: Path, switches: dict, reorder: bool = False, skip: list[str] = ()) -> Path:
    smoke_data(root)
    raw = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    if skip:
        raw["models"]["tiny-llama"]["skip"] = list(skip)
    if reorder:  # the same config, its keys listed in another order
        raw = dict(reversed(list(raw.items())))
    config = validate_config(raw, load_schema(REPO / "config/schema.yaml"))
    inputs = {
        key: [str(root / p) for p in paths] if isinstance(paths, list) else str(root / paths)
        for key, paths in report_inputs(SMOKE_VALUES, switches).items()
    }
    figures = {name: str(root / path) for name, path in report_figures().items()}
    build_report(inputs, root / "index.html", figures, options=config["report"], config=config, workflow_dir=REPO)
    return root / "index.html"


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    return root, render(
        root, {"hybrid": True, "hybrid_swap": True, "attribution": True, "facts_choice": True}
    ).read_text()


@pytest.mark.slow
def test_report_of_the_smoke_results_has_every_section_figure_and_caption(smoke_report):
    root, page = smoke_report
    headings = [title for title in SECTION_TITLES if f"<h2>{title}</h2>" in page]
    assert headings == SECTION_TITLES
    assert page.index("<h2>Per-head ablation</h2>") < page.index("<h2>Gather-and-Aggregate roles</h2>")
    assert page.count("<figure>") == len(FIGURES)
    for figure in FIGURES:
        assert (root / figure.path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure.name
        assert f"<figcaption>{read_caption(REPO / figure.caption_file)}</figcaption>" in page, figure.name


@pytest.mark.slow
def test_report_shows_the_smoke_numbers(smoke_report):
    _, page = smoke_report
    assert "tiny random llama (seed 0)" in page
    assert "Template: <b>lookup</b>" in page
    assert "tiny-llama: layer swap" in page and "k0-n8 + attention layer 3" in page
    assert "heads_sweep/tiny-llama" not in page and " UTC" not in page  # in the run record
    assert "code hash" in page and "href='../run/index.html'" in page
    assert "Reference, not produced by this pipeline" in page
    # accuracies carry their interval and n; a student that ignores the context is flagged, the
    # tiny random teacher among them (the golden smoke results say so)
    assert "<td class=''>25.0% [7–59]</td>" in page and "KV all (n=8)" in page
    assert "degenerate (acc " in page and "Per-head alignment error" in page


@pytest.mark.slow
def test_the_report_is_the_same_bytes_under_another_recorded_environment(smoke_report, tmp_path, monkeypatch):
    """Another machine with the same results (another Python, torch build, CPU) renders the same
    bytes, page and figures: those facts live in the run record, not in what DVC hashes."""
    import platform

    import torch

    from gna.core import provenance

    root, page = smoke_report
    monkeypatch.setattr(platform, "python_version", lambda: "3.12.9")
    monkeypatch.setattr(platform, "platform", lambda: "Linux-6.8-x86_64-with-glibc2.39")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(provenance, "cpu_name", lambda cpuinfo=None: "AMD EPYC 9654, family 25")
    assert provenance.machine()["torch"] == "2.11.0+cu130"  # the environment the page would read
    other = render(tmp_path, {"hybrid": True, "hybrid_swap": True, "attribution": True, "facts_choice": True})
    assert other.read_bytes() == page.encode()
    for figure in FIGURES:
        assert (tmp_path / figure.path).read_bytes() == (root / figure.path).read_bytes(), figure.name


def test_the_cpu_is_named_with_its_family():
    from gna.core.provenance import cpu_name

    info = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
        "model name\t: AMD Ryzen 9 9950X 16-Core Processor\n"
    )
    assert cpu_name(info) == "AMD Ryzen 9 9950X 16-Core Processor, family 26"
    assert "family" not in cpu_name("model name\t: Apple M3\n")


@pytest.mark.slow
def test_the_report_is_the_same_bytes_for_the_same_results(smoke_report, tmp_path):
    """Nothing of the run (time, machine, folder, timings, the config file's key order) is in the
    report, so DVC hashes it the same whenever the results are the same."""
    _, page = smoke_report
    assert (
        render(
            tmp_path, {"hybrid": True, "hybrid_swap": True, "attribution": True, "facts_choice": True}, reorder=True
        ).read_text()
        == page
    )


def test_run_record_gathers_benchmark_records_and_timed_parts(tmp_path):
    bench, logs = tmp_path / "benchmarks", tmp_path / "logs"
    for step, seconds, rss in (("heads_sweep/m", 12.5, 800.0), ("distill_kd/m-k0-n8", 3.0, 1200.0)):
        (bench / step).parent.mkdir(parents=True, exist_ok=True)
        (bench / f"{step}.tsv").write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:12\t{rss}\n")
    (logs / "heads_attribution").mkdir(parents=True)
    (logs / "heads_attribution/m.timings.json").write_text(json.dumps({"attribution": 1.5, "verify top 5": 0.5}))
    assert timings(bench).rows() == [("distill_kd/m-k0-n8", 3.0, 1200.0), ("heads_sweep/m", 12.5, 800.0)]
    assert part_timings(logs).rows() == [
        ("heads_attribution/m", "attribution", 1.5),
        ("heads_attribution/m", "verify top 5", 0.5),
    ]
    (logs / "heads_sweep").mkdir(parents=True)
    (logs / "heads_sweep/m.work.json").write_text(json.dumps({"layer_tokens": 2_500_000}))
    work = with_work(timings(bench), logs)
    assert work["layer-tokens (M)"].to_list() == [None, 2.5] and work["s per M layer-tokens"][1] == 5.0
    assert phase_timings(work).filter(pl.col("phase") == "all")["layer-tokens (M)"][0] == 2.5
    write_run_record(tmp_path / "run/index.html", bench, logs, {"a": 1}, REPO)
    page = (tmp_path / "run/index.html").read_text()
    for needle in (
        "git commit",
        " UTC",
        "heads_sweep/m",
        "students",
        "verify top 5",
        "Parts of steps",
        "layer-tokens (M)",
        "<td class=''>2.50</td>",
        "CPUs, CUDA",
    ):
        assert needle in page, needle
    write_run_record(tmp_path / "empty.html", tmp_path / "none", tmp_path / "none", {}, REPO)
    assert "No benchmark records" in (tmp_path / "empty.html").read_text()


@pytest.mark.slow
def test_report_without_the_hybrid_phase_draws_placeholders(tmp_path):
    page = render(
        tmp_path, {"hybrid": False, "hybrid_swap": False, "attribution": True, "facts_choice": True}
    ).read_text()
    assert "<h2>SSM and hybrid students</h2>" not in page
    assert page.count("<figure>") == len(FIGURES) - 4
    for name in ("hybrid_heads", "hybrid_budget", "hybrid_training", "hybrid_align_heads"):
        assert (tmp_path / report_figures()[name]).is_file()


@pytest.mark.slow
def test_a_model_skipped_by_the_hybrid_phase_is_named_under_the_students_heading(tmp_path):
    page = render(
        tmp_path, {"hybrid": False, "hybrid_swap": False, "attribution": True, "facts_choice": True}, skip=["hybrid"]
    ).read_text()
    heading = page.index("<h2>SSM and hybrid students</h2>")
    assert page.index("No students of <code>tiny-llama</code>: <code>skip: [hybrid]</code>") > heading


def test_phase_timings_sum_each_phase_and_the_total():
    """Steps are grouped by their rule's phase (unknown rules: 'other'); seconds add up,
    memory is the largest peak."""
    steps = pl.DataFrame(
        {
            "step": ["distill_kd/m-k0-n16", "hybrid_score/m-teacher", "heads_sweep/m", "custom/x"],
            "seconds": [10.0, 5.0, 100.0, 1.0],
            "peak RSS (MB)": [300.0, 900.0, 200.0, 50.0],
        }
    )
    phases = {row["phase"]: row for row in phase_timings(steps).iter_rows(named=True)}
    assert phases["students"]["seconds"] == 15.0 and phases["students"]["peak RSS (MB)"] == 900.0
    assert phases["students"]["steps"] == 2 and phases["heads"]["seconds"] == 100.0
    assert phases["other"]["steps"] == 1
    assert phases["all"]["seconds"] == 116.0 and phases["all"]["peak RSS (MB)"] == 900.0


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


def test_gradual_pruning_draws_only_the_tasks_scored_at_every_depth_and_names_the_others(tmp_path):
    from gna.report.htmlkit import SectionContext
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
        options={},
        config={},
    )
    part = gradual_part(pl.DataFrame(kv + cloze), ctx)
    assert "Scored on the full model only" in part and "<b>m</b>, mmlu_cloze: not distinguishable" in part
    assert (
        "kv_retrieval</th>" in part and "mmlu_cloze</th>" not in part
    )  # no column of the depth table: it was not scored per depth


def test_tasks_the_students_were_not_scored_on_are_named_with_the_reason():
    from gna.report.hybrid_section import not_scored_note

    rows = pl.DataFrame(
        {
            "task": ["kv_retrieval", "mmlu_letter", "mmlu_letter", "heldout"],
            "metric": ["acc", "not_scored", "not_scored", "perplexity"],
            "skipped_reason": [None, "the teacher keeps its answer on 100% of 50 items", None, None],
        }
    )
    note = not_scored_note(rows)
    assert note.count("<li>") == 1 and "MMLU letter (retrieval-heavy): the teacher keeps its answer on 100%" in note
    assert not_scored_note(rows.filter(pl.col("metric") != "not_scored")) == ""
    assert not_scored_note(rows.drop("skipped_reason")) == ""
