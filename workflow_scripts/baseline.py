"""Rule baseline: score one model on one task with our engine (per-item scores and a summary)."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.phases.evaluation import run_baseline

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
run_baseline(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.task,
    snakemake.output.summary,
    snakemake.output.per_item,
    evaluation=Evaluation(**snakemake.params.evaluation),
)
