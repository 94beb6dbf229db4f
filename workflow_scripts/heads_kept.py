"""Rule heads_kept: the minimal model with only the top head kept in each of two critical layers."""

from gna.core.runtime import run_rule
from gna.phases.head_tables import HeadsKept, run_heads_kept

run_rule(snakemake, run_heads_kept, HeadsKept)
