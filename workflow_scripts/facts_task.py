"""Rule facts_task: the facts task in one format (cloze or choice) as Parquet."""

from gna.core.runtime import setup
from gna.tasks.facts import write_facts_task

setup(snakemake.log[0], outputs=snakemake.output)
write_facts_task(snakemake.input[0], snakemake.params.facts, snakemake.wildcards.facts_fmt, snakemake.output[0])
