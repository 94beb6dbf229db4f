"""Rule case_gna: G&A roles and attention maps of the heads found, inside the minimal model."""

from gna.core.runtime import run_rule
from gna.phases.case_gna import CaseGna, run_case_gna

run_rule(snakemake, run_case_gna, CaseGna)
