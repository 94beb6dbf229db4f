"""The README's time table (gna.report.timing_table): generated from kept run records, and the
README's own table is the one docs/runs/ gives."""

import json

import pytest
from conftest import REPO

from gna.report.timing_table import (
    BEGIN,
    END,
    comparison,
    main,
    markdown,
    model_of,
    read_records,
    summary,
    with_table,
)


def record(cpu: str, kernels: str, steps: list[tuple]) -> dict:
    return {
        "written": "2026-11-29 05:00 UTC",
        "git commit": "0123456789abcdef",
        "cpu": cpu,
        "kernels": kernels,
        "cpu_count": 2,
        "cuda": False,
        "models": ["small", "small-big"],
        "steps": [
            {"step": s, "seconds": sec, "peak RSS (MB)": rss, "layer-tokens (M)": tokens}
            for s, sec, rss, tokens in steps
        ],
    }


ZEN4 = record(
    "AMD EPYC 9R14, family 25",
    "AVX-512 + BF16",
    [
        ("baseline/small/kv_retrieval", 120.0, 2048.0, 2.0),
        ("distill_kd/small-k10-n16", 180.0, 3072.0, None),
        ("heads_topk/small-big", 600.0, 10240.0, 4.0),
        ("kv_task", 6.0, 100.0, None),
        ("report", 54.0, 500.0, None),
    ],
)


def test_each_step_counts_for_its_model_a_student_for_its_teacher():
    models = ["small", "small-big"]
    assert model_of("distill_kd/small-k10-n16", models) == "small"
    assert model_of("heads_topk/small-big", models) == "small-big"  # the longest name it starts with
    assert model_of("baseline/small/kv_retrieval", models) == "small"
    assert model_of("report", models) == "shared" and model_of("distill_corpus_check/all", models) == "shared"


def test_a_records_row_sums_minutes_per_model_and_rates_the_work():
    row = summary(ZEN4)
    assert row["minutes"] == {"small": 5.0, "small-big": 10.0, "shared": 1.0} and row["total"] == 16.0
    assert row["s per M layer-tokens"] == pytest.approx(720.0 / 6.0) and row["peak GB"] == 10.0
    table = markdown(
        [ZEN4, record("Intel Xeon 8488C, family 6", "AMX", [("baseline/small/kv_retrieval", 60.0, 1024.0, 2.0)])]
    )
    lines = table.splitlines()
    assert lines[0] == (
        "| CPU | kernels | cores | small (min) | small-big (min) | shared (min) | all (min) | s / M layer-tokens "
        "| GFLOP/s (of peak) | peak RSS (GB) | commit | written |"
    )
    assert lines[2].startswith(
        "| AMD EPYC 9R14, family 25 | AVX-512 + BF16 | 2 | 5.0 | 10.0 | 1.0 | 16.0 | 120.0 | – | 10.0 |"
    )
    assert lines[3].startswith(
        "| Intel Xeon 8488C, family 6 | AMX | 2 | 1.0 | – | – | 1.0 | 30.0 | – | 1.0 | 0123456 |"
    )


def test_a_record_with_flops_rates_its_steps_against_the_peak_measured_at_its_start():
    """The steps that count FLOPs together: their FLOPs over their seconds, and that over the peak."""
    counted = record("Intel Xeon 8488C, family 6", "AMX", [("baseline/small/kv_retrieval", 60.0, 1024.0, 2.0)])
    counted["steps"][0]["GFLOP/s"] = 300.0
    counted["steps"].append({"step": "heads_sweep/small", "seconds": 20.0, "peak RSS (MB)": 1.0, "GFLOP/s": 700.0})
    counted["steps"].append({"step": "report", "seconds": 5.0, "peak RSS (MB)": 1.0, "GFLOP/s": None})
    assert summary(counted)["GFLOP/s"] == pytest.approx(400.0) and summary(counted)["of peak"] is None
    counted["peak"] = {"GFLOP/s": 1600.0}
    assert summary(counted)["of peak"] == pytest.approx(0.25)
    assert "| 400 (25%) |" in markdown([counted])


def test_keep_write_and_check_the_readme_table(tmp_path, capsys):
    source = tmp_path / "record.json"
    source.write_text(json.dumps(ZEN4))
    assert main(["keep", str(source), str(tmp_path / "runs")]) == 0
    assert (tmp_path / "runs" / "amd-epyc-9r14-family-25-avx-512-bf16.json").is_file()
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{BEGIN}\nold, typed by hand\n{END}\n\nafter\n")
    assert main(["check", str(tmp_path / "runs"), str(readme)]) == 1
    assert "differs from the records" in capsys.readouterr().err
    assert main(["write", str(tmp_path / "runs"), str(readme)]) == 0
    text = readme.read_text()
    assert "old, typed by hand" not in text and markdown([ZEN4]) in text and text.endswith("\n\nafter\n")
    assert main(["check", str(tmp_path / "runs"), str(readme)]) == 0
    with pytest.raises(ValueError, match="notes.md: no time table markers"):
        with_table("no markers", "t", "notes.md")
    assert main(["keep", str(tmp_path / "none.json"), str(tmp_path / "runs")]) == 2
    with pytest.raises(FileNotFoundError, match="empty: no kept run records"):
        read_records(tmp_path / "empty")


def test_the_readmes_table_is_the_one_the_kept_records_give():
    readme = (REPO / "README.md").read_text()
    assert with_table(readme, markdown(read_records(REPO / "docs" / "runs"))) == readme


def test_two_runs_of_one_host_compare_step_by_step_and_two_hosts_are_refused(tmp_path, capsys):
    """compare: the matching steps' seconds before and after, their speed-up and layer-tokens (a
    work cut shows there), a step of one record only with dashes, the sum over the steps both hold;
    records of two kinds of machine are refused, as is a pattern nothing matches."""
    before = record(
        "Intel Xeon, family 6",
        "AMX",
        [
            ("distill_kd/small-k0-n16", 100.0, 1.0, 2.0),
            ("hybrid_score/small-k0-n16", 50.0, 1.0, 1.0),
            ("report", 9.0, 1.0, None),
        ],
    )
    after = record(
        "Intel Xeon, family 6",
        "AMX",
        [
            ("distill_kd/small-k0-n16", 40.0, 1.0, 2.0),
            ("hybrid_score/small-k0-n16", 35.0, 1.0, 0.5),
            ("hybrid_memory/small", 5.0, 1.0, None),
        ],
    )
    table = comparison(before, after, ("distill_*", "hybrid_*"))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "report" not in rows
    assert "| 100.0 | 40.0 | 2.50 | 2.000 | 2.000 |" in rows["distill_kd/small-k0-n16"]
    assert "| 50.0 | 35.0 | 1.43 | 1.000 | 0.500 |" in rows["hybrid_score/small-k0-n16"]
    assert "| – | 5.0 | – |" in rows["hybrid_memory/small"]
    assert "| 150.0 | 75.0 | **2.00** |" in rows["**2 steps in both**"]
    with pytest.raises(ValueError, match="two kinds of machine"):
        comparison(before, ZEN4)
    with pytest.raises(ValueError, match="no step"):
        comparison(before, after, ("prune_*",))
    paths = []
    for name, r in (("before", before), ("after", after)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(r))
    assert main(["compare", *map(str, paths), "distill_*"]) == 0
    assert "distill_kd/small-k0-n16" in capsys.readouterr().out
    assert main(["compare", str(paths[0]), str(tmp_path / "none.json")]) == 2
    (tmp_path / "zen4.json").write_text(json.dumps(ZEN4))
    assert main(["compare", str(paths[0]), str(tmp_path / "zen4.json")]) == 2
    assert "two kinds of machine" in capsys.readouterr().err
