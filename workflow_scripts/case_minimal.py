"""Rule case_minimal: the case study's minimal model, chosen on the development questions."""

from gna.core.runtime import run_rule
from gna.phases.case_study import CaseMinimal, run_case_minimal

run_rule(snakemake, run_case_minimal, CaseMinimal)
