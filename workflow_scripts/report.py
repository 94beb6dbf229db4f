"""Rule report: data/report/index.html and its figures from the Parquet results (sections: gna.report.registry)."""

from gna.core.runtime import run_rule
from gna.report.page import Report, run_report

run_rule(snakemake, run_report, Report)
