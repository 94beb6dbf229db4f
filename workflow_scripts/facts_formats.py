"""Rule facts_formats: the facts' multiple-choice formats scored side by side with the cloze form."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.knowledge import run_facts_formats

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_facts_formats(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.facts,
    snakemake.params.facts,
    snakemake.output[0],
    task_paths=snakemake.input.tasks,
    baseline_paths=snakemake.input.baseline,
    evaluation=Evaluation(**snakemake.params.evaluation),
)
