"""Rule facts_formats: the facts' multiple-choice formats scored side by side with the cloze form."""

from gna.core.runtime import run_rule
from gna.phases.knowledge import FactsFormats, run_facts_formats

run_rule(snakemake, run_facts_formats, FactsFormats)
