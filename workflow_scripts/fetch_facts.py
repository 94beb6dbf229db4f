"""Rule fetch_facts: the facts (relation, subject, object) from the pinned wheels or a local CSV."""

from gna.core.runtime import run_rule
from gna.tasks.facts import FetchFacts, run_fetch_facts

run_rule(snakemake, run_fetch_facts, FetchFacts)
