"""Rule mmlu_task: the MMLU evaluation set in one format (letter or cloze) as Parquet."""

from gna.core.runtime import setup
from gna.tasks.tables import write_mmlu_task

setup(snakemake.log[0], outputs=snakemake.output)
write_mmlu_task(
    snakemake.input[0], snakemake.params.sha256, snakemake.params.mmlu, snakemake.wildcards.fmt, snakemake.output[0]
)
