"""Rule gna_roles: G&A role scores of every head on KV prompts, and the maps of the chosen heads."""

from gna.core.runtime import run_rule
from gna.phases.gather_aggregate import GnaRoles, run_gna_roles

run_rule(snakemake, run_gna_roles, GnaRoles)
