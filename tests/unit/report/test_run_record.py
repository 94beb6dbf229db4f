"""The run record (gna.report.run_record): benchmark records, timed parts, work and phase
timings."""

import json

import polars as pl
from conftest import REPO

from gna.report.run_record import part_timings, phase_timings, timings, with_work, write_run_record


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
    (logs / "heads_sweep/m.work.json").write_text(json.dumps({"layer_tokens": 2_500_000, "flops": 2.5e12}))
    work = with_work(timings(bench), logs)
    assert work["layer-tokens (M)"].to_list() == [None, 2.5] and work["s per M layer-tokens"][1] == 5.0
    assert work["GFLOP/s"].to_list() == [None, 200.0] and work["of peak"].to_list() == [None, None]
    assert with_work(timings(bench), logs, {"GFLOP/s": 400.0})["of peak"].to_list() == [None, 0.5]
    (tmp_path / "run").mkdir()
    peak = {"GFLOP/s": 800.0, "dtype": "bfloat16", "kernel": "oneDNN prepacked", "threads": 2, "shape": [4, 4, 4]}
    (tmp_path / "run/peak.json").write_text(json.dumps(peak))
    assert phase_timings(work).filter(pl.col("phase") == "all")["layer-tokens (M)"][0] == 2.5
    by_phase = phase_timings(with_work(timings(bench), logs, {"GFLOP/s": 400.0})).rows_by_key("phase", named=True)
    assert (by_phase["heads"][0]["GFLOP/s"], by_phase["heads"][0]["of peak"]) == (200.0, 0.5)
    assert by_phase["students"][0]["GFLOP/s"] is None and by_phase["all"][0]["of peak"] == 0.5
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
    record = json.loads((tmp_path / "run/record.json").read_text())  # the same record for the time table
    assert record["steps"][1] == {
        "step": "heads_sweep/m",
        "seconds": 12.5,
        "peak RSS (MB)": 800.0,
        "layer-tokens (M)": 2.5,
        "GFLOP/s": 200.0,
        "of peak": 0.25,
    }
    assert record["peak"] == peak and "800 GFLOP/s bfloat16 (oneDNN prepacked, 2 threads, 4×4×4)" in page
    assert "<td class=''>25%</td>" in page
    assert record["kernels"] in ("AMX", "AVX-512 + BF16", "AVX-512", "AVX2", "unknown") and record["models"] == []
    write_run_record(tmp_path / "empty.html", tmp_path / "none", tmp_path / "none", {}, REPO)
    assert "No benchmark records" in (tmp_path / "empty.html").read_text()


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


def test_the_cpu_kernels_are_the_widest_matmul_instructions():
    from gna.core.provenance import cpu_kernels

    assert cpu_kernels("flags\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n") == "AMX"
    assert cpu_kernels("flags\t: fpu avx2 avx512f avx512_bf16\n") == "AVX-512 + BF16"  # Zen 4
    assert cpu_kernels("flags\t: fpu avx2 avx512f\n") == "AVX-512"
    assert cpu_kernels("flags\t: fpu sse4_2 avx2\n") == "AVX2" and cpu_kernels("model name: M3\n") == "unknown"
