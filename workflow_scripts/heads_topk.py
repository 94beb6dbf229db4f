"""Rule heads_topk: every task with the top-k ranked heads removed, beside random-k controls."""

from gna.core.runtime import run_rule
from gna.phases.head_tables import HeadsTopk, run_heads_topk

run_rule(snakemake, run_heads_topk, HeadsTopk)
