"""Rule case_prune: the minimal model cut where the letter format breaks, from one pass over every prefix."""

from gna.core.runtime import run_rule
from gna.phases.case_study import CasePrune, run_case_prune

run_rule(snakemake, run_case_prune, CasePrune)
