"""Rule facts_known: the multiple-choice facts split into the model's known and unknown items."""

from gna.core.runtime import run_rule
from gna.tasks.facts import FactsKnown, run_facts_known

run_rule(snakemake, run_facts_known, FactsKnown)
