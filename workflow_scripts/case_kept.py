"""Rule case_kept: the heads-kept table of the heads found."""

from gna.core.runtime import run_rule
from gna.phases.case_study import CaseKept, run_case_kept

run_rule(snakemake, run_case_kept, CaseKept)
