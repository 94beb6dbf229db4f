"""Render data/report/index.html and its figures from the Parquet results."""
from gna.report import build_report
from gna.runtime import setup

setup(snakemake.log[0])
inputs = {name: snakemake.input[name] for name in snakemake.input.keys()}
figures = {name: snakemake.output[name] for name in snakemake.output.keys() if name != "html"}
build_report(inputs, snakemake.output.html, figures, options=snakemake.params.report, config=snakemake.params.config,
             benchmark_dir=snakemake.params.benchmark_dir, workflow_dir=snakemake.params.workflow_dir)
