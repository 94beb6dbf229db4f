"""Render data/report/index.html and its figures from the Parquet results."""
from gna.report import build_report
from gna.runtime import setup

setup(snakemake.log[0])
build_report(
    baseline_path=snakemake.input.baseline,
    model_dirs=list(snakemake.input.models),
    kv_task_path=snakemake.input.kv_task,
    html_path=snakemake.output.html,
    figures={"kv": snakemake.output.kv_figure, "mmlu": snakemake.output.mmlu_figure},
    options=snakemake.params.report,
    config=snakemake.params.config,
    benchmark_dir=snakemake.params.benchmark_dir,
    workflow_dir=snakemake.params.workflow_dir,
)
