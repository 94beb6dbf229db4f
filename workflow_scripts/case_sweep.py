"""Rule case_sweep: every query head of the critical layers ablated alone inside the minimal model."""

from gna.core.runtime import run_rule
from gna.phases.case_study import CaseSweep, run_case_sweep

run_rule(snakemake, run_case_sweep, CaseSweep)
