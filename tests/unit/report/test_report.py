"""The whole HTML report built from the golden smoke results (tests/data/smoke_results). (Its
registry: test_registry.py; the caption markup: test_htmlkit.py; the run record:
test_run_record.py; each section's pieces: test_<section module>.py.)"""

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import REPO
from smoke_values import SMOKE_VALUES

from gna.core.settings import Files
from gna.report.htmlkit import read_caption
from gna.report.page import Report, run_report
from gna.report.registry import FIGURES, report_figures, report_inputs
from gna.tasks.facts import FactsTask, read_local_facts, run_facts_task
from gna.workflow.config import load_schema, validate_config

GOLDEN = REPO / "tests" / "data" / "smoke_results"
SECTION_TITLES = [
    "Models",
    "Baseline",
    "Layer pruning",
    "Per-head ablation",
    "Gather-and-Aggregate roles",
    "SSM and hybrid students",
    "Config",
]


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
    # the facts task tables, built as the smoke run builds them (the golden answers refer to their items)
    facts_cfg = validate_config(
        yaml.safe_load((REPO / "config/smoke.yaml").read_text()), load_schema(REPO / "config/schema.yaml")
    )["tasks"]["facts"]
    read_local_facts(REPO / facts_cfg["data"]["path"]).write_parquet(root / "facts.parquet")
    selection = {k: facts_cfg[k] for k in ("relations", "n", "seed")}
    for fmt in facts_cfg["formats"]:
        settings = FactsTask.of({"fmt": fmt, "selection": selection, "choice": facts_cfg["choice"]})
        outputs = Files(table=str(data / f"tasks/facts_{fmt}.parquet"))
        run_facts_task(Files(facts=str(root / "facts.parquet")), outputs, settings)
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
    # as rule report passes its settings: the whole validated config as JSON
    config_json = json.dumps(config, sort_keys=True)
    settings = Report.of({"options": config["report"], "config_json": config_json, "workflow_dir": str(REPO)})
    run_report(Files(**inputs), Files(html=str(root / "index.html"), **figures), settings)
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
    """Another machine with the same results (another Python, torch build, CPU, host name, core
    count, a GPU), another folder and the config's keys in another order render the same bytes,
    page and figures: those facts live in the run record, not in what DVC hashes, so DVC hashes
    the report the same whenever the results are the same. Each is varied where any code would
    read it (platform, sys, socket, os, torch.cuda), not only where the run record does."""
    import os
    import platform
    import socket
    import sys

    import torch

    from gna.core import provenance

    root, page = smoke_report
    monkeypatch.setattr(platform, "python_version", lambda: "3.12.9")
    monkeypatch.setattr(platform, "platform", lambda: "Linux-6.8-x86_64-with-glibc2.39")
    monkeypatch.setattr(platform, "node", lambda: "gpu-node-17")
    monkeypatch.setattr(sys, "version", "3.12.9 (main, Feb  4 2026, 14:00:00) [GCC 13.2.0]")
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-17")
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(provenance, "cpu_name", lambda cpuinfo=None: "AMD EPYC 9654, family 25")
    assert provenance.machine()["torch"] == "2.11.0+cu130"  # the environment the page would read
    switches = {"hybrid": True, "hybrid_swap": True, "attribution": True, "facts_choice": True}
    other = render(tmp_path, switches, reorder=True)
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
def test_without_students_the_figures_are_placeholders_and_a_skipped_model_is_named(tmp_path):
    page = render(
        tmp_path, {"hybrid": False, "hybrid_swap": False, "attribution": True, "facts_choice": True}, skip=["hybrid"]
    ).read_text()
    # the students' figures are declared outputs of the report rule: drawn as placeholders
    assert page.count("<figure>") == len(FIGURES) - 4
    for name in ("hybrid_heads", "hybrid_budget", "hybrid_training", "hybrid_align_heads"):
        assert (tmp_path / report_figures()[name]).is_file()
    heading = page.index("<h2>SSM and hybrid students</h2>")
    assert page.index("No students of <code>tiny-llama</code>: <code>skip: [hybrid]</code>") > heading
