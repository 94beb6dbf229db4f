"""Render data/report/index.html and its figures from the Parquet results (sections: gna.report.registry)."""

from gna.core.runtime import setup
from gna.report.page import build_report

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
build_report(
    dict(snakemake.input.items()),
    snakemake.output.html,
    {name: path for name, path in snakemake.output.items() if name != "html"},
    options=snakemake.params.report,
    config=snakemake.params.config,
    workflow_dir=snakemake.params.workflow_dir,
)
