"""Rule facts_known: the multiple-choice facts split into the model's known and unknown items."""

from gna.core.runtime import setup
from gna.tasks.facts import write_known_task

setup(snakemake.log[0], outputs=snakemake.output)
write_known_task(snakemake.input.choice, snakemake.input.cloze, snakemake.params.margin, snakemake.output[0])
